// The event simulator: what a ScheduleOrder costs on a PipelineProblem, in time and
// memory; and the lower bounds a schedule is measured against.
//
// Semantics (docs/schedules.md, "Simulator"):
//  * Each device runs its ops strictly in the given order, one at a time, each as soon
//    as the device is free and its inputs are there.
//  * F(mb,s) needs F(mb,s-1); B(mb,s) and I(mb,s) need F(mb,s) and the backward
//    (B or I) of (mb,s+1); the last stage's B/I needs only its own F; W(mb,s) needs
//    I(mb,s). Between stages on different devices the message takes
//    PipelineProblem::p2p_ms(output_bytes of stage s) for both the activation s -> s+1
//    and the gradient s+1 -> s; on the same device it is free.
//  * Each directed device link carries one message at a time, first in first out by
//    send time (= the producing op's end); links in different directions or between
//    different pairs are independent, and sending never occupies the compute stream.
//  * Synchronous schedules (ScheduleOrder::op_cycle non-empty) add cycle barriers.
//  * Memory of a device = static_bytes + stored_bytes of every (mb, stage) of the device
//    whose F has run and whose backward has not freed it yet, plus, during an op, that
//    op's peak_bytes (during F its own stored_bytes count already: they fill up while
//    F's working memory is live). B frees stored_bytes. With the split backward, I frees
//    nothing and W frees stored_bytes (conservative: W still needs the layer inputs, and we keep
//    the whole activation until then). Received-but-unconsumed messages are not
//    counted. The peak depends only on each device's order, not on timing.
//  * Replicated stages (PipelineProblem::stage_replicas): each stage-replica is a device
//    of its own (own op list, compute stream, links and memory, static bytes of its
//    stage); "device" in the results means these simulated devices.
//  * Asynchronous orders (ScheduleOrder::weight_update) also hold their stashed weight
//    versions (weight_versions.h), each PipelineProblem::weight_bytes of the device: during
//    an op, the versions stashed before it; right after a stash, one more.
//
// Thread-safety: simulate() is reentrant; one Simulator object per thread.
//
//   SimResult r = simulate(problem, order);   // throws InvalidArgument on a bad order
//   double bubble = bubble_fractions(r)[0];
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "dynapipe/schedule/pipeline.h"

namespace dynapipe {

struct SimOptions {
  // Fill SimResult::timeline and ::transfers (sorted). Off = makespan, busy and memory
  // only, which is what a search needs for each candidate. Default: on.
  bool record = true;
  // Stop as soon as the makespan is known to be at or after this time
  // (SimResult::stopped): a search whose best makespan so far is this needs no more of a
  // run that cannot beat it (ties keep the earlier candidate). Ops are resolved in
  // dependency order, not time order, but any op's end bounds the makespan from below,
  // and so does an op's end plus the rest of its device's work (its ops run one after
  // another), which shows it sooner: stopping is exact (a relative 1e-9 of slack keeps
  // the sums' rounding from stopping a run that ends below the bound).
  double stop_at_ms = std::numeric_limits<double>::infinity();
  // Validate the problem and check the order first (Simulator::check). Off: the caller
  // vouches for both, as search_schedule does for the orders its schedules build of a
  // problem it validated (it checks the winner's); a bad order then gives unspecified
  // results. Default: on.
  bool check = true;
};

// Simulator with scratch buffers reused across runs, so that repeated runs (a search)
// allocate nothing per op.
//
// Invariants: a device's op i starts at max(end of its op i-1, arrival of each input,
// barrier of its cycle); link messages leave in the sender's program order, which is
// also their send-time order. Ops are resolved in any dependency order (a worklist of
// devices), which gives the same times as a time-ordered event queue because nothing
// else is shared.
// Complexity: O(ops + devices^2) per run, plus O(ops log ops) to sort a recorded
// timeline.
class Simulator {
 public:
  // Throws InvalidArgument when the problem is inconsistent, an op is out of range, on
  // the wrong device, duplicated or missing (every (mb, stage) needs F and either B or
  // I and W), or the order cannot complete (names each blocked op and what it waits for).
  void run(const PipelineProblem& problem, const ScheduleOrder& order, const SimOptions& options,
           SimResult* result);
  SimResult run(const PipelineProblem& problem, const ScheduleOrder& order,
                const SimOptions& options = {}) {
    SimResult result;
    run(problem, order, options, &result);
    return result;
  }
  // The memory run() reports (peak_memory_bytes, peak_op, fits_memory) without the
  // timing, which it does not depend on; the other fields are left as they are. Unchecked
  // (SimOptions::check off): for an order known to be complete.
  void memory(const PipelineProblem& problem, const ScheduleOrder& order, SimResult* result);
  // What run() checks before it simulates, but for the deadlock: throws InvalidArgument
  // as run() does.
  void check(const PipelineProblem& problem, const ScheduleOrder& order) {
    problem.validate();
    check_order(problem, order);
  }

 private:
  void check_order(const PipelineProblem& problem, const ScheduleOrder& order);
  void compute_memory(const PipelineProblem& problem, const ScheduleOrder& order,
                      SimResult* result) const;
  [[noreturn]] void throw_blocked(const PipelineProblem& problem, const ScheduleOrder& order) const;

  // The passes of run(): reset the state, run the ops event by event, sort the records.
  struct Run {
    const PipelineProblem& problem;
    const ScheduleOrder& order;
    const SimOptions& options;
    SimResult* result;
    int stages;  // problem.num_stages(), read per op
  };
  void reset(const PipelineProblem& problem, const ScheduleOrder& order);
  void set_devices(const PipelineProblem& problem);  // device_of_sim_
  std::size_t run_ops(const Run& run);
  // When op i of device d may start (its inputs and its cycle's barrier), or < 0 if not yet.
  double ready_ms(const Run& run, int d, std::size_t i) const;
  // Records the op's end and sends its activation or gradient on.
  void finish(const Run& run, int d, const PipelineOp& op, double end);
  // A message from (mb, from_stage) on device `from`, sent at send_ms; returns its arrival.
  double send(const Run& run, int from, int mb, int from_stage, int to_stage, std::int64_t bytes,
              double send_ms, bool is_grad);
  void end_op_of_cycle(int cycle, double end);
  void wake(int device);
  static void sort_records(SimResult* result);

  std::vector<std::uint8_t> seen_;     // [(mb * S + s) * 4 + kind]
  std::vector<double> fwd_end_;        // [mb * S + s], < 0 = not run yet
  std::vector<double> act_arrive_;     // [mb * S + s] activation of F(mb,s) at stage s+1
  std::vector<double> bwd_end_;        // [mb * S + s] end of B or I
  std::vector<double> grad_arrive_;    // [mb * S + s] gradient of B/I(mb,s) at stage s-1
  std::vector<double> device_free_;    // [device]
  std::vector<double> work_left_;      // [device]: its ops not yet run (a stopping run)
  std::vector<double> link_free_;      // [from * D + to]
  std::vector<std::size_t> next_;      // [device] index of the next op to run
  std::vector<int> worklist_;
  std::vector<std::uint8_t> queued_;   // [device]
  std::vector<int> cycle_left_;        // [cycle] ops not yet run
  std::vector<double> cycle_end_;      // [cycle] latest end of its ops
  std::vector<double> barrier_ms_;     // [cycle] latest end over all earlier cycles
  std::vector<int> device_of_sim_;     // [simulated device] its pipeline device
  std::size_t done_cycles_ = 0;        // cycles [0, done_cycles_) have all ended
};

// One-shot convenience over Simulator::run.
SimResult simulate(const PipelineProblem& problem, const ScheduleOrder& order,
                   const SimOptions& options = {});

// Useful compute per device: Σ over its virtual stages and micro-batches of F + B, with
// B replaced by I + W where the cost model splits the backward and that is cheaper
// (so that the bound holds for split-backward schedules too).
std::vector<double> device_work_ms(const PipelineProblem& problem);

// The ideal makespan: max over devices of device_work_ms (Σ useful work / stages when
// stages are balanced). No schedule beats it.
double ideal_makespan_ms(const PipelineProblem& problem);

// A tighter bound: the largest of ideal_makespan_ms, the longest single micro-batch's
// chain of F and backward over all stages plus its p2p hops (the backward counts only I
// where the cost model splits it, since W is off the chain) and, with one stage per
// device (layout.chunks == 1, no stage replicas), each device's fill, work and drain: its
// work starts no earlier than the fastest micro-batch's forwards and hops can reach it,
// and where every backward runs whole (`whole_backward`, Schedule::whole_backward()) its
// last op is a backward whose micro-batch still runs its backwards and hops below it
// (the fastest such chain). Still a true lower bound, for the order and schedule searched.
double makespan_lower_bound_ms(const PipelineProblem& problem, bool whole_backward = false);

// makespan_lower_bound_ms() both ways in one pass over the costs (a search asks it of
// every candidate, and the candidates of one problem differ only in whole_backward).
struct MakespanLowerBounds {
  double split_ms = 0;  // whole_backward false
  double whole_ms = 0;  // whole_backward true
};
MakespanLowerBounds makespan_lower_bounds_ms(const PipelineProblem& problem);

// [device] 1 - busy / makespan (0 when the makespan is 0).
std::vector<double> bubble_fractions(const SimResult& result);

}  // namespace dynapipe
