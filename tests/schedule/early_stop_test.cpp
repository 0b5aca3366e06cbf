// The search's exact shortcuts: a list schedule (zb1p, critical-path) given stop_at_ms
// gives up exactly when its order's makespan would not be below it (as soon as an op, or
// an op plus its device's work left, ends at or after it), and with over_memory exactly when the order would not fit; wait-free-cyclic reuses
// cyclic's orders; a search with the shortcuts finds what a search without them finds,
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/core/units.h"
#include "dynapipe/schedule/schedule.h"
#include "dynapipe/schedule/schedule_search.h"
#include "dynapipe/schedule/simulator.h"
#include "schedule/schedule_test_util.h"

namespace dynapipe {
namespace {

using testing::letters;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

struct Built {
  std::optional<ScheduleOrder> order;
  bool stopped = false;
};

Built build(ScheduleKind kind, const PipelineProblem& p, double stop_at_ms,
            SimResult* timing = nullptr, bool over_memory = false) {
  Built built;
  std::string why_not;
  const Schedule::BuildOptions stop{.stop_at_ms = stop_at_ms, .stop_over_memory = over_memory};
  built.order = make_schedule(kind)->build(p, &why_not, stop, &built.stopped, timing);
  EXPECT_TRUE(built.order || built.stopped) << why_not;
  return built;
}

// A build given the cutoff `makespan` or anything below (ties cannot beat the best, as in the
// simulator) stops; given `above` (> makespan) it builds `full`'s order.
void expect_stops_below(ScheduleKind kind, const PipelineProblem& p, const Built& full,
                        double makespan, std::initializer_list<double> below, double above) {
  EXPECT_TRUE(build(kind, p, makespan).stopped);
  for (double cutoff : below) EXPECT_TRUE(build(kind, p, cutoff).stopped) << cutoff;
  const Built built = build(kind, p, above);
  EXPECT_FALSE(built.stopped);
  ASSERT_TRUE(built.order);
  EXPECT_EQ(built.order->device_ops, full.order->device_ops);
}

// The hand-checked case of CriticalPathTest.LongThenShortOnTwoDevicesExactly: makespan 16
// (device 0's B2 ends at 16; every other op by 14).
TEST(EarlyStopTest, CriticalPathStopsAtItsMakespanExactly) {
  const PipelineProblem p = testing::long_then_short_problem();
  const Built full = build(ScheduleKind::CriticalPath, p, kInfinity);
  ASSERT_TRUE(full.order);
  EXPECT_DOUBLE_EQ(simulate(p, *full.order).makespan_ms, 16.0);
  expect_stops_below(ScheduleKind::CriticalPath, p, full, 16.0, {15.0, 1.0}, 16.5);
}

// 4 equal micro-batches on 2 devices, F = I = W = 1, free messages. By hand: device 1
// waits for F0 until 1 and runs F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3 back to back to 13;
// device 0 holds at most 2 micro-batches between F and W: F0 F1 [0,2], waits for I0's
// gradient until 3, I0 W0 F2 [3,6], I1 W1 F3 I2 [6,10], W2 while I3's gradient comes,
// I3 W3 [11,13]. Makespan 13.
TEST(EarlyStopTest, Zb1pStopsAtItsMakespanExactly) {
  const PipelineProblem p = testing::uniform_problem(4, 2, 1.0, 2.0);
  const Built full = build(ScheduleKind::Zb1p, p, kInfinity);
  ASSERT_TRUE(full.order);
  EXPECT_EQ(letters(full.order->device_ops[0]), "F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3 ");
  EXPECT_EQ(letters(full.order->device_ops[1]), "F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3 ");
  EXPECT_DOUBLE_EQ(simulate(p, *full.order).makespan_ms, 13.0);
  expect_stops_below(ScheduleKind::Zb1p, p, full, 13.0, {7.5}, 13.25);
}

// A build gives up as soon as a device's work left shows it cannot end before the cutoff,
// not only when an op ends past it. The problem above with cutoff 12.5: device 1 has 12
// of work (4 x F + I + W); its first op F0 runs [1, 2], after which 11 are left, so it
// cannot end before 13 and the build stops there, with only device 0's F0 and F1 (to 2)
// timed. Without the bound it would have run to device 1's last op (ending at 13). Each
// list schedule, and the simulator on 1F1B's order (device 1's work is 4 x (F + B) = 12).
TEST(EarlyStopTest, BuildsGiveUpOnceADevicesWorkLeftCannotEndInTime) {
  const PipelineProblem p = testing::uniform_problem(4, 2, 1.0, 2.0);
  for (ScheduleKind kind : {ScheduleKind::Zb1p, ScheduleKind::CriticalPath}) {
    SimResult timing;
    const Built stopped = build(kind, p, 12.5, &timing);
    EXPECT_TRUE(stopped.stopped) << schedule_kind_name(kind);
    EXPECT_LE(timing.makespan_ms, 2.0) << schedule_kind_name(kind);
  }
  const auto order = make_schedule(ScheduleKind::OneFOneB)->build(p, nullptr);
  ASSERT_TRUE(order);
  SimResult run;
  Simulator().run(p, *order, SimOptions{.record = false, .stop_at_ms = 12.5}, &run);
  EXPECT_TRUE(run.stopped);
  // Device 0's F0 and device 1's F0 (whose end, 2, plus its 10 left reach 12.5... and past).
  EXPECT_LE(run.busy_ms[0] + run.busy_ms[1], 3.0);
}

// On random problems with memory limits, tight and loose, a list schedule told to give
// up over memory stops exactly when its whole order would not fit (Simulator::memory)
// and otherwise builds the same order.
TEST(EarlyStopTest, BuildersStopOverMemoryExactlyWhenTheOrderDoesNotFit) {
  Rng rng(20261128);
  int stopped = 0, built = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int devices = static_cast<int>(rng.uniform_int(1, 6));
    const int m = static_cast<int>(rng.uniform_int(1, 24));
    PipelineProblem p = testing::random_problem(rng, m, devices, 1);
    p.memory_limit_bytes = trial % 5 == 0 ? 0 : rng.uniform_int(500, 6000);
    for (ScheduleKind kind : {ScheduleKind::Zb1p, ScheduleKind::CriticalPath}) {
      const Built full = build(kind, p, kInfinity);
      ASSERT_TRUE(full.order);
      SimResult memory;
      Simulator().memory(p, *full.order, &memory);
      const Built exiting = build(kind, p, kInfinity, nullptr, /*over_memory=*/true);
      EXPECT_EQ(exiting.stopped, !memory.fits_memory)
          << schedule_kind_name(kind) << " trial " << trial;
      if (exiting.order) {
        EXPECT_EQ(exiting.order->device_ops, full.order->device_ops);
      }
      (exiting.stopped ? stopped : built) += 1;
    }
  }
  EXPECT_GT(stopped, 50);  // both cases are exercised
  EXPECT_GT(built, 50);
}

// Schedules without their own clock build in full whatever the cutoff.
TEST(EarlyStopTest, OtherSchedulesIgnoreTheCutoff) {
  const PipelineProblem p = testing::uniform_problem(4, 2, 1.0, 2.0);
  for (const char* name : {"gpipe", "1f1b", "cyclic", "wait-free-cyclic"}) {
    bool stopped = true;
    std::string why_not;
    const Schedule::BuildOptions stop{.stop_at_ms = 0.5, .stop_over_memory = true};
    EXPECT_TRUE(make_schedule(name)->build(p, &why_not, stop, &stopped, nullptr)) << name;
    EXPECT_FALSE(stopped) << name;
  }
}

// On random problems (links, memory limits tight and loose) each list schedule's own
// clock ends where the simulator's does, to the bit: it stops at the simulated makespan,
// builds the same order just above it, and reports the run's makespan and busy times.
TEST(EarlyStopTest, BuildersStopExactlyAtTheSimulatedMakespanOnRandomProblems) {
  Rng rng(20261126);
  for (int trial = 0; trial < 300; ++trial) {
    const int devices = static_cast<int>(rng.uniform_int(1, 6));
    const int m = static_cast<int>(rng.uniform_int(1, 24));
    PipelineProblem p = testing::random_problem(rng, m, devices, 1);
    if (trial % 3 == 1) p.memory_limit_bytes = rng.uniform_int(500, 4000);
    if (trial % 7 == 0) p.costs[0][0].fwd_ms = 0;  // a zero-length op ties with its neighbour
    for (ScheduleKind kind : {ScheduleKind::Zb1p, ScheduleKind::CriticalPath}) {
      SimResult timing;
      const Built full = build(kind, p, kInfinity, &timing);
      ASSERT_TRUE(full.order);
      const SimResult run = simulate(p, *full.order, SimOptions{.record = false});
      const double makespan = run.makespan_ms;
      EXPECT_EQ(timing.makespan_ms, makespan) << schedule_kind_name(kind) << " trial " << trial;
      EXPECT_EQ(timing.busy_ms, run.busy_ms) << schedule_kind_name(kind) << " trial " << trial;
      EXPECT_TRUE(build(kind, p, makespan).stopped)
          << schedule_kind_name(kind) << " trial " << trial;
      const Built above = build(kind, p, std::nextafter(makespan, kInfinity));
      ASSERT_TRUE(above.order) << schedule_kind_name(kind) << " trial " << trial;
      EXPECT_EQ(above.order->device_ops, full.order->device_ops);
    }
  }
}

// A twin of the winner (other bytes, the same times) ties with it, so its build stops at
// its last op (ties keep the earlier candidate) and is never simulated; the first is
// timed by its own build. (An exact repeat is not built at all: SearchResult::duplicates.)
TEST(EarlyStopTest, SearchStopsARepeatedWinnersBuild) {
  const PipelineProblem p = testing::uniform_problem(8, 4, 1.0, 2.0);
  PipelineProblem twin = p;
  twin.costs[0][0].peak_bytes += 1;
  const std::vector<SearchCandidate> twice = {
      {ScheduleKind::Zb1p, Recompute::None, testing::shared(p), {}},
      {ScheduleKind::Zb1p, Recompute::None, testing::shared(twin), {}}};
  SearchOptions options;
  options.permute = false;
  const SearchResult r = search_schedule(twice, options);
  EXPECT_EQ(r.candidate, 0);
  EXPECT_EQ(r.stopped_builds, 1);
  EXPECT_EQ(r.unsimulated, 1);  // the first candidate: its build timed it
  EXPECT_EQ(r.simulations, 1);  // the winner's recorded run
  options.shortcuts = false;
  const SearchResult slow = search_schedule(twice, options);
  EXPECT_EQ(slow.candidate, 0);
  EXPECT_EQ(slow.stopped_builds, 0);
  EXPECT_EQ(slow.unsimulated, 0);
  EXPECT_EQ(slow.simulations, 3);
}

// Cyclic then wait-free-cyclic on one problem: each of wait-free-cyclic's 8 orders (the
// default max_orders: as given, longest first, 6 orders of 4 clusters) is cyclic's, and the
// result is the one built without the reuse. A different problem builds its own.
TEST(EarlyStopTest, WaitFreeCyclicReusesCyclicsOrders) {
  PipelineProblem p = testing::uniform_problem(9, 3, 1.0, 2.0);
  for (int mb = 0; mb < 9; ++mb) {
    for (StageCost& c : p.costs[mb]) {
      c.fwd_ms *= 1 + mb % 3;
      c.bwd_ms *= 1 + mb % 3;
    }
  }
  std::vector<SearchCandidate> pair = {
      {ScheduleKind::Cyclic, Recompute::None, testing::shared(p), {}},
      {ScheduleKind::WaitFreeCyclic, Recompute::None, testing::shared(p), {}}};
  SearchOptions options;
  const SearchResult r = search_schedule(pair, options);
  EXPECT_EQ(r.reused_builds, 8);
  options.shortcuts = false;
  const SearchResult slow = search_schedule(pair, options);
  EXPECT_EQ(slow.reused_builds, 0);
  EXPECT_EQ(r.candidate, slow.candidate);
  EXPECT_EQ(r.mb_order, slow.mb_order);
  EXPECT_EQ(r.order.device_ops, slow.order.device_ops);
  EXPECT_EQ(r.order.op_cycle, slow.order.op_cycle);
  EXPECT_EQ(r.sim.makespan_ms, slow.sim.makespan_ms);
  // Not after an unequal problem.
  PipelineProblem unequal = p;
  unequal.costs[0][0].fwd_ms += 0.5;
  pair[1].problem = testing::shared(unequal);
  EXPECT_EQ(search_schedule(pair).reused_builds, 0);
}

// The memory of an order, alone, is what a full run reports, on random problems with
// limits (async orders with their stashed versions too).
TEST(EarlyStopTest, MemoryAloneEqualsTheRunsMemory) {
  Rng rng(31);
  Simulator simulator;
  for (int trial = 0; trial < 100; ++trial) {
    PipelineProblem p = testing::random_problem(rng, static_cast<int>(rng.uniform_int(1, 12)),
                                                static_cast<int>(rng.uniform_int(1, 5)), 1);
    p.memory_limit_bytes = rng.uniform_int(500, 4000);
    p.weight_bytes.assign(p.layout.num_devices, rng.uniform_int(0, 300));
    for (const char* name : {"1f1b", "zb1p", "critical-path", "pipedream", "pipedream-2bw"}) {
      const ScheduleOrder order = *make_schedule(name)->build(p, nullptr);
      const SimResult run = simulator.run(p, order);
      SimResult alone;
      simulator.memory(p, order, &alone);
      EXPECT_EQ(alone.peak_memory_bytes, run.peak_memory_bytes) << name << " trial " << trial;
      EXPECT_EQ(alone.peak_op, run.peak_op) << name;
      EXPECT_EQ(alone.fits_memory, run.fits_memory) << name;
    }
  }
}

// zb1p alone under a limit it cannot meet (device 0 holds 4 micro-batches of 10 GiB, + 1
// GiB working memory: 41 GiB): its memory is found without a simulation, and the error is
// the same.
TEST(EarlyStopTest, UnfitTimedBuildsReportTheSameViolation) {
  PipelineProblem p = testing::uniform_problem(8, 4, 1.0, 2.0);
  for (auto& per_stage : p.costs) {
    for (StageCost& c : per_stage) {
      c.stored_bytes = 10 * kGiB;
      c.peak_bytes = kGiB;
    }
  }
  p.memory_limit_bytes = 25 * kGiB;
  const std::vector<SearchCandidate> zb1p = {
      {ScheduleKind::Zb1p, Recompute::None, testing::shared(p), {}}};
  std::string with, without;
  SearchOptions options;
  try {
    search_schedule(zb1p, options);
  } catch (const Error& e) {
    with = e.what();
  }
  options.shortcuts = false;
  try {
    search_schedule(zb1p, options);
  } catch (const Error& e) {
    without = e.what();
  }
  EXPECT_EQ(with.rfind("--memory-limit 25 GiB: no schedule fits; micro-batch ", 0), 0u) << with;
  EXPECT_NE(with.find("(schedule zb1p, recompute none)"), std::string::npos) << with;
  EXPECT_EQ(with, without);
}

// The builders order one list per pipeline device; a problem with replicated stages is
// simulated checked, so the search still rejects their orders (first candidate zb1p, which
// would otherwise have its memory taken unchecked).
TEST(EarlyStopTest, ReplicatedProblemsAreStillRejected) {
  PipelineProblem p = testing::uniform_problem(4, 2, 1.0, 2.0);
  p.stage_replicas = {2, 1};
  p.memory_limit_bytes = 1000;
  const std::vector<SearchCandidate> zb1p = {
      {ScheduleKind::Zb1p, Recompute::None, testing::shared(p), {}}};
  try {
    search_schedule(zb1p);
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("one op list per device (3), got 2"), std::string::npos)
        << e.what();
  }
}

// Random searches over every schedule, permuted and random orders, memory limits that
// reject some candidates: the same winner, order, makespan, peaks and rejections with the
// builds' early exits as without (the simulations then stop instead), and they do fire.
TEST(EarlyStopTest, SearchFindsTheSameResultWithAndWithoutEarlyExits) {
  Rng rng(8);
  int stopped_builds = 0, reused_builds = 0, unsimulated = 0, over_memory = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int devices = static_cast<int>(rng.uniform_int(1, 5));
    const int m = static_cast<int>(rng.uniform_int(1, 16));
    PipelineProblem plain = testing::random_problem(rng, m, devices, 1);
    PipelineProblem interleaved = testing::random_problem(rng, m, devices, 2);
    if (trial % 2 == 1) {
      plain.memory_limit_bytes = interleaved.memory_limit_bytes = rng.uniform_int(800, 5000);
    }
    std::vector<SearchCandidate> candidates;
    for (ScheduleKind kind : schedule_kinds()) {
      const bool virtual_stages = make_schedule(kind)->needs_virtual_stages();
      candidates.push_back(
          {kind, Recompute::None, testing::shared(virtual_stages ? interleaved : plain), {}});
    }
    // The fixed schedules last, after something may fit: their orders over memory are
    // then not run.
    if (trial % 4 == 3) std::reverse(candidates.begin(), candidates.end());
    SearchOptions fast;
    fast.random_orders = static_cast<int>(rng.uniform_int(0, 3));
    fast.max_orders += fast.random_orders;
    fast.seed = static_cast<std::uint64_t>(trial);
    fast.record_winner = trial % 3 != 0;
    SearchOptions slow = fast;
    slow.shortcuts = false;
    auto run = [&](const SearchOptions& options) -> std::optional<SearchResult> {
      try {
        return search_schedule(candidates, options);
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Infeasible) << e.what();
        return std::nullopt;
      }
    };
    const std::optional<SearchResult> a = run(fast), b = run(slow);
    ASSERT_EQ(a.has_value(), b.has_value()) << "trial " << trial;
    if (!a) continue;
    EXPECT_EQ(a->candidate, b->candidate) << "trial " << trial;
    EXPECT_EQ(a->mb_order, b->mb_order);
    EXPECT_EQ(a->order.device_ops, b->order.device_ops);
    EXPECT_EQ(a->sim.makespan_ms, b->sim.makespan_ms);
    EXPECT_EQ(a->sim.busy_ms, b->sim.busy_ms);
    EXPECT_EQ(a->sim.peak_memory_bytes, b->sim.peak_memory_bytes);
    EXPECT_EQ(a->rejected, b->rejected);
    EXPECT_EQ(b->stopped_builds, 0);
    EXPECT_EQ(b->reused_builds, 0);
    // Each stopped build is one simulation that would have stopped (or found the order
    // over memory); each unsimulated order one whose result its builder and the memory
    // pass gave; each order over memory one whose memory pass ruled it out.
    EXPECT_EQ(a->simulations + a->stopped_builds + a->unsimulated + a->over_memory,
              b->simulations);
    EXPECT_EQ(b->over_memory, 0);
    EXPECT_EQ(b->unsimulated, 0);
    stopped_builds += a->stopped_builds;
    reused_builds += a->reused_builds;
    unsimulated += a->unsimulated;
    over_memory += a->over_memory;
  }
  EXPECT_GT(stopped_builds, 0);
  EXPECT_GT(reused_builds, 0);
  EXPECT_GT(unsimulated, 0);
  EXPECT_GT(over_memory, 0);
}

}  // namespace
}  // namespace dynapipe
