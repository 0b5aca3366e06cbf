#include "dynapipe/cost/calibration.h"

#include <cmath>
#include <cstdio>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/cost/profile.h"

namespace dynapipe {

namespace {

// The first observation is taken whole (the model may be off by 10x on a new machine);
// later ones are averaged geometrically, so one noisy step moves the factor only part way.
double fold(double factor, bool seen, double ratio, double smoothing) {
  if (!seen) return ratio;
  return std::exp((1 - smoothing) * std::log(factor) + smoothing * std::log(ratio));
}

bool usable(const TimeObservation& o) {
  return o.measured_ms > 0 && o.base_ms > 0 && std::isfinite(o.measured_ms) && std::isfinite(o.base_ms);
}

class CalibratedCostModel final : public CostModel {
 public:
  CalibratedCostModel(std::shared_ptr<const CostModel> base,
                      std::shared_ptr<const CostCalibration> calibration)
      : base_(std::move(base)), calibration_(std::move(calibration)) {}
  const ModelSpec& model() const override { return base_->model(); }
  const DeviceSpec& device() const override { return base_->device(); }
  const std::vector<StageLayers>& stages() const override { return base_->stages(); }
  StageCost stage_cost(int stage, const MicroBatchShape& shape, const AttentionDensity& density,
                       Recompute recompute) const override {
    StageCost c = base_->stage_cost(stage, shape, density, recompute);
    scale(stage, c);
    return c;
  }
  void stage_costs(const MicroBatchShape& shape, const AttentionDensity& density,
                   Recompute recompute, std::span<StageCost> out) const override {
    base_->stage_costs(shape, density, recompute, out);
    for (std::size_t s = 0; s < out.size(); ++s) scale(static_cast<int>(s), out[s]);
  }
  // Positive per-stage factors keep each stage's time, and so their maximum, subadditive.
  bool subadditive() const override { return base_->subadditive(); }
  bool monotone() const override { return base_->monotone(); }
  bool varlen_costs_extra() const override { return base_->varlen_costs_extra(); }
  bool lone_samples_dense() const override { return base_->lone_samples_dense(); }
  std::int64_t static_bytes(int stage) const override { return base_->static_bytes(stage); }
  std::int64_t weight_bytes(int stage) const override { return base_->weight_bytes(stage); }
  double p2p_ms(std::int64_t bytes) const override { return base_->p2p_ms(bytes); }
  double allreduce_ms(std::int64_t bytes, int replicas) const override {
    return base_->allreduce_ms(bytes, replicas);
  }
  std::string describe() const override { return base_->describe(); }
  std::string extrapolation_warning(std::int64_t max_seqlen, std::int64_t max_dec_seqlen) const override {
    return base_->extrapolation_warning(max_seqlen, max_dec_seqlen);
  }

 private:
  void scale(int stage, StageCost& c) const {
    const double f = calibration_->forward_factor(stage), b = calibration_->backward_factor(stage);
    c.fwd_ms *= f;
    c.bwd_ms *= b;
    c.bwd_input_ms *= b;
    c.bwd_weight_ms *= b;
    const double m = calibration_->memory_factor(stage);
    auto scale_bytes = [m](std::int64_t& bytes) {
      if (bytes < kInfeasibleBytes) bytes = static_cast<std::int64_t>(std::llround(m * static_cast<double>(bytes)));
    };
    scale_bytes(c.stored_bytes);
    scale_bytes(c.peak_bytes);
  }

  std::shared_ptr<const CostModel> base_;
  std::shared_ptr<const CostCalibration> calibration_;
};

}  // namespace

CostCalibration::CostCalibration(int num_stages, double smoothing) : smoothing_(smoothing) {
  if (num_stages < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("calibration stages must be >= 1, got ", num_stages));
  }
  if (!(smoothing > 0 && smoothing <= 1)) {
    throw Error(ErrorKind::InvalidArgument, cat("calibration smoothing must be in (0, 1], got ", smoothing));
  }
  forward_.assign(static_cast<std::size_t>(num_stages), 1.0);
  backward_ = forward_;
  memory_ = forward_;
  seen_forward_.assign(forward_.size(), false);
  seen_backward_ = seen_forward_;
  seen_memory_ = seen_forward_;
}

namespace {

void check_stage(int stage, int num_stages) {
  if (stage < 0 || stage >= num_stages) {
    throw Error(ErrorKind::InvalidArgument,
                cat("calibration stage must be in [0, ", num_stages, "), got ", stage));
  }
}

}  // namespace

void CostCalibration::observe(int stage, TimeObservation forward, TimeObservation backward) {
  check_stage(stage, num_stages());
  const auto s = static_cast<std::size_t>(stage);
  std::lock_guard lock(mutex_);
  if (usable(forward)) {
    forward_[s] = fold(forward_[s], seen_forward_[s], forward.measured_ms / forward.base_ms, smoothing_);
    seen_forward_[s] = true;
  }
  if (usable(backward)) {
    backward_[s] = fold(backward_[s], seen_backward_[s], backward.measured_ms / backward.base_ms, smoothing_);
    seen_backward_[s] = true;
  }
}

void CostCalibration::observe_memory(int stage, MemoryObservation memory) {
  check_stage(stage, num_stages());
  const double measured_activations = memory.measured_bytes - memory.static_bytes;
  if (!(measured_activations > 0 && memory.activation_bytes > 0 && std::isfinite(memory.measured_bytes) &&
        std::isfinite(memory.activation_bytes))) {
    return;
  }
  const auto s = static_cast<std::size_t>(stage);
  std::lock_guard lock(mutex_);
  memory_[s] = fold(memory_[s], seen_memory_[s], measured_activations / memory.activation_bytes, smoothing_);
  seen_memory_[s] = true;
}

double CostCalibration::forward_factor(int stage) const {
  std::lock_guard lock(mutex_);
  return forward_.at(static_cast<std::size_t>(stage));
}

double CostCalibration::backward_factor(int stage) const {
  std::lock_guard lock(mutex_);
  return backward_.at(static_cast<std::size_t>(stage));
}

double CostCalibration::memory_factor(int stage) const {
  std::lock_guard lock(mutex_);
  return memory_.at(static_cast<std::size_t>(stage));
}

std::string CostCalibration::describe() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (std::size_t s = 0; s < forward_.size(); ++s) {
    char line[128];
    std::snprintf(line, sizeof line, "%sstage %zu: fwd x%.2f bwd x%.2f mem x%.2f", s > 0 ? ", " : "", s,
                  forward_[s], backward_[s], memory_[s]);
    out += line;
  }
  return out;
}

std::unique_ptr<CostModel> make_calibrated_cost_model(std::shared_ptr<const CostModel> base,
                                                      std::shared_ptr<const CostCalibration> calibration) {
  DYNAPIPE_CHECK(base && calibration, "make_calibrated_cost_model needs a model and a calibration");
  if (calibration->num_stages() != base->num_stages()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("calibration stages must equal the cost model's ", base->num_stages(), ", got ",
                    calibration->num_stages()));
  }
  return std::make_unique<CalibratedCostModel>(std::move(base), std::move(calibration));
}

}  // namespace dynapipe
