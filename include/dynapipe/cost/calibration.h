// CostCalibration: per-stage multipliers of a cost model's forward and backward times and
// of its activation memory, learnt from measured training steps (`dynapipe train
// --refine-cost-model`), so the planner's estimates track the machine it actually runs on.
//
//   auto calibration = std::make_shared<CostCalibration>(/*num_stages=*/2);
//   auto model = make_calibrated_cost_model(base, calibration);   // plan with this
//   calibration->observe(0, {.measured_ms = 812, .base_ms = 640}, {...});  // after a step
//
// observe() takes the *uncalibrated* model's estimate of the work that was measured, so
// the factor converges to measured / base however stale the plans in flight are. Factors
// move geometrically: f <- f^(1-a) * (measured/base)^a with smoothing a in (0, 1].
// Memory: a device's peak is static + activations (docs/cost-model.md); the memory factor
// scales the activation part (stored_bytes, peak_bytes), learnt from
// (measured peak - static) / (uncalibrated estimate - static) and folded the same way, so
// what the model misses per token (and, roughly, per step) moves the planner's limit check.
// Thread-safe: training threads observe while planning threads read.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dynapipe/cost/cost_model.h"

namespace dynapipe {

struct TimeObservation {
  double measured_ms = 0;  // what the stage's executor measured for this kind of op
  double base_ms = 0;      // the uncalibrated model's estimate of the same work
};

struct MemoryObservation {
  double measured_bytes = 0;    // the device's measured peak, static memory included
  double static_bytes = 0;      // the model's parameters, gradients, optimizer states
  double activation_bytes = 0;  // the uncalibrated model's peak minus static_bytes
};

class CostCalibration {
 public:
  // Throws InvalidArgument unless num_stages >= 1 and 0 < smoothing <= 1.
  explicit CostCalibration(int num_stages, double smoothing = 0.5);

  // Folds in one step of `stage`. Observations with a non-positive side are ignored
  // (a stage that ran no backward, a zero estimate). Throws InvalidArgument for a bad stage.
  void observe(int stage, TimeObservation forward, TimeObservation backward);
  // Folds in one step's peak memory of `stage`; ignored unless measured_bytes > static_bytes
  // and activation_bytes > 0. Throws InvalidArgument for a bad stage.
  void observe_memory(int stage, MemoryObservation memory);

  int num_stages() const { return static_cast<int>(forward_.size()); }
  double forward_factor(int stage) const;
  double backward_factor(int stage) const;
  double memory_factor(int stage) const;
  // "stage 0: fwd x1.27 bwd x1.41 mem x1.10, stage 1: ..."
  std::string describe() const;

 private:
  mutable std::mutex mutex_;
  double smoothing_;
  std::vector<double> forward_, backward_, memory_;  // 1.0 until observed
  std::vector<bool> seen_forward_, seen_backward_, seen_memory_;
};

// `base` with forward and backward times (and the I/W split) and activation bytes
// (stored_bytes, peak_bytes; out-of-memory points stay so) scaled by the calibration's
// current factors of each stage; static bytes, transfers and describe() unchanged. The
// calibration must have base->num_stages() stages.
std::unique_ptr<CostModel> make_calibrated_cost_model(std::shared_ptr<const CostModel> base,
                                                      std::shared_ptr<const CostCalibration> calibration);

}  // namespace dynapipe
