// The critical-path schedule: a memory-aware list schedule for micro-batches of unequal
// cost, where 1F1B's fixed p − s in-flight count cannot hide a long micro-batch's round
// trip (docs/schedules.md, "critical-path").
//
// Simulated time, one decision each time a device falls free (stage == device):
//  * a backward whose gradient is there runs first (it sits on the critical path);
//    among several, the oldest (lowest micro-batch id, i.e. injected first). Where the
//    cost model splits the backward, this is the I pass and the W pass waits (below).
//    (Longest remaining chain first was measured too: never better on the issue-8
//    points, up to 0.3% worse; docs/RESULTS.md);
//  * else a forward whose activation is there and that fits in memory: on stage 0 the
//    next micro-batch in id order (the injection order stays the search's to choose),
//    elsewhere the one with the longest remaining chain (forward to the last stage and
//    its backward down to stage 0). It fits when the device's static bytes + the held
//    bytes of what it holds + this one's held bytes + the largest peak_bytes of any of
//    them stay within the memory limit (none: unlimited). Held bytes are the stored
//    activations plus the forward's output: the lowered plan keeps the sent activation
//    until its backward waits on the send (plan/lowering.cpp), and with no in-flight
//    count those outputs add up (many short micro-batches: GPT-6.7B pp 4 on H100 at 512
//    with one row each went 5.4 MB over 80 GiB in the plan verifier, which counts them).
//    A device holding nothing admits any forward — it would wait forever otherwise; the
//    simulator then reports the overflow;
//  * else (nothing ready, or the forward does not fit) the oldest pending W, which frees
//    its micro-batch's memory;
//  * else it waits for the next input to arrive.
// There is no in-flight count: memory alone bounds what a device holds, so short
// micro-batches fill the time a long one's backward takes to come back, and deferred W
// passes fill what is left.
// Messages follow the simulator's model (p2p_ms, FIFO per directed link), so the
// simulator reproduces the times the choices were made with.
//
// Invariants: an op is chosen only when its inputs have arrived, so the per-device orders
// replay without deadlock; the memory bound holds at every op because it holds at each
// admission and backwards only free memory (I frees nothing, W or B what F stored).
// Complexity: O(ops · (m + log devices)) — the ready lists are scanned per decision.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "dynapipe/core/error.h"
#include "schedule/builders.h"

namespace dynapipe::detail {
namespace {

// An input that has been sent to a device: the micro-batch and when it is there.
struct Arrival {
  int mb = 0;
  double at_ms = 0;
};

struct DeviceState {
  double free_ms = 0;
  std::vector<Arrival> forwards;   // activations sent here, forward not yet run
  std::vector<Arrival> backwards;  // gradients sent here (or own F done, last stage)
  std::vector<int> held;           // micro-batches between F and B (or W) here
  std::vector<int> pending_w;      // I run, W not yet (oldest first)
  std::int64_t memory = 0;         // static + held_bytes() of `held`
  int next_injection = 0;          // stage 0: the next micro-batch in id order
  int ops_run = 0;
};

}  // namespace

std::optional<ScheduleOrder> build_critical_path(const PipelineProblem& problem,
                                                 const BuildOptions& options, SimResult* timing) {
  const int m = problem.num_microbatches();
  const int p = problem.layout.num_devices;  // == stages (chunks == 1)
  // The split backward where the cost model gives one (as zb1p needs it).
  bool split = true;
  for (const auto& per_stage : problem.costs) {
    for (const StageCost& c : per_stage) {
      if (c.bwd_ms > 0 && c.bwd_input_ms == 0 && c.bwd_weight_ms == 0) split = false;
    }
  }
  const OpKind backward = split ? OpKind::I : OpKind::B;
  const std::int64_t limit = problem.memory_limit_bytes;
  ScheduleOrder order;
  order.device_ops.resize(p);
  const int ops_per_device = (split ? 3 : 2) * m;
  for (auto& ops : order.device_ops) ops.reserve(static_cast<std::size_t>(ops_per_device));

  // A forward's remaining chain: the forward from stage s to the last stage, then the
  // backward (I where split) down to stage 0; hops cost p2p_ms.
  const std::size_t cells = static_cast<std::size_t>(m) * p;
  auto cell = [&](int mb, int s) { return static_cast<std::size_t>(mb) * p + s; };
  std::vector<double> fchain(cells);
  for (int mb = 0; mb < m; ++mb) {
    const auto& c = problem.costs[mb];
    double back = 0;  // the backward from the last stage down to stage 0
    for (int s = 0; s < p; ++s) {
      back += (split ? c[s].bwd_input_ms : c[s].bwd_ms) +
              (s > 0 ? problem.p2p_ms(c[s - 1].output_bytes) : 0);
    }
    for (int s = p - 1; s >= 0; --s) {
      fchain[cell(mb, s)] =
          c[s].fwd_ms + (s + 1 < p ? problem.p2p_ms(c[s].output_bytes) + fchain[cell(mb, s + 1)] : back);
    }
  }

  std::vector<DeviceState> devices(p);
  for (int d = 0; d < p; ++d) devices[d].memory = problem.static_bytes[d];
  std::vector<double> link_free(static_cast<std::size_t>(p) * p, 0.0);
  MemoryTrack tracked(problem, options);
  start_timing(timing, p);
  WakeupQueue wakeups(p);
  WorkLeft work_left(problem, split);

  // Sends `mb`'s output from `from` to `to` at `send_ms`; returns the arrival.
  auto send = [&](int from, int to, std::int64_t bytes, double send_ms) {
    double& link = link_free[static_cast<std::size_t>(from) * p + to];
    link = std::max(send_ms, link) + problem.p2p_ms(bytes);
    wakeups.push(std::max(link, devices[to].free_ms), to);
    return link;
  };
  // The admissible ready entry of `list` with the highest priority (ties: the lowest
  // micro-batch), or -1.
  auto pick = [&](const std::vector<Arrival>& list, double now, auto&& priority,
                  auto&& admissible) {
    int best = -1;
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Arrival& a = list[i];
      if (a.at_ms > now || !admissible(a.mb)) continue;
      if (best < 0) {
        best = i;
        continue;
      }
      const double mine = priority(a.mb), theirs = priority(list[best].mb);
      if (mine > theirs || (mine == theirs && a.mb < list[best].mb)) best = i;
    }
    return best;
  };

  while (!wakeups.empty()) {
    const auto [now, d] = wakeups.pop();
    DeviceState& dev = devices[d];
    if (now < dev.free_ms || dev.ops_run == ops_per_device) continue;  // stale or done
    const int s = d;

    PipelineOp op;
    auto oldest = [](int mb) { return -static_cast<double>(mb); };
    auto longest_chain = [&](int mb) { return fchain[cell(mb, s)]; };
    auto any = [](int) { return true; };
    const int b = pick(dev.backwards, now, oldest, any);
    if (b >= 0) {
      op = {dev.backwards[b].mb, s, backward};
      dev.backwards.erase(dev.backwards.begin() + b);
    } else {
      std::int64_t held_peak = 0;
      for (int mb : dev.held) held_peak = std::max(held_peak, problem.costs[mb][s].peak_bytes);
      auto fits = [&](int mb) {
        const StageCost& c = problem.costs[mb][s];
        return limit <= 0 || dev.held.empty() ||
               dev.memory + c.held_bytes() + std::max(held_peak, c.peak_bytes) <= limit;
      };
      int mb = -1;
      if (s == 0) {
        if (dev.next_injection < m && fits(dev.next_injection)) mb = dev.next_injection++;
      } else {
        const int f = pick(dev.forwards, now, longest_chain, fits);
        if (f >= 0) {
          mb = dev.forwards[f].mb;
          dev.forwards.erase(dev.forwards.begin() + f);
        }
      }
      if (mb >= 0) {
        op = {mb, s, OpKind::F};
      } else if (!dev.pending_w.empty()) {
        op = {dev.pending_w.front(), s, OpKind::W};
        dev.pending_w.erase(dev.pending_w.begin());
      } else {
        // Nothing to run now: wait for the next arrival. send() pushed a wake-up at each
        // arrival still to come (after this device's last op), and inputs not yet produced
        // wake this device when they are sent.
        continue;
      }
    }

    const double op_ms = problem.op_ms(op);
    const double end = now + op_ms;
    // The simulator times this op the same way (start = now, the end of its device's
    // last op or its input's arrival), so the order cannot beat options.stop_at_ms.
    if (work_left.cannot_finish_before(d, op_ms, end, options.stop_at_ms)) return std::nullopt;
    const StageCost& cost = problem.costs[op.mb][s];
    if (!tracked.fits(d, op, cost)) return std::nullopt;
    time_op(timing, d, now, end);
    dev.free_ms = end;
    ++dev.ops_run;
    order.device_ops[d].push_back(op);
    if (op.kind == OpKind::F) {
      dev.held.push_back(op.mb);
      dev.memory += cost.held_bytes();
      if (s + 1 < p) {
        devices[s + 1].forwards.push_back({op.mb, send(d, d + 1, cost.output_bytes, end)});
      } else {
        dev.backwards.push_back({op.mb, end});
      }
    } else if (op.kind == OpKind::W) {
      std::erase(dev.held, op.mb);
      dev.memory -= cost.held_bytes();
    } else {
      if (op.kind == OpKind::I) {
        dev.pending_w.push_back(op.mb);
      } else {
        std::erase(dev.held, op.mb);
        dev.memory -= cost.held_bytes();
      }
      if (s > 0) {
        devices[s - 1].backwards.push_back(
            {op.mb, send(d, d - 1, problem.costs[op.mb][s - 1].output_bytes, end)});
      }
    }
    wakeups.push(end, d);
  }
  for (int d = 0; d < p; ++d) {
    DYNAPIPE_CHECK(devices[d].ops_run == ops_per_device,
                   cat("critical-path schedule: device ", d, " stopped after ",
                       devices[d].ops_run, " of ", ops_per_device, " ops"));
  }
  return order;
}

}  // namespace dynapipe::detail
