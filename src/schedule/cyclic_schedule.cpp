// DynaPipe's adaptive cyclic schedule with memory-aware injection
// (research/dynapipe-reference.md §4.2; cyclic_schedule.py in the reference).
//
// A synchronous cycle simulation that only decides *order*; timing comes from the
// event simulator (with cycle barriers for "cyclic", without for "wait-free-cyclic").
//  * Every virtual stage has a forward queue and a backward queue. All micro-batches
//    start in stage 0's forward queue, in id order.
//  * In each cycle every device looks at the head of each queue of each stage it holds
//    (so a stage runs at most one F and one B per cycle) as of the cycle's start —
//    outputs of this cycle become visible in the next one — and runs them alternating
//    backward and forward (B1, F1, B2, F2, ...; each side by (micro-batch, stage)).
//  * Memory-aware injection: the first forward of a micro-batch on a device is skipped
//    for this cycle when memory_limit_bytes > 0 and the device's current memory
//    (static + held bytes of everything in flight there: StageCost::held_bytes(), the
//    stored activations and the sent output) + the op's held bytes + peak_bytes exceeds
//    the limit. Micro-batch 0 is always admitted, and so is any micro-batch on a device
//    with nothing in flight — otherwise that device would wait forever; the simulator
//    then reports the order as not fitting.
//
// Invariants: each (mb, stage) enters each of its queues exactly once, FIFO, so every
// device sees micro-batches in id order; the cycles form a valid global execution, so
// replaying the per-device orders cannot deadlock.
// Complexity: O(cycles · stages + ops log(stages per device)); cycles <= 2 · m · stages
// and about m + 2 · stages without memory pressure.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "dynapipe/core/error.h"
#include "schedule/builders.h"

namespace dynapipe::detail {
namespace {

// A FIFO of micro-batch ids that each enter once: a fixed array with head/tail, and the
// tail as of the start of the current cycle (what may be taken this cycle).
struct CycleQueue {
  std::vector<int> items;
  int head = 0, tail = 0, visible = 0;
  void push(int mb) { items[tail++] = mb; }
  bool has_visible() const { return head < visible; }
  int front() const { return items[head]; }
};

}  // namespace

ScheduleOrder build_cyclic(const PipelineProblem& problem, bool barriers) {
  const int m = problem.num_microbatches();
  const int stages = problem.num_stages();
  const int num_devices = problem.layout.num_devices;
  const std::int64_t limit = problem.memory_limit_bytes;

  ScheduleOrder order;
  order.device_ops.resize(num_devices);
  order.op_cycle.resize(num_devices);
  std::vector<CycleQueue> fwd(stages), bwd(stages);
  for (int s = 0; s < stages; ++s) {
    fwd[s].items.resize(m);
    bwd[s].items.resize(m);
  }
  for (int mb = 0; mb < m; ++mb) fwd[0].push(mb);

  std::vector<std::int64_t> memory(problem.static_bytes.begin(), problem.static_bytes.end());
  std::vector<int> in_flight(num_devices, 0);     // (mb, stage) with F run and B not
  std::vector<int> newest_mb(num_devices, -1);    // highest mb whose F ran on the device
  std::vector<PipelineOp> backwards, forwards;    // this device's candidates this cycle

  std::int64_t remaining = 2LL * m * stages;
  for (int cycle = 0; remaining > 0; ++cycle) {
    for (int s = 0; s < stages; ++s) {
      fwd[s].visible = fwd[s].tail;
      bwd[s].visible = bwd[s].tail;
    }
    bool progress = false;
    for (int d = 0; d < num_devices; ++d) {
      backwards.clear();
      forwards.clear();
      for (int s = d; s < stages; s += num_devices) {
        if (bwd[s].has_visible()) backwards.push_back({bwd[s].front(), s, OpKind::B});
        if (fwd[s].has_visible()) forwards.push_back({fwd[s].front(), s, OpKind::F});
      }
      auto by_mb_stage = [](const PipelineOp& a, const PipelineOp& b) {
        return a.mb != b.mb ? a.mb < b.mb : a.stage < b.stage;
      };
      std::sort(backwards.begin(), backwards.end(), by_mb_stage);
      std::sort(forwards.begin(), forwards.end(), by_mb_stage);

      auto emit = [&](const PipelineOp& op) {
        order.device_ops[d].push_back(op);
        order.op_cycle[d].push_back(cycle);
        --remaining;
        progress = true;
      };
      const std::size_t rounds = std::max(backwards.size(), forwards.size());
      for (std::size_t r = 0; r < rounds; ++r) {
        if (r < backwards.size()) {
          const PipelineOp& op = backwards[r];
          ++bwd[op.stage].head;
          memory[d] -= problem.costs[op.mb][op.stage].held_bytes();
          --in_flight[d];
          if (op.stage > 0) bwd[op.stage - 1].push(op.mb);
          emit(op);
        }
        if (r < forwards.size()) {
          const PipelineOp& op = forwards[r];
          const StageCost& cost = problem.costs[op.mb][op.stage];
          const bool first_on_device = op.mb > newest_mb[d];
          if (limit > 0 && first_on_device && op.mb != 0 && in_flight[d] > 0 &&
              memory[d] + cost.held_bytes() + cost.peak_bytes > limit) {
            continue;  // not admitted this cycle; stays at the head of its queue
          }
          ++fwd[op.stage].head;
          newest_mb[d] = std::max(newest_mb[d], op.mb);
          memory[d] += cost.held_bytes();
          ++in_flight[d];
          if (op.stage + 1 < stages) {
            fwd[op.stage + 1].push(op.mb);
          } else {
            bwd[op.stage].push(op.mb);
          }
          emit(op);
        }
      }
    }
    DYNAPIPE_CHECK(progress, cat("cyclic schedule: no device made progress in cycle ", cycle,
                                 " with ", remaining, " ops left"));
  }
  if (!barriers) order.op_cycle.clear();
  return order;
}

}  // namespace dynapipe::detail
