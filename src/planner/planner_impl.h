// Private to planner/: the planner's search state (Planner::Impl) and the plan candidates
// its steps pass between them. planner.cpp builds an Impl and lowers its choice;
// replica_search.cpp searches schedules for a cut, dp_candidates.cpp cuts and ranks the
// DP strategies' candidates, choose.cpp picks the plan of one iteration, choice.cpp holds
// what the steps ask of a candidate.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "dynapipe/batching/batching.h"
#include "dynapipe/core/error.h"
#include "dynapipe/planner/planner.h"
#include "dynapipe/schedule/schedule_search.h"

namespace dynapipe {
namespace planner_detail {

class SearchesAhead;  // searches_ahead.h

// Chunks per device under the interleaved schedule (its virtual stages: pp × chunks).
constexpr int kInterleavedChunks = 2;

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
  // SearchOptions::abandon: the result is then dropped (searches_ahead.h).
  const std::atomic<bool>* abandon = nullptr;
  bool operator==(const ReplicaSearch&) const = default;
};

// One search_replicas() call: each replica's micro-batches, the schedule, the options.
struct SearchCall {
  std::vector<std::vector<MicroBatch>> replicas;
  ScheduleKind schedule = ScheduleKind::Auto;
  ReplicaSearch how;
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
  // One of rank_dp_plans()'s cuts in a recompute mode the DP did not pick (auto recompute;
  // dynapipe at dp > 1, dynapipe-padded at any dp): tried against the finished plan at the
  // end of choose() and left out of every other step.
  bool other_mode_cut = false;
  // A head-and-tail form auto ranks for the sake of a rule's own schedule (rank_dp_plans()):
  // searched in full on top of the three best where it ranks among them, and no other step
  // starts from it.
  bool named_schedule_form = false;
};

// What rank_dp_plans()'s first pass (Planner::Impl::first_dp_pass()) found: its cuts in
// plan order, and what the later steps ask of them.
struct FirstPass {
  std::size_t rules = 0;                   // the memory rules planned for: plans[0 .. rules) sorted
  std::vector<Choice> ranked;              // the plans' cuts that fit, in plan order
  std::vector<std::size_t> best_of_order;  // per order: index into ranked
  std::vector<std::size_t> rule_of;        // per cut: the rule (plans[rule]) it was cut for
  std::vector<std::size_t> order_of;       // per cut: its order (index into best_of_order)
};

// A schedule the DP strategies plan their micro-batches for: its memory rule and bubble
// weight (docs/batching.md, "Schedule-aware DP"), and the schedule name the search then
// tries on them ("auto": every schedule).
struct DpTarget {
  ScheduleKind schedule = ScheduleKind::Auto;
  std::vector<int> in_flight;  // empty: 1F1B's p − s
  double bubble_weight = 1.0;
};

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

// What search_replicas() returns where some replica cannot beat its bar: no replicas,
// est_ms +inf (ReplicaSearch::beat_ms).
Choice nothing_found(ScheduleKind schedule);
// Each replica's micro-batches of a choice, as search_replicas() takes them.
std::vector<std::vector<MicroBatch>> replica_microbatches(const Choice& choice);
// Whether two plans run the same micro-batches, replica by replica.
bool same_cut(const Choice& a, const Choice& b);
// Whether choose_ranked() searches this ranked cut in full on top of the three best
// others, not in one of their slots: the padded, lone-sample and other-mode cuts and the
// forms ranked for a rule's own schedule.
bool searched_on_top(const Choice& c);
// Whether some choice of `ranked` runs exactly these micro-batches (any schedule or mode).
bool ranks_cut(const std::vector<Choice>& ranked, const std::vector<std::vector<MicroBatch>>& replicas);
// The ranked choice whose quick search ran on these micro-batches with this schedule and
// recompute mode, or nullptr (choice.cpp).
const Choice* same_quick_search(const std::vector<Choice>& ranked,
                                const std::vector<std::vector<MicroBatch>>& replicas,
                                ScheduleKind schedule, Recompute recompute);
// makespan ÷ the busiest device's busy time − 1, the most over replicas.
double bottleneck_overhead(const Choice& choice);
// 1 − Σ busy / (devices · makespan) of the slowest replica.
double idle_share(const Choice& choice);
// The busiest device's busy time ÷ the mean device's − 1, the most over replicas: how
// unequal the layer split leaves the devices' work.
double stage_imbalance(const Choice& choice);
// Under auto the interleaved rule's best cut is cut again with its bubble weight halved
// whatever its quick estimate and the gates above, where the best plan's devices work this
// unequally: interleaving gives each device two chunks of layers, which evens out a split
// the stages' layers leave unequal, and its rule's cut can rank far behind until its bubble
// weight is line-searched (T5-11B pp 4, uniform split, on the H200 profile, 80 GiB, 1024,
// 262,144 tokens: imbalance 0.23, the interleaved rule's cut 10,275.8 ms by quick
// estimate, 9,105.0 with half its bubble weight, where auto planned 9,189.6 against
// `--schedule interleaved`'s 9,064.8 for 2 iterations; 216 micro-batches against the best
// plan's 120), where that rule cut more than kInterleavedHalvingCount times the best plan's
// micro-batches (a halved β cuts fewer, larger ones).
constexpr double kInterleavedStartsImbalance = 0.15, kInterleavedHalvingCount = 1.7;
// The same step where the best plan's makespan exceeds its busiest device's work by more
// than this (bottleneck_overhead): fill and drain dominate, which interleaving halves, and
// its rule's DP at β = 1/chunks still prices them as 1F1B's and cuts small micro-batches
// (T5-11B pp 8, uniform split, H100 preset, 40 GiB, max seqlen 512, 262,144 tokens; bench/
// random_points.py schedules seed 40: overhead 0.36, the interleaved rule's best 4% behind
// by quick estimate at 33 micro-batches; halving β twice gives 16 larger ones, whose
// fixed costs weigh less in full recompute: auto planned iteration 0 in 4,881.5 ms against
// `--schedule interleaved`'s 4,707.8). At 0.2 it changed no plan of bench/issue8_points.sh
// nor of `random_points.py strategies` seeds 51–80, and no planner_bench plan's instructions.
constexpr double kInterleavedStartsOverhead = 0.2;
// Whether another schedule of `choice`'s kind of cut could still gain enough to search the
// other rules' cuts as a named schedule would (kRuleStartsIdleShare, kRuleStartsOverhead).
bool schedules_can_gain(const Choice& choice);
// Whether every replica's search ran in the recompute mode its cut was made for (else that
// mode fit no schedule and a heavier one ran).
bool runs_in_own_mode(const Choice& choice);
// Whether every replica's search picked critical-path.
bool runs_critical_path(const Choice& choice);
// The ranking's order: by the estimate, then the other replicas' makespans, slowest first.
bool ranks_before(const Choice& a, const Choice& b);
bool is_dp_strategy(Strategy strategy);
// The strategies of a fixed rows-per-micro-batch (BatchingOptions::size_by_objective).
bool sizes_rows(Strategy strategy);
// `ours` as `baseline` plans itself: its 1F1B memory rule, bubble weight 1.
BatchingOptions as_baseline(BatchingOptions ours, Strategy baseline);
// A baseline's cut with each micro-batch as one varlen row (as_varlen_microbatches()).
std::vector<std::vector<MicroBatch>> varlen_replicas(const GlobalBatch& batch, const BatchingResult& cut,
                                                     const BatchingOptions& options,
                                                     const CostModel& cost_model);
// The size next to `size` of a baseline's micro-batches, up (direction 1) or down (−1);
// nullopt past the range.
std::optional<std::int64_t> next_size(Strategy strategy, std::int64_t size, int direction);
// `options` at one size (next_size()): rows per micro-batch or token budget.
BatchingOptions with_size(BatchingOptions options, std::int64_t size);

}  // namespace planner_detail

struct Planner::Impl {
  using Choice = planner_detail::Choice;
  using DpTarget = planner_detail::DpTarget;
  using ReplicaSearch = planner_detail::ReplicaSearch;

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
  // The schedule kind that won the last schedule search (-1: none yet), searched first in
  // the next, zb1p after it (SearchOptions::search_first): it mostly wins again (zb1p 75% of
  // a T5-11B pp 8 short256 plan's quick searches, critical-path 80% of GPT-6.7B pp 4's).
  // Only the work depends on it, never a result, so threads may share it.
  mutable std::atomic<int> last_winner{-1};

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
  // threads: how many one plan may use (resolved, >= 1; rank_dp_plans()).
  Choice choose(const GlobalBatch& batch, int threads) const;
  // choose()'s steps from the DP strategies' ranked cuts (ranks_before() order); `ahead`
  // runs some of their searches on a second thread (searches_ahead.h).
  Choice choose_ranked(const GlobalBatch& batch, const std::vector<Choice>& ranked,
                       planner_detail::SearchesAhead& ahead) const;
  // bar_ms: the random orders need only beat this too (a plan the result is compared with).
  // ahead: where given, its searches run through it (searches_ahead.h).
  Choice with_random_orders(const GlobalBatch& batch, Choice choice,
                            double bar_ms = std::numeric_limits<double>::infinity(),
                            planner_detail::SearchesAhead* ahead = nullptr) const;
  // The searches with_random_orders() runs for `choice` and bar_ms (none: it keeps the choice).
  std::vector<planner_detail::SearchCall> random_order_searches(const Choice& choice, double bar_ms) const;
  // make_search_candidates() for one recompute mode: only that mode's problems are costed.
  std::vector<SearchCandidate> own_mode_candidates(ScheduleKind schedule,
                                                   std::span<const MicroBatch> microbatches,
                                                   Recompute recompute) const;
  // On `threads` > 1 the first DPs of the sorted and the packed orders run side by side,
  // the baselines' cuts beside them and beside the steps from their cuts; the list is what
  // one thread gives. `ahead` (where given, and helped): the full searches choose_ranked()
  // will likely start with, of the two best cuts once the head-and-tail forms are ranked,
  // are queued there, and the baselines' task runs them once its work ends, each while the
  // steps still run.
  std::vector<Choice> rank_dp_plans(const GlobalBatch& batch, int threads,
                                    planner_detail::SearchesAhead* ahead = nullptr) const;
  // rank_dp_plans()'s first pass: a quick search of each plan's DP cut (plans[k]: options
  // and the schedule searched), the interleaved rule's later orders skipped where it lost
  // clearly on the sorted order; `then` gets the cuts that fit, in plan order. On `threads`
  // > 1 the sorted order's DPs and the packed rows' run side by side, `beside` (if given)
  // as a third task on the thread that ends its group first, and `then` on the thread that
  // ends its group last; on one thread the groups, `then` and `beside` run in that order.
  // `cache` is the sorted order's, and holds every sequence's rows from `then` on. Throws
  // the first plan's errors, then `then`'s, then `beside`'s.
  void first_dp_pass(const GlobalBatch& batch,
                     const std::vector<std::pair<BatchingOptions, ScheduleKind>>& plans, int threads,
                     BatchingCache& cache, const std::function<void()>& beside,
                     const std::function<void(planner_detail::FirstPass)>& then) const;
  void walk_token_budget(const GlobalBatch& batch, Choice* choice, std::vector<Choice>* searched) const;
  std::optional<Choice> redeal(const GlobalBatch& batch, const Choice& from, ScheduleKind schedule,
                               double beat_ms) const;
  // redeal() with one bubble weight; skips deals in `dealt_before` and adds its own.
  std::optional<Choice> redeal_by(const GlobalBatch& batch, const Choice& from,
                                  ScheduleKind schedule, double beat_ms, double bubble_weight,
                                  std::vector<std::vector<std::vector<int>>>* dealt_before) const;
  template <typename Score>
  void walk_sizes(const GlobalBatch& batch, const BatchingOptions& options, std::int64_t from,
                  double from_ms, Score&& score, int patience = 0, BatchingCache* cache = nullptr) const;
};

// A baseline's micro-batch sizes next to the objective's `from` (rows, or token-based's
// token budget: next_size()), as a practitioner sweeps the size: upward while
// score(options, cut) improves on the size before it, and downward only if the first size
// up did not improve on `from_ms`. score(options, cut, to_beat_ms) returns the cut's
// simulated time, a value not below to_beat_ms where it cannot beat that (the size before
// it: only then does the walk go on), or nullopt where no schedule fits it; a size that
// fits no recompute mode under the pipelined memory rule ends that direction (the most
// that fit in the objective's mode can be fewer: heavier recompute fits more). The
// simulated time has one minimum over the size at every point measured (docs/batching.md,
// "The baselines' micro-batch size"). With `patience` > 0 a direction goes on past that
// many sizes in a row that did not improve on the best before them (each scored against
// that best), for scores noisier than a full search (quick estimates). `cache` (optional)
// is make_microbatches()'s.
template <typename Score>
void Planner::Impl::walk_sizes(const GlobalBatch& batch, const BatchingOptions& options,
                               std::int64_t from, double from_ms, Score&& score, int patience,
                               BatchingCache* cache) const {
  for (const int direction : {1, -1}) {
    double previous_ms = from_ms;
    bool improved = false;
    int misses = 0;
    for (std::optional<std::int64_t> size = planner_detail::next_size(options.strategy, from, direction); size;
         size = planner_detail::next_size(options.strategy, *size, direction)) {
      const BatchingOptions sized = planner_detail::with_size(options, *size);
      const std::optional<BatchingResult> cut =
          planner_detail::unless_ruled_out([&] { return make_microbatches(batch, *cost, sized, cache); });
      if (!cut || cut->one_in_flight) break;  // past the sizes the pipelined rule fits
      const std::optional<double> ms = score(sized, *cut, previous_ms);
      if (!ms) break;
      if (!(*ms < previous_ms)) {
        if (++misses > patience) break;
        continue;
      }
      previous_ms = *ms;
      improved = true;
      misses = 0;
    }
    if (improved) break;
  }
}

}  // namespace dynapipe
