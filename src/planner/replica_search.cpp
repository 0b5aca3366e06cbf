// The schedule searches of one cut: quick, full, with random orders, dealt again.
#include "planner_impl.h"
#include "searches_ahead.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "dynapipe/batching/replica_balancer.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/schedule/schedule.h"

namespace dynapipe {

using namespace planner_detail;

namespace {

// choose(): the best plan's cut is searched again with random micro-batch orders
// (PlannerOptions::random_orders) where its devices idle more than this share of the
// makespan. At the issue-8 points the shares are 0.09 (GPT-6.7B pp 4) to 0.47 (GPT-6.7B
// pp 8 at 8192); a gate at 0.15 changed no plan there, one at 0.1 one point by 0.06%.
constexpr double kRandomOrdersIdleShare = 0.2;

}  // namespace

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
      choice.other_mode_cut = false;
      choice.named_schedule_form = false;
      return choice;
    }
  }
  return search_replicas(batch, replicas, schedule,
                         {.quick = true, .recompute = recompute, .record = false});
}

std::vector<SearchCandidate> Planner::Impl::own_mode_candidates(
    ScheduleKind schedule, std::span<const MicroBatch> microbatches, Recompute recompute) const {
  return make_mode_candidates(schedule, *cost, interleaved_cost.get(), microbatches, recompute,
                              config.pp, memory_limit_bytes, config.mixed_recompute,
                              /*mix_only=*/true);
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
    // Copied into the choice only if the search finds one (many searches cannot beat
    // their bar, and a copy is two allocations per micro-batch).
    const std::vector<MicroBatch>& microbatches = replicas[r];
    if (microbatches.empty()) {
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
    search_options.abandon = how.abandon;
    if (const int kind = m.last_winner.load(std::memory_order_relaxed); kind >= 0) {
      search_options.search_first = {static_cast<ScheduleKind>(kind), ScheduleKind::Zb1p};
    }
    auto with_vertical_sync = [&](std::vector<SearchCandidate> candidates) {
      // The candidates of one problem share it: each problem copied once.
      std::shared_ptr<const PipelineProblem> from, to;
      for (SearchCandidate& c : candidates) {
        if (c.problem->vertical_sync == m.config.vertical_sync) continue;
        if (c.problem != from) {
          from = c.problem;
          PipelineProblem synced = *from;
          synced.vertical_sync = m.config.vertical_sync;
          to = std::make_shared<const PipelineProblem>(std::move(synced));
        }
        c.problem = to;
      }
      return candidates;
    };
    auto all_candidates = [&] {
      std::vector<SearchCandidate> candidates =
          make_search_candidates(schedule, *m.cost, m.interleaved_cost.get(),
                                 microbatches, m.config.pp, m.memory_limit_bytes,
                                 m.config.mixed_recompute);
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
            with_vertical_sync(m.own_mode_candidates(schedule, microbatches, how.recompute));
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
    if (!replica.best.found) return nothing_found(schedule);  // it cannot beat beat_ms
    replica.microbatches = microbatches;
    m.last_winner.store(static_cast<int>(replica.best.schedule), std::memory_order_relaxed);
    choice.est_ms = std::max(choice.est_ms, replica.best.sim.makespan_ms);
    choice.replicas.push_back(std::move(replica));
  }
  return choice;
}

// Where a plan still leaves a large share of its devices idle (fill, drain and stalls
// between unequal micro-batches), the order of its micro-batches matters more than the few
// cluster orders the full search tries: its cut again in its chosen recompute mode, every
// schedule of its row, with seeded random orders too (the winners move 1F1B plans to zb1p;
// docs/batching.md "Random orders where the bubble is large"). Every strategy gets it, so
// that no baseline is compared without the search its rival had.
std::vector<SearchCall> Planner::Impl::random_order_searches(const Choice& choice, double bar_ms) const {
  if (options.random_orders <= 0 || !(idle_share(choice) > kRandomOrdersIdleShare)) return {};
  const Recompute mode = choice.replicas.front().best.recompute;
  const bool one_mode = std::ranges::all_of(
      choice.replicas, [&](const ReplicaChoice& r) { return r.best.recompute == mode; });
  if (!one_mode) {
    // Replicas in different modes: the given mode's deterministic orders were not all
    // searched on every replica, so they run again with the random ones.
    return {{replica_microbatches(choice), choice.schedule,
             {.quick = true, .recompute = mode, .permute = true, .random_orders = options.random_orders}}};
  }
  // The full search that made `choice` ran these candidates in the deterministic orders:
  // only the random ones run, each replica against its own makespan so far.
  std::vector<SearchCall> searches;
  for (const ReplicaChoice& replica : choice.replicas) {
    searches.push_back({{replica.microbatches}, choice.schedule,
                        {.quick = true, .recompute = mode, .permute = true,
                         .random_orders = options.random_orders,
                         .searched_orders = SearchOptions{}.max_orders,
                         .beat_ms = std::min(replica.best.sim.makespan_ms, bar_ms)}});
  }
  return searches;
}

Choice Planner::Impl::with_random_orders(const GlobalBatch& batch, Choice choice, double bar_ms,
                                         SearchesAhead* ahead) const {
  const std::vector<SearchCall> searches = random_order_searches(choice, bar_ms);
  if (searches.empty()) return choice;
  auto run = [&](const SearchCall& s) {
    return ahead != nullptr ? ahead->search(s) : search_replicas(batch, s.replicas, s.schedule, s.how);
  };
  if (searches.front().replicas.size() > 1) {
    // One search of every replica (their modes differ).
    Choice again = run(searches.front());
    if (!(again.est_ms < choice.est_ms)) return choice;
    again.batching = choice.batching;
    again.dp_recompute = choice.dp_recompute;
    again.baseline_cut = choice.baseline_cut;
    return again;
  }
  std::vector<std::optional<ReplicaChoice>> better(choice.replicas.size());
  double est_ms = 0;
  for (std::size_t r = 0; r < choice.replicas.size(); ++r) {
    Choice again = run(searches[r]);
    if (again.replicas.empty()) {  // no random order beats it
      est_ms = std::max(est_ms, choice.replicas[r].best.sim.makespan_ms);
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
// The deal's β is the cut's own and, where the quick search ran the cut with another
// schedule than the one its rule plans for, that schedule's rule's: under auto the 1F1B
// rule (β = 1) cuts what zb1p runs, whose bubble weighs about half (T5-11B pp 8 dp 2 on the
// measured H100 profile, 80 GiB, 2048, 16,384 tokens, uniform split; bench/random_points.py
// schedules seed 44: dealt 5 and 5 micro-batches for β = 1, auto planned iteration 0 in
// 334.2 ms against `--schedule zb1p`'s 328.7, which the zb1p rule's β dealt 4 and 6).
std::optional<Choice> Planner::Impl::redeal(const GlobalBatch& batch, const Choice& from,
                                            ScheduleKind schedule, double beat_ms) const {
  std::vector<double> weights{from.batching.bubble_weight};
  const ScheduleKind ran = from.replicas.front().best.schedule;
  for (const DpTarget& target : more_targets) {
    if (target.schedule == ran && target.bubble_weight != weights.front()) {
      weights.push_back(target.bubble_weight);
    }
  }
  std::vector<std::vector<std::vector<int>>> dealt_before;
  std::optional<Choice> best;
  for (const double weight : weights) {
    std::optional<Choice> other =
        redeal_by(batch, from, schedule, best ? best->est_ms : beat_ms, weight, &dealt_before);
    if (other) best = std::move(other);
  }
  return best;
}

std::optional<Choice> Planner::Impl::redeal_by(
    const GlobalBatch& batch, const Choice& from, ScheduleKind schedule, double beat_ms,
    double bubble_weight, std::vector<std::vector<std::vector<int>>>* dealt_before) const {
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
      balance_pipeline_replicas(times, config.dp, bubble_weight * (config.pp - 1));
  // Each replica's micro-batches (indices into `all`, in order) under a deal.
  auto groups = [&](const std::vector<int>& of) {
    std::vector<std::vector<int>> g(static_cast<std::size_t>(config.dp));
    for (std::size_t k = 0; k < of.size(); ++k) {
      g[static_cast<std::size_t>(of[k])].push_back(static_cast<int>(k));
    }
    return g;
  };
  const std::vector<std::vector<int>> dealt = groups(owner), had = groups(before);
  if (std::ranges::any_of(dealt, [](const auto& g) { return g.empty(); })) return std::nullopt;
  // The same deal up to the replicas' numbering, or one searched before: nothing new.
  if (std::ranges::is_permutation(dealt, had)) return std::nullopt;
  for (const auto& earlier : *dealt_before) {
    if (std::ranges::is_permutation(dealt, earlier)) return std::nullopt;
  }
  dealt_before->push_back(dealt);
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
  for (std::size_t r = 0; r < dealt.size(); ++r) {
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
    std::vector<MicroBatch> replica;  // the dealt micro-batches, numbered in order
    for (int item : dealt[r]) {
      replica.push_back(all[static_cast<std::size_t>(item)]);
      replica.back().id = static_cast<int>(replica.size() - 1);
    }
    std::optional<ReplicaChoice> fastest;
    for (const Recompute k : modes) {
      // Each mode after the first only has to beat the fastest so far.
      const double bar = fastest ? std::min(beat_ms, fastest->best.sim.makespan_ms) : beat_ms;
      const std::optional<Choice> one = unless_ruled_out([&] {
        return search_replicas(
            batch, {replica}, schedule,
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

}  // namespace dynapipe
