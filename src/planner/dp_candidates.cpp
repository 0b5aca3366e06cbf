// The DP strategies' candidate cuts, each ranked by a quick search.
#include "planner_impl.h"
#include "searches_ahead.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <ranges>
#include <utility>

#include "dynapipe/batching/head_tail.h"
#include "dynapipe/batching/varlen_regroup.h"

namespace dynapipe {

using namespace planner_detail;

namespace {

// rank_dp_plans(): the DP with lone samples held to fitting alone runs where 1 to p samples
// are such (count_lone_samples()). Each one critical-path runs alone stalls the others'
// admission; where many are (GPT-6.7B pp 4 at 40 GiB, 2048: ~20 of ~140 samples), the cut
// changed no issue-8 plan and cost 5% of a 65,536-token plan's instructions.
bool lone_samples_may_gain(int lone, int pp) { return lone >= 1 && lone <= pp; }

}  // namespace

// The DP strategies' micro-batchings, each ranked by a quick search: one DP per memory
// rule planned for (and, for dynapipe, per varlen order), the best of each order again
// with a head and a tail, and a line search on the bubble weight of the best.
std::vector<Choice> Planner::Impl::rank_dp_plans(const GlobalBatch& batch, int threads,
                                                  SearchesAhead* ahead) const {
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
  // The baselines' cuts (below) do not depend on the DPs: on several threads they are
  // ranked beside the first pass's other DP group and the steps after it
  // (rank_from_first_pass), into a list of their own, which joins `ranked` where one
  // thread ranks them.
  std::vector<Choice> baseline_ranked;
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
  auto rank_cut = [&](Strategy baseline, const BatchingResult& cut,
                      std::vector<Choice>& into) -> std::optional<double> {
    std::vector<std::vector<std::vector<MicroBatch>>> forms;
    if (baseline == Strategy::DynaPipePadded) {
      forms.push_back(cut.replicas);  // its padded rows, dense
    } else {
      forms.push_back(varlen_replicas(batch, cut, m.batching, *m.cost));
      if (baseline == Strategy::PackingVarlen) {
        std::vector<std::vector<MicroBatch>> own;  // its rows, a lone sample as dynapipe runs it
        for (const std::vector<MicroBatch>& replica : cut.replicas) {
          own.push_back(with_lone_samples_dense(replica, *m.cost));
        }
        if (own != forms.front()) forms.push_back(std::move(own));
      }
    }
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
        Choice choice = m.quick_search(batch, form, m.schedule, cut.recompute, &into);
        choice.batching = m.batching;
        choice.dp_recompute = cut.recompute;
        return choice;
      });
      ranked_cuts.emplace_back(std::move(form), c ? std::optional(c->est_ms) : std::nullopt);
      if (!c) continue;
      c->baseline_cut = true;
      keep(c->est_ms);
      into.push_back(std::move(*c));
    }
    return best_ms;
  };
  // `baseline_cache`: the baselines' sorted order, packed rows and sample checks, shared by
  // their cuts and walks (and with the DPs on one thread).
  auto rank_baseline_cuts = [&](std::vector<Choice>& into, BatchingCache& baseline_cache) {
    for (const auto& [baseline, by_objective] :
         {std::pair{Strategy::PackingVarlen, true}, std::pair{Strategy::PackingVarlen, false},
          std::pair{Strategy::TokenBased, true}}) {
      BatchingOptions theirs = as_baseline(m.batching, baseline);
      theirs.size_by_objective = by_objective;
      const std::optional<BatchingResult> cut =
          unless_ruled_out([&] { return make_microbatches(batch, *m.cost, theirs, &baseline_cache); });
      if (!cut) continue;
      const std::optional<double> ms = rank_cut(baseline, *cut, into);
      if (!by_objective || !ms) continue;
      // token-based's budget is walked only with dp > 1: at dp 1 that took T5-11B pp 8 65k
      // plans from 15.6 to 23 ms (more baseline cuts searched in full) for dynapipe plans at
      // most 2% faster. With dp > 1 the DP's objective only estimates how the replicas deal
      // the micro-batches (as for the other modes' cuts below), and token-based's walked
      // budget can deal better: GPT-6.7B pp 4 dp 4, A100 40 GiB, 4096, 65,536 tokens on
      // joint's split 7,8,9,8 (bench/random_points.py strategies --seed 9 --partition
      // joint), 5 to 6 micro-batches per replica planned iteration 0 in 1855.2 ms,
      // token-based's 8 to 9 in 1736.1. No size past a miss (patience 0): +27% and +19%
      // plan instructions at GPT-6.7B pp 4 dp 4 4096 and T5-11B pp 8 dp 2 2048 (+52% and
      // +31% with packing-varlen's patience of one).
      if (!(baseline == Strategy::PackingVarlen || m.config.dp > 1)) continue;
      // Sizes that fit only in a heavier recompute mode than the objective's too, as
      // packing-varlen's own walk takes them: at T5-11B pp 4 (A100 80 GiB, 1024, 32,768
      // tokens) its 2-row micro-batches under selective recompute planned 2678.2 ms against
      // dynapipe's 2699.1 until dynapipe ranked them (2640.8); +4% instructions for a
      // GPT-6.7B pp 4 65k plan (it was +10% before the full searches stopped at their bars).
      // Under auto one size past a miss (patience): quick estimates are noisier than
      // packing-varlen's full searches (GPT-6.7B pp 4, H100 80 GiB, 1024, 262,144 tokens: 9
      // rows ranked 1.1% behind 8, its own walk went on to 10, 1% ahead of dynapipe until it
      // ranked 10 too); +4.8% instructions for a GPT-6.7B pp 4 65k plan. Not under a named
      // schedule: there it found cuts that auto's three full searches pass over (T5-11B pp 4,
      // H200 profile, 80 GiB, 1024, 262,144 tokens: interleaved 9102.1 ms, auto 9105.0).
      const int patience = m.schedule == ScheduleKind::Auto && baseline == Strategy::PackingVarlen ? 1 : 0;
      m.walk_sizes(batch, theirs, cut->size, *ms,
                   [&](const BatchingOptions&, const BatchingResult& sized, double) -> std::optional<double> {
                     return rank_cut(baseline, sized, into);
                   }, patience, &baseline_cache);
    }
  };
  BatchingCache cache;  // segment costs shared by every DP below
  const bool baseline_task = threads > 1 && varlen && m.options.baseline_cuts;
  // The first pass's results (first_dp_pass()), which the steps below extend.
  std::size_t rules = 0;
  std::vector<Choice> ranked;
  std::vector<std::size_t> best_of_order, rule_of, order_of;
  // With dp > 1 under auto recompute, the first rule's cuts (dynapipe's in the sorted order)
  // in the other two modes as well: there the DP's objective only estimates how the
  // replicas deal the micro-batches and how the schedule runs them, so the mode it ranks
  // best need not be (T5-11B pp 8 dp 2 on the measured H100 profile, 40 GiB, 1024, 65,536
  // tokens: the DP's pick, no recomputation in 31 micro-batches, ranked 883.0 ms; its
  // full-recompute cut, 10 micro-batches, 780.2; dynapipe planned 794.5 ms against
  // `--recompute full`'s 764.0, dynapipe-padded 900.0 against 835.2). Ranked last, tried
  // against the finished plan at the end of choose(), and no other step starts from them:
  // letting the line search start there moved it off a better start (GPT-6.7B pp 8 dp 2,
  // A100-40G preset, 2048, 65,536 tokens: 1285.8 -> 1295.7 ms).
  // dynapipe-padded at dp = 1 too, where it gains up to 1.1% (T5-11B pp 4, A100-80G, 80 GiB,
  // 1024); dynapipe's DPs there cost +8% to +21% planning instructions for ≤ 0.2%.
  // The fastest ranked cut by quick estimate, the forms for a rule's own schedule left out
  // (no step starts from them), and the padded cut (ranked on its better of two orders).
  auto best = [&] {
    auto found = ranked.end();
    for (auto it = ranked.begin(); it != ranked.end(); ++it) {
      if (it->named_schedule_form || it->batching.varlen_padded_cut) continue;
      if (found == ranked.end() || it->est_ms < found->est_ms) found = it;
    }
    return found;
  };
  // On two threads the baselines' task ends well before the steps from the first pass
  // (T5-11B pp 8 short256: ~3.5 ms before). choose_ranked() starts with full searches of
  // the best ranked cuts (the first with no bar, the second with the first's result; a
  // full search with no bar serves either, searches_ahead.h), and once the head-and-tail
  // forms are ranked its first two are, mostly, the two best by then (every plan of the
  // four `threads2` benchmarks, by a throwaway counter): both are queued there, and that
  // task runs them when its own work ends, each only while the steps still run, so the
  // end of the ranking waits for at most the one it started. Where a later step ranks
  // another cut first one goes unused, on a thread that idled.
  // The baselines' task waits for that point only while the steps run: they reach it or
  // end (by an error too: `then`'s guard below), so the wait ends.
  constexpr std::size_t kFullSearchesAhead = 2;
  const bool ahead_helped = ahead != nullptr && ahead->helped();
  enum class Steps { NotStarted, Running, Queued, Ended };
  std::atomic<Steps> steps{Steps::NotStarted};
  auto set_steps = [&](Steps to) {
    steps = to;
    steps.notify_all();
  };
  auto queue_full_searches = [&] {
    if (ahead_helped) {
      // As choose_ranked() takes them: the cuts that get a full search slot, best first.
      std::vector<const Choice*> order;
      for (const Choice& c : ranked) {
        if (!c.baseline_cut && !searched_on_top(c)) order.push_back(&c);
      }
      std::ranges::stable_sort(order, [](const Choice* a, const Choice* b) { return ranks_before(*a, *b); });
      for (std::size_t i = 0; i < std::min(order.size(), kFullSearchesAhead); ++i) {
        ahead->add({replica_microbatches(*order[i]), order[i]->schedule, {}});
      }
    }
    set_steps(Steps::Queued);
  };
  std::vector<Choice> other_mode_cuts;
  // The steps from the first pass's cuts: other modes, lone samples, heads and tails, the
  // bubble-weight line search and the padded cut.
  auto rank_from_first_pass = [&] {
    if (!m.batching.recompute && !m.batching.mixed_recompute && (m.config.dp > 1 || !varlen)) {
      for (const Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        if (mode == ranked.front().dp_recompute) continue;
        BatchingOptions fixed = plans.front().first;
        fixed.recompute = mode;
        std::optional<Choice> c = unless_ruled_out(
            [&] { return m.search(batch, fixed, plans.front().second, true, &cache, &ranked); });
        if (!c) continue;
        c->other_mode_cut = true;
        other_mode_cuts.push_back(std::move(*c));
      }
    }
    if (varlen && !m.batching.recompute && m.config.pp > 1 && ranked.front().dp_recompute != Recompute::None &&
        (m.schedule == ScheduleKind::Auto || m.schedule == ScheduleKind::CriticalPath) &&
        lone_samples_may_gain(count_lone_samples(batch, *m.cost, plans.front().first, m.config.pp), m.config.pp)) {
      // The 1F1B rule forced a heavier recompute mode than none: often a few long samples
      // that cannot keep p − s copies in flight. critical-path admits forwards by memory, so
      // it can run such a sample alone while the others wait: the sorted order's DP again
      // without recomputation, a lone sample held to fitting alone (lone_samples_alone;
      // docs/batching.md, "Lone samples"). GPT-6.7B pp 2 on the H100 preset, 80 GiB, 8192,
      // 65,536 tokens: every cut ran full recompute, 3655.8 ms for iteration 0, while
      // token-based, walking its budget, ran 19 micro-batches without recomputation under
      // critical-path in 3425.0; this cut runs 3199.5.
      BatchingOptions lone = plans.front().first;
      lone.lone_samples_alone = true;
      lone.recompute = Recompute::None;
      // Ranked with critical-path alone: the other schedules keep p − s in flight or more.
      std::optional<Choice> c = unless_ruled_out(
          [&] { return m.search(batch, lone, ScheduleKind::CriticalPath, true, &cache, &ranked); });
      if (c) {
        ranked.push_back(std::move(*c));
        rule_of.push_back(0);
        order_of.push_back(best_of_order.size());  // an order of its own, no head and tail
      }
    }
    if (varlen && m.options.head_and_tail) {
      // Each order's best cuts again with small micro-batches first and last
      // (batching/head_tail.h); and each rule's best cut of an order where its own recompute
      // mode fit no schedule: the DP's memory rule let it fill the devices, and a heavier mode
      // ran it, while small micro-batches in fill and drain can let its own mode fit (T5-11B
      // pp 4, A100 80 GiB preset, 512, 262,144 tokens: the interleaved rule's cuts ran in full
      // recompute, 26,124.4 ms, their head-and-tail form in selective, 20,018.4; that rule was
      // not its order's best under auto, so auto planned 23,295.5 ms against
      // `--schedule interleaved`'s 19,929.2).
      std::vector<std::size_t> head_tail_of = best_of_order;
      const std::size_t dp_cuts = ranked.size();
      std::map<std::pair<std::size_t, std::size_t>, std::size_t> rule_best;  // (order, rule) → its best cut
      for (std::size_t k = 0; k < dp_cuts; ++k) {
        const auto [best_k, first] = rule_best.try_emplace({order_of[k], rule_of[k]}, k);
        if (!first && ranked[k].est_ms < ranked[best_k->second].est_ms) best_k->second = k;
      }
      // Under auto, also each rule's best cut of each order that its own schedule ran
      // fastest, where the order's best idles more than kRuleStartsIdleShare and the cut ranks
      // within kRuleWindow of it (the 1F1B rule, where critical-path ran it) or
      // kOtherRuleWindow (the zb1p and interleaved rules): a named schedule plans from its
      // own rule's cuts only, and the head-and-tail form of a cut another rule beat by quick
      // estimate can still run fastest. GPT-6.7B pp 8, A100 80 GiB preset, 4096, 262,144
      // tokens (uniform split): the zb1p rule's cut of the packed order ranked 10,182.0 ms,
      // the 1F1B rule's 10,190.1, and auto planned iteration 0 in 9690.7 ms where `--schedule
      // critical-path` ran the 1F1B rule's head-and-tail forms, 9631.5; GPT-6.7B pp 4, H100
      // preset, 80 GiB, 8192, 131,072 tokens, iteration 1: the 1F1B rule's cuts ranked ~5 ms
      // ahead of the zb1p rule's, whose head-and-tail form `--schedule zb1p` ran in 3124.3 ms
      // against auto's 3145.0. Without the schedule and idle gates GPT-6.7B pp 4 65k plans
      // cost +12.6% instructions, T5-11B pp 8 short256 +3.9%.
      std::vector<std::size_t> named_schedule_forms;
      for (std::size_t k = 0; k < dp_cuts; ++k) {
        if (rule_best.at({order_of[k], rule_of[k]}) != k || std::ranges::count(head_tail_of, k) > 0) {
          continue;
        }
        if (!runs_in_own_mode(ranked[k])) {
          head_tail_of.push_back(k);
          continue;
        }
        // (The lone-sample cut is an order of its own, without a best of order.)
        if (m.schedule != ScheduleKind::Auto || order_of[k] >= best_of_order.size()) continue;
        const Choice& order_best = ranked[best_of_order[order_of[k]]];
        // The 1F1B rule's cuts run with every schedule, the others with their own.
        const bool own_schedule = rule_of[k] != 0 || runs_critical_path(ranked[k]);
        const double window = rule_of[k] == 0 ? kRuleWindow : kOtherRuleWindow;
        if (own_schedule && idle_share(order_best) > kRuleStartsIdleShare &&
            ranked[k].est_ms <= order_best.est_ms * window) {
          named_schedule_forms.push_back(k);
        }
      }
      // These forms come last, flagged: they take no full search from the others and no step
      // starts from them.
      const std::size_t named_schedule_forms_from = head_tail_of.size();
      head_tail_of.insert(head_tail_of.end(), named_schedule_forms.begin(), named_schedule_forms.end());
      for (std::size_t h = 0; h < head_tail_of.size(); ++h) {
        const std::size_t k = head_tail_of[h];
        const Choice& base = ranked[k];
        std::vector<std::vector<MicroBatch>> replicas;
        for (const ReplicaChoice& replica : base.replicas) {
          replicas.push_back(split_head_and_tail(batch, replica.microbatches, *m.cost,
                                                 base.dp_recompute, m.batching));
        }
        // Such a form of a cut already ranked (the zb1p rule's cut is often the 1F1B rule's)
        // would only take a full search on top from a form that differs: not searched.
        const bool named_schedule_form = h >= named_schedule_forms_from;
        if (named_schedule_form && ranks_cut(ranked, replicas)) continue;
        // (Such a form can fit no schedule in any mode, its head and tail adding micro-batches
        // in flight: it is then left out.)
        std::optional<Choice> other = unless_ruled_out(
            [&] { return m.quick_search(batch, replicas, base.schedule, base.dp_recompute, &ranked); });
        if (!other) continue;
        other->named_schedule_form = named_schedule_form;
        other->batching = base.batching;
        other->dp_recompute = base.dp_recompute;
        rule_of.push_back(rule_of[k]);
        ranked.push_back(std::move(*other));
      }
    }
    // The cuts the steps below start from: the best plan, and under auto each other rule's
    // best near it (kRuleWindow). A fixed --schedule starts them from its own rule's best,
    // and auto must find what that finds (GPT-6.7B pp 8 on the H100 preset, 80 GiB, 1024,
    // 262,144 tokens: the 1F1B rule's best, 3193.1 ms by quick estimate, line-searched to
    // 3135.2 and its padded cut planned 3051.6 in full with critical-path, while every step
    // from the zb1p rule's best stopped at auto's 3077.7).
    // The fastest cut by quick estimate that is not a lone-sample one (of `rule`, if given),
    // among the DP cuts ranked so far.
    auto best_regular = [&](std::optional<std::size_t> rule = std::nullopt) {
      std::optional<std::size_t> found;
      for (std::size_t k = 0; k < rule_of.size(); ++k) {
        if (ranked[k].batching.lone_samples_alone || ranked[k].named_schedule_form || (rule && rule_of[k] != *rule)) {
          continue;
        }
        if (!found || ranked[k].est_ms < ranked[*found].est_ms) found = k;
      }
      return found;
    };
    auto regular_starts = [&] {
      const std::size_t overall = static_cast<std::size_t>(best() - ranked.begin());
      std::vector<std::size_t> starts{overall};
      // A lone-sample cut's steps come on top of the others', which start from the best other
      // cut as they would without it (T5-11B pp 8 on the H100 preset, 40 GiB, 4096, 16,384
      // tokens: the lone-sample cut ranked first and took the 1F1B rule's line search, whose
      // cut had planned 823.6 ms for iteration 1; 854.5 without it).
      const std::optional<std::size_t> regular = best_regular();
      if (!regular) return starts;
      if (*regular != overall) starts.push_back(*regular);
      if (!schedules_can_gain(ranked[*regular])) {
        // Where the gates below stay closed, still the 1F1B rule's best when critical-path
        // ran it and it comes within kOtherRuleWindow: the full search, which permutes
        // critical-path's injection orders, gains most over its quick estimate, and a named
        // critical-path line-searches that rule. GPT-6.7B pp 8, A100-40 preset, 512, 131,072
        // tokens (uniform split; idle 0.19, overhead 0.03): the zb1p rule's best ranked 0.8%
        // ahead, and auto planned iteration 1 in 4281.7 ms where `--schedule critical-path`
        // line-searched the 1F1B rule to β = 1/4 and ran its padded cut, 4222.5. Without the
        // critical-path gate T5-11B pp 8 short256 plans paid +40% instructions. (dynapipe
        // only: dynapipe-padded, whose cuts the new start's copies displaced from the full
        // searches, planned GPT-6.7B pp 2 dp 2 at 1024 0.24% slower in one iteration.)
        const std::optional<std::size_t> first_rule = best_regular(0);
        if (varlen && m.schedule == ScheduleKind::Auto && first_rule && rule_of[*regular] != 0 &&
            runs_critical_path(ranked[*first_rule]) &&
            ranked[*first_rule].est_ms <= ranked[*regular].est_ms * kOtherRuleWindow) {
          starts.push_back(*first_rule);
        }
        return starts;
      }
      for (std::size_t rule = 0; rule < rules; ++rule) {
        const std::optional<std::size_t> rule_best = best_regular(rule);
        const double window = rule == 0 ? kRuleWindow : kOtherRuleWindow;
        if (rule != rule_of[*regular] && rule_best &&
            ranked[*rule_best].est_ms <= ranked[*regular].est_ms * window) {
          starts.push_back(*rule_best);
        }
      }
      return starts;
    };
    // Under auto, also the best lone-sample cut where it comes within kOtherRuleWindow of the
    // best: critical-path alone runs it, and `--schedule critical-path`, where it ranks first,
    // line-searches it. GPT-6.7B pp 2, A100-80 preset, 80 GiB, 2048, 16,384 tokens (uniform
    // split): the lone-sample cut ranked 0.9% behind the zb1p rule's best, which auto ran in
    // 1992.0 ms for iteration 1; critical-path's line search took the lone-sample cut to β =
    // 1/2 and planned 1972.1.
    auto rule_starts = [&] {
      std::vector<std::size_t> starts = regular_starts();
      if (m.schedule != ScheduleKind::Auto) return starts;
      std::optional<std::size_t> lone;
      for (std::size_t k = 0; k < ranked.size(); ++k) {
        if (ranked[k].batching.lone_samples_alone && !ranked[k].named_schedule_form &&
            (!lone || ranked[k].est_ms < ranked[*lone].est_ms)) {
          lone = k;
        }
      }
      if (lone && std::ranges::count(starts, *lone) == 0 &&
          ranked[*lone].est_ms <= ranked[starts.front()].est_ms * kOtherRuleWindow) {
        starts.push_back(*lone);
      }
      return starts;
    };
    queue_full_searches();
    if (m.options.schedule_aware_dp && m.config.pp > 1) {
      // Up to two steps from ranked[k], β times `factor` each, while the simulation
      // improves; whether one did.
      auto walk_bubble_weight = [&](std::size_t k, double factor) {
        // What the steps need of ranked[k], copied: the pushes below can move it.
        const ScheduleKind schedule = ranked[k].schedule;
        const std::size_t rule = rule_of[k];
        BatchingOptions again = ranked[k].batching;
        double est = ranked[k].est_ms;
        bool improved = false;
        for (int step = 0; step < 2; ++step) {
          again.bubble_weight = std::clamp(again.bubble_weight * factor, 0.01, 16.0);
          std::optional<Choice> c =
              unless_ruled_out([&] { return m.search(batch, again, schedule, true, &cache, &ranked); });
          if (!c || !(c->est_ms < est)) break;
          est = c->est_ms;
          ranked.push_back(std::move(*c));
          rule_of.push_back(rule);
          improved = true;
        }
        return improved;
      };
      // DP ↔ simulation: a line search on the bubble weight of the best plan's memory rule.
      // (p − 1)·max t only approximates what a schedule loses to fill, drain and unequal
      // micro-batches, so the DP runs again with β doubled (smaller micro-batches) and, if
      // that did not help, halved; each step continues while the simulation improves.
      const std::vector<std::size_t> starts = rule_starts();
      for (std::size_t k : starts) {
        if (!walk_bubble_weight(k, 2.0)) walk_bubble_weight(k, 0.5);
      }
      // And the interleaved rule's best cut with β halved (larger micro-batches), whatever its
      // rank, where the best plan leaves the devices' work unequal (kInterleavedStartsImbalance)
      // and that rule cut the batch into many more micro-batches than the best plan
      // (kInterleavedHalvingCount): interleaving evens the devices out, but that rule's DP at
      // β = 1/chunks can cut too finely. (T5-11B pp 8 short256 plans, whose stages are as
      // unequal, paid +25% instructions for this step without the count gate, and +9% for the
      // whole line search and padded cut instead, for no gain: their interleaved cut holds
      // 1.2–1.6× the best's micro-batches.) Or where the best plan's makespan runs far past
      // its busiest device's work (kInterleavedStartsOverhead): interleaving shortens fill and
      // drain, which then lets larger, cheaper micro-batches win.
      auto microbatches = [&](std::size_t k) {
        std::size_t count = 0;
        for (const ReplicaChoice& replica : ranked[k].replicas) count += replica.microbatches.size();
        return static_cast<double>(count);
      };
      const std::optional<std::size_t> regular = best_regular();
      std::optional<std::size_t> interleaved_best;
      for (std::size_t rule = 0; rule < rules; ++rule) {
        if (plans[rule].second == ScheduleKind::Interleaved) interleaved_best = best_regular(rule);
      }
      if (regular && interleaved_best && std::ranges::count(starts, *interleaved_best) == 0 &&
          ((stage_imbalance(ranked[*regular]) > kInterleavedStartsImbalance &&
            microbatches(*interleaved_best) > kInterleavedHalvingCount * microbatches(*regular)) ||
           bottleneck_overhead(ranked[*regular]) > kInterleavedStartsOverhead)) {
        walk_bubble_weight(*interleaved_best, 0.5);
      }
    }
    if (varlen && m.options.padded_cut) {
      // dynapipe-padded's cut of the best plan's rule, run varlen: more, length-homogeneous
      // micro-batches than the varlen DP makes, each no slower than dynapipe-padded's own
      // (docs/batching.md "Padded cuts").
      for (std::size_t k : rule_starts()) {
        const ScheduleKind schedule = ranked[k].schedule;  // copied: the push below can move it
        BatchingOptions padded_cut = ranked[k].batching;
        padded_cut.varlen_order = VarlenOrder::Sorted;
        padded_cut.varlen_row_capacity = false;
        padded_cut.varlen_padded_cut = true;
        // And its recompute mode: the padded DP cannot be pruned by the varlen incumbent, so
        // each extra mode is a full DP (T5-11B pp 8 short256: ~8% of the plan).
        if (!padded_cut.recompute) padded_cut.recompute = ranked[k].dp_recompute;
        // Ranked on the better of its sorted order and its organ pipe (as choose_ranked()
        // looks at the baselines' cuts again): sorted, its longest micro-batches fill or
        // drain the pipeline alone, and the padding penalty makes them many and small, which
        // the organ pipe gains most. As sorted it was ranked out of the full searches at
        // gpt-tiny pp 2 on the CPU model (2048, 16,384 tokens, first batch: 2840.1 ms,
        // eighth), where dynapipe planned 2654.7 against dynapipe-padded's 2638.0 for the
        // same cut dense; in the organ pipe it ranks 2610.2 and the full search keeps it.
        // The other cuts are ranked as sorted, so no window is measured from this estimate
        // (best() above, choose_ranked()), and choose_ranked() searches the cut last, where
        // this estimate beats the plan.
        std::optional<Choice> c = unless_ruled_out([&] {
          const BatchingResult cut = make_microbatches(batch, *m.cost, padded_cut, &cache);
          Choice choice = m.search_replicas(batch, cut.replicas, schedule,
                                            {.quick = true, .recompute = cut.recompute, .permute = true,
                                             .record = false, .max_orders = 2});
          choice.dp_recompute = cut.recompute;
          choice.cut_size = cut.size;
          choice.batching = padded_cut;
          return choice;
        });
        if (c) ranked.push_back(std::move(*c));
      }
    }
  };
  // The first pass (one DP per plan), then the steps from its cuts; on several threads the
  // baselines' cuts beside them.
  m.first_dp_pass(batch, plans, threads, cache,
                  baseline_task ? std::function<void()>([&] {
                    BatchingCache baseline_cache;  // this task's own: the DPs run beside it
                    rank_baseline_cuts(baseline_ranked, baseline_cache);
                    if (!ahead_helped) return;
                    steps.wait(Steps::Running);
                    ahead->serve_queued([&] { return steps == Steps::Queued; });
                  })
                                : std::function<void()>(),
                  [&](FirstPass first) {
                    set_steps(Steps::Running);
                    const struct StepsEnd {
                      decltype(set_steps)& set;
                      ~StepsEnd() { set(Steps::Ended); }
                    } steps_end{set_steps};
                    rules = first.rules;
                    ranked = std::move(first.ranked);
                    best_of_order = std::move(first.best_of_order);
                    rule_of = std::move(first.rule_of);
                    order_of = std::move(first.order_of);
                    rank_from_first_pass();
                  });
  if (varlen && m.options.baseline_cuts) {
    if (baseline_task) {
      for (Choice& c : baseline_ranked) ranked.push_back(std::move(c));
    } else {
      rank_baseline_cuts(ranked, cache);
    }
    if (m.cost->varlen_costs_extra()) {
      // Where varlen rows cost more than the same rows dense (a profile's fixed varlen
      // cost), dynapipe-padded's own cut, run dense as it runs it: T5-11B pp 4 dp 4 on the
      // H200 profile, 80 GiB, 8192, 32,768 tokens, where each replica's few short
      // micro-batches pay the decoder's fixed varlen cost, dynapipe planned 1112.0 ms
      // against dynapipe-padded's 1100.6 (bench/random_points.py strategies --card h200,
      // seed 8). Without such a cost the varlen form is never dearer: not ranked.
      BatchingOptions padded = as_baseline(m.batching, Strategy::DynaPipePadded);
      auto rank_padded = [&]() -> std::optional<double> {
        const std::optional<BatchingResult> cut =
            unless_ruled_out([&] { return make_microbatches(batch, *m.cost, padded); });
        return cut ? rank_cut(Strategy::DynaPipePadded, *cut, ranked) : std::nullopt;
      };
      std::optional<double> best_ms = rank_padded();
      const double best_ranked_ms = best()->est_ms;
      if (best_ms && *best_ms <= best_ranked_ms * kOtherRuleWindow &&
          m.options.schedule_aware_dp && m.config.pp > 1) {
        // And, where it ranks near the best, with its bubble weight walked as
        // dynapipe-padded's own plan walks it (β doubled, else halved, up to twice while the
        // estimate improves): T5-11B pp 8 on the H200 profile, 80 GiB, 1024, 16,384 tokens,
        // where dynapipe-padded's β = 2 cut planned iteration 1 in 351.4 ms and dynapipe,
        // ranking only its β = 1 cut (the best ranked), 359.9 (random_points.py strategies
        // --card h200, seed 20). Walked wherever it ranked, it cost T5-11B pp 8 65k plans on
        // that profile +20% instructions.
        const double start = padded.bubble_weight;
        for (const double factor : {2.0, 0.5}) {
          padded.bubble_weight = start;
          bool improved = false;
          for (int step = 0; step < 2; ++step) {
            padded.bubble_weight = std::clamp(padded.bubble_weight * factor, 0.01, 16.0);
            const std::optional<double> ms = rank_padded();
            if (!ms || !(*ms < *best_ms)) break;
            best_ms = ms;
            improved = true;
          }
          if (improved) break;
        }
      }
    }
  }
  for (Choice& c : other_mode_cuts) ranked.push_back(std::move(c));
  return ranked;
}

}  // namespace dynapipe
