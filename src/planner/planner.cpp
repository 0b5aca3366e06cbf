#include "dynapipe/planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <type_traits>

#include "dynapipe/batching/batching.h"
#include "dynapipe/batching/head_tail.h"
#include "dynapipe/batching/replica_balancer.h"
#include "dynapipe/batching/varlen_regroup.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/rank_layout.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/plan/lowering.h"
#include "dynapipe/plan/replicate_stages.h"
#include "dynapipe/plan/verifier.h"
#include "dynapipe/schedule/schedule.h"
#include "dynapipe/schedule/schedule_search.h"
#include "dynapipe/schedule/simulator.h"

namespace dynapipe {

namespace {

constexpr int kInterleavedChunks = 2;
// rank_dp_plans(): the interleaved rule is cut in the later varlen orders only where its
// sorted-order cut's quick estimate came within this factor of that order's best.
constexpr double kInterleavedWindow = 1.02;

void validate_config(const PlanConfig& config) {
  config.model.validate();
  if (config.tp < 1) throw Error(ErrorKind::InvalidArgument, cat("--tp must be >= 1, got ", config.tp));
  check_tensor_parallel(config.model, config.tp);
  if (config.micro_batch_size < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--micro-batch-size must be >= 0, got ", config.micro_batch_size));
  }
  if (config.token_budget < 0) {
    throw Error(ErrorKind::InvalidArgument, cat("--token-budget must be >= 0, got ", config.token_budget));
  }
  if (config.pp < 1) throw Error(ErrorKind::InvalidArgument, cat("--pp must be >= 1, got ", config.pp));
  if (config.dp < 1) throw Error(ErrorKind::InvalidArgument, cat("--dp must be >= 1, got ", config.dp));
  if (config.zero != 0 && config.zero != 1) {
    throw Error(ErrorKind::InvalidArgument, cat("--zero must be 0 or 1, got ", config.zero));
  }
  if (config.pp > config.model.total_layers()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--pp must be at most the model's ", config.model.total_layers(),
                    " layers (", config.model.name, "), got ", config.pp));
  }
  if (config.max_seqlen < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("--max-seqlen must be >= 1, got ", config.max_seqlen));
  }
  if (config.global_batch_tokens < 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--global-batch-tokens must be >= 1, got ", config.global_batch_tokens));
  }
  if (config.memory_limit_gib < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--memory-limit must be >= 0 GiB, got ", config.memory_limit_gib));
  }
  // Asynchronous schedules step per micro-batch on each stage: no replicas to reduce with.
  if (is_async_schedule(config.schedule) && config.dp != 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--schedule ", schedule_kind_name(config.schedule), " needs --dp 1, got ",
                    config.dp));
  }
  if (config.vertical_sync && config.schedule != ScheduleKind::PipeDream) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--vertical-sync needs --schedule pipedream, got ",
                    schedule_kind_name(config.schedule)));
  }
  if (!config.stage_replicas.empty()) {
    const auto& r = config.stage_replicas;
    if (static_cast<int>(r.size()) != config.pp || *std::min_element(r.begin(), r.end()) < 1) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--replicas must have one count >= 1 per stage (--pp ", config.pp, "), got ",
                      join(r, ",")));
    }
    if (config.schedule == ScheduleKind::Interleaved) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--schedule interleaved cannot run replicated stages (--replicas ",
                      join(r, ","), "); choose another --schedule"));
    }
    // Replicated stages reduce their gradients once per iteration.
    if (is_async_schedule(config.schedule)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--schedule ", schedule_kind_name(config.schedule),
                      " cannot run replicated stages (--replicas ", join(r, ","),
                      "); choose a schedule that flushes"));
    }
  }
}

// Replays the replica's programs (deadlock freedom, matching, buffers) and their memory
// in instruction order: static bytes, each micro-batch's stored activations from F to its
// B/W and every live message buffer together must stay within the memory limit. This is
// the plan's memory claim checked independently of the simulator's timeline, which
// chose the schedule.
void verify_replica(const ReplicaPlan& replica, const PipelineProblem& problem,
                    const CostModel& stage_model, std::int64_t memory_limit_bytes,
                    const std::vector<int>& stage_replicas) {
  VerifyOptions verify;
  verify.layout = problem.layout;
  verify.stage_replicas = stage_replicas;
  verify.num_microbatches = static_cast<int>(replica.microbatches.size());
  verify.static_bytes = problem.static_bytes;
  verify.weight_bytes = problem.weight_bytes;
  verify.memory_limit_bytes = memory_limit_bytes;
  verify.bytes_per_element = stage_model.device().bytes_per_element;
  for (const auto& per_stage : problem.costs) {
    std::vector<std::int64_t> stored;
    for (const StageCost& c : per_stage) stored.push_back(c.stored_bytes);
    verify.stored_bytes.push_back(std::move(stored));
  }
  verify_programs(replica.executors, verify);
}

// Replicated stages: the chosen order simulated with each stage-replica as a device of
// its own, running its stage's ops of its micro-batches (m mod r) in the stage's order, as
// replicate_stages() splits the programs. Orders of the pp-device search stay valid: a
// run of the stage order restricted to a stage-replica's ops is a run of the split one.
SimResult simulate_stage_replicas(const PipelineProblem& problem, const ScheduleOrder& order,
                                  const std::vector<int>& stage_replicas) {
  PipelineProblem replicated = problem;
  replicated.stage_replicas = stage_replicas;
  ScheduleOrder split;
  for (int d = 0; d < problem.layout.num_devices; ++d) {
    const int r = stage_replicas[static_cast<std::size_t>(d)];
    for (int a = 0; a < r; ++a) {
      auto& ops = split.device_ops.emplace_back();
      std::vector<int>* cycles = order.op_cycle.empty() ? nullptr : &split.op_cycle.emplace_back();
      for (std::size_t i = 0; i < order.device_ops[d].size(); ++i) {
        const PipelineOp& op = order.device_ops[d][i];
        if (op.mb % r != a) continue;
        ops.push_back(op);
        if (cycles != nullptr) cycles->push_back(order.op_cycle[d][i]);
      }
    }
  }
  return simulate(replicated, split, SimOptions{.record = false});
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = q * (values.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - lo) * (values[hi] - values[lo]);
}

template <typename T>
struct AsOptional {
  using type = std::optional<T>;
};
template <typename T>
struct AsOptional<std::optional<T>> {
  using type = std::optional<T>;
};

// make()'s result (an optional one as it is), or nullopt where it throws an error that
// rules_out_option().
template <typename Make>
auto unless_ruled_out(Make&& make) -> typename AsOptional<std::decay_t<std::invoke_result_t<Make&>>>::type {
  using Result = typename AsOptional<std::decay_t<std::invoke_result_t<Make&>>>::type;
  try {
    return Result(make());
  } catch (const Error& e) {
    if (!rules_out_option(e)) throw;
    return std::nullopt;
  }
}

}  // namespace

namespace {

// How search_replicas() searches; the defaults are the full search (every recompute mode,
// permuted orders, the winner recorded).
struct ReplicaSearch {
  // Only `recompute`'s candidates; if that mode fits no schedule, every mode (other_modes)
  // or the error (!other_modes).
  bool quick = false;
  Recompute recompute = Recompute::None;
  bool other_modes = true;
  bool permute = false;  // a quick search also tries the permuted micro-batch orders
  bool record = true;    // the winner's timeline (SearchOptions::record_winner), which a plan needs
  int random_orders = 0;    // seeded random orders too (where orders are permuted)
  int max_orders = 0;       // at most that many orders (0: SearchOptions' default)
  int searched_orders = 0;  // SearchOptions::searched_orders
  // Only a plan faster than this counts; where some replica cannot beat it the result has
  // est_ms +inf and no replicas (SearchOptions::beat_ms).
  double beat_ms = std::numeric_limits<double>::infinity();
};

struct ReplicaChoice {
  std::vector<MicroBatch> microbatches;
  std::vector<SearchCandidate> candidates;
  SearchResult best;
};

struct Choice {
  std::vector<ReplicaChoice> replicas;
  double est_ms = 0;  // the slowest replica's simulated makespan
  ScheduleKind schedule = ScheduleKind::Auto;  // the --schedule value searched
  Recompute dp_recompute = Recompute::None;  // the batching result's recompute mode
  std::int64_t cut_size = 0;  // the batching result's size (BatchingResult::size)
  BatchingOptions batching;        // the options the micro-batches were cut with
  // packing-varlen's or token-based's cut: searched in full after those when its quick
  // estimate comes near the best full one (choose()).
  bool baseline_cut = false;
};

// Each replica's micro-batches of a choice, as search_replicas() takes them.
std::vector<std::vector<MicroBatch>> replica_microbatches(const Choice& choice) {
  std::vector<std::vector<MicroBatch>> replicas;
  replicas.reserve(choice.replicas.size());
  for (const ReplicaChoice& replica : choice.replicas) replicas.push_back(replica.microbatches);
  return replicas;
}

// Whether `choice` runs exactly `microbatches_of(r)` on its replica r, for r < `replicas`.
bool runs_cut(const Choice& choice, std::size_t replicas, auto&& microbatches_of) {
  if (choice.replicas.size() != replicas) return false;
  for (std::size_t r = 0; r < replicas; ++r) {
    if (choice.replicas[r].microbatches != microbatches_of(r)) return false;
  }
  return true;
}

// Whether two plans run the same micro-batches, replica by replica.
bool same_cut(const Choice& a, const Choice& b) {
  return runs_cut(a, b.replicas.size(),
                  [&](std::size_t r) -> const std::vector<MicroBatch>& { return b.replicas[r].microbatches; });
}

// The ranked choice whose quick search ran on these micro-batches with this schedule and
// recompute mode (every entry of rank_dp_plans()'s list is such a search), or nullptr.
// Searches are deterministic, so a repeat gives that choice's result: T5-11B pp 8 plans
// of short samples cut the same micro-batches under ~3 of ~14 targets (the row-capacity
// cut often is the packed-rows cut).
const Choice* same_quick_search(const std::vector<Choice>& ranked,
                                const std::vector<std::vector<MicroBatch>>& replicas,
                                ScheduleKind schedule, Recompute recompute) {
  for (const Choice& c : ranked) {
    if (c.schedule == schedule && c.dp_recompute == recompute &&
        runs_cut(c, replicas.size(),
                 [&](std::size_t r) -> const std::vector<MicroBatch>& { return replicas[r]; })) {
      return &c;
    }
  }
  return nullptr;
}

}  // namespace

namespace {

// A schedule the DP strategies plan their micro-batches for: its memory rule and bubble
// weight (docs/batching.md, "Schedule-aware DP"), and the schedule name the search then
// tries on them ("auto": every schedule).
struct DpTarget {
  ScheduleKind schedule = ScheduleKind::Auto;
  std::vector<int> in_flight;  // empty: 1F1B's p − s
  double bubble_weight = 1.0;
};

// choose(): the best plan's cut is searched again with random micro-batch orders
// (PlannerOptions::random_orders) where its devices idle more than this share of the
// makespan. At the issue-8 points the shares are 0.09 (GPT-6.7B pp 4) to 0.47 (GPT-6.7B
// pp 8 at 8192); a gate at 0.15 changed no plan there, one at 0.1 one point by 0.06%.
constexpr double kRandomOrdersIdleShare = 0.2;

// Under auto, another schedule's rule gets the steps that start from the best plan (the
// bubble-weight line search, the padded cut) too where its best cut's quick estimate comes
// within kRuleWindow of the best (the 1F1B rule, whose cuts critical-path runs: its quick
// estimates fall furthest short of its full ones) or kOtherRuleWindow (the zb1p and
// interleaved rules), where the best plan idles more than kRuleStartsIdleShare of its
// device time and its makespan exceeds its busiest device's work by more than
// kRuleStartsOverhead (what any schedule could still win). T5-11B pp 8 short256 idles 0.23
// but mostly from its unequal encoder and decoder stages (overhead 0.03–0.04): there these
// steps cost +68% planning instructions for plans 0.04% faster; the gains on random
// configurations came at 0.053–0.1 and more. GPT-6.7B pp 4 65k plans idle 0.09. The idle
// gate was 0.15 until a dp 4 plan idling 0.14 lost 1.3% to critical-path (GPT-6.7B pp 4,
// H100 preset, 80 GiB, 2048, 262,144 tokens); at 0.12 no benchmark plan costs more. Each
// schedule row's best cut gets a full search within kRuleWindow under the same thresholds
// (choose(): the idle share of the plan so far, the overhead of the best ranked cut).
constexpr double kRuleWindow = 1.05, kOtherRuleWindow = 1.02;
constexpr double kRuleStartsIdleShare = 0.12, kRuleStartsOverhead = 0.05;

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

// Whether another schedule of `choice`'s kind of cut could still gain enough to search the
// other rules' cuts as a named schedule would (kRuleStartsIdleShare, kRuleStartsOverhead).
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

// The strategies of a fixed rows-per-micro-batch (BatchingOptions::size_by_objective).
bool sizes_rows(Strategy strategy) {
  return strategy == Strategy::Padding || strategy == Strategy::Packing ||
         strategy == Strategy::PackingVarlen || strategy == Strategy::PackingMegatron;
}

// ZB-H1 fills 1F1B's bubble with deferred W passes: its fill/drain costs about
// (p − 1)·(F + I − W) instead of (p − 1)·(F + I + W) (Qi et al., "Zero Bubble Pipeline
// Parallelism", 2023). The ratio on the bottleneck stage of a max-length sample.
double zero_bubble_weight(const CostModel& cost, const BatchingOptions& batching) {
  const MicroBatchShape shape{.batch = 1,
                              .seqlen = batching.max_seqlen,
                              .dec_seqlen = batching.kind == ModelKind::T5 ? batching.max_target_len + 1 : 0};
  double worst = -1, weight = 1;
  for (int s = 0; s < cost.num_stages(); ++s) {
    const StageCost c = cost.stage_cost(s, shape, {}, Recompute::None);
    const double total = c.fwd_ms + c.bwd_ms;
    if (total > worst && total > 0) {
      worst = total;
      weight = (c.fwd_ms + c.bwd_input_ms - c.bwd_weight_ms) / total;
    }
  }
  return std::clamp(weight, 0.05, 1.0);
}

// Interleaved 1F1B with C chunks: device d warms up with 2(D − d − 1) + (C − 1)·D chunk
// forwards and holds one more in the steady state, each 1/C of its layers' activations.
std::vector<int> interleaved_in_flight(int pp, int chunks) {
  std::vector<int> k;
  for (int d = 0; d < pp; ++d) {
    const int chunk_forwards = 2 * (pp - d - 1) + (chunks - 1) * pp + 1;
    k.push_back((chunk_forwards + chunks - 1) / chunks);
  }
  return k;
}

}  // namespace

struct Planner::Impl {
  PlanConfig config;
  PlannerOptions options;
  std::shared_ptr<const CostModel> base_cost;   // pp stages, as configured
  std::shared_ptr<const CostModel> cost;        // base_cost, calibrated when asked
  std::unique_ptr<CostModel> interleaved_cost;  // pp * chunks stages, when interleaving applies
  std::int64_t memory_limit_bytes = 0;
  std::int64_t max_static_bytes = 0;  // the largest stage's parameters, grads, optimizer
  BatchingOptions batching;           // the first DP target's rule (or a baseline's)
  // The schedule searched on `batching`'s result: config.schedule, except
  // packing-megatron's "auto", which is 1F1B (the baseline's own schedule).
  ScheduleKind schedule = ScheduleKind::Auto;
  std::vector<DpTarget> more_targets; // DP strategies: further schedules planned for

  // quick: only the batching's recompute mode and no micro-batch permutations, to rank
  // many micro-batchings before the full search of the best (choose()). ranked: quick
  // searches already run, whose result a repeat takes (same_quick_search()).
  Choice search(const GlobalBatch& batch, const BatchingOptions& options,
                ScheduleKind schedule, bool quick = false,
                BatchingCache* cache = nullptr,
                const std::vector<Choice>* ranked = nullptr) const;
  // The ranking's quick search: search_replicas(quick, recompute) without recording the
  // winner's timeline (only its makespan ranks), or the result of the same search in
  // `ranked`.
  Choice quick_search(const GlobalBatch& batch,
                      const std::vector<std::vector<MicroBatch>>& replicas,
                      ScheduleKind schedule, Recompute recompute,
                      const std::vector<Choice>* ranked) const;
  Choice search_replicas(const GlobalBatch& batch,
                         const std::vector<std::vector<MicroBatch>>& replicas,
                         ScheduleKind schedule, const ReplicaSearch& how = {}) const;
  Choice choose(const GlobalBatch& batch) const;
  // bar_ms: the random orders need only beat this too (a plan the result is compared with).
  Choice with_random_orders(const GlobalBatch& batch, Choice choice,
                            double bar_ms = std::numeric_limits<double>::infinity()) const;
  // make_search_candidates() for one recompute mode: only that mode's problems are costed.
  std::vector<SearchCandidate> own_mode_candidates(ScheduleKind schedule,
                                                   std::span<const MicroBatch> microbatches,
                                                   Recompute recompute) const;
  std::vector<Choice> rank_dp_plans(const GlobalBatch& batch) const;
  void walk_token_budget(const GlobalBatch& batch, Choice* choice, std::vector<Choice>* searched) const;
  std::optional<Choice> redeal(const GlobalBatch& batch, const Choice& from, ScheduleKind schedule,
                               double beat_ms) const;
  template <typename Score>
  void walk_sizes(const GlobalBatch& batch, const BatchingOptions& options, std::int64_t from,
                  double from_ms, Score&& score) const;
};

// `ours` as `baseline` plans itself: its 1F1B memory rule, bubble weight 1 (docs/batching.md,
// "Baseline cuts").
BatchingOptions as_baseline(BatchingOptions ours, Strategy baseline) {
  ours.strategy = baseline;
  ours.in_flight.clear();
  ours.bubble_weight = 1.0;
  return ours;
}

// A baseline's cut with each micro-batch as one varlen row (as_varlen_microbatches()).
std::vector<std::vector<MicroBatch>> varlen_replicas(const GlobalBatch& batch, const BatchingResult& cut,
                                                     const BatchingOptions& options) {
  std::vector<std::vector<MicroBatch>> replicas;
  for (const std::vector<MicroBatch>& replica : cut.replicas) {
    replicas.push_back(as_varlen_microbatches(batch, replica, options));
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

// `options` at one size (next_size()): rows per micro-batch or token budget.
BatchingOptions with_size(BatchingOptions options, std::int64_t size) {
  if (options.strategy == Strategy::TokenBased) {
    options.token_budget = size;
  } else {
    options.fixed_batch = size;
    options.size_by_objective = true;
  }
  return options;
}

// A baseline's micro-batch sizes next to the objective's `from` (rows, or token-based's
// token budget: next_size()), as a practitioner sweeps the size: upward while
// score(options, cut) improves on the size before it, and downward only if the first size
// up did not improve on `from_ms`. score(options, cut, to_beat_ms) returns the cut's
// simulated time, a value not below to_beat_ms where it cannot beat that (the size before
// it: only then does the walk go on), or nullopt where no schedule fits it; a size that
// fits no recompute mode under the pipelined memory
// rule ends that direction (the most that fit in the objective's mode can be fewer:
// heavier recompute fits more). The simulated time has one minimum over the size at every
// point measured (docs/batching.md, "The baselines' micro-batch size").
template <typename Score>
void Planner::Impl::walk_sizes(const GlobalBatch& batch, const BatchingOptions& options,
                               std::int64_t from, double from_ms, Score&& score) const {
  for (const int direction : {1, -1}) {
    double previous_ms = from_ms;
    bool improved = false;
    for (std::optional<std::int64_t> size = next_size(options.strategy, from, direction); size;
         size = next_size(options.strategy, *size, direction)) {
      const BatchingOptions sized = with_size(options, *size);
      const std::optional<BatchingResult> cut =
          unless_ruled_out([&] { return make_microbatches(batch, *cost, sized); });
      if (!cut || cut->one_in_flight) break;  // past the sizes the pipelined rule fits
      const std::optional<double> ms = score(sized, *cut, previous_ms);
      if (!ms || !(*ms < previous_ms)) break;
      previous_ms = *ms;
      improved = true;
    }
    if (improved) break;
  }
}

// Micro-batches under `options`, then the best schedule x recompute of every replica.
Choice Planner::Impl::search(const GlobalBatch& batch, const BatchingOptions& options,
                             ScheduleKind schedule, bool quick,
                             BatchingCache* cache, const std::vector<Choice>* ranked) const {
  const BatchingResult batching = make_microbatches(batch, *cost, options, cache);
  Choice choice = quick ? quick_search(batch, batching.replicas, schedule, batching.recompute, ranked)
                        : search_replicas(batch, batching.replicas, schedule);
  choice.dp_recompute = batching.recompute;
  choice.cut_size = batching.size;
  choice.batching = options;
  return choice;
}

Choice Planner::Impl::quick_search(const GlobalBatch& batch,
                                   const std::vector<std::vector<MicroBatch>>& replicas,
                                   ScheduleKind schedule, Recompute recompute,
                                   const std::vector<Choice>* ranked) const {
  if (ranked != nullptr) {
    if (const Choice* same = same_quick_search(*ranked, replicas, schedule, recompute)) {
      Choice choice = *same;
      choice.baseline_cut = false;  // the caller's to set, as for a fresh search
      return choice;
    }
  }
  return search_replicas(batch, replicas, schedule,
                         {.quick = true, .recompute = recompute, .record = false});
}

std::vector<SearchCandidate> Planner::Impl::own_mode_candidates(
    ScheduleKind schedule, std::span<const MicroBatch> microbatches, Recompute recompute) const {
  const std::vector<ScheduleKind> kinds =
      schedule == ScheduleKind::Auto ? auto_schedule_kinds(*cost) : std::vector<ScheduleKind>{schedule};
  std::vector<SearchCandidate> candidates;
  std::optional<PipelineProblem> plain, interleaved;
  for (ScheduleKind kind : kinds) {
    if (make_schedule(kind)->needs_virtual_stages()) {
      if (interleaved_cost == nullptr) continue;  // as make_search_candidates() under auto
      if (!interleaved) {
        interleaved = make_pipeline_problem(*interleaved_cost, microbatches, recompute,
                                            {config.pp, kInterleavedChunks}, memory_limit_bytes);
      }
      candidates.push_back({kind, recompute, *interleaved});
    } else {
      if (!plain) {
        plain = make_pipeline_problem(*cost, microbatches, recompute, {config.pp, 1},
                                      memory_limit_bytes);
      }
      candidates.push_back({kind, recompute, *plain});
    }
  }
  return candidates;
}

// The best schedule x recompute of every replica's micro-batches.
Choice Planner::Impl::search_replicas(const GlobalBatch& batch,
                                      const std::vector<std::vector<MicroBatch>>& replicas,
                                      ScheduleKind schedule, const ReplicaSearch& how) const {
  const Impl& m = *this;
  Choice choice;
  choice.schedule = schedule;
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    ReplicaChoice replica;
    replica.microbatches = replicas[r];
    if (replica.microbatches.empty()) {
      throw Error(ErrorKind::Infeasible,
                  cat("iteration ", batch.index, ": ", batch.samples.size(),
                      " samples cannot feed --dp ", m.config.dp,
                      " replicas; raise --global-batch-tokens or lower --dp"));
    }
    SearchOptions search_options;
    search_options.seed = m.config.seed;
    search_options.random_orders = how.random_orders;
    if (how.max_orders > 0) search_options.max_orders = how.max_orders;
    search_options.max_orders += how.random_orders;
    search_options.searched_orders = how.searched_orders;
    search_options.beat_ms = how.beat_ms;
    auto with_vertical_sync = [&](std::vector<SearchCandidate> candidates) {
      for (SearchCandidate& c : candidates) c.problem.vertical_sync = m.config.vertical_sync;
      return candidates;
    };
    auto all_candidates = [&] {
      std::vector<SearchCandidate> candidates =
          make_search_candidates(schedule, *m.cost, m.interleaved_cost.get(),
                                 replica.microbatches, m.config.pp, m.memory_limit_bytes);
      if (m.batching.recompute) {
        // One mode for the whole run (--recompute): the search keeps the batching's.
        std::erase_if(candidates, [&](const SearchCandidate& c) {
          return c.recompute != *m.batching.recompute;
        });
      }
      return with_vertical_sync(std::move(candidates));
    };
    try {
      if (how.quick) {
        // The batching's own recompute mode, as given, costed for that mode only; if that
        // fits no schedule, a heavier mode may (the simulator's peaks are not the DP's
        // memory rule): all of them.
        SearchOptions quick_options = search_options;
        quick_options.permute = how.permute;
        quick_options.record_winner = how.record;
        replica.candidates =
            with_vertical_sync(m.own_mode_candidates(schedule, replica.microbatches, how.recompute));
        try {
          replica.best = search_schedule(replica.candidates, quick_options);
        } catch (const Error& e) {
          if (!how.other_modes || !rules_out_option(e)) throw;
          replica.candidates = all_candidates();
          replica.best = search_schedule(replica.candidates, quick_options);
        }
      } else {
        replica.candidates = all_candidates();
        replica.best = search_schedule(replica.candidates, search_options);
      }
    } catch (const Error& e) {
      throw Error(e.kind(), cat("iteration ", batch.index, " replica ", r, ": ", e.what()));
    }
    if (!replica.best.found) {  // the slowest replica cannot beat beat_ms
      choice.replicas.clear();
      choice.est_ms = std::numeric_limits<double>::infinity();
      return choice;
    }
    choice.est_ms = std::max(choice.est_ms, replica.best.sim.makespan_ms);
    choice.replicas.push_back(std::move(replica));
  }
  return choice;
}

// The DP strategies' micro-batchings, each ranked by a quick search: one DP per memory
// rule planned for (and, for dynapipe, per varlen order), the best of each order again
// with a head and a tail, and a line search on the bubble weight of the best.
std::vector<Choice> Planner::Impl::rank_dp_plans(const GlobalBatch& batch) const {
  const Impl& m = *this;
  std::vector<std::pair<BatchingOptions, ScheduleKind>> plans{{m.batching, m.schedule}};
  for (const DpTarget& target : m.more_targets) {
    BatchingOptions planned_for = m.batching;
    planned_for.in_flight = target.in_flight;
    planned_for.bubble_weight = target.bubble_weight;
    plans.emplace_back(planned_for, target.schedule);
  }
  const bool varlen = m.batching.strategy == Strategy::DynaPipe;
  if (varlen) {
    // Both varlen orders for every rule; the simulation decides (the DP's objective
    // ranks them poorly, docs/batching.md "Ordering for varlen").
    const std::size_t rules = plans.size();
    for (std::size_t k = 0; k < rules; ++k) {
      plans[k].first.varlen_order = VarlenOrder::Sorted;
      plans.push_back(plans[k]);
      plans.back().first.varlen_order = VarlenOrder::PackedRows;
    }
    // And packing-varlen's rows merged only within the row capacity: micro-batches of
    // gradually falling size, which zb1p and 1F1B drain better than equal large ones.
    for (std::size_t k = 0; k < rules; ++k) {
      plans.push_back(plans[rules + k]);
      plans.back().first.varlen_row_capacity = true;
    }
  }
  BatchingCache cache;  // segment costs shared by every DP below
  // The first plan's errors are the planner's (e.g. a sample that fits nowhere).
  std::vector<Choice> ranked;
  ranked.push_back(m.search(batch, plans.front().first, plans.front().second, true, &cache));
  std::vector<std::size_t> best_of_order{0};  // per order: index into ranked
  std::vector<std::size_t> rule_of{0};        // per ranked cut: the rule (plans[rule]) it was cut for
  // Quick estimates of the sorted order's cuts, one per rule (plans[0 .. rules)).
  const std::size_t rules = 1 + m.more_targets.size();
  std::vector<double> sorted_ms(rules, std::numeric_limits<double>::infinity());
  sorted_ms[0] = ranked.front().est_ms;
  for (std::size_t k = 1; k < plans.size(); ++k) {
    if (varlen && k >= rules && k % rules != 0 &&
        plans[k].second == ScheduleKind::Interleaved) {
      // The interleaved rule's DPs cost the most of the later ones (a memory rule of its
      // own: T5-11B pp 8 short256, ~15% of a plan). Where interleaving lost clearly on
      // the sorted order, skipping them left every issue-8 point's plan as it was.
      const double best_sorted = *std::min_element(sorted_ms.begin(), sorted_ms.end());
      if (!(sorted_ms[k % rules] <= best_sorted * kInterleavedWindow)) continue;
    }
    const bool new_order = plans[k].first.varlen_order != plans[k - 1].first.varlen_order ||
                           plans[k].first.varlen_row_capacity != plans[k - 1].first.varlen_row_capacity;
    std::optional<Choice> c =
        unless_ruled_out([&] { return m.search(batch, plans[k].first, plans[k].second, true, &cache, &ranked); });
    if (!c) continue;
    if (k < rules) sorted_ms[k] = c->est_ms;
    ranked.push_back(std::move(*c));
    rule_of.push_back(k % rules);
    if (new_order) {
      best_of_order.push_back(ranked.size() - 1);
    } else if (ranked.back().est_ms < ranked[best_of_order.back()].est_ms) {
      best_of_order.back() = ranked.size() - 1;
    }
  }
  if (varlen && m.options.head_and_tail) {
    // Each order's best cuts again with small micro-batches first and last
    // (batching/head_tail.h).
    for (std::size_t k : best_of_order) {
      const Choice& base = ranked[k];
      std::vector<std::vector<MicroBatch>> replicas;
      for (const ReplicaChoice& replica : base.replicas) {
        replicas.push_back(split_head_and_tail(batch, replica.microbatches, *m.cost,
                                               base.dp_recompute, m.batching));
      }
      Choice other = m.quick_search(batch, replicas, base.schedule, base.dp_recompute, &ranked);
      other.batching = base.batching;
      other.dp_recompute = base.dp_recompute;
      rule_of.push_back(rule_of[k]);
      ranked.push_back(std::move(other));
    }
  }
  auto best = [&] {
    return std::min_element(ranked.begin(), ranked.end(), [](const Choice& a, const Choice& b) {
      return a.est_ms < b.est_ms;
    });
  };
  // The cuts the steps below start from: the best plan, and under auto each other rule's
  // best near it (kRuleWindow). A fixed --schedule starts them from its own rule's best,
  // and auto must find what that finds (GPT-6.7B pp 8 on the H100 preset, 80 GiB, 1024,
  // 262,144 tokens: the 1F1B rule's best, 3193.1 ms by quick estimate, line-searched to
  // 3135.2 and its padded cut planned 3051.6 in full with critical-path, while every step
  // from the zb1p rule's best stopped at auto's 3077.7).
  auto rule_starts = [&] {
    const std::size_t overall = static_cast<std::size_t>(best() - ranked.begin());
    std::vector<std::size_t> starts{overall};
    if (!schedules_can_gain(ranked[overall])) return starts;
    for (std::size_t rule = 0; rule < rules; ++rule) {
      std::optional<std::size_t> rule_best;
      for (std::size_t k = 0; k < rule_of.size(); ++k) {
        if (rule_of[k] == rule && (!rule_best || ranked[k].est_ms < ranked[*rule_best].est_ms)) rule_best = k;
      }
      const double window = rule == 0 ? kRuleWindow : kOtherRuleWindow;
      if (rule != rule_of[overall] && rule_best &&
          ranked[*rule_best].est_ms <= ranked[overall].est_ms * window) {
        starts.push_back(*rule_best);
      }
    }
    return starts;
  };
  if (m.options.schedule_aware_dp && m.config.pp > 1) {
    // DP ↔ simulation: a line search on the bubble weight of the best plan's memory rule.
    // (p − 1)·max t only approximates what a schedule loses to fill, drain and unequal
    // micro-batches, so the DP runs again with β doubled (smaller micro-batches) and, if
    // that did not help, halved; each step continues while the simulation improves.
    for (std::size_t k : rule_starts()) {
      const Choice start = ranked[k];
      const std::size_t rule = rule_of[k];
      for (double factor : {2.0, 0.5}) {
        bool improved = false;
        BatchingOptions again = start.batching;
        double est = start.est_ms;
        for (int step = 0; step < 2; ++step) {
          again.bubble_weight = std::clamp(again.bubble_weight * factor, 0.01, 16.0);
          std::optional<Choice> c =
              unless_ruled_out([&] { return m.search(batch, again, start.schedule, true, &cache, &ranked); });
          if (!c || !(c->est_ms < est)) break;
          est = c->est_ms;
          ranked.push_back(std::move(*c));
          rule_of.push_back(rule);
          improved = true;
        }
        if (improved) break;
      }
    }
  }
  if (varlen && m.options.padded_cut) {
    // dynapipe-padded's cut of the best plan's rule, run varlen: more, length-homogeneous
    // micro-batches than the varlen DP makes, each no slower than dynapipe-padded's own
    // (docs/batching.md "Padded cuts").
    for (std::size_t k : rule_starts()) {
      const Choice start = ranked[k];
      BatchingOptions padded_cut = start.batching;
      padded_cut.varlen_order = VarlenOrder::Sorted;
      padded_cut.varlen_row_capacity = false;
      padded_cut.varlen_padded_cut = true;
      // And its recompute mode: the padded DP cannot be pruned by the varlen incumbent, so
      // each extra mode is a full DP (T5-11B pp 8 short256: ~8% of the plan).
      if (!padded_cut.recompute) padded_cut.recompute = start.dp_recompute;
      std::optional<Choice> c =
          unless_ruled_out([&] { return m.search(batch, padded_cut, start.schedule, true, &cache, &ranked); });
      if (c) ranked.push_back(std::move(*c));
    }
  }
  if (varlen && m.options.baseline_cuts) {
    // packing-varlen's and token-based's own micro-batches (their 1F1B rule, as they plan
    // themselves), each run as one varlen row, so dynapipe's plan can match the baseline
    // wherever it is the best (docs/batching.md "Baseline cuts"). packing-varlen's plan
    // simulates two sizes of micro-batch (choose()): both cuts, the second where it
    // differs. One varlen row drops the rows' end padding, but the cost model need not
    // find it cheaper (T5-11B pp 8 on the flash H100 preset: 1.7% dearer on the decoder
    // stages), so packing-varlen's cuts are also run in its own block-diagonal rows.
    // Each cut is ranked once, as packing-varlen's plan walks its micro-batch size
    // (walk_sizes(), here on quick estimates) past the objective's and the most's.
    std::vector<std::pair<std::vector<std::vector<MicroBatch>>, std::optional<double>>> ranked_cuts;
    // Ranks `cut` (the baseline's micro-batches) in its forms; the best quick estimate,
    // or nullopt if no form fits a schedule.
    auto rank_cut = [&](Strategy baseline, const BatchingResult& cut) -> std::optional<double> {
      std::vector<std::vector<std::vector<MicroBatch>>> forms{varlen_replicas(batch, cut, m.batching)};
      if (baseline == Strategy::PackingVarlen && cut.replicas != forms.front()) forms.push_back(cut.replicas);
      std::optional<double> best_ms;
      auto keep = [&](std::optional<double> ms) {
        if (ms) best_ms = std::min(best_ms.value_or(*ms), *ms);
      };
      for (auto& form : forms) {
        const auto same = std::find_if(ranked_cuts.begin(), ranked_cuts.end(),
                                       [&](const auto& ranked_cut) { return ranked_cut.first == form; });
        if (same != ranked_cuts.end()) {
          keep(same->second);
          continue;
        }
        std::optional<Choice> c = unless_ruled_out([&]() -> std::optional<Choice> {
          Choice choice = m.quick_search(batch, form, m.schedule, cut.recompute, &ranked);
          choice.batching = m.batching;
          choice.dp_recompute = cut.recompute;
          return choice;
        });
        ranked_cuts.emplace_back(std::move(form), c ? std::optional(c->est_ms) : std::nullopt);
        if (!c) continue;
        c->baseline_cut = true;
        keep(c->est_ms);
        ranked.push_back(std::move(*c));
      }
      return best_ms;
    };
    for (const auto& [baseline, by_objective] :
         {std::pair{Strategy::PackingVarlen, true}, std::pair{Strategy::PackingVarlen, false},
          std::pair{Strategy::TokenBased, true}}) {
      BatchingOptions theirs = as_baseline(m.batching, baseline);
      theirs.size_by_objective = by_objective;
      const std::optional<BatchingResult> cut =
          unless_ruled_out([&] { return make_microbatches(batch, *m.cost, theirs); });
      if (!cut) continue;
      const std::optional<double> ms = rank_cut(baseline, *cut);
      // token-based's budget is not walked here: that took T5-11B pp 8 65k plans from 15.6
      // to 23 ms (more baseline cuts searched in full) for dynapipe plans at most 2% faster.
      if (!by_objective || !ms || baseline != Strategy::PackingVarlen) continue;
      // Sizes that fit only in a heavier recompute mode than the objective's too, as
      // packing-varlen's own walk takes them: at T5-11B pp 4 (A100 80 GiB, 1024, 32,768
      // tokens) its 2-row micro-batches under selective recompute planned 2678.2 ms against
      // dynapipe's 2699.1 until dynapipe ranked them (2640.8); +4% instructions for a
      // GPT-6.7B pp 4 65k plan (it was +10% before the full searches stopped at their bars).
      m.walk_sizes(batch, theirs, cut->size, *ms,
                   [&](const BatchingOptions&, const BatchingResult& sized, double) -> std::optional<double> {
                     return rank_cut(baseline, sized);
                   });
    }
  }
  return ranked;
}

// Where a plan still leaves a large share of its devices idle (fill, drain and stalls
// between unequal micro-batches), the order of its micro-batches matters more than the few
// cluster orders the full search tries: its cut again in its chosen recompute mode, every
// schedule of its row, with seeded random orders too (the winners move 1F1B plans to zb1p;
// docs/batching.md "Random orders where the bubble is large"). Every strategy gets it, so
// that no baseline is compared without the search its rival had.
Choice Planner::Impl::with_random_orders(const GlobalBatch& batch, Choice choice, double bar_ms) const {
  if (options.random_orders <= 0 || !(idle_share(choice) > kRandomOrdersIdleShare)) return choice;
  const Recompute mode = choice.replicas.front().best.recompute;
  const bool one_mode = std::ranges::all_of(
      choice.replicas, [&](const ReplicaChoice& r) { return r.best.recompute == mode; });
  if (one_mode) {
    // The full search that made `choice` ran these candidates in the deterministic
    // orders: only the random ones run, each replica against its own makespan so far.
    const ReplicaSearch how{.quick = true, .recompute = mode, .permute = true,
                            .random_orders = options.random_orders,
                            .searched_orders = SearchOptions{}.max_orders};
    std::vector<std::optional<ReplicaChoice>> better(choice.replicas.size());
    double est_ms = 0;
    for (std::size_t r = 0; r < choice.replicas.size(); ++r) {
      const ReplicaChoice& replica = choice.replicas[r];
      ReplicaSearch barred = how;
      barred.beat_ms = std::min(replica.best.sim.makespan_ms, bar_ms);
      Choice again = search_replicas(batch, {replica.microbatches}, choice.schedule, barred);
      if (again.replicas.empty()) {  // no random order beats it
        est_ms = std::max(est_ms, replica.best.sim.makespan_ms);
        continue;
      }
      est_ms = std::max(est_ms, again.est_ms);
      better[r] = std::move(again.replicas.front());
    }
    if (!(est_ms < choice.est_ms)) return choice;
    for (std::size_t r = 0; r < choice.replicas.size(); ++r) {
      if (better[r]) choice.replicas[r] = std::move(*better[r]);
    }
    choice.est_ms = est_ms;
    return choice;
  }
  // Replicas in different modes: the given mode's deterministic orders were not all
  // searched on every replica, so they run again with the random ones.
  Choice again = search_replicas(batch, replica_microbatches(choice), choice.schedule,
                                 {.quick = true, .recompute = mode, .permute = true,
                                  .random_orders = options.random_orders});
  if (!(again.est_ms < choice.est_ms)) return choice;
  again.batching = choice.batching;
  again.dp_recompute = choice.dp_recompute;
  again.baseline_cut = choice.baseline_cut;
  return again;
}

// walk_token_budget() runs where the plan so far idles more than this share of its device
// time: fill and drain then rule, and the size of the micro-batches around the longest
// sample decides. Where any schedule could gain (schedules_can_gain()) the walk gained
// 0.3–1.9% at 6 of 60 issue-8-family plans, but cost T5-11B pp 8 65k plans (idle 0.33, no
// gain) +59% instructions with full searches, +25% with two orders each.
constexpr double kTokenWalkIdleShare = 0.5;

// token-based's own micro-batches run as varlen rows, its token budget walked as its own
// plan walks it: by full searches. Where fill and drain rule, quick estimates cannot stand
// in for them (GPT-6.7B pp 8, A100 40 GiB, 8192, 16,384 tokens, the plan idling 0.81: they
// walked the budget up, token-based's full searches down to many short micro-batches
// around a lone 8192-token sample, 3816.3 ms against dynapipe's 3872.4). Each search need
// only beat the plan so far (`choice`), which a faster cut replaces; the walk goes on while
// its sizes do. Those cuts join `searched` for their random orders.
void Planner::Impl::walk_token_budget(const GlobalBatch& batch, Choice* choice,
                                      std::vector<Choice>* searched) const {
  const BatchingOptions theirs = as_baseline(batching, Strategy::TokenBased);
  const std::optional<BatchingResult> cut =
      unless_ruled_out([&] { return make_microbatches(batch, *cost, theirs); });
  if (!cut) return;
  // The cut's simulated time where it beats the plan so far, else to_beat_ms (the walk
  // stops there).
  auto beats = [&](const BatchingResult& sized, double to_beat_ms) -> std::optional<double> {
    const std::vector<std::vector<MicroBatch>> replicas = varlen_replicas(batch, sized, batching);
    return unless_ruled_out([&]() -> double {
      Choice c = search_replicas(batch, replicas, schedule, {.beat_ms = std::min(to_beat_ms, choice->est_ms)});
      if (c.replicas.empty()) return to_beat_ms;
      c.batching = batching;
      c.dp_recompute = sized.recompute;
      c.baseline_cut = true;
      const double ms = c.est_ms;
      *choice = c;
      searched->push_back(std::move(c));
      return ms;
    });
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::optional<double> objective_ms = beats(*cut, inf);
  if (!objective_ms) return;
  walk_sizes(batch, theirs, cut->size, *objective_ms,
             [&](const BatchingOptions&, const BatchingResult& sized, double to_beat_ms) {
               return beats(sized, to_beat_ms);
             });
}

// With dp > 1 the DP strategies deal their micro-batches to the replicas by Karmarkar–Karp
// on t(M), which balances Σ t but not the pipeline's (p − 1)·max t per replica. A cut's
// micro-batches dealt again so that the largest Σ t + β(p − 1)·max t falls
// (balance_pipeline_replicas()), each replica searched quickly with permuted orders in
// every recompute mode, replace the cut's own deal where faster: GPT-6.7B pp 4 dp 4 on the
// H100 preset, 80 GiB, 8192, 32,768 tokens (bench/random_points.py strategies seed 11),
// where 11 micro-batches over 4 replicas had left dynapipe 1% behind dynapipe-padded. As
// the batching's own deal, that balance alone was slower in simulation at GPT-6.7B pp 4
// dp 2 2048 (+0.2%), so it only adds a candidate. nullopt: the same deal, or none faster
// than beat_ms.
std::optional<Choice> Planner::Impl::redeal(const GlobalBatch& batch, const Choice& from,
                                            ScheduleKind schedule, double beat_ms) const {
  std::vector<MicroBatch> all;
  std::vector<int> before;
  for (std::size_t r = 0; r < from.replicas.size(); ++r) {
    for (const MicroBatch& mb : from.replicas[r].microbatches) {
      all.push_back(mb);
      before.push_back(static_cast<int>(r));
    }
  }
  const Recompute mode = from.replicas.front().best.recompute;
  std::vector<double> times;
  for (const MicroBatch& mb : all) times.push_back(microbatch_time_ms(*cost, mb, mode));
  const std::vector<int> owner =
      balance_pipeline_replicas(times, config.dp, from.batching.bubble_weight * (config.pp - 1));
  std::vector<std::vector<MicroBatch>> replicas(static_cast<std::size_t>(config.dp));
  for (std::size_t k = 0; k < all.size(); ++k) replicas[static_cast<std::size_t>(owner[k])].push_back(all[k]);
  for (std::vector<MicroBatch>& replica : replicas) {
    for (std::size_t k = 0; k < replica.size(); ++k) replica[k].id = static_cast<int>(k);
  }
  if (std::ranges::any_of(replicas, [](const auto& r) { return r.empty(); })) return std::nullopt;
  // Each replica's micro-batches (indices into `all`, in order) under a deal.
  auto groups = [&](const std::vector<int>& of) {
    std::vector<std::vector<int>> g(static_cast<std::size_t>(config.dp));
    for (std::size_t k = 0; k < of.size(); ++k) {
      g[static_cast<std::size_t>(of[k])].push_back(static_cast<int>(k));
    }
    return g;
  };
  const std::vector<std::vector<int>> dealt = groups(owner), had = groups(before);
  // The same deal up to the replicas' numbering: nothing new to search.
  if (std::ranges::is_permutation(dealt, had)) return std::nullopt;
  // Each replica in every mode up to the heaviest the cut ran (unless --recompute fixed
  // one), its fastest kept: a replica dealt fewer or smaller micro-batches may store every
  // activation (T5-11B pp 8 dp 2, A100 80 GiB, 4096, 32,768 tokens: a lone 4096-token
  // micro-batch 2248.2 ms under the plan's selective mode, 1784.7 without recomputation),
  // and one dealt more may need the heavier mode for the schedule that suits it. A replica
  // dealt what it had keeps its search.
  Recompute heaviest = from.dp_recompute;
  for (const ReplicaChoice& r : from.replicas) heaviest = std::max(heaviest, r.best.recompute);
  std::vector<Recompute> modes;
  for (Recompute k : kRecomputeModes) {
    if (batching.recompute ? k == *batching.recompute : k <= heaviest) modes.push_back(k);
  }
  Choice other;
  other.schedule = schedule;
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    const auto kept = std::ranges::find(had, dealt[r]);
    const ReplicaChoice* same =
        kept != had.end() ? &from.replicas[static_cast<std::size_t>(kept - had.begin())] : nullptr;
    // (Where its timeline was recorded: a ranking's quick search records none.)
    if (same != nullptr && schedule == from.schedule && !same->best.sim.timeline.empty()) {
      if (!(same->best.sim.makespan_ms < beat_ms)) return std::nullopt;
      other.est_ms = std::max(other.est_ms, same->best.sim.makespan_ms);
      other.replicas.push_back(*same);
      continue;
    }
    std::optional<ReplicaChoice> fastest;
    for (const Recompute k : modes) {
      // Each mode after the first only has to beat the fastest so far.
      const double bar = fastest ? std::min(beat_ms, fastest->best.sim.makespan_ms) : beat_ms;
      const std::optional<Choice> one = unless_ruled_out([&] {
        return search_replicas(
            batch, {replicas[r]}, schedule,
            {.quick = true, .recompute = k, .other_modes = false, .permute = true, .beat_ms = bar});
      });
      if (!one || one->replicas.empty()) continue;
      if (!fastest || one->est_ms < fastest->best.sim.makespan_ms) fastest = one->replicas.front();
    }
    if (!fastest) return std::nullopt;  // this replica cannot beat beat_ms
    other.est_ms = std::max(other.est_ms, fastest->best.sim.makespan_ms);
    other.replicas.push_back(std::move(*fastest));
  }
  if (!(other.est_ms < beat_ms)) return std::nullopt;
  other.batching = from.batching;
  other.dp_recompute = from.dp_recompute;
  other.baseline_cut = from.baseline_cut;
  return other;
}

// The plan of one iteration: baselines search their one micro-batching; the DP strategies
// rank theirs quickly and search the three best in full (every recompute mode, permuted
// orders), keeping the faster.
Choice Planner::Impl::choose(const GlobalBatch& batch) const {
  const Impl& m = *this;
  if (!is_dp_strategy(m.batching.strategy)) {
    Choice best = m.search(batch, m.batching, m.schedule);
    const bool rows_chosen = sizes_rows(m.batching.strategy) && m.batching.fixed_batch == 0;
    const bool budget_chosen = m.batching.strategy == Strategy::TokenBased && m.batching.token_budget == 0;
    if (rows_chosen || budget_chosen) {
      // The size the objective chose (rows per micro-batch, or token-based's token budget),
      // the most rows that fit and the sizes next to the objective's (walk_sizes()), each
      // searched in full: the objective's 1F1B bubble can favour micro-batches smaller than
      // a schedule with a shorter fill and drain wants (GPT-6.7B pp 4 on H100 80 GiB at
      // 512: packing-varlen 1.00x dynapipe with the most that fit, 0.96x by the objective;
      // pp 8 at 2048: 806.1 ms with 2 rows, 883.6 with the objective's 1, 931.1 with the
      // most, 4).
      const double objective_ms = best.est_ms;
      const std::int64_t objective_size = best.cut_size;
      // Each cut is searched once: the walk passes the objective's and the most's sizes.
      // A search only has to beat what its result is compared with (the size before it in
      // the walk; the best so far is never above that): its builds stop there, and a cut
      // that cannot beat it is kept as that lower bound (exact: false).
      struct Searched {
        std::vector<std::vector<MicroBatch>> replicas;
        double ms;
        bool exact;
      };
      std::vector<Searched> searched_cuts{{replica_microbatches(best), objective_ms, true}};
      auto searched = [&](const BatchingOptions& options, const BatchingResult& cut, double to_beat_ms) {
        auto same = std::find_if(searched_cuts.begin(), searched_cuts.end(),
                                 [&](const Searched& s) { return s.replicas == cut.replicas; });
        if (same != searched_cuts.end() && (same->exact || same->ms >= to_beat_ms)) return same->ms;
        Choice other = m.search_replicas(batch, cut.replicas, m.schedule, {.beat_ms = to_beat_ms});
        const bool found = !other.replicas.empty();
        const double ms = found ? other.est_ms : to_beat_ms;
        if (same != searched_cuts.end()) {
          *same = {cut.replicas, ms, found};
        } else {
          searched_cuts.push_back({cut.replicas, ms, found});
        }
        if (found && ms < best.est_ms) {
          other.dp_recompute = cut.recompute;
          other.batching = options;
          best = std::move(other);
        }
        return ms;
      };
      if (rows_chosen) {
        BatchingOptions most = m.batching;
        most.size_by_objective = false;
        // (Not where the most that fit make fewer micro-batches than replicas.)
        if (const auto cut = unless_ruled_out([&] { return make_microbatches(batch, *m.cost, most); })) {
          searched(most, *cut, best.est_ms);
        }
      }
      if (objective_size > 0) {
        m.walk_sizes(batch, m.batching, objective_size, objective_ms,
                     [&](const BatchingOptions& options, const BatchingResult& cut, double to_beat_ms) {
                       return unless_ruled_out([&] { return searched(options, cut, to_beat_ms); });
                     });
      }
    }
    return with_random_orders(batch, std::move(best));
  }
  std::vector<Choice> ranked = rank_dp_plans(batch);
  std::stable_sort(ranked.begin(), ranked.end(), ranks_before);
  constexpr std::size_t kFullSearches = 3;
  std::optional<Choice> choice;
  // Full searches run so far: a repeat on the same micro-batches, schedule and modes gives
  // the same estimate and, not strictly faster, leaves the choice as it is.
  struct Searched {
    const Choice* ranked_choice;
    ScheduleKind schedule;
    std::optional<Recompute> mode;
    double est_ms;
  };
  std::vector<Searched> searched;
  std::vector<Choice> baseline_full;  // the baseline cuts' full searches, where they ran
  // mode: only that recompute mode, orders permuted (other_modes: every mode if that one
  // fits no schedule); none given: every mode. schedule: the --schedule value searched
  // (none given: the choice's).
  // beat_ms (a mode-less search only): a result no faster than this is not needed and
  // returns +inf (search_replicas()).
  // dynapipe-padded is the paper's formulation, Karmarkar–Karp's deal included (the
  // reference deals with prtpy's kk); dynapipe deals each cut searched in full again.
  const bool redeals = m.config.dp > 1 && m.batching.strategy == Strategy::DynaPipe;
  auto search_in_full = [&](const Choice& ranked_choice,
                            std::optional<Recompute> mode = std::nullopt,
                            bool other_modes = true,
                            std::optional<ScheduleKind> schedule_given = std::nullopt,
                            double beat_ms = std::numeric_limits<double>::infinity()) -> double {
    const ScheduleKind schedule = schedule_given.value_or(ranked_choice.schedule);
    // Under auto the zb1p rule often cuts what the 1F1B rule cut: a cut searched in every
    // mode with auto (every schedule) gives another schedule's search nothing faster.
    for (const Searched& s : searched) {
      const bool covers = s.schedule == schedule || (!mode && s.schedule == ScheduleKind::Auto);
      if (s.mode == mode && covers && same_cut(*s.ranked_choice, ranked_choice)) return s.est_ms;
    }
    const std::vector<std::vector<MicroBatch>> replicas = replica_microbatches(ranked_choice);
    Choice full = mode ? m.search_replicas(batch, replicas, schedule,
                                           {.quick = true, .recompute = *mode,
                                            .other_modes = other_modes, .permute = true})
                       : m.search_replicas(batch, replicas, schedule, {.beat_ms = beat_ms});
    if (redeals) {
      // Only a deal faster than this cut's own and the plan so far can matter.
      double bar = full.replicas.empty() ? beat_ms : full.est_ms;
      if (choice) bar = std::min(bar, choice->est_ms);
      if (std::optional<Choice> other = m.redeal(batch, ranked_choice, schedule, bar)) {
        full = std::move(*other);
      }
    }
    if (full.replicas.empty()) {  // it could not beat beat_ms
      searched.push_back({&ranked_choice, schedule, mode, full.est_ms});
      return full.est_ms;
    }
    full.batching = ranked_choice.batching;
    full.dp_recompute = ranked_choice.dp_recompute;
    full.baseline_cut = ranked_choice.baseline_cut;
    const double est_ms = full.est_ms;
    if (full.baseline_cut) baseline_full.push_back(full);
    if (!choice || est_ms < choice->est_ms) choice = std::move(full);
    searched.push_back({&ranked_choice, schedule, mode, est_ms});
    return est_ms;
  };
  // The padded cut is searched on top of the three best others when it ranks among the
  // three best (the baselines' cuts not counted), so adding it never pushes a plan out of
  // the full search.
  std::size_t others_searched = 0, rank = 0;
  double others_best_ms = std::numeric_limits<double>::infinity();
  for (const Choice& ranked_choice : ranked) {
    if (ranked_choice.baseline_cut) continue;
    // Each full search needs only to beat what its result is compared with: the padded
    // cut the choice so far, the others the best of the others (it sets the baseline
    // cuts' window below), so builds stop there.
    if (ranked_choice.batching.varlen_padded_cut) {
      if (rank++ < kFullSearches) {
        search_in_full(ranked_choice, std::nullopt, true, std::nullopt,
                       choice ? choice->est_ms : std::numeric_limits<double>::infinity());
      }
      continue;
    }
    if (++rank, others_searched++ == kFullSearches) break;
    others_best_ms = std::min(others_best_ms, search_in_full(ranked_choice, std::nullopt, true,
                                                             std::nullopt, others_best_ms));
  }
  if (m.schedule == ScheduleKind::Auto && choice && idle_share(*choice) > kRuleStartsIdleShare &&
      bottleneck_overhead(ranked.front()) > kRuleStartsOverhead) {
    // And each schedule row's best cut and best padded cut (the 1F1B rule's, searched with
    // every schedule; the zb1p and interleaved rules'), where the quick estimate is within
    // kRuleWindow of the best, the plan so far idles more than kRuleStartsIdleShare and the
    // best ranked cut leaves a schedule more than kRuleStartsOverhead to win: quick
    // estimates favour zb1p over critical-path, whose gain comes from the injection orders
    // only the full search permutes, so the three best can all be zb1p cuts while
    // --schedule critical-path plans faster. (Where the plan idles less these searches
    // changed no plan of the random points or the issue-8 settings, and cost GPT-6.7B pp 4
    // 65k plans 3.5% of their instructions.)
    const double best_quick_ms = ranked.front().est_ms;
    // A row's next cuts (up to kFullSearches, as its named schedule searches them) only
    // while its searches come within kCloseRow of the plan so far (GPT-6.7B pp 4 on the
    // measured H100 profile, 40 GiB, 8192: the zb1p rule's third cut 1839.8 ms against
    // 1861.4; every row's three regardless cost T5-11B pp 8 65k +16% instructions).
    constexpr double kCloseRow = 1.01;
    // Per row (schedule, padded cut): its cuts taken so far; kFullSearches closes it.
    std::map<std::pair<ScheduleKind, bool>, std::size_t> taken;
    for (const Choice& ranked_choice : ranked) {
      if (ranked_choice.baseline_cut) continue;
      const bool padded = ranked_choice.batching.varlen_padded_cut;
      std::size_t& row_taken = taken[{ranked_choice.schedule, padded}];
      if (row_taken >= kFullSearches) continue;
      ++row_taken;
      if (!(ranked_choice.est_ms <= best_quick_ms * kRuleWindow)) {
        row_taken = kFullSearches;
        continue;
      }
      const double ms = search_in_full(ranked_choice, std::nullopt, true, std::nullopt,
                                       padded ? choice->est_ms : others_best_ms);
      if (!padded) others_best_ms = std::min(others_best_ms, ms);
      if (!(ms <= choice->est_ms * kCloseRow)) row_taken = kFullSearches;
    }
  }
  // The baselines' cuts, then, each whose quick estimate is within kBaselineWindow of the
  // best full result of the three (the padded cut left out, so that option never changes
  // this choice), searched in its own recompute mode with permuted orders: those orders gain
  // such a cut 3–4% over its quick estimate (T5-11B pp 8 at 4096, GPT-6.7B pp 8 at 4096),
  // more than the quick ranking separates it from the DP's cuts; the other recompute modes
  // changed no plan and cost 3× the search. The window was 2% and only the better-ranked
  // cut was searched until the critical-path schedule, whose injection order the
  // permutations choose: packing-varlen's own plan then beat dynapipe's at GPT-6.7B pp 8
  // 4096 iteration 2 (2870.1 vs 2879.7 ms; its quick estimate 2986.4 was 3.7% above).
  // 5% still left packing-varlen ahead at GPT-6.7B pp 4 80 GiB 8192 (bench/suite: 5636.5
  // vs 5707.9 ms in iteration 0): 10%, at +40% planning time for T5-11B pp 8 short256.
  constexpr double kBaselineWindow = 1.10;
  // Where the devices idle little the orders matter less: 2% there (it was everywhere;
  // GPT-6.7B pp 4 plans idle ~9%), which saves ~8% of their planning time and changed no
  // issue-8 plan.
  constexpr double kLowIdleBaselineWindow = 1.02, kLowIdleShare = 0.15;
  const double base_ms = std::isfinite(others_best_ms) ? others_best_ms : choice->est_ms;
  const bool idles_much = idle_share(*choice) > kLowIdleShare;
  const double window_ms = base_ms * (idles_much ? kBaselineWindow : kLowIdleBaselineWindow);
  // A baseline cut's quick estimate runs its micro-batches as the baseline lists them;
  // outside the window it is judged again in its two first orders, as listed and the
  // organ pipe (micro_batch_orders()), which alone gains such a cut up to 6% (GPT-6.7B
  // pp 8 4096): without it packing-varlen's own plan beat dynapipe's at GPT-6.7B pp 4
  // 4096 iterations 0 and 2 (5870.1 vs 5886.4 ms; quick estimate 2.5% above the window's
  // base, as listed and organ pipe 0.3% below). Where the devices idle little that look
  // must beat the three's best, not only come within the window (+5% planning, not +15%).
  const double two_window_ms = idles_much ? window_ms : base_ms;
  auto in_window = [&](const Choice& cut) {
    if (cut.est_ms < window_ms) return true;
    // Where its ranking ran in its own mode (which then fits in the given order), the given
    // order is that ranking's, already outside the window: only the organ pipe runs, its
    // builds stopping at the window. Otherwise that mode fits nothing and the search tries
    // every mode, which skipped orders and a bar would cut short.
    const bool own_mode = std::ranges::all_of(
        cut.replicas, [&](const ReplicaChoice& r) { return r.best.recompute == cut.dp_recompute; });
    ReplicaSearch how{.quick = true, .recompute = cut.dp_recompute, .permute = true,
                      .record = false, .max_orders = 2};
    if (own_mode) {
      how.searched_orders = 1;
      how.beat_ms = two_window_ms;
    }
    return m.search_replicas(batch, replica_microbatches(cut), cut.schedule, how).est_ms < two_window_ms;
  };
  for (const Choice& ranked_choice : ranked) {
    if (!ranked_choice.baseline_cut) continue;
    if (in_window(ranked_choice)) search_in_full(ranked_choice, ranked_choice.dp_recompute);
    // The baseline's own search tries every recompute mode. One lighter than the mode its
    // cut was sized for (the 1F1B rule) can fit the schedule that admits forwards by memory
    // alone, critical-path: packing-varlen's own plan ran its cut so at recompute none where
    // the cut was sized for selective, and beat dynapipe's at GPT-6.7B pp 8 2048 (2431.8 vs
    // 2437.3 ms). So each lighter mode whose quick estimate there comes within the window is
    // searched in full too (the heavier ones only add recomputation to a cut that fits).
    // A --recompute given is the one mode of every plan: no lighter one is tried.
    const ScheduleKind memory_bound =
        m.schedule != ScheduleKind::Auto ? m.schedule : ScheduleKind::CriticalPath;
    if (m.batching.recompute || ranked_choice.dp_recompute == Recompute::None ||
        (m.schedule == ScheduleKind::Auto &&
         std::ranges::count(auto_schedule_kinds(*m.cost), memory_bound) == 0)) {
      continue;  // a fixed mode, no lighter mode, or no critical-path (the cpu device)
    }
    const std::vector<std::vector<MicroBatch>> replicas = replica_microbatches(ranked_choice);
    for (Recompute lighter : {Recompute::None, Recompute::Selective}) {
      if (!(lighter < ranked_choice.dp_recompute)) break;
      // Where that mode fits no schedule (or none applies), the heavier ones were searched.
      // Only an estimate within the window matters: the builds stop there.
      unless_ruled_out([&] {
        const Choice quick =
            m.search_replicas(batch, replicas, memory_bound,
                              {.quick = true, .recompute = lighter, .other_modes = false,
                               .record = false, .beat_ms = window_ms});
        if (quick.est_ms < window_ms) {
          search_in_full(ranked_choice, lighter, /*other_modes=*/false, memory_bound);
        }
        return true;
      });
    }
  }
  // A cut the DP made for full recomputation is ranked by a quick search in that mode, but
  // the simulator often runs it in selective mode, which only a full search tries: under
  // auto the interleaved rule's cuts at T5-11B pp 8 dp 4 (A100-80 preset at 40 GiB, 1024,
  // 32k) ranked ~20% behind the best while the first of them ran 599.2 ms in full, as
  // `--schedule interleaved` finds. So the one such cut fastest in selective mode is
  // searched in full where that quick estimate beats the plan so far. (Re-ranking by it
  // instead pushed better cuts out of the three full searches.)
  if (!m.batching.recompute) {
    const Choice* lightest = nullptr;
    double lightest_ms = choice->est_ms;
    for (const Choice& ranked_choice : ranked) {
      if (ranked_choice.baseline_cut || ranked_choice.dp_recompute != Recompute::Full) continue;
      // Only a schedule row none of whose cuts was searched in full.
      if (std::ranges::any_of(searched, [&](const Searched& s) {
            return s.ranked_choice->schedule == ranked_choice.schedule;
          })) {
        continue;
      }
      const std::optional<Choice> quick = unless_ruled_out([&] {
        return m.search_replicas(batch, replica_microbatches(ranked_choice), ranked_choice.schedule,
                                 {.quick = true, .recompute = Recompute::Selective,
                                  .other_modes = false, .record = false, .beat_ms = lightest_ms});
      });
      if (quick && !quick->replicas.empty() && quick->est_ms < lightest_ms) {
        lightest = &ranked_choice;
        lightest_ms = quick->est_ms;
      }
    }
    if (lightest != nullptr) {
      search_in_full(*lightest, std::nullopt, true, std::nullopt, choice->est_ms);
    }
  }
  if (m.options.baseline_cuts && m.batching.strategy == Strategy::DynaPipe &&
      idle_share(*choice) > kTokenWalkIdleShare) {
    walk_token_budget(batch, &*choice, &baseline_full);
  }
  if (redeals) {
    if (std::optional<Choice> other = m.redeal(batch, *choice, choice->schedule, choice->est_ms)) {
      choice = std::move(other);
    }
  }
  // Random orders for the chosen plan and for the baseline cuts searched in full: given
  // the same search, packing-varlen's own plan beat the DP's at T5-11B pp 8 4096
  // (6813.0 vs 6834.8 ms), so dynapipe searches those cuts the same way.
  const Choice chosen_before = *choice;
  choice = with_random_orders(batch, std::move(*choice));
  for (Choice& full : baseline_full) {
    if (chosen_before.baseline_cut && same_cut(full, chosen_before)) continue;
    // Only orders that beat the plan so far matter: their builds stop there.
    Choice other = with_random_orders(batch, std::move(full), choice->est_ms);
    if (other.est_ms < choice->est_ms) choice = std::move(other);
  }
  // The DP sizes micro-batches to the 1F1B memory rule; schedules that keep more in
  // flight (zb1p, cyclic) may only fit smaller ones. Optionally also the DP under a
  // tighter activation budget (PlannerOptions::activation_budget_shares).
  for (double share : m.options.activation_budget_shares) {
    BatchingOptions tighter = m.batching;
    tighter.memory_limit_bytes =
        m.max_static_bytes +
        static_cast<std::int64_t>(share * static_cast<double>(m.memory_limit_bytes - m.max_static_bytes));
    try {
      Choice other = m.search(batch, tighter, m.schedule);
      if (other.est_ms < choice->est_ms) choice = std::move(other);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::Infeasible) throw;  // a sample alone no longer fits: skip
    }
  }
  return std::move(*choice);
}

Planner::Planner(const PlanConfig& config, const PlannerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  validate_config(config);
  for (double share : options.activation_budget_shares) {
    if (!(share > 0 && share < 1)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("activation budget share must be in (0, 1), got ", share));
    }
  }
  if (options.random_orders < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("random orders must be >= 0, got ", options.random_orders));
  }
  Impl& m = *impl_;
  m.config = config;
  m.options = options;
  m.schedule = config.schedule;
  if (config.strategy == Strategy::PackingMegatron && config.schedule == ScheduleKind::Auto) {
    m.schedule = ScheduleKind::OneFOneB;
  }
  CostModelOptions cost_options;
  cost_options.num_stages = config.pp;
  cost_options.tp = config.tp;
  cost_options.seqlen_multiple = config.seqlen_multiple;
  cost_options.layers = config.stage_layers;
  cost_options.zero_shards = config.zero == 1 ? config.dp : 1;
  m.base_cost = make_cost_model(config.cost_model, config.model, cost_options);
  m.cost = options.calibration ? make_calibrated_cost_model(m.base_cost, options.calibration)
                               : m.base_cost;

  // Interleaving keeps the chosen split: each device's layers are cut into chunks
  // (assign_layers_interleaved), so every device holds what the split gives it. The uniform
  // split keeps its uniform virtual stages.
  const std::vector<int> device_layers = layers_per_stage(m.base_cost->stages());
  const bool interleaving_possible =
      config.pp > 1 && *std::min_element(device_layers.begin(), device_layers.end()) >= kInterleavedChunks;
  // Replicated stages split each device's program by micro-batch (replicate_stages.h),
  // which interleaved chunks do not support.
  const bool wants_interleaved =
      m.schedule == ScheduleKind::Interleaved ||
      (m.schedule == ScheduleKind::Auto && !options.fixed_layout && config.stage_replicas.empty());
  if (config.schedule == ScheduleKind::Interleaved && !interleaving_possible) {
    throw Error(ErrorKind::Unsupported,
                cat("--schedule interleaved needs --pp >= 2 and at least ", kInterleavedChunks,
                    " layers on every stage (", config.model.name, " split ", join(device_layers, ","),
                    "), got --pp ", config.pp));
  }
  m.config.chunks = 1;
  if (wants_interleaved && interleaving_possible) {
    CostModelOptions interleaved_options = cost_options;
    interleaved_options.num_stages = config.pp * kInterleavedChunks;
    if (!config.stage_layers.empty()) {
      interleaved_options.layers = assign_layers_interleaved(config.model, device_layers, kInterleavedChunks);
    }
    m.interleaved_cost = make_cost_model(config.cost_model, config.model, interleaved_options);
    if (config.schedule == ScheduleKind::Interleaved) m.config.chunks = kInterleavedChunks;
  }

  m.memory_limit_bytes = config.memory_limit_gib > 0 ? gib_to_bytes(config.memory_limit_gib)
                                                     : m.cost->device().memory_bytes;
  if (config.memory_limit_gib <= 0) m.config.memory_limit_gib = bytes_to_gib(m.memory_limit_bytes);
  for (int stage = 0; stage < m.cost->num_stages(); ++stage) {
    const std::int64_t static_bytes = m.cost->static_bytes(stage);
    m.max_static_bytes = std::max(m.max_static_bytes, static_bytes);
    if (static_bytes >= m.memory_limit_bytes) {
      throw Error(ErrorKind::Infeasible,
                  cat("--memory-limit ", format_gib(m.memory_limit_bytes),
                      " must exceed the static memory of stage ", stage, " (",
                      format_gib(static_bytes),
                      " of parameters, gradients and optimizer states), got ",
                      format_gib(m.memory_limit_bytes)));
    }
  }

  BatchingOptions& b = m.batching;
  b.strategy = config.strategy;
  b.kind = config.model.kind;
  b.num_stages = config.pp;
  b.dp = config.dp;
  b.memory_limit_bytes = m.memory_limit_bytes;
  b.max_seqlen = config.max_seqlen;
  b.max_target_len = config.max_target_len > 0 ? config.max_target_len : config.max_seqlen;
  b.seqlen_multiple = config.seqlen_multiple;
  b.fixed_batch = config.micro_batch_size;
  b.token_budget = config.token_budget;
  b.recompute = config.recompute;
  b.validate();

  // DP strategies plan their cuts for the schedule: one DP per schedule family, each
  // searched with that schedule (the 1F1B rule with every schedule under auto).
  if (is_dp_strategy(b.strategy) && options.schedule_aware_dp && config.pp > 1) {
    const DpTarget zb{ScheduleKind::Zb1p, std::vector<int>(static_cast<std::size_t>(config.pp), config.pp),
                      zero_bubble_weight(*m.cost, b)};
    const bool interleaved = m.interleaved_cost != nullptr;
    const DpTarget il{ScheduleKind::Interleaved, interleaved_in_flight(config.pp, kInterleavedChunks),
                      1.0 / kInterleavedChunks};
    if (config.schedule == ScheduleKind::Zb1p) {
      b.in_flight = zb.in_flight;
      b.bubble_weight = zb.bubble_weight;
    } else if (config.schedule == ScheduleKind::Interleaved) {
      b.in_flight = il.in_flight;
      b.bubble_weight = il.bubble_weight;
    } else if (config.schedule == ScheduleKind::Auto) {
      m.more_targets.push_back(zb);
      if (interleaved) m.more_targets.push_back(il);
    }
  }
}

Planner::~Planner() = default;

const PlanConfig& Planner::config() const { return impl_->config; }
const CostModel& Planner::cost_model() const { return *impl_->cost; }
const CostModel& Planner::base_cost_model() const { return *impl_->base_cost; }

std::string Planner::extrapolation_warning() const {
  const PlanConfig& c = impl_->config;
  return impl_->base_cost->extrapolation_warning(c.max_seqlen, c.max_target_len > 0 ? c.max_target_len : c.max_seqlen);
}
const std::vector<StageLayers>& Planner::stage_layers() const {
  return impl_->config.chunks > 1 ? impl_->interleaved_cost->stages() : impl_->base_cost->stages();
}

IterationPlan Planner::plan_iteration(const GlobalBatch& batch) const {
  const Impl& m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  IterationPlan iteration;
  iteration.index = batch.index;
  iteration.truncated_ids = batch.truncated_ids;
  iteration.sample_ids.reserve(batch.samples.size());
  for (const Sample& s : batch.samples) iteration.sample_ids.push_back(s.id);

  Choice choice = m.choose(batch);
  std::int64_t real_tokens = 0, computed_tokens = 0;
  for (std::size_t r = 0; r < choice.replicas.size(); ++r) {
    const std::vector<MicroBatch>& microbatches = choice.replicas[r].microbatches;
    const std::vector<SearchCandidate>& candidates = choice.replicas[r].candidates;
    const SearchResult& best = choice.replicas[r].best;
    const SearchCandidate& chosen = candidates[best.candidate];
    const CostModel& stage_model =
        chosen.problem.layout.chunks > 1 ? *m.interleaved_cost : *m.cost;

    DYNAPIPE_CHECK(!m.config.recompute || best.recompute == *m.config.recompute,
                   cat("iteration ", batch.index, " planned recompute ", recompute_name(best.recompute),
                       " under --recompute ", recompute_name(*m.config.recompute)));
    ReplicaPlan replica;
    replica.microbatches = microbatches;
    replica.schedule = best.schedule;
    replica.recompute = best.recompute;
    replica.est_iteration_ms = best.sim.makespan_ms;
    replica.est_peak_memory_bytes = best.sim.peak_memory_bytes;
    replica.timeline = best.sim.timeline;
    for (const MicroBatch& mb : microbatches) {
      MicroBatchEstimate estimate;
      for (const StageCost& c : chosen.problem.costs[mb.id]) {
        estimate.fwd_ms.push_back(c.fwd_ms);
        estimate.bwd_ms.push_back(c.bwd_ms);
        estimate.activation_bytes.push_back(c.stored_bytes);
      }
      replica.estimates.push_back(std::move(estimate));
      real_tokens += mb.real_tokens;
      computed_tokens += mb.shape.tokens();
    }

    LoweringInput lowering;
    lowering.model = m.config.model.kind;
    lowering.hidden = m.config.model.hidden;
    lowering.layout = chosen.problem.layout;
    for (const MicroBatch& mb : microbatches) lowering.microbatches.push_back(mb.shape);
    lowering.stages = stage_model.stages();
    lowering.replica = static_cast<int>(r);
    lowering.dp = m.config.dp;
    lowering.order = &best.order;
    lowering.sim = &best.sim;
    replica.executors = lower_to_programs(lowering);
    if (best.order.weight_update != WeightUpdate::PerIteration) {
      add_weight_versions(replica.executors, best.order);
    }
    if (!m.config.stage_replicas.empty()) {
      // Estimates of the ranks as they run: makespan, and per stage its largest
      // stage-replica peak (est_peak_memory_bytes stays [device]).
      const SimResult ranks_sim =
          simulate_stage_replicas(chosen.problem, best.order, m.config.stage_replicas);
      replica.est_iteration_ms = ranks_sim.makespan_ms;
      std::size_t rank = 0;
      for (int d = 0; d < m.config.pp; ++d) {
        std::int64_t& peak = replica.est_peak_memory_bytes[static_cast<std::size_t>(d)];
        peak = 0;
        for (int a = 0; a < m.config.stage_replicas[d]; ++a) {
          peak = std::max(peak, ranks_sim.peak_memory_bytes[rank++]);
        }
      }
      replica.executors = replicate_stages(
          replica.executors,
          RankLayout{
              .pp = m.config.pp, .dp = m.config.dp, .stage_replicas = m.config.stage_replicas});
    }
    if (m.options.verify) {
      verify_replica(replica, chosen.problem, stage_model, m.memory_limit_bytes,
                     m.config.stage_replicas);
    }
    iteration.est_iteration_ms = std::max(iteration.est_iteration_ms, replica.est_iteration_ms);
    iteration.replicas.push_back(std::move(replica));
  }
  if (m.config.dp > 1) {
    // Gradient all-reduce after the last backward: the gradients of the largest stage.
    std::int64_t grad_bytes = 0;
    for (int s = 0; s < m.cost->num_stages(); ++s) grad_bytes = std::max(grad_bytes, m.cost->weight_bytes(s));
    iteration.est_iteration_ms += m.cost->allreduce_ms(grad_bytes, m.config.dp);
  }
  iteration.padding_efficiency =
      computed_tokens > 0 ? static_cast<double>(real_tokens) / computed_tokens : 0.0;
  iteration.planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return iteration;
}

TruncationLimits truncation_limits(const PlanConfig& config) {
  TruncationLimits limits;
  limits.kind = config.model.kind;
  limits.max_seqlen = config.max_seqlen;
  limits.max_target_len = config.max_target_len;
  return limits;
}

PlanSummary summarize(const std::vector<IterationPlan>& iterations) {
  PlanSummary summary;
  summary.iterations = static_cast<std::int64_t>(iterations.size());
  if (iterations.empty()) return summary;
  double total_ms = 0, planning_ms = 0;
  std::int64_t real_tokens = 0, computed_tokens = 0;
  std::vector<double> planning;
  for (const IterationPlan& it : iterations) {
    total_ms += it.est_iteration_ms;
    planning_ms += it.planning_ms;
    planning.push_back(it.planning_ms);
    for (const ReplicaPlan& r : it.replicas) {
      for (const MicroBatch& mb : r.microbatches) {
        real_tokens += mb.real_tokens;
        computed_tokens += mb.shape.tokens();
      }
    }
  }
  summary.mean_est_iteration_ms = total_ms / iterations.size();
  summary.est_tokens_per_s = total_ms > 0 ? real_tokens / (total_ms / 1000.0) : 0.0;
  summary.padding_efficiency =
      computed_tokens > 0 ? static_cast<double>(real_tokens) / computed_tokens : 0.0;
  summary.mean_planning_ms = planning_ms / iterations.size();
  summary.p99_planning_ms = percentile(planning, 0.99);
  return summary;
}

}  // namespace dynapipe
