// What the planner's steps ask of a candidate plan, and the baselines' cuts and sizes.
#include "planner_impl.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "dynapipe/batching/varlen_regroup.h"

namespace dynapipe::planner_detail {

namespace {

// Whether `choice` runs exactly `microbatches_of(r)` on its replica r, for r < `replicas`.
bool runs_cut(const Choice& choice, std::size_t replicas, auto&& microbatches_of) {
  if (choice.replicas.size() != replicas) return false;
  for (std::size_t r = 0; r < replicas; ++r) {
    if (choice.replicas[r].microbatches != microbatches_of(r)) return false;
  }
  return true;
}

}  // namespace

Choice nothing_found(ScheduleKind schedule) {
  Choice none;
  none.schedule = schedule;
  none.est_ms = std::numeric_limits<double>::infinity();
  return none;
}

std::vector<std::vector<MicroBatch>> replica_microbatches(const Choice& choice) {
  std::vector<std::vector<MicroBatch>> replicas;
  replicas.reserve(choice.replicas.size());
  for (const ReplicaChoice& replica : choice.replicas) replicas.push_back(replica.microbatches);
  return replicas;
}

bool same_cut(const Choice& a, const Choice& b) {
  return runs_cut(a, b.replicas.size(),
                  [&](std::size_t r) -> const std::vector<MicroBatch>& { return b.replicas[r].microbatches; });
}

bool searched_on_top(const Choice& c) {
  return c.batching.varlen_padded_cut || c.batching.lone_samples_alone || c.other_mode_cut ||
         c.named_schedule_form;
}

bool ranks_cut(const std::vector<Choice>& ranked, const std::vector<std::vector<MicroBatch>>& replicas) {
  return std::ranges::any_of(ranked, [&](const Choice& c) {
    return runs_cut(c, replicas.size(), [&](std::size_t r) -> const std::vector<MicroBatch>& { return replicas[r]; });
  });
}

// The ranked choice whose quick search ran on these micro-batches with this schedule and
// recompute mode (every entry of rank_dp_plans()'s list is such a search but the padded
// cut's, which tries two orders), or nullptr. Searches are deterministic, so a repeat
// gives that choice's result: T5-11B pp 8 plans of short samples cut the same
// micro-batches under ~3 of ~14 targets (the row-capacity cut often is the packed-rows
// cut).
const Choice* same_quick_search(const std::vector<Choice>& ranked,
                                const std::vector<std::vector<MicroBatch>>& replicas,
                                ScheduleKind schedule, Recompute recompute) {
  for (const Choice& c : ranked) {
    if (c.schedule == schedule && c.dp_recompute == recompute && !c.batching.varlen_padded_cut &&
        runs_cut(c, replicas.size(),
                 [&](std::size_t r) -> const std::vector<MicroBatch>& { return replicas[r]; })) {
      return &c;
    }
  }
  return nullptr;
}

// makespan ÷ the busiest device's busy time − 1, the most over replicas: what any schedule
// of these micro-batches could still gain (fill, drain and stalls on the bottleneck device).
double bottleneck_overhead(const Choice& choice) {
  double overhead = 0;
  for (const ReplicaChoice& replica : choice.replicas) {
    const SimResult& sim = replica.best.sim;
    const double busiest = sim.busy_ms.empty() ? 0 : *std::ranges::max_element(sim.busy_ms);
    if (busiest > 0) overhead = std::max(overhead, sim.makespan_ms / busiest - 1);
  }
  return overhead;
}

double stage_imbalance(const Choice& choice) {
  double imbalance = 0;
  for (const ReplicaChoice& replica : choice.replicas) {
    const std::vector<double>& busy = replica.best.sim.busy_ms;
    if (busy.empty()) continue;
    const double mean = std::accumulate(busy.begin(), busy.end(), 0.0) / static_cast<double>(busy.size());
    if (mean > 0) imbalance = std::max(imbalance, *std::ranges::max_element(busy) / mean - 1);
  }
  return imbalance;
}

// 1 − Σ busy / (devices · makespan) of the slowest replica: the share of device time a
// plan loses to fill, drain and stalls.
double idle_share(const Choice& choice) {
  double share = 0;
  for (const ReplicaChoice& replica : choice.replicas) {
    const SimResult& sim = replica.best.sim;
    if (sim.makespan_ms <= 0 || sim.busy_ms.empty()) continue;
    double busy = 0;
    for (double b : sim.busy_ms) busy += b;
    share = std::max(share, 1 - busy / (sim.busy_ms.size() * sim.makespan_ms));
  }
  return share;
}

bool runs_in_own_mode(const Choice& choice) {
  return std::ranges::all_of(choice.replicas,
                             [&](const ReplicaChoice& r) { return r.best.recompute == choice.dp_recompute; });
}

bool runs_critical_path(const Choice& choice) {
  return std::ranges::all_of(choice.replicas,
                             [](const ReplicaChoice& r) { return r.best.schedule == ScheduleKind::CriticalPath; });
}

bool schedules_can_gain(const Choice& choice) {
  return idle_share(choice) > kRuleStartsIdleShare && bottleneck_overhead(choice) > kRuleStartsOverhead;
}

// The ranking's order: by the estimate (the slowest replica), then by the other replicas'
// makespans, slowest first. With dp > 1 many cuts tie on a replica that holds one long
// sample alone (T5-11B pp 8 dp 4 at 8192: 9 of 13 cuts at 2127.2 ms), and the full search
// can lighten that replica (another recompute mode, 1563.8 ms): the next replica then
// decides, which the order of the ranking's DPs had left to chance.
bool ranks_before(const Choice& a, const Choice& b) {
  if (a.est_ms != b.est_ms) return a.est_ms < b.est_ms;
  auto slowest_first = [](const Choice& c) {
    std::vector<double> ms;
    for (const ReplicaChoice& r : c.replicas) ms.push_back(r.best.sim.makespan_ms);
    std::ranges::sort(ms, std::greater<>());
    return ms;
  };
  return slowest_first(a) < slowest_first(b);
}

bool is_dp_strategy(Strategy strategy) {
  return strategy == Strategy::DynaPipe || strategy == Strategy::DynaPipePadded;
}

bool sizes_rows(Strategy strategy) {
  return strategy == Strategy::Padding || strategy == Strategy::Packing ||
         strategy == Strategy::PackingVarlen || strategy == Strategy::PackingMegatron;
}

// `ours` as `baseline` plans itself: its 1F1B memory rule, bubble weight 1 (docs/batching.md,
// "Baseline cuts").
BatchingOptions as_baseline(BatchingOptions ours, Strategy baseline) {
  ours.strategy = baseline;
  ours.in_flight.clear();
  ours.bubble_weight = 1.0;
  return ours;
}

std::vector<std::vector<MicroBatch>> varlen_replicas(const GlobalBatch& batch, const BatchingResult& cut,
                                                     const BatchingOptions& options,
                                                     const CostModel& cost_model) {
  std::vector<std::vector<MicroBatch>> replicas;
  for (const std::vector<MicroBatch>& replica : cut.replicas) {
    replicas.push_back(as_varlen_microbatches(batch, replica, options, cost_model));
  }
  return replicas;
}

// The size next to `size` of a baseline's micro-batches, up (direction 1) or down (−1):
// rows one at a time (padding, the packings), token budgets doubled or halved
// (token-based); nullopt past the range.
std::optional<std::int64_t> next_size(Strategy strategy, std::int64_t size, int direction) {
  if (strategy == Strategy::TokenBased) {
    const std::int64_t next = direction > 0 ? 2 * size : size / 2;
    if (next < kSmallestTokenBudget || next > kLargestTokenBudget) return std::nullopt;
    return next;
  }
  if (size + direction < 1) return std::nullopt;
  return size + direction;
}

BatchingOptions with_size(BatchingOptions options, std::int64_t size) {
  if (options.strategy == Strategy::TokenBased) {
    options.token_budget = size;
  } else {
    options.fixed_batch = size;
    options.size_by_objective = true;
  }
  return options;
}

}  // namespace dynapipe::planner_detail
