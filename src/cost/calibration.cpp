#include "dynapipe/cost/calibration.h"

#include <cmath>
#include <cstdio>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {

namespace {

// The first observation is taken whole (the model may be off by 10x on a new machine);
// later ones are averaged geometrically, so one noisy step moves the factor only part way.
double fold(double factor, bool seen, const TimeObservation& o, double smoothing) {
  const double ratio = o.measured_ms / o.base_ms;
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
  std::int64_t static_bytes(int stage) const override { return base_->static_bytes(stage); }
  double p2p_ms(std::int64_t bytes) const override { return base_->p2p_ms(bytes); }
  double allreduce_ms(std::int64_t bytes, int replicas) const override {
    return base_->allreduce_ms(bytes, replicas);
  }
  std::string describe() const override { return base_->describe(); }

 private:
  void scale(int stage, StageCost& c) const {
    const double f = calibration_->forward_factor(stage), b = calibration_->backward_factor(stage);
    c.fwd_ms *= f;
    c.bwd_ms *= b;
    c.bwd_input_ms *= b;
    c.bwd_weight_ms *= b;
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
  seen_forward_.assign(forward_.size(), false);
  seen_backward_ = seen_forward_;
}

void CostCalibration::observe(int stage, TimeObservation forward, TimeObservation backward) {
  if (stage < 0 || stage >= num_stages()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("calibration stage must be in [0, ", num_stages(), "), got ", stage));
  }
  const auto s = static_cast<std::size_t>(stage);
  std::lock_guard lock(mutex_);
  if (usable(forward)) {
    forward_[s] = fold(forward_[s], seen_forward_[s], forward, smoothing_);
    seen_forward_[s] = true;
  }
  if (usable(backward)) {
    backward_[s] = fold(backward_[s], seen_backward_[s], backward, smoothing_);
    seen_backward_[s] = true;
  }
}

double CostCalibration::forward_factor(int stage) const {
  std::lock_guard lock(mutex_);
  return forward_.at(static_cast<std::size_t>(stage));
}

double CostCalibration::backward_factor(int stage) const {
  std::lock_guard lock(mutex_);
  return backward_.at(static_cast<std::size_t>(stage));
}

std::string CostCalibration::describe() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (std::size_t s = 0; s < forward_.size(); ++s) {
    char line[96];
    std::snprintf(line, sizeof line, "%sstage %zu: fwd x%.2f bwd x%.2f", s > 0 ? ", " : "", s,
                  forward_[s], backward_[s]);
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
