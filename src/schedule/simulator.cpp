#include "dynapipe/schedule/simulator.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "dynapipe/core/error.h"
#include "dynapipe/schedule/weight_versions.h"
#include "schedule/builders.h"

namespace dynapipe {
namespace {

constexpr double kNotRun = -1.0;

bool is_backward(OpKind kind) { return kind == OpKind::B || kind == OpKind::I; }

int kind_index(OpKind kind) { return static_cast<int>(kind); }

}  // namespace

void Simulator::check_order(const PipelineProblem& problem, const ScheduleOrder& order) {
  const int num_devices = problem.num_sim_devices();
  const int stages = problem.num_stages();
  const int m = problem.num_microbatches();
  if (static_cast<int>(order.device_ops.size()) != num_devices) {
    throw Error(ErrorKind::InvalidArgument,
                cat("simulate: order must have one op list per device (", num_devices, "), got ",
                    order.device_ops.size()));
  }
  const bool barriers = !order.op_cycle.empty();
  if (barriers && order.op_cycle.size() != order.device_ops.size()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("simulate: op_cycle must be empty or have one list per device (", num_devices,
                    "), got ", order.op_cycle.size()));
  }
  seen_.assign(static_cast<std::size_t>(m) * stages * 4, 0);
  for (int d = 0; d < num_devices; ++d) {
    const auto& ops = order.device_ops[d];
    if (barriers && order.op_cycle[d].size() != ops.size()) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("simulate: op_cycle[", d, "] must have one entry per op (", ops.size(),
                      "), got ", order.op_cycle[d].size()));
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const PipelineOp& op = ops[i];
      if (op.mb < 0 || op.mb >= m || op.stage < 0 || op.stage >= stages ||
          kind_index(op.kind) > 3) {
        throw Error(ErrorKind::InvalidArgument,
                    cat("simulate: device ", d, " op ", i, " must have mb in [0, ", m,
                        "), stage in [0, ", stages, ") and kind F/B/I/W, got mb ", op.mb,
                        ", stage ", op.stage, ", kind ", kind_index(op.kind)));
      }
      if (problem.sim_device_of(op) != d) {
        throw Error(ErrorKind::InvalidArgument,
                    cat("simulate: ", op_name(op), " must be on device ", problem.sim_device_of(op),
                        ", got device ", d));
      }
      if (barriers && order.op_cycle[d][i] < 0) {
        throw Error(ErrorKind::InvalidArgument,
                    cat("simulate: op_cycle[", d, "][", i, "] must be >= 0, got ",
                        order.op_cycle[d][i]));
      }
      std::uint8_t& slot =
          seen_[(static_cast<std::size_t>(op.mb) * stages + op.stage) * 4 + kind_index(op.kind)];
      if (slot) {
        throw Error(ErrorKind::InvalidArgument,
                    cat("simulate: ", op_name(op), " must appear once, got it twice"));
      }
      slot = 1;
    }
  }
  for (int mb = 0; mb < m; ++mb) {
    for (int s = 0; s < stages; ++s) {
      const std::uint8_t* k = &seen_[(static_cast<std::size_t>(mb) * stages + s) * 4];
      const bool has_f = k[0], has_b = k[1], has_i = k[2], has_w = k[3];
      if (!has_f || has_b == (has_i || has_w) || has_i != has_w) {
        throw Error(ErrorKind::InvalidArgument,
                    cat("simulate: micro-batch ", mb, " on stage ", s,
                        " must have F and either B or both I and W, got",
                        has_f ? " F" : "", has_b ? " B" : "", has_i ? " I" : "",
                        has_w ? " W" : "", (has_f || has_b || has_i || has_w) ? "" : " nothing"));
      }
    }
  }
}

void Simulator::compute_memory(const PipelineProblem& problem, const ScheduleOrder& order,
                               SimResult* result) const {
  const int num_devices = problem.num_sim_devices();
  result->peak_memory_bytes.assign(num_devices, 0);
  result->peak_op.assign(num_devices, PipelineOp{});
  result->fits_memory = true;
  // Asynchronous schedules also hold stashed weight versions (one copy each).
  const bool stashes = order.weight_update != WeightUpdate::PerIteration;
  const WeightVersionPlan versions = stashes ? weight_versions(order) : WeightVersionPlan{};
  for (int d = 0; d < num_devices; ++d) {
    std::int64_t current = problem.static_bytes[device_of_sim_[d]];
    std::int64_t peak = current;
    PipelineOp peak_op{};
    // weight_bytes is per device, d a simulated one (stage replicas add some).
    const std::int64_t copy_bytes =
        stashes && !problem.weight_bytes.empty() ? problem.weight_bytes[device_of_sim_[d]] : 0;
    const auto& ops = order.device_ops[d];
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const PipelineOp& op = ops[k];
      const StageCost& c = problem.costs[op.mb][op.stage];
      const VersionedOp* v = stashes ? &versions.devices[d].ops[k] : nullptr;
      const std::int64_t stashed = v ? v->stashed_during * copy_bytes : 0;
      const std::int64_t during = step_memory(current, op, c) + stashed;
      if (during > peak) {
        peak = during;
        peak_op = op;
      }
      // Right after the stash (the op's free came first): one more copy is held.
      if (v && v->stash_before) {
        const auto kept = v->stashed_during - static_cast<std::int64_t>(v->free_after.size()) + 1;
        if (current + kept * copy_bytes > peak) {
          peak = current + kept * copy_bytes;
          peak_op = op;
        }
      }
    }
    result->peak_memory_bytes[d] = peak;
    result->peak_op[d] = peak_op;
    if (problem.memory_limit_bytes > 0 && peak > problem.memory_limit_bytes) {
      result->fits_memory = false;
    }
  }
}

void Simulator::throw_blocked(const PipelineProblem& problem, const ScheduleOrder& order) const {
  const int stages = problem.num_stages();
  std::vector<std::string> blocked;
  for (int d = 0; d < problem.num_sim_devices(); ++d) {
    const std::size_t i = next_[d];
    if (i >= order.device_ops[d].size()) continue;
    const PipelineOp& op = order.device_ops[d][i];
    const std::size_t k = static_cast<std::size_t>(op.mb) * stages + op.stage;
    std::string waits;
    if (op.kind == OpKind::F) {
      if (op.stage > 0 && fwd_end_[k - 1] < 0) waits = op_name({op.mb, op.stage - 1, OpKind::F});
    } else if (op.kind == OpKind::W) {
      if (bwd_end_[k] < 0) waits = op_name({op.mb, op.stage, OpKind::I});
    } else if (fwd_end_[k] < 0) {
      waits = op_name({op.mb, op.stage, OpKind::F});
    } else if (op.stage + 1 < stages && bwd_end_[k + 1] < 0) {
      waits = cat("the backward (B or I) of micro-batch ", op.mb, " on stage ", op.stage + 1);
    }
    if (waits.empty()) waits = cat("the end of cycle ", order.op_cycle[d][i] - 1);
    blocked.push_back(cat("device ", d, " at ", op_name(op), " waits for ", waits));
  }
  throw Error(ErrorKind::InvalidArgument,
              cat("simulate: the order must be able to complete, got a deadlock: ",
                  join(blocked, "; ")));
}

void Simulator::set_devices(const PipelineProblem& problem) {
  device_of_sim_.clear();
  for (int d = 0; d < problem.layout.num_devices; ++d) {
    device_of_sim_.insert(device_of_sim_.end(), problem.replicas_of(d), d);
  }
}

void Simulator::memory(const PipelineProblem& problem, const ScheduleOrder& order,
                       SimResult* result) {
  set_devices(problem);
  compute_memory(problem, order, result);
}

void Simulator::reset(const PipelineProblem& problem, const ScheduleOrder& order) {
  set_devices(problem);
  const int num_devices = problem.num_sim_devices();
  const std::size_t cells =
      static_cast<std::size_t>(problem.num_microbatches()) * problem.num_stages();
  fwd_end_.assign(cells, kNotRun);
  act_arrive_.assign(cells, kNotRun);
  bwd_end_.assign(cells, kNotRun);
  grad_arrive_.assign(cells, kNotRun);
  device_free_.assign(num_devices, 0.0);
  link_free_.assign(static_cast<std::size_t>(num_devices) * num_devices, 0.0);
  next_.assign(num_devices, 0);
  queued_.assign(num_devices, 1);
  worklist_.resize(num_devices);
  for (int d = 0; d < num_devices; ++d) worklist_[d] = num_devices - 1 - d;

  done_cycles_ = 0;
  if (order.op_cycle.empty()) return;
  int num_cycles = 0;
  for (const auto& cycles : order.op_cycle) {
    for (int c : cycles) num_cycles = std::max(num_cycles, c + 1);
  }
  cycle_left_.assign(num_cycles, 0);
  cycle_end_.assign(num_cycles, 0.0);
  barrier_ms_.assign(num_cycles + 1, 0.0);
  for (const auto& cycles : order.op_cycle) {
    for (int c : cycles) ++cycle_left_[c];
  }
  while (done_cycles_ < cycle_left_.size() && cycle_left_[done_cycles_] == 0) ++done_cycles_;
}

// The per-op passes below are `inline` (used only in this file): the quick schedule
// searches run them millions of times, and out-of-line calls cost ~5% of a T5 plan.
inline void Simulator::wake(int device) {
  if (!queued_[device]) {
    queued_[device] = 1;
    worklist_.push_back(device);
  }
}

inline double Simulator::ready_ms(const Run& run, int d, std::size_t i) const {
  const PipelineOp& op = run.order.device_ops[d][i];
  const int stages = run.stages;
  const std::size_t k = static_cast<std::size_t>(op.mb) * stages + op.stage;
  double ready = 0;
  if (op.kind == OpKind::F) {
    if (op.stage > 0) {
      if (fwd_end_[k - 1] < 0) return kNotRun;
      ready = act_arrive_[k - 1];
    }
  } else if (op.kind == OpKind::W) {
    if (bwd_end_[k] < 0) return kNotRun;
    ready = bwd_end_[k];
  } else {
    if (fwd_end_[k] < 0) return kNotRun;
    ready = fwd_end_[k];
    if (op.stage + 1 < stages) {
      if (bwd_end_[k + 1] < 0) return kNotRun;
      ready = std::max(ready, grad_arrive_[k + 1]);
    }
  }
  if (!run.order.op_cycle.empty()) {
    const int cycle = run.order.op_cycle[d][i];
    if (static_cast<std::size_t>(cycle) > done_cycles_) return kNotRun;
    ready = std::max(ready, barrier_ms_[cycle]);
  }
  return ready;
}

inline double Simulator::send(const Run& run, int from, int mb, int from_stage, int to_stage,
                       std::int64_t bytes, double send_ms, bool is_grad) {
  const int to = run.problem.sim_device_of({mb, to_stage, OpKind::F});
  if (to == from) return send_ms;
  const std::size_t num_devices = device_free_.size();
  double& link = link_free_[static_cast<std::size_t>(from) * num_devices + to];
  const double arrive = std::max(send_ms, link) + run.problem.p2p_ms(bytes);
  link = arrive;
  if (run.options.record) {
    run.result->transfers.push_back(
        Transfer{mb, from_stage, to_stage, from, to, is_grad, bytes, send_ms, arrive});
  }
  wake(to);
  return arrive;
}

inline void Simulator::finish(const Run& run, int d, const PipelineOp& op, double end) {
  const int stages = run.stages;
  const std::size_t k = static_cast<std::size_t>(op.mb) * stages + op.stage;
  if (op.kind == OpKind::F) {
    fwd_end_[k] = end;
    if (op.stage + 1 < stages) {
      const std::int64_t bytes = run.problem.costs[op.mb][op.stage].output_bytes;
      act_arrive_[k] = send(run, d, op.mb, op.stage, op.stage + 1, bytes, end, false);
    }
  } else if (is_backward(op.kind)) {
    bwd_end_[k] = end;
    if (op.stage > 0) {
      // The gradient w.r.t. stage s-1's output has that output's size.
      const std::int64_t bytes = run.problem.costs[op.mb][op.stage - 1].output_bytes;
      grad_arrive_[k] = send(run, d, op.mb, op.stage, op.stage - 1, bytes, end, true);
    }
  }
}

inline void Simulator::end_op_of_cycle(int cycle, double end) {
  cycle_end_[cycle] = std::max(cycle_end_[cycle], end);
  if (--cycle_left_[cycle] != 0 || static_cast<std::size_t>(cycle) != done_cycles_) return;
  while (done_cycles_ < cycle_left_.size() && cycle_left_[done_cycles_] == 0) {
    barrier_ms_[done_cycles_ + 1] = std::max(barrier_ms_[done_cycles_], cycle_end_[done_cycles_]);
    ++done_cycles_;
  }
  for (int other = 0; other < static_cast<int>(queued_.size()); ++other) wake(other);
}

// Runs each woken device's ops in order for as long as their inputs are there; returns
// how many ops ran (all of them unless the order deadlocks).
std::size_t Simulator::run_ops(const Run& run) {
  const bool barriers = !run.order.op_cycle.empty();
  std::size_t ops_run = 0;
  double makespan = 0;
  // A stopping run stops by makespan_reaches(): an op's end, or its end plus the work its
  // device has left (the builders' rule).
  const double stop_at = run.options.stop_at_ms;
  const bool stops = stop_at < std::numeric_limits<double>::infinity();
  if (stops) {
    work_left_.assign(run.order.device_ops.size(), 0.0);
    for (std::size_t d = 0; d < work_left_.size(); ++d) {
      for (const PipelineOp& op : run.order.device_ops[d]) work_left_[d] += run.problem.op_ms(op);
    }
  }
  while (!worklist_.empty()) {
    const int d = worklist_.back();
    worklist_.pop_back();
    queued_[d] = 0;
    const auto& ops = run.order.device_ops[d];
    for (std::size_t& i = next_[d]; i < ops.size(); ++i, ++ops_run) {
      const double ready = ready_ms(run, d, i);
      if (ready < 0) break;
      const PipelineOp& op = ops[i];
      const double start = std::max(device_free_[d], ready);
      const double op_ms = run.problem.op_ms(op);
      const double end = start + op_ms;
      device_free_[d] = end;
      run.result->busy_ms[d] += end - start;
      makespan = std::max(makespan, end);
      if (stops && detail::makespan_reaches(end, work_left_[d] -= op_ms, stop_at)) {
        run.result->stopped = true;
        return ops_run + 1;
      }
      if (run.options.record) run.result->timeline.push_back(TimedOp{op, d, start, end});
      finish(run, d, op, end);
      if (barriers) end_op_of_cycle(run.order.op_cycle[d][i], end);
    }
  }
  run.result->makespan_ms = makespan;
  return ops_run;
}

void Simulator::run(const PipelineProblem& problem, const ScheduleOrder& order,
                    const SimOptions& options, SimResult* result) {
  if (options.check) check(problem, order);
  reset(problem, order);

  std::size_t total_ops = 0;
  for (const auto& ops : order.device_ops) total_ops += ops.size();
  result->timeline.clear();
  result->transfers.clear();
  if (options.record) result->timeline.reserve(total_ops);
  result->busy_ms.assign(problem.num_sim_devices(), 0.0);

  const Run run{problem, order, options, result, problem.num_stages()};
  result->stopped = false;
  const std::size_t ops_run = run_ops(run);
  if (result->stopped) return;
  if (ops_run != total_ops) throw_blocked(problem, order);
  compute_memory(problem, order, result);
  if (options.record) sort_records(result);
}

void Simulator::sort_records(SimResult* result) {
  std::sort(result->timeline.begin(), result->timeline.end(),
            [](const TimedOp& a, const TimedOp& b) {
              if (a.start_ms != b.start_ms) return a.start_ms < b.start_ms;
              if (a.device != b.device) return a.device < b.device;
              return a.end_ms < b.end_ms;
            });
  std::stable_sort(result->transfers.begin(), result->transfers.end(),
                   [](const Transfer& a, const Transfer& b) {
                     if (a.send_ms != b.send_ms) return a.send_ms < b.send_ms;
                     if (a.from_device != b.from_device) return a.from_device < b.from_device;
                     return a.to_device < b.to_device;
                   });
}

SimResult simulate(const PipelineProblem& problem, const ScheduleOrder& order,
                   const SimOptions& options) {
  Simulator simulator;
  return simulator.run(problem, order, options);
}

namespace {

// The least a stage's backward can cost: B, or I + W when the cost model splits it
// (then only I is on a micro-batch's critical path).
bool has_split(const StageCost& c) { return c.bwd_input_ms + c.bwd_weight_ms > 0; }
double least_backward_ms(const StageCost& c) {
  return has_split(c) ? std::min(c.bwd_ms, c.bwd_input_ms + c.bwd_weight_ms) : c.bwd_ms;
}
double least_critical_backward_ms(const StageCost& c) {
  return has_split(c) ? std::min(c.bwd_ms, c.bwd_input_ms) : c.bwd_ms;
}

}  // namespace

std::vector<double> device_work_ms(const PipelineProblem& problem) {
  std::vector<double> work(problem.layout.num_devices, 0.0);
  for (const auto& per_stage : problem.costs) {
    for (int s = 0; s < problem.num_stages(); ++s) {
      work[problem.layout.device_of(s)] += per_stage[s].fwd_ms + least_backward_ms(per_stage[s]);
    }
  }
  return work;
}

double ideal_makespan_ms(const PipelineProblem& problem) {
  const std::vector<double> work = device_work_ms(problem);
  return work.empty() ? 0.0 : *std::max_element(work.begin(), work.end());
}

double makespan_lower_bound_ms(const PipelineProblem& problem, bool whole_backward) {
  const MakespanLowerBounds bounds = makespan_lower_bounds_ms(problem);
  return whole_backward ? bounds.whole_ms : bounds.split_ms;
}

MakespanLowerBounds makespan_lower_bounds_ms(const PipelineProblem& problem) {
  const int stages = problem.num_stages();
  const PipelineLayout& layout = problem.layout;
  // device_work_ms()'s sums, taken in this pass: calling it (a second pass over the costs)
  // costs 0.2–0.6% of a plan's instructions.
  std::vector<double> work(static_cast<std::size_t>(layout.num_devices), 0.0);
  // With one stage per device, per stage: the least time a forward takes to reach it and a
  // backward from it to leave stage 0 (the fill and the drain around its device's work).
  const bool fill_and_drain = layout.chunks == 1 && problem.stage_replicas.empty();
  constexpr double kNone = std::numeric_limits<double>::infinity();
  std::vector<double> fill(fill_and_drain ? static_cast<std::size_t>(stages) : 0, kNone), drain = fill;
  double bound = 0;
  for (const auto& per_stage : problem.costs) {
    double chain = 0, forward = 0, backward = 0;  // forward, backward: over the stages below s
    for (int s = 0; s < stages; ++s) {
      const StageCost& c = per_stage[s];
      work[static_cast<std::size_t>(layout.device_of(s))] += c.fwd_ms + least_backward_ms(c);
      chain += c.fwd_ms + least_critical_backward_ms(c);
      const bool hop = s + 1 < stages && layout.device_of(s) != layout.device_of(s + 1);
      const double hop_ms = hop ? problem.p2p_ms(c.output_bytes) : 0.0;
      if (hop) chain += 2 * hop_ms;  // activation + gradient
      if (fill_and_drain) {
        fill[s] = std::min(fill[s], forward);
        drain[s] = std::min(drain[s], backward);
        forward += c.fwd_ms + hop_ms;
        backward += c.bwd_ms + hop_ms;
      }
    }
    bound = std::max(bound, chain);
  }
  for (double w : work) bound = std::max(bound, w);  // ideal_makespan_ms()
  MakespanLowerBounds bounds{.split_ms = bound, .whole_ms = bound};
  for (std::size_t s = 0; s < fill.size() && !problem.costs.empty(); ++s) {
    bounds.split_ms = std::max(bounds.split_ms, fill[s] + work[s]);
    bounds.whole_ms = std::max(bounds.whole_ms, fill[s] + work[s] + drain[s]);
  }
  return bounds;
}

std::vector<double> bubble_fractions(const SimResult& result) {
  std::vector<double> bubbles(result.busy_ms.size(), 0.0);
  if (result.makespan_ms <= 0) return bubbles;
  for (std::size_t d = 0; d < bubbles.size(); ++d) {
    bubbles[d] = 1.0 - result.busy_ms[d] / result.makespan_ms;
  }
  return bubbles;
}

}  // namespace dynapipe
