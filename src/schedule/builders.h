// Private to schedule/: the order builders behind the Schedule registry. Each takes a
// validated problem whose layout it supports (the registry checks) and returns the
// per-device op order; micro-batches are injected in id order.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
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
// options.stop_at_ms, or its device's work left shows that the device cannot finish
// before it (WorkLeft), since the order's simulated makespan is then >= that, and with
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

// The stop rule of SimOptions::stop_at_ms and BuildOptions::stop_at_ms, for an op that
// ends at `end_ms` on a device with `left_ms` of work still to start: the makespan is at
// or after stop_at_ms if the op ends there, or if the device's later ops, run one after
// another, do. The second test keeps a relative slack of 1e-9, far above the rounding of
// these sums, so it stops no order that would end below stop_at_ms.
inline bool makespan_reaches(double end_ms, double left_ms, double stop_at_ms) {
  return end_ms >= stop_at_ms || end_ms + left_ms >= stop_at_ms * (1 + 1e-9);
}

// A list schedule's early stop by the work a device has left (makespan_reaches()): an
// order that cannot beat options.stop_at_ms is given up where that shows (often
// mid-build) rather than where one of its ops ends past it (near the end).
class WorkLeft {
 public:
  // Each device's ops: every micro-batch's forward and backward on its stage (device ==
  // stage), the backward as I and W where `split`, else as B.
  WorkLeft(const PipelineProblem& problem, bool split)
      : left_(static_cast<std::size_t>(problem.num_stages()), 0.0) {
    for (const std::vector<StageCost>& per_stage : problem.costs) {
      for (std::size_t s = 0; s < left_.size(); ++s) {
        const StageCost& c = per_stage[s];
        left_[s] += c.fwd_ms + (split ? c.bwd_input_ms + c.bwd_weight_ms : c.bwd_ms);
      }
    }
  }
  // Takes an op of `op_ms` off device d's work as it starts, to end at `end_ms`: whether
  // the order's makespan cannot end before `stop_at_ms` now.
  bool cannot_finish_before(int d, double op_ms, double end_ms, double stop_at_ms) {
    double& left = left_[static_cast<std::size_t>(d)];
    left -= op_ms;
    return makespan_reaches(end_ms, left, stop_at_ms);
  }

 private:
  std::vector<double> left_;  // per device: the work of its ops not yet started
};

// The list schedules' wake-ups: (time, device) pairs popped earliest first, ties by the
// lower device, as one min-heap of pairs pops them. Kept per device (each holds a few)
// under a tournament over the devices' earliest: a push or pop touches its device's short
// list and log2(devices) nodes, where the heap sifted through every pending pair (half of a
// zb1p build's instructions, T5-11B pp 8 short256).
class WakeupQueue {
 public:
  explicit WakeupQueue(int devices)
      : pending_(static_cast<std::size_t>(devices)),
        leaves_(std::bit_ceil(static_cast<std::size_t>(devices))),
        earliest_(leaves_, kNone), tree_(2 * leaves_) {
    for (std::size_t d = 0; d < leaves_; ++d) tree_[leaves_ + d] = static_cast<int>(d);
    for (std::size_t node = leaves_ - 1; node >= 1; --node) tree_[node] = tree_[2 * node];
    for (int d = 0; d < devices; ++d) push(0.0, d);
  }
  bool empty() const { return earliest_[static_cast<std::size_t>(tree_[1])] == kNone; }
  // REQUIRES: !empty().
  std::pair<double, int> pop() {
    const int d = tree_[1];
    std::vector<double>& mine = pending_[static_cast<std::size_t>(d)];
    const double time_ms = mine.back();
    mine.pop_back();
    update(d, mine.empty() ? kNone : mine.back());
    return {time_ms, d};
  }
  void push(double time_ms, int device) {
    std::vector<double>& mine = pending_[static_cast<std::size_t>(device)];
    // Latest first, so the earliest is at the back; a device holds a few.
    auto it = mine.end();
    while (it != mine.begin() && *(it - 1) < time_ms) --it;
    const bool earliest = it == mine.end();
    mine.insert(it, time_ms);
    if (earliest) update(device, time_ms);
  }

 private:
  static constexpr double kNone = std::numeric_limits<double>::infinity();  // no wake-up

  // Device d's earliest wake-up is now `time_ms`: replay its matches up to the root (a
  // left child holds the lower devices, so it wins ties).
  void update(int d, double time_ms) {
    earliest_[static_cast<std::size_t>(d)] = time_ms;
    for (std::size_t node = (leaves_ + static_cast<std::size_t>(d)) / 2; node >= 1; node /= 2) {
      const int left = tree_[2 * node], right = tree_[2 * node + 1];
      tree_[node] = earliest_[static_cast<std::size_t>(right)] < earliest_[static_cast<std::size_t>(left)]
                        ? right : left;
    }
  }

  std::vector<std::vector<double>> pending_;  // per device, latest first
  std::size_t leaves_;
  std::vector<double> earliest_;  // per device (and padding up to leaves_): kNone if none
  std::vector<int> tree_;         // tree_[1]: the device with the earliest wake-up
};

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
