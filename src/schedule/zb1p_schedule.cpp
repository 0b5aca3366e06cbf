// Zero-bubble ZB-H1-like schedule (research/peers.md §4): the backward is split into I
// (gradient w.r.t. the input, on the critical path) and W (gradient w.r.t. the
// weights, deferrable). ZB-H1 keeps 1F1B's order of F and I and moves the W's: stage 0
// runs each W right after its I (1F1B's memory), later stages defer W's, so that every
// stage holds at most D micro-batches between F and W — stage 0's 1F1B count — and the
// deferred W's fill the bubbles of the warm-up and the tail.
//
// Built as a list schedule over simulated time, so the W's land where *these*
// micro-batches leave gaps. A free device d with next F/I op x (1F1B order) runs:
//  * a pending W, if x is an F and the device already holds D micro-batches between F
//    and W (the memory bound);
//  * else x, if its inputs are there;
//  * else the oldest pending W, if any (it would idle otherwise);
//  * else it waits for x's inputs. After the last I it drains its W's.
// Messages use the simulator's model (p2p_ms, FIFO per directed link), so the
// simulator reproduces the times the choices were made with.
//
// Invariants: per device, F and I keep 1F1B's order and W's run in micro-batch order
// after their I; an op is chosen only when its inputs have arrived, so the order
// replays without deadlock.
// Complexity: O(ops log devices) with the devices' wake-up times in a WakeupQueue.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "dynapipe/core/error.h"
#include "schedule/builders.h"

namespace dynapipe::detail {
namespace {

constexpr double kUnknown = -1.0;

struct DeviceState {
  double free_ms = 0;
  std::vector<PipelineOp> sequence;  // F and I in 1F1B order
  std::size_t next = 0;              // index into sequence
  int forwards = 0, inputs = 0, weights = 0;  // ops run so far, each in micro-batch order
  bool done() const { return next == sequence.size() && weights == inputs; }
};

}  // namespace

std::optional<ScheduleOrder> build_zb1p(const PipelineProblem& problem, const BuildOptions& options,
                                        SimResult* timing) {
  const int m = problem.num_microbatches();
  const int num_devices = problem.layout.num_devices;  // == stages (chunks == 1)
  ScheduleOrder order;
  order.device_ops.resize(num_devices);
  for (auto& ops : order.device_ops) ops.reserve(3 * static_cast<std::size_t>(m));

  const std::size_t cells = static_cast<std::size_t>(m) * num_devices;
  std::vector<double> fwd_end(cells, kUnknown), act_arrive(cells, kUnknown);
  std::vector<double> inp_end(cells, kUnknown), grad_arrive(cells, kUnknown);
  std::vector<double> link_free(static_cast<std::size_t>(num_devices) * num_devices, 0.0);
  std::vector<DeviceState> devices(num_devices);
  for (int d = 0; d < num_devices; ++d) {
    auto& seq = devices[d].sequence;
    const int warmup = std::min(num_devices - d - 1, m);
    for (int mb = 0; mb < warmup; ++mb) seq.push_back({mb, d, OpKind::F});
    for (int i = 0; i < m - warmup; ++i) {
      seq.push_back({warmup + i, d, OpKind::F});
      seq.push_back({i, d, OpKind::I});
    }
    for (int mb = m - warmup; mb < m; ++mb) seq.push_back({mb, d, OpKind::I});
  }

  MemoryTrack memory(problem, options);
  start_timing(timing, num_devices);
  WakeupQueue wakeups(num_devices);
  WorkLeft work_left(problem, /*split=*/true);

  auto send = [&](int from, int to, std::int64_t bytes, double send_ms) {
    if (from == to) return send_ms;
    double& link = link_free[static_cast<std::size_t>(from) * num_devices + to];
    link = std::max(send_ms, link) + problem.p2p_ms(bytes);
    // A device busy past the arrival wakes at its own end anyway (that wake-up is still
    // queued, since send_ms >= the current time).
    if (link >= devices[to].free_ms) wakeups.push(link, to);
    return link;
  };
  auto cell = [&](int mb, int s) { return static_cast<std::size_t>(mb) * num_devices + s; };

  while (!wakeups.empty()) {
    const auto [now, d] = wakeups.pop();
    DeviceState& dev = devices[d];
    if (now < dev.free_ms || dev.done()) continue;  // stale: busy until free_ms
    const int s = d;

    // When the next F/I can start (kUnknown = its input's producer has not run).
    double ready = kUnknown;
    bool memory_bound = false;
    const bool has_next = dev.next < dev.sequence.size();
    if (has_next) {
      const PipelineOp& x = dev.sequence[dev.next];
      const std::size_t k = cell(x.mb, s);
      if (x.kind == OpKind::F) {
        memory_bound = dev.forwards - dev.weights >= num_devices;
        if (s == 0) {
          ready = 0;
        } else if (fwd_end[k - 1] >= 0) {
          ready = act_arrive[k - 1];
        }
      } else if (s + 1 == num_devices) {
        ready = fwd_end[k];
      } else if (inp_end[k + 1] >= 0) {
        ready = std::max(fwd_end[k], grad_arrive[k + 1]);
      }
    }
    const bool w_pending = dev.weights < dev.inputs;

    PipelineOp op;
    if (w_pending && (memory_bound || !has_next || ready < 0 || ready > now)) {
      op = {dev.weights, s, OpKind::W};
    } else if (has_next && !memory_bound && ready >= 0 && ready <= now) {
      op = dev.sequence[dev.next];
    } else {
      // Nothing to run: wait for the next op's input. send() pushed its arrival's
      // wake-up (an input on its way arrives after this device's last op ends, or it
      // would be here), and one not yet produced pushes it when its producer runs.
      continue;
    }

    const double op_ms = problem.op_ms(op);
    const double end = now + op_ms;
    // The simulator times this op the same way (start = now, the end of its device's
    // last op or its input's arrival), so the order cannot beat options.stop_at_ms.
    if (work_left.cannot_finish_before(d, op_ms, end, options.stop_at_ms)) return std::nullopt;
    const StageCost& cost = problem.costs[op.mb][s];
    if (!memory.fits(d, op, cost)) return std::nullopt;
    time_op(timing, d, now, end);
    dev.free_ms = end;
    order.device_ops[d].push_back(op);
    const std::size_t k = cell(op.mb, s);
    switch (op.kind) {
      case OpKind::F:
        ++dev.next;
        ++dev.forwards;
        fwd_end[k] = end;
        if (s + 1 < num_devices) act_arrive[k] = send(d, d + 1, cost.output_bytes, end);
        break;
      case OpKind::I:
        ++dev.next;
        ++dev.inputs;
        inp_end[k] = end;
        if (s > 0) {
          grad_arrive[k] = send(d, d - 1, problem.costs[op.mb][s - 1].output_bytes, end);
        }
        break;
      default:
        ++dev.weights;
        break;
    }
    wakeups.push(end, d);
  }
  for (int d = 0; d < num_devices; ++d) {
    DYNAPIPE_CHECK(devices[d].done(), cat("zb1p schedule: device ", d, " stopped after ",
                                           order.device_ops[d].size(), " of ", 3 * m, " ops"));
  }
  return order;
}

}  // namespace dynapipe::detail
