// The plan of one iteration from the candidates: which cuts get a full search.
#include "planner_impl.h"
#include "searches_ahead.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "dynapipe/core/parallel.h"

namespace dynapipe {

using namespace planner_detail;

namespace {

// walk_token_budget() runs where the plan so far idles more than this share of its device
// time: fill and drain then rule, and the size of the micro-batches around the longest
// sample decides. Where any schedule could gain (schedules_can_gain()) the walk gained
// 0.3–1.9% at 6 of 60 issue-8-family plans, but cost T5-11B pp 8 65k plans (idle 0.33, no
// gain) +59% instructions with full searches, +25% with two orders each. Its walk of
// token-based's padded cuts, which costs most, only above kPaddedTokenWalkIdleShare: both
// walks ran above 0.5 until a plan idling 0.45 (T5-11B pp 8, A100 40 GiB preset, 2048,
// 16,384 tokens, third batch) ran 1730.1 ms against token-based's walked 1729.9; the varlen
// walk gives 1720.6, at +47% of that point's planning time (both walks: 2.8x, for no more
// gain there or at the random points).
constexpr double kTokenWalkIdleShare = 0.4, kPaddedTokenWalkIdleShare = 0.5;

// choose(): under auto, the fastest cut critical-path ran in full gets random orders where it
// came within this factor of the plan another schedule won.
constexpr double kCriticalPathOrdersWindow = 1.01;

// choose_ranked(): the baselines' cuts, each whose quick estimate is within kBaselineWindow
// of the best full result of the three (the padded cut left out, so that option never
// changes this choice), searched in its own recompute mode with permuted orders: those gain
// such a cut 3–4% over its quick estimate (T5-11B pp 8 at 4096, GPT-6.7B pp 8 at 4096),
// more than the quick ranking separates it from the DP's cuts; the other recompute modes
// changed no plan and cost 3× the search. The window was 2% and only the better-ranked
// cut was searched until the critical-path schedule, whose injection order the
// permutations choose: packing-varlen's own plan then beat dynapipe's at GPT-6.7B pp 8
// 4096 iteration 2 (2870.1 vs 2879.7 ms; its quick estimate 2986.4 was 3.7% above).
// 5% still left packing-varlen ahead at GPT-6.7B pp 4 80 GiB 8192 (bench/suite: 5636.5
// vs 5707.9 ms in iteration 0): 10%, at +40% planning time for T5-11B pp 8 short256.
// Where the devices idle little the orders matter less: 2% there (it was everywhere;
// GPT-6.7B pp 4 plans idle ~9%), which saves ~8% of their planning time and changed no
// issue-8 plan. Not with dp > 1, where the walked token budgets (rank_dp_plans()) give
// cuts whose permuted orders gain most: at GPT-6.7B pp 4 dp 4 (H100 preset, 80 GiB,
// 2048, 262,144 tokens) a 36-micro-batch cut ranked 1622.0 ms ran 1535.0 in full, which
// `--schedule critical-path` (its plan idling 0.17) searched and auto (0.14) did not;
// +4.7% of that plan's instructions.
constexpr double kBaselineWindow = 1.10;
constexpr double kLowIdleBaselineWindow = 1.02, kLowIdleShare = 0.15;

// Whether the baselines' cuts get the wide window (kBaselineWindow) against `plan`.
bool wide_baseline_window(const Choice& plan, int dp) { return idle_share(plan) > kLowIdleShare || dp > 1; }

}  // namespace

// token-based's own micro-batches, its token budget walked as its own plan walks it: by
// full searches. Where fill and drain rule, quick estimates cannot stand in for them
// (GPT-6.7B pp 8, A100 40 GiB, 8192, 16,384 tokens, the plan idling 0.81: they walked the
// budget up, token-based's full searches down to many short micro-batches around a lone
// 8192-token sample, 3816.3 ms against dynapipe's 3872.4). Two walks, one with the cuts
// as varlen rows and, where the plan idles more than kPaddedTokenWalkIdleShare, one padded
// as token-based runs them (the cost model need not price a varlen row below the same
// samples padded), each following its cuts' own times as
// token-based's walk does; a cut faster than the plan so far (`choice`) replaces it. Where
// only varlen cuts were walked, and only while they beat the plan, T5-11B pp 8 on the H100
// preset (40 GiB, 8192, 16,384 tokens, iteration 2) ran 915.6 ms and token-based's own
// plan, walked to 12 padded micro-batches, 894.3. Those cuts join `searched` for their
// random orders.
void Planner::Impl::walk_token_budget(const GlobalBatch& batch, Choice* choice,
                                      std::vector<Choice>* searched) const {
  const BatchingOptions theirs = as_baseline(batching, Strategy::TokenBased);
  const std::optional<BatchingResult> cut =
      unless_ruled_out([&] { return make_microbatches(batch, *cost, theirs); });
  if (!cut) return;
  // One walk per form: token-based's micro-batches as varlen rows, then padded as
  // token-based runs them (its own walk) where the plan idles more still. The cut's
  // simulated time where it beats to_beat_ms, else to_beat_ms (the walk stops there).
  const bool walk_padded = idle_share(*choice) > kPaddedTokenWalkIdleShare;
  for (const bool padded : {false, true}) {
    if (padded && !walk_padded) break;
    auto beats = [&](const BatchingResult& sized, double to_beat_ms) -> std::optional<double> {
      const std::vector<std::vector<MicroBatch>> replicas =
          padded ? sized.replicas : varlen_replicas(batch, sized, batching, *cost);
      return unless_ruled_out([&]() -> double {
        Choice c = search_replicas(batch, replicas, schedule, {.beat_ms = to_beat_ms});
        if (c.replicas.empty()) return to_beat_ms;
        c.batching = batching;
        c.dp_recompute = sized.recompute;
        c.baseline_cut = true;
        const double ms = c.est_ms;
        if (ms < choice->est_ms) *choice = c;
        searched->push_back(std::move(c));
        return ms;
      });
    };
    const std::optional<double> objective_ms = beats(*cut, std::numeric_limits<double>::infinity());
    if (!objective_ms) continue;
    walk_sizes(batch, theirs, cut->size, *objective_ms,
               [&](const BatchingOptions&, const BatchingResult& sized, double to_beat_ms) {
                 return beats(sized, to_beat_ms);
               });
  }
}

// The plan of one iteration: baselines search their one micro-batching; the DP strategies
// rank theirs quickly and search the three best in full (every recompute mode, permuted
// orders), keeping the faster.
Choice Planner::Impl::choose(const GlobalBatch& batch, int threads) const {
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
  // The steps from the ranked cuts, on this thread; on a second one the searches they will
  // likely need later (searches_ahead.h), the first of them already while the cuts are
  // ranked. On one thread the steps alone, as before.
  const bool helped = threads > 1;
  SearchesAhead ahead([&](const SearchesAhead::Search& s) {
    return m.search_replicas(batch, s.replicas, s.schedule, s.how);
  }, helped);
  std::vector<Choice> ranked = rank_dp_plans(batch, threads, &ahead);
  // A search queued there and not started is left to the steps, as on one thread.
  ahead.drop_queued();
  std::stable_sort(ranked.begin(), ranked.end(), ranks_before);
  std::optional<Choice> chosen;
  const std::vector<std::exception_ptr> errors = run_indexed(helped ? 2 : 1, threads, [&](std::size_t task) {
    if (task == 1) {
      ahead.serve();
      return;
    }
    const SearchesAhead::Closer closer{ahead};
    chosen = choose_ranked(batch, ranked, ahead);
  });
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return std::move(*chosen);
}

// The three best ranked cuts searched in full (every recompute mode, permuted orders), then
// the steps that may find a faster plan from the others.
Choice Planner::Impl::choose_ranked(const GlobalBatch& batch, const std::vector<Choice>& ranked,
                                    SearchesAhead& ahead) const {
  const Impl& m = *this;
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
  // Under auto, the fastest full search critical-path won on every replica (random orders
  // below).
  std::optional<Choice> critical_path_best;
  // Whether auto's schedules include critical-path (not on the cpu device).
  const bool auto_has_critical_path =
      std::ranges::count(auto_schedule_kinds(*m.cost), ScheduleKind::CriticalPath) > 0;
  // mode: only that recompute mode, orders permuted (other_modes: every mode if that one
  // fits no schedule); none given: every mode. schedule: the --schedule value searched
  // (none given: the choice's).
  // beat_ms: a result no faster than this is not needed and returns +inf
  // (search_replicas()). With a mode it also ends the search where that mode fits no
  // schedule (no fall-back to the others): given only where the mode is known to fit.
  // dynapipe-padded is the paper's formulation, Karmarkar–Karp's deal included (the
  // reference deals with prtpy's kk); dynapipe deals each cut searched in full again.
  const bool redeals = m.config.dp > 1 && m.batching.strategy == Strategy::DynaPipe;
  // The full search so far that covers `ranked_choice` in `mode` with `schedule`, or
  // nullptr. Under auto the zb1p rule often cuts what the 1F1B rule cut: a cut searched in
  // every mode with auto (every schedule) gives another schedule's search nothing faster.
  auto covering = [&](const Choice& ranked_choice, std::optional<Recompute> mode,
                      ScheduleKind schedule) -> const Searched* {
    for (const Searched& s : searched) {
      const bool covers = s.schedule == schedule || (!mode && s.schedule == ScheduleKind::Auto);
      if (s.mode == mode && covers && same_cut(*s.ranked_choice, ranked_choice)) return &s;
    }
    return nullptr;
  };
  // The best full search of a cut but a padded one: the schedule rows' steps measure their
  // own cuts against it, so that a padded cut winning among them closes no row and no look.
  double unpadded_best_ms = std::numeric_limits<double>::infinity();
  auto search_in_full = [&](const Choice& ranked_choice,
                            std::optional<Recompute> mode = std::nullopt,
                            bool other_modes = true,
                            std::optional<ScheduleKind> schedule_given = std::nullopt,
                            double beat_ms = std::numeric_limits<double>::infinity()) -> double {
    const ScheduleKind schedule = schedule_given.value_or(ranked_choice.schedule);
    if (const Searched* s = covering(ranked_choice, mode, schedule)) return s->est_ms;
    SearchCall call{replica_microbatches(ranked_choice), schedule, {.beat_ms = beat_ms}};
    if (mode) {
      call.how = {.quick = true, .recompute = *mode, .other_modes = other_modes, .permute = true, .beat_ms = beat_ms};
    }
    // A full search without a bar (the plan's first) tries every mode and schedule in
    // permuted orders, the quick estimate's among them: with that estimate as its bar, whose
    // own result then still counts, the builds stop there, and where nothing beats it (a
    // quick estimate from another problem) the search runs again without one. On one thread
    // only: on two the helper has run it ahead without a bar, which serves either call.
    // (T5-11B pp 8 short256: -2.4% plan instructions, GPT-6.7B pp 4 -1.4%.)
    const double below_estimate_ms = std::nextafter(ranked_choice.est_ms, std::numeric_limits<double>::infinity());
    Choice full;
    if (!mode && !ahead.helped() && below_estimate_ms < beat_ms) {
      SearchCall tried = call;
      tried.how.beat_ms = below_estimate_ms;
      full = ahead.search(tried);
      if (full.replicas.empty()) full = ahead.search(call);
    } else {
      full = ahead.search(call);
    }
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
    if (m.schedule == ScheduleKind::Auto && runs_critical_path(full) &&
        (!critical_path_best || est_ms < critical_path_best->est_ms)) {
      critical_path_best = full;
    }
    if (!ranked_choice.batching.varlen_padded_cut) unpadded_best_ms = std::min(unpadded_best_ms, est_ms);
    if (!choice || est_ms < choice->est_ms) choice = std::move(full);
    searched.push_back({&ranked_choice, schedule, mode, est_ms});
    return est_ms;
  };
  // The lone-sample cut is searched on top of the three best others when it ranks among
  // the three best (the baselines' cuts not counted), so adding it never pushes a plan out
  // of the full search (it did, before: T5-11B pp 8 on the H100 preset, 40 GiB, 4096,
  // 16,384 tokens, 670.2 → 680.6 ms). The padded cuts rank on another order than the
  // others (rank_dp_plans()): none takes a place among the three; the schedule rows' steps
  // measure their own cuts against the best full search of the others, and the cuts no step
  // searched are searched last where they beat the plan.
  // (A cut in a mode the DP did not pick, other_mode_cut, is searched last, below.)
  // searched_on_top() tells them.
  // Ahead, on a second thread: the baselines' cuts' searches in their own mode (below) for
  // those whose quick estimate is within the window of the best ranked cut's, which
  // the three's best full result, mostly below it, sets.
  const auto first_regular = std::ranges::find_if(
      ranked, [](const Choice& c) { return !c.baseline_cut && !c.batching.varlen_padded_cut; });
  if (ahead.helped() && first_regular != ranked.end()) {
    const double likely_window_ms =
        first_regular->est_ms *
        (wide_baseline_window(*first_regular, m.config.dp) ? kBaselineWindow : kLowIdleBaselineWindow);
    for (const Choice& ranked_choice : ranked) {
      if (!ranked_choice.baseline_cut || !(ranked_choice.est_ms < likely_window_ms)) continue;
      ahead.add({replica_microbatches(ranked_choice), ranked_choice.schedule,
                 {.quick = true, .recompute = ranked_choice.dp_recompute, .permute = true}});
    }
  }
  std::size_t others_searched = 0, rank = 0;
  std::set<const Choice*> merged;  // copies whose search an earlier copy ran with auto
  double others_best_ms = std::numeric_limits<double>::infinity();
  for (const Choice& ranked_choice : ranked) {
    // The padded cuts are searched in the schedule rows' steps or last (below), the
    // other-mode cuts last.
    if (ranked_choice.baseline_cut || ranked_choice.other_mode_cut || ranked_choice.batching.varlen_padded_cut) {
      continue;
    }
    // Each full search needs only to beat what its result is compared with: the
    // lone-sample cut the choice so far, the others the best of the others (it sets the
    // baseline cuts' window below), so builds stop there.
    if (searched_on_top(ranked_choice)) {
      if (rank++ < kFullSearches) {
        search_in_full(ranked_choice, std::nullopt, true, std::nullopt,
                       choice ? choice->est_ms : std::numeric_limits<double>::infinity());
      }
      continue;
    }
    // A copy of a cut whose search with auto (every schedule) ran for an earlier copy takes
    // no slot: that search was the earlier copy's, promoted below.
    if (merged.contains(&ranked_choice)) continue;
    if (++rank, others_searched++ == kFullSearches) break;
    // A cut ranked with one schedule whose copy (the same micro-batches, ranked later, as
    // another rule cut them) is ranked with auto is searched with auto now, once for both:
    // searching it with its schedule and then the copy with auto took two of the three
    // (GPT-6.7B pp 2, H100 preset, 80 GiB, 1024, 16,384 tokens: the zb1p and the 1F1B rules'
    // copies of one cut, and the zb1p rule's third cut, 684.4 ms in full in iteration 1 and
    // fourth, went unsearched: auto 707.3 ms over two iterations, `--schedule zb1p` 697.6).
    std::optional<ScheduleKind> promoted;
    if (ranked_choice.schedule != ScheduleKind::Auto) {
      for (const Choice& later : ranked) {
        if (&later == &ranked_choice || later.baseline_cut || later.schedule != ScheduleKind::Auto ||
            searched_on_top(later) || !same_cut(later, ranked_choice) || merged.contains(&later)) {
          continue;
        }
        promoted = ScheduleKind::Auto;
        merged.insert(&later);
        break;
      }
    }
    others_best_ms = std::min(others_best_ms, search_in_full(ranked_choice, std::nullopt, true,
                                                             promoted, others_best_ms));
  }
  // Ahead: the plan so far's random orders and critical-path search, which end
  // choose_ranked() where the plan stays this cut (the critical-path search's bar, the
  // plan's estimate, can only fall).
  if (ahead.helped() && choice) {
    for (SearchCall& s : m.random_order_searches(*choice, std::numeric_limits<double>::infinity())) {
      ahead.add(std::move(s));
    }
  }
  if (ahead.helped() && m.schedule == ScheduleKind::Auto && auto_has_critical_path && choice &&
      !runs_critical_path(*choice)) {
    ahead.add({replica_microbatches(*choice), ScheduleKind::CriticalPath, {.beat_ms = choice->est_ms}});
  }
  // The steps below measure against the best ranked cut but one searched on top or last (a
  // lone-sample or a padded cut, ...): adding such a cut must not close their windows on the
  // others (T5-11B pp 8 on the H100 preset, 40 GiB, 4096, 16,384 tokens: the lone-sample cut
  // ranked first at 893.8 ms, which left the 1F1B row's 1022.9, 827.4 in full, outside the
  // 5% window of the per-row searches).
  const auto front = std::ranges::find_if(ranked, [](const Choice& c) { return !searched_on_top(c); });
  const Choice& best_ranked = front != ranked.end() ? *front : ranked.front();
  const bool rows_gated = !(choice && idle_share(*choice) > kRuleStartsIdleShare &&
                            bottleneck_overhead(best_ranked) > kRuleStartsOverhead);
  if (m.schedule == ScheduleKind::Auto && choice && rows_gated) {
    // Where the gate below stays closed, each schedule row's best cut within
    // kOtherRuleWindow of the best quick estimate and not yet searched in full gets a look
    // in its own mode with its two first orders (as in_window() below gives the baseline
    // cuts), and a full search where that look beats the plan so far. The three best can
    // all be one row's cuts, which the full search gains little, while another row's cut
    // gains more than the ranking separates them: T5-11B pp 4 dp 2 on the measured H100
    // profile, 80 GiB, 1024, 65,536 tokens, where the plan idles 8%: the three best were
    // interleaved cuts (1449.2 ms by quick estimate, 1445.3 in full), the zb1p rule's best
    // ranked fifth at 1474.0 and ran 1427.4 in its organ-pipe order, which `--schedule zb1p`
    // found and auto did not (iteration 0: 1451.6 against 1440.4 ms). Costs the
    // 262,144-token and T5-11B short256 plans 2.5% and 3.6% of their instructions, the
    // other planner_bench plans ≤ 0.6%.
    const double best_quick_ms = best_ranked.est_ms;
    std::map<std::pair<ScheduleKind, bool>, bool> row_seen;  // (schedule, padded cut)
    for (const Choice& ranked_choice : ranked) {
      if (ranked_choice.baseline_cut || ranked_choice.other_mode_cut || ranked_choice.named_schedule_form) continue;
      const bool padded = ranked_choice.batching.varlen_padded_cut;
      if (std::exchange(row_seen[{ranked_choice.schedule, padded}], true)) continue;
      if (!(ranked_choice.est_ms <= best_quick_ms * kOtherRuleWindow)) continue;
      if (covering(ranked_choice, std::nullopt, ranked_choice.schedule) != nullptr) continue;
      const double bar_ms = padded ? choice->est_ms : std::min(others_best_ms, unpadded_best_ms);
      const std::optional<Choice> look = unless_ruled_out([&] {
        return m.search_replicas(batch, replica_microbatches(ranked_choice), ranked_choice.schedule,
                                 {.quick = true, .recompute = ranked_choice.dp_recompute, .permute = true,
                                  .record = false, .max_orders = 2, .beat_ms = bar_ms});
      });
      if (!look || !(look->est_ms < bar_ms)) continue;
      const double ms = search_in_full(ranked_choice, std::nullopt, true, std::nullopt,
                                       padded ? choice->est_ms : others_best_ms);
      if (!padded) others_best_ms = std::min(others_best_ms, ms);
    }
  }
  if (m.schedule == ScheduleKind::Auto && choice && !rows_gated) {
    // And each schedule row's best cut and best padded cut (the 1F1B rule's, searched with
    // every schedule; the zb1p and interleaved rules'), where the quick estimate is within
    // kRuleWindow of the best, the plan so far idles more than kRuleStartsIdleShare and the
    // best ranked cut leaves a schedule more than kRuleStartsOverhead to win: quick
    // estimates favour zb1p over critical-path, whose gain comes from the injection orders
    // only the full search permutes, so the three best can all be zb1p cuts while
    // --schedule critical-path plans faster. (Where the plan idles less these searches
    // changed no plan of the random points or the issue-8 settings, and cost GPT-6.7B pp 4
    // 65k plans 3.5% of their instructions.)
    const double best_quick_ms = best_ranked.est_ms;
    // A row's next cuts (up to kFullSearches, as its named schedule searches them) only
    // while its searches come within kCloseRow of the plan so far (GPT-6.7B pp 4 on the
    // measured H100 profile, 40 GiB, 8192: the zb1p rule's third cut 1839.8 ms against
    // 1861.4; every row's three regardless cost T5-11B pp 8 65k +16% instructions).
    constexpr double kCloseRow = 1.01;
    // Per row (schedule, padded cut): its cuts taken so far; kFullSearches closes it.
    std::map<std::pair<ScheduleKind, bool>, std::size_t> taken;
    for (const Choice& ranked_choice : ranked) {
      if (ranked_choice.baseline_cut || ranked_choice.other_mode_cut || ranked_choice.named_schedule_form) continue;
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
      if (!(ms <= (padded ? choice->est_ms : unpadded_best_ms) * kCloseRow)) row_taken = kFullSearches;
    }
  }
  // The baselines' cuts, then, each whose quick estimate is within the window
  // (kBaselineWindow) of the best full result of the three (the padded cut left out, so that
  // option never changes this choice), searched in its own recompute mode with permuted
  // orders.
  const double base_ms = std::isfinite(others_best_ms) ? others_best_ms : choice->est_ms;
  const bool wide_window = wide_baseline_window(*choice, m.config.dp);
  const double window_ms = base_ms * (wide_window ? kBaselineWindow : kLowIdleBaselineWindow);
  // A baseline cut's quick estimate runs its micro-batches as the baseline lists them;
  // outside the window it is judged again in its two first orders, as listed and the
  // organ pipe (micro_batch_orders()), which alone gains such a cut up to 6% (GPT-6.7B
  // pp 8 4096): without it packing-varlen's own plan beat dynapipe's at GPT-6.7B pp 4
  // 4096 iterations 0 and 2 (5870.1 vs 5886.4 ms; quick estimate 2.5% above the window's
  // base, as listed and organ pipe 0.3% below). Where the devices idle little that look
  // must beat the three's best, not only come within the window (+5% planning, not +15%).
  const double two_window_ms = wide_window ? window_ms : base_ms;
  auto in_window = [&](const Choice& cut) {
    if (cut.est_ms < window_ms) return true;
    // Where its ranking ran in its own mode (which then fits in the given order), the given
    // order is that ranking's, already outside the window: only the organ pipe runs, its
    // builds stopping at the window. Otherwise that mode fits nothing and the search tries
    // every mode, which skipped orders and a bar would cut short.
    const bool own_mode = runs_in_own_mode(cut);
    ReplicaSearch how{.quick = true, .recompute = cut.dp_recompute, .permute = true,
                      .record = false, .max_orders = 2};
    if (own_mode) {
      how.searched_orders = 1;
      how.beat_ms = two_window_ms;
    }
    return m.search_replicas(batch, replica_microbatches(cut), cut.schedule, how).est_ms < two_window_ms;
  };
  // With one replica a baseline cut's search in one mode needs only beat the plan so far:
  // its builds stop there. Without a bar every order ran to its end where the plan was far
  // ahead (T5-11B pp 8 short256: packing-varlen's cut, 2.2 ms of a ~16 ms plan). The bar
  // leaves unknown only what a result above it would have told the random orders below
  // (its time and idle share): those whose search found nothing (`barred`) get their random
  // orders against the plan, ungated. Given only where the mode cannot fall back to others
  // (a finite bar ends that): the ranking ran in it, or no fall-back is asked. With several
  // replicas the random orders need each one's time: no bar.
  struct BarredCut {
    const Choice* cut;
    Recompute mode;
    ScheduleKind schedule;
  };
  std::vector<BarredCut> barred;
  auto search_baseline_in_full = [&](const Choice& cut, Recompute mode, bool other_modes, ScheduleKind schedule,
                                     bool mode_fits) {
    const bool bar = m.config.dp == 1 && (mode_fits || !other_modes);
    const double bar_ms = bar ? choice->est_ms : std::numeric_limits<double>::infinity();
    const double ms = search_in_full(cut, mode, other_modes, schedule, bar_ms);
    if (bar && !(ms < bar_ms) && std::ranges::none_of(barred, [&](const BarredCut& b) {
          return b.mode == mode && b.schedule == schedule && same_cut(*b.cut, cut);
        })) {
      barred.push_back({&cut, mode, schedule});
    }
  };
  for (const Choice& ranked_choice : ranked) {
    if (!ranked_choice.baseline_cut) continue;
    if (in_window(ranked_choice)) {
      search_baseline_in_full(ranked_choice, ranked_choice.dp_recompute, true, ranked_choice.schedule,
                              runs_in_own_mode(ranked_choice));
    }
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
        (m.schedule == ScheduleKind::Auto && !auto_has_critical_path)) {
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
          search_baseline_in_full(ranked_choice, lighter, /*other_modes=*/false, memory_bound, false);
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
      if (ranked_choice.baseline_cut || ranked_choice.other_mode_cut || ranked_choice.named_schedule_form ||
          ranked_choice.dp_recompute != Recompute::Full) {
        continue;
      }
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
  choice = with_random_orders(batch, std::move(*choice), std::numeric_limits<double>::infinity(), &ahead);
  for (Choice& full : baseline_full) {
    if (chosen_before.baseline_cut && same_cut(full, chosen_before)) continue;
    // Only orders that beat the plan so far matter: their builds stop there.
    Choice other = with_random_orders(batch, std::move(full), choice->est_ms);
    if (other.est_ms < choice->est_ms) choice = std::move(other);
  }
  // And the barred ones (above): on one replica a result's random orders run in its mode,
  // each build against the plan, as here.
  for (const BarredCut& b : barred) {
    if (m.options.random_orders <= 0) break;
    if (chosen_before.baseline_cut && same_cut(*b.cut, chosen_before)) continue;
    Choice other = m.search_replicas(batch, replica_microbatches(*b.cut), b.schedule,
                                     {.quick = true, .recompute = b.mode, .permute = true,
                                      .random_orders = m.options.random_orders,
                                      .searched_orders = SearchOptions{}.max_orders,
                                      .beat_ms = choice->est_ms});
    if (other.replicas.empty() || !(other.est_ms < choice->est_ms)) continue;
    other.batching = b.cut->batching;
    other.dp_recompute = b.cut->dp_recompute;
    other.baseline_cut = true;
    choice = std::move(other);
  }
  // Under auto, where another schedule won, the fastest DP cut critical-path ran in full gets
  // random orders too when it came within kCriticalPathOrdersWindow of the plan: the orders
  // are critical-path's to gain from, and `--schedule critical-path` gives them to that cut.
  // T5-11B pp 8 on the measured H100 profile, 80 GiB, 2048, 16,384 tokens (uniform split),
  // iteration 1: a zb1p plan at 434.2 ms won over the 1F1B rule's 7-micro-batch cut under
  // critical-path at 434.7, which random orders took to 431.5 under `--schedule critical-path`.
  if (critical_path_best && !critical_path_best->baseline_cut && !runs_critical_path(chosen_before) &&
      critical_path_best->est_ms <= chosen_before.est_ms * kCriticalPathOrdersWindow) {
    Choice other = with_random_orders(batch, std::move(*critical_path_best), choice->est_ms);
    if (other.est_ms < choice->est_ms) choice = std::move(other);
  }
  // Last, the cuts in the modes the DP did not pick (rank_dp_plans(); other_mode_cut) that rank
  // among the three best regular cuts: each searched in full, dealt again and given random
  // orders as the plan was, and taken only where it then beats the finished plan. Searched
  // with the three, one that won there moved the later steps' bars and gates, and the plan
  // they finished came out slower at 12 of 654 random dp > 1 points (dynapipe-padded, T5-11B
  // pp 8 dp 4, A100-40G preset, 1024, 65,536 tokens: 1053.6 -> 1061.5 ms).
  // And so the padded cuts not searched in full by now whose quick estimate beats the plan
  // (that estimate takes the better of two orders, the other cuts' their sorted one:
  // rank_dp_plans()).
  std::size_t regular_ahead = 0;
  for (const Choice& ranked_choice : ranked) {
    if (ranked_choice.baseline_cut) continue;
    if (ranked_choice.batching.varlen_padded_cut) {
      if (!(ranked_choice.est_ms < choice->est_ms) ||
          covering(ranked_choice, std::nullopt, ranked_choice.schedule) != nullptr) {
        continue;
      }
    } else if (!ranked_choice.other_mode_cut) {
      ++regular_ahead;
      continue;
    } else if (regular_ahead >= kFullSearches) {
      continue;
    }
    const std::vector<std::vector<MicroBatch>> replicas = replica_microbatches(ranked_choice);
    Choice full =
        m.search_replicas(batch, replicas, ranked_choice.schedule, {.beat_ms = choice->est_ms});
    if (redeals) {
      const double bar = full.replicas.empty() ? choice->est_ms : full.est_ms;
      if (std::optional<Choice> other = m.redeal(batch, ranked_choice, ranked_choice.schedule, bar)) {
        full = std::move(*other);
      }
    }
    if (full.replicas.empty()) continue;  // it could not beat the plan
    full.batching = ranked_choice.batching;
    full.dp_recompute = ranked_choice.dp_recompute;
    if (redeals) {  // as the plan's own was, once more
      if (std::optional<Choice> again = m.redeal(batch, full, full.schedule, full.est_ms)) {
        full = std::move(*again);
      }
    }
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
  // Last, under auto, the plan with critical-path too where another schedule ran it: a rule's
  // cut is ranked and searched with that rule's schedule, and critical-path, which admits
  // forwards by memory, can run it faster in an injection order only its full search
  // permutes. GPT-6.7B pp 8 on the measured H100 profile, 40 GiB, 2048, 65,536 tokens
  // (uniform split): the zb1p rule's padded cut of 21 micro-batches ran 825.7 ms for
  // iteration 0 under zb1p, and the same cut 820.9 under `--schedule critical-path`. Last,
  // so that no step above measures against it: searched before the baselines' cuts, it
  // moved their bars, and two dp 4 plans came out up to 0.6% slower. Costs GPT-6.7B pp 4 65k
  // plans 1.7% of their instructions, T5-11B pp 8 short256 3.3%; a quick look with
  // critical-path first, to skip the full search, cost more (3.0% and 4.9%).
  if (m.schedule == ScheduleKind::Auto && auto_has_critical_path && !runs_critical_path(*choice)) {
    // A copy: search_in_full() reads the cut while it may replace *choice.
    const Choice chosen = *choice;
    search_in_full(chosen, std::nullopt, true, ScheduleKind::CriticalPath, chosen.est_ms);
  }
  return std::move(*choice);
}

}  // namespace dynapipe
