#include "dynapipe/schedule/schedule_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/core/units.h"
#include "dynapipe/schedule/simulator.h"
#include "schedule/schedule_test_util.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using testing::uniform_problem;

std::vector<SearchCandidate> candidates_for(const std::vector<std::string>& names,
                                            const PipelineProblem& problem) {
  std::vector<SearchCandidate> out;
  for (const std::string& name : names) {
    out.push_back({*parse_schedule_kind(name), Recompute::None, testing::shared(problem), {}});
  }
  return out;
}

// Micro-batches of three sizes in a bad order (all long ones last).
PipelineProblem heterogeneous_problem() {
  PipelineProblem p = uniform_problem(9, 4, 1.0, 2.0);
  for (int mb = 0; mb < 9; ++mb) {
    const double size = 1.0 + (mb / 3);
    for (auto& c : p.costs[mb]) {
      c.fwd_ms *= size;
      c.bwd_ms *= size;
      c.bwd_input_ms *= size;
      c.bwd_weight_ms *= size;
      c.stored_bytes = static_cast<std::int64_t>(c.stored_bytes * size);
    }
  }
  return p;
}

TEST(ScheduleSearchTest, PicksTheShortestSchedule) {
  const PipelineProblem p = uniform_problem(8, 4, 1.0, 2.0);
  const SearchResult r = search_schedule(candidates_for({"gpipe", "1f1b", "zb1p"}, p));
  EXPECT_EQ(r.schedule, ScheduleKind::Zb1p);
  EXPECT_EQ(r.candidate, 2);
  EXPECT_DOUBLE_EQ(r.sim.makespan_ms, simulate(p, r.order).makespan_ms);
  EXPECT_FALSE(r.sim.timeline.empty());
  EXPECT_TRUE(r.rejected.empty());
  EXPECT_GE(r.simulations, 3);
  // zb1p searched first (SearchOptions::search_first): the same result, and its makespan
  // is below the others' lower bounds, so each is pruned, not built.
  const SearchResult first = search_schedule(candidates_for({"gpipe", "1f1b", "zb1p"}, p),
                                             {.search_first = {ScheduleKind::Zb1p}});
  EXPECT_EQ(first.candidate, 2);
  EXPECT_EQ(first.sim.makespan_ms, r.sim.makespan_ms);
  EXPECT_EQ(first.pruned, 2);
}

TEST(ScheduleSearchTest, PrunesASchedulesFillAndDrain) {
  // 8 equal micro-batches on 4 stages: no 1F1B order beats the last device's fill (three
  // forwards), its work (24) and its drain (three whole backwards), 33 ms, which zb1p's
  // split backward beats; searched after it, 1F1B is not built. (Its work alone, 24, did
  // not prune it.)
  const PipelineProblem p = uniform_problem(8, 4, 1.0, 2.0);
  const SearchResult first = search_schedule(candidates_for({"zb1p"}, p));
  ASSERT_LT(first.sim.makespan_ms, 33.0);
  const SearchResult r = search_schedule(candidates_for({"zb1p", "1f1b"}, p));
  EXPECT_EQ(r.schedule, ScheduleKind::Zb1p);
  EXPECT_EQ(r.pruned, 1);
  EXPECT_EQ(r.simulations + r.unsimulated, first.simulations + first.unsimulated);
  EXPECT_DOUBLE_EQ(r.sim.makespan_ms, first.sim.makespan_ms);
}

TEST(ScheduleSearchTest, TiesKeepTheEarlierCandidate) {
  const PipelineProblem p = uniform_problem(8, 4, 1.0, 2.0);
  const SearchResult r = search_schedule(candidates_for({"gpipe", "1f1b"}, p));
  EXPECT_EQ(r.schedule, ScheduleKind::GPipe);  // same makespan; gpipe was listed first
}

// Whichever kind is searched first (SearchOptions::search_first), the result is the listed
// order's: the fastest candidate, the first listed among equals. Every kind twice, on two
// problems that differ only in a memory limit neither reaches (not "the same" problem, so
// both are searched and tie), against each candidate searched alone.
TEST(ScheduleSearchTest, TheWinnerIsTheListedOrdersWhicheverIsSearchedFirst) {
  Rng rng(5);
  int later_wins = 0, tied = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int devices = static_cast<int>(rng.uniform_int(2, 5));
    const int m = static_cast<int>(rng.uniform_int(2, 16));
    PipelineProblem a = testing::random_problem(rng, m, devices, 1);
    a.memory_limit_bytes = std::int64_t{1} << 50;
    PipelineProblem b = a;
    b.memory_limit_bytes += 1;
    std::vector<SearchCandidate> candidates;
    for (const PipelineProblem* problem : {&a, &b}) {
      for (ScheduleKind kind : schedule_kinds()) {
        if (make_schedule(kind)->needs_virtual_stages()) continue;
        candidates.push_back({kind, Recompute::None, testing::shared(*problem), {}});
      }
    }
    int expected = -1;
    double expected_ms = 0;
    for (int ci = 0; ci < static_cast<int>(candidates.size()); ++ci) {
      const SearchResult alone = search_schedule(std::span(candidates).subspan(static_cast<std::size_t>(ci), 1));
      if (expected < 0 || alone.sim.makespan_ms < expected_ms) {
        expected = ci;
        expected_ms = alone.sim.makespan_ms;
      } else if (alone.sim.makespan_ms == expected_ms) {
        ++tied;
      }
    }
    auto any_kind = [&] {
      return candidates[static_cast<std::size_t>(rng.uniform_int(0, static_cast<std::int64_t>(candidates.size()) - 1))]
          .schedule;
    };
    const ScheduleKind first = any_kind();
    const SearchResult r = search_schedule(candidates, {.search_first = {first, any_kind()}});
    EXPECT_EQ(r.candidate, expected) << "trial " << trial << ", " << schedule_kind_name(first) << " first";
    EXPECT_EQ(r.sim.makespan_ms, expected_ms) << "trial " << trial;
    const ScheduleKind won = candidates[static_cast<std::size_t>(expected)].schedule;
    if (won != first) ++later_wins;
  }
  // Cases where the order matters: a kind searched later wins or ties the one searched first.
  EXPECT_GT(later_wins, 0);
  EXPECT_GT(tied, 0);
}

TEST(ScheduleSearchTest, SkipsASchedulesRepeatOnTheSameProblem) {
  // Per-micro-batch recompute's mixes often equal a lighter mode's problem: the repeat
  // ends as the first did, so it is not built again, and the result is the same.
  const PipelineProblem p = heterogeneous_problem();
  const std::vector<SearchCandidate> once = candidates_for({"1f1b", "zb1p"}, p);
  std::vector<SearchCandidate> twice = once;
  for (SearchCandidate c : candidates_for({"zb1p", "1f1b"}, p)) {
    c.recompute = Recompute::Selective;  // another mode's label, the same costs
    twice.push_back(c);
  }
  const SearchResult a = search_schedule(once), b = search_schedule(twice);
  EXPECT_EQ(a.duplicates, 0);
  EXPECT_EQ(b.duplicates, 2);
  EXPECT_EQ(b.candidate, a.candidate);
  EXPECT_EQ(b.recompute, Recompute::None);
  EXPECT_EQ(b.sim.makespan_ms, a.sim.makespan_ms);
  EXPECT_EQ(b.order.device_ops, a.order.device_ops);
  EXPECT_EQ(b.simulations + b.unsimulated + b.stopped_builds + b.pruned,
            a.simulations + a.unsimulated + a.stopped_builds + a.pruned);
  // Other costs are another problem, searched (or pruned by its bound).
  PipelineProblem heavier = p;
  for (auto& c : heavier.costs[0]) c.fwd_ms += 0.5;
  std::vector<SearchCandidate> other = once;
  other.push_back(candidates_for({"zb1p"}, heavier).front());
  EXPECT_EQ(search_schedule(other).duplicates, 0);
}

TEST(ScheduleSearchTest, SkipsCandidatesThatDoNotFit) {
  PipelineProblem p = uniform_problem(8, 4, 1.0, 2.0);
  p.memory_limit_bytes = 250;
  std::vector<SearchCandidate> candidates = candidates_for({"1f1b", "wait-free-cyclic"}, p);
  const SearchResult r = search_schedule(candidates);
  EXPECT_EQ(r.schedule, ScheduleKind::WaitFreeCyclic);
  EXPECT_TRUE(r.sim.fits_memory);
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_THAT(r.rejected[0], HasSubstr("1f1b, recompute none: needs"));
}

TEST(ScheduleSearchTest, ReportsTheSmallestViolationWhenNothingFits) {
  PipelineProblem none = uniform_problem(2, 2, 1.0, 2.0);
  none.static_bytes = {30 * kGiB, 30 * kGiB};
  none.memory_limit_bytes = 40 * kGiB;
  PipelineProblem full = none;
  for (auto& per_stage : none.costs) {
    for (auto& c : per_stage) {
      c.stored_bytes = 8 * kGiB;
      c.peak_bytes = kGiB;
    }
  }
  for (auto& per_stage : full.costs) {
    for (auto& c : per_stage) {
      c.stored_bytes = 11 * kGiB / 2;   // 5.5 GiB
      c.peak_bytes = 7 * kGiB / 10;     // 0.7 GiB
    }
  }
  std::vector<SearchCandidate> candidates = {
      {ScheduleKind::OneFOneB, Recompute::None, testing::shared(none), {}},
      {ScheduleKind::OneFOneB, Recompute::Full, testing::shared(full), {}}};
  try {
    search_schedule(candidates);
    FAIL() << "expected Infeasible";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Infeasible);
    EXPECT_STREQ(e.what(),
                 "--memory-limit 40 GiB: no schedule fits; micro-batch 1 needs 41.7 GiB on stage 0 "
                 "(schedule 1f1b, recompute full)");
  }
}

// Five micro-batches of sizes 3, 1, 5, 2, 4 on 2 stages.
PipelineProblem five_sizes_problem() {
  PipelineProblem p = uniform_problem(5, 2, 1.0, 2.0);
  const double sizes[] = {3, 1, 5, 2, 4};
  for (int mb = 0; mb < 5; ++mb) {
    for (auto& c : p.costs[mb]) {
      c.fwd_ms *= sizes[mb];
      c.bwd_ms *= sizes[mb];
      c.bwd_input_ms *= sizes[mb];
      c.bwd_weight_ms *= sizes[mb];
    }
  }
  return p;
}

// Sizes 3, 1, 5, 2, 4: longest first is 2 4 0 3 1; the organ pipe rises to the
// longest and falls again (sizes 1 3 5 4 2); the smallest first puts 1 ahead of the rest.
TEST(ScheduleSearchTest, OrdersTriedAreHandChecked) {
  const PipelineProblem p = five_sizes_problem();
  const SearchOptions options;
  const std::vector<std::vector<int>> orders = micro_batch_orders(p, /*permute=*/true, options);
  ASSERT_EQ(orders.size(), 8u);  // options.max_orders
  EXPECT_EQ(orders[0], (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(orders[1], (std::vector<int>{1, 0, 2, 4, 3}));
  EXPECT_EQ(orders[2], (std::vector<int>{2, 4, 0, 3, 1}));
  EXPECT_EQ(orders[3], (std::vector<int>{1, 2, 4, 0, 3}));
  // Then the cluster orders ({2, 4}, {0}, {3}, {1}; the first is longest first again).
  EXPECT_EQ(orders[4], (std::vector<int>{2, 4, 0, 1, 3}));
  for (std::size_t i = 0; i < orders.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(orders[i], orders[j]) << i << " repeats " << j;
  }
  EXPECT_EQ(micro_batch_orders(p, /*permute=*/false, options),
            (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
}

// At pp 2 the organ pipe wins: the smallest micro-batch fills the pipeline and the second
// smallest drains it, where longest first starts stage 1 only after the largest forward.
TEST(ScheduleSearchTest, OrganPipeShortensFillAndDrain) {
  const PipelineProblem p = five_sizes_problem();
  const SearchResult r = search_schedule(candidates_for({"wait-free-cyclic"}, p));
  EXPECT_EQ(r.mb_order, (std::vector<int>{1, 0, 2, 4, 3}));
  SearchOptions longest_first;
  longest_first.permute = false;
  PipelineProblem sorted = p;
  for (int i = 0; const int mb : {2, 4, 0, 3, 1}) sorted.costs[i++] = p.costs[mb];
  const SearchResult longest = search_schedule(candidates_for({"wait-free-cyclic"}, sorted), longest_first);
  EXPECT_LT(r.sim.makespan_ms, longest.sim.makespan_ms);
}

TEST(ScheduleSearchTest, PermutedOrdersSpeakOriginalIds) {
  const PipelineProblem p = heterogeneous_problem();
  SearchOptions options;
  options.random_orders = 3;
  options.max_orders = 12;
  const SearchResult r = search_schedule(candidates_for({"wait-free-cyclic"}, p), options);
  std::vector<int> sorted = r.mb_order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(9);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  // Every op's duration is its own micro-batch's cost: ids were mapped back.
  for (const TimedOp& t : r.sim.timeline) {
    EXPECT_DOUBLE_EQ(t.end_ms - t.start_ms, p.op_ms(t.op)) << op_name(t.op);
  }
  // Re-simulating the returned order on the original problem gives the same result.
  const SimResult again = simulate(p, r.order);
  EXPECT_DOUBLE_EQ(again.makespan_ms, r.sim.makespan_ms);
  EXPECT_EQ(again.peak_memory_bytes, r.sim.peak_memory_bytes);
  // Stage 0 takes the micro-batches in mb_order.
  std::vector<int> injected;
  for (const PipelineOp& op : r.order.device_ops[0]) {
    if (op.kind == OpKind::F) injected.push_back(op.mb);
  }
  EXPECT_EQ(injected, r.mb_order);
  // It beat (or tied) the identity order, and the search tried several.
  SearchOptions identity_only;
  identity_only.permute = false;
  EXPECT_LE(r.sim.makespan_ms,
            search_schedule(candidates_for({"wait-free-cyclic"}, p), identity_only).sim.makespan_ms);
  EXPECT_GT(r.simulations, 5);
}

TEST(ScheduleSearchTest, IsDeterministic) {
  const PipelineProblem p = heterogeneous_problem();
  SearchOptions options;
  options.random_orders = 2;
  options.seed = 7;
  auto all = candidates_for({"gpipe", "1f1b", "cyclic", "wait-free-cyclic", "zb1p"}, p);
  const SearchResult a = search_schedule(all, options), b = search_schedule(all, options);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.mb_order, b.mb_order);
  EXPECT_EQ(a.order.device_ops, b.order.device_ops);
  EXPECT_DOUBLE_EQ(a.sim.makespan_ms, b.sim.makespan_ms);
}

// record_winner off (the planner's ranking): the same winner, order and simulated
// figures as a recording search, bit for bit, without the timeline, where the winner ran
// in the given order; a permuted winner is simulated again in its relabelled order.
TEST(ScheduleSearchTest, UnrecordedWinnerMatchesTheRecordedOne) {
  const PipelineProblem p = heterogeneous_problem();
  const auto all = candidates_for({"gpipe", "1f1b", "cyclic", "wait-free-cyclic", "zb1p"}, p);
  for (bool permute : {false, true}) {
    SearchOptions recorded;
    recorded.permute = permute;
    SearchOptions unrecorded = recorded;
    unrecorded.record_winner = false;
    const SearchResult a = search_schedule(all, recorded), b = search_schedule(all, unrecorded);
    EXPECT_EQ(a.candidate, b.candidate) << "permute " << permute;
    EXPECT_EQ(a.mb_order, b.mb_order);
    EXPECT_EQ(a.order.device_ops, b.order.device_ops);
    EXPECT_EQ(a.sim.makespan_ms, b.sim.makespan_ms);
    EXPECT_EQ(a.sim.busy_ms, b.sim.busy_ms);
    EXPECT_EQ(a.sim.peak_memory_bytes, b.sim.peak_memory_bytes);
    EXPECT_EQ(a.sim.fits_memory, b.sim.fits_memory);
    EXPECT_FALSE(a.sim.timeline.empty());
    EXPECT_TRUE(b.sim.timeline.empty());
    EXPECT_TRUE(b.sim.transfers.empty());
  }
  // The given order wins here without permutations: one simulation fewer.
  SearchOptions quick;
  quick.permute = false;
  const int recorded_runs = search_schedule(all, quick).simulations;
  quick.record_winner = false;
  EXPECT_EQ(search_schedule(all, quick).simulations, recorded_runs - 1);
}

TEST(ScheduleSearchTest, ErrorsNameTheProblem) {
  const PipelineProblem p = uniform_problem(4, 2, 1.0, 2.0);
  EXPECT_THROW(search_schedule({}), Error);
  try {
    search_schedule(candidates_for({"interleaved"}, p));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_THAT(e.what(), HasSubstr("interleaved, recompute none: interleaved needs layout.chunks"));
  }
  try {
    // Auto is a search, not a schedule a candidate can name.
    search_schedule(candidates_for({"auto"}, p));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
  }
  SearchOptions bad;
  bad.max_orders = 0;
  EXPECT_THROW(search_schedule(candidates_for({"1f1b"}, p), bad), Error);
  for (auto spoil : {+[](SearchOptions& o) { o.searched_orders = -1; },
                     +[](SearchOptions& o) { o.beat_ms = 0; },
                     +[](SearchOptions& o) { o.beat_ms = std::nan(""); }}) {
    SearchOptions options;
    spoil(options);
    try {
      search_schedule(candidates_for({"1f1b"}, p), options);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr("search options: "));
    }
  }
}

// SearchOptions::abandon: set, the search ends before its first order with nothing
// found (and throws nothing, even where nothing would fit); left clear, it changes nothing.
TEST(ScheduleSearchTest, AnAbandonedSearchEndsWithNothingFound) {
  Rng rng(5);
  const PipelineProblem problem = testing::random_problem(rng, 12, 4, 1);
  std::vector<SearchCandidate> candidates;
  for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::Zb1p, ScheduleKind::CriticalPath}) {
    candidates.push_back({kind, Recompute::None, testing::shared(problem), {}});
  }
  std::atomic<bool> abandon{false};
  SearchOptions options;
  options.abandon = &abandon;
  const SearchResult plain = search_schedule(candidates, {});
  const SearchResult watched = search_schedule(candidates, options);
  EXPECT_TRUE(watched.found);
  EXPECT_EQ(watched.candidate, plain.candidate);
  EXPECT_EQ(watched.mb_order, plain.mb_order);
  EXPECT_EQ(watched.sim.makespan_ms, plain.sim.makespan_ms);
  abandon = true;
  const SearchResult abandoned = search_schedule(candidates, options);
  EXPECT_FALSE(abandoned.found);
  EXPECT_EQ(abandoned.simulations, 0);
  PipelineProblem tiny = problem;
  tiny.memory_limit_bytes = 1;  // nothing fits: abandoned, no Infeasible either
  const std::vector<SearchCandidate> none_fit = {{ScheduleKind::OneFOneB, Recompute::None, testing::shared(tiny), {}}};
  EXPECT_THROW(search_schedule(none_fit, {}), Error);
  EXPECT_FALSE(search_schedule(none_fit, options).found);
}

// The planner's random orders after a full search (searched_orders, beat_ms): random
// problems over every schedule, searched first with the default orders, then again with
// only the orders that search skipped against its makespan, give exactly what one search
// of all those orders gives: its winner where it beats the first search, else !found.
TEST(ScheduleSearchTest, OrdersAddedToASearchFindWhatOneSearchFinds) {
  Rng rng(11);
  int improved = 0, not_improved = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int devices = static_cast<int>(rng.uniform_int(2, 5));
    const int m = static_cast<int>(rng.uniform_int(2, 24));
    const PipelineProblem plain = testing::random_problem(rng, m, devices, 1);
    const PipelineProblem interleaved = testing::random_problem(rng, m, devices, 2);
    std::vector<SearchCandidate> candidates;
    for (ScheduleKind kind : schedule_kinds()) {
      candidates.push_back(
          {kind,
           Recompute::None,
           testing::shared(make_schedule(kind)->needs_virtual_stages() ? interleaved : plain),
           {}});
    }
    const SearchOptions first;
    SearchOptions all = first;
    all.random_orders = static_cast<int>(rng.uniform_int(1, 8));
    all.max_orders += all.random_orders;
    all.seed = static_cast<std::uint64_t>(trial);
    SearchOptions added = all;
    added.searched_orders = first.max_orders;
    const SearchResult before = search_schedule(candidates, first);
    added.beat_ms = before.sim.makespan_ms;
    const SearchResult one = search_schedule(candidates, all);
    const SearchResult more = search_schedule(candidates, added);
    // beat_ms alone: the same winner where it beats the bar, else none.
    SearchOptions above = all, at = all;
    above.beat_ms = one.sim.makespan_ms * 1.01;
    at.beat_ms = one.sim.makespan_ms;
    const SearchResult under_bar = search_schedule(candidates, above);
    ASSERT_TRUE(under_bar.found) << "trial " << trial;
    EXPECT_EQ(under_bar.candidate, one.candidate) << "trial " << trial;
    EXPECT_EQ(under_bar.mb_order, one.mb_order) << "trial " << trial;
    EXPECT_EQ(under_bar.sim.makespan_ms, one.sim.makespan_ms) << "trial " << trial;
    EXPECT_FALSE(search_schedule(candidates, at).found) << "trial " << trial;
    // Makespans a few ulps apart are one tie: the builders' clocks, the simulator and the
    // lower bound add the same times in different orders.
    const double ulps = 1e-12 * before.sim.makespan_ms;
    if (!(one.sim.makespan_ms < before.sim.makespan_ms - ulps)) {
      EXPECT_TRUE(!more.found || more.sim.makespan_ms >= before.sim.makespan_ms - ulps)
          << "trial " << trial;
      ++not_improved;
      continue;
    }
    ASSERT_TRUE(more.found) << "trial " << trial;
    ++improved;
    EXPECT_EQ(more.candidate, one.candidate) << "trial " << trial;
    EXPECT_EQ(more.mb_order, one.mb_order) << "trial " << trial;
    EXPECT_EQ(more.order.device_ops, one.order.device_ops);
    EXPECT_EQ(more.sim.makespan_ms, one.sim.makespan_ms);
    EXPECT_EQ(more.sim.peak_memory_bytes, one.sim.peak_memory_bytes);
    EXPECT_LT(more.simulations + more.unsimulated + more.stopped_builds,
              one.simulations + one.unsimulated + one.stopped_builds);
  }
  // Both outcomes occur.
  EXPECT_GT(improved, 10);
  EXPECT_GT(not_improved, 10);
}

}  // namespace
}  // namespace dynapipe
