// Private to schedule/: the order builders behind the Schedule registry. Each takes a
// validated problem whose layout it supports (the registry checks) and returns the
// per-device op order; micro-batches are injected in id order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "dynapipe/schedule/pipeline.h"
#include "dynapipe/schedule/schedule.h"

namespace dynapipe::detail {

// All forwards in (mb, stage) order, then all backwards in (mb desc, stage desc) order.
// Any layout.
ScheduleOrder build_gpipe(const PipelineProblem& problem);

// Megatron non-interleaved 1F1B: device d warms up with min(D - d - 1, m) forwards.
// layout.chunks == 1.
ScheduleOrder build_1f1b(const PipelineProblem& problem);

// Megatron interleaved 1F1B. layout.chunks >= 2.
ScheduleOrder build_interleaved(const PipelineProblem& problem);

// DynaPipe's cyclic schedule with memory-aware injection. With `barriers` the order
// carries op_cycle (the "cyclic" schedule); without, it is "wait-free-cyclic".
// Any layout.
ScheduleOrder build_cyclic(const PipelineProblem& problem, bool barriers);

// The two list schedules below keep the simulator's clock while they choose; each
// returns nullopt (stopped) as soon as one of its ops ends at or after
// options.stop_at_ms, since the order's simulated makespan is then >= that, and with
// options.stop_over_memory as soon as a device's memory passes the limit
// (Schedule::build). With an order, `timing` (when non-null) gets its makespan_ms and
// busy_ms as the simulator sums them.
using BuildOptions = Schedule::BuildOptions;

// Each device's memory as Simulator::memory counts it, op by op in the device's order
// (per-iteration weight update: no stashed versions), where options.stop_over_memory
// asks for it.
class MemoryTrack {
 public:
  MemoryTrack(const PipelineProblem& problem, const BuildOptions& options)
      : limit_(options.stop_over_memory ? problem.memory_limit_bytes : 0) {
    if (limit_ > 0) current_.assign(problem.static_bytes.begin(), problem.static_bytes.end());
  }
  // Adds `op` (costing `c`) to device d's order; false once the device passed the limit.
  bool fits(int d, const PipelineOp& op, const StageCost& c) {
    return limit_ <= 0 || step_memory(current_[static_cast<std::size_t>(d)], op, c) <= limit_;
  }

 private:
  std::int64_t limit_;  // 0: not tracked
  std::vector<std::int64_t> current_;
};

// A list schedule's own clock as the simulator sums it (`timing` may be null): reset for
// `devices` devices, then each op added in its device's op order.
inline void start_timing(SimResult* timing, int devices) {
  if (timing == nullptr) return;
  timing->makespan_ms = 0;
  timing->busy_ms.assign(static_cast<std::size_t>(devices), 0.0);
}
inline void time_op(SimResult* timing, int device, double start_ms, double end_ms) {
  if (timing == nullptr) return;
  timing->busy_ms[static_cast<std::size_t>(device)] += end_ms - start_ms;
  timing->makespan_ms = std::max(timing->makespan_ms, end_ms);
}

// Zero-bubble ZB-H1-like greedy list schedule with split backward (I, W).
// layout.chunks == 1.
std::optional<ScheduleOrder> build_zb1p(const PipelineProblem& problem, const BuildOptions& options,
                                        SimResult* timing);

// Memory-aware list schedule for unequal micro-batches: backward first, the longest
// remaining chain first, forwards admitted while memory fits (no in-flight count).
// layout.chunks == 1.
std::optional<ScheduleOrder> build_critical_path(const PipelineProblem& problem,
                                                 const BuildOptions& options, SimResult* timing);

}  // namespace dynapipe::detail
