// The critical-path schedule: exact orders on hand-checked cases, and properties on
// random heterogeneous micro-batches (memory never over the limit when each micro-batch
// fits alone, the lower bound, determinism, injection order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/schedule/schedule.h"
#include "dynapipe/schedule/simulator.h"
#include "schedule/schedule_test_util.h"

namespace dynapipe {
namespace {

using testing::fused;
using testing::letters;

ScheduleOrder build(const PipelineProblem& p) {
  std::string why_not;
  auto order = make_schedule(ScheduleKind::CriticalPath)->build(p, &why_not);
  if (!order) throw Error(ErrorKind::Internal, "critical-path did not build: " + why_not);
  return *order;
}

// The critical-path order of a 2-device problem, its makespan and 1F1B's, all by hand.
void expect_orders(const PipelineProblem& p, const std::string& device0,
                   const std::string& device1, double makespan_ms, double one_f_one_b_ms) {
  const ScheduleOrder order = build(p);
  EXPECT_EQ(letters(order.device_ops[0]), device0);
  EXPECT_EQ(letters(order.device_ops[1]), device1);
  EXPECT_DOUBLE_EQ(simulate(p, order).makespan_ms, makespan_ms);
  EXPECT_DOUBLE_EQ(simulate(p, *make_schedule("1f1b")->build(p, nullptr)).makespan_ms,
                   one_f_one_b_ms);
}

// 2 devices, free messages, no limit. mb 0: f = 2, b = 4; mbs 1, 2: f = 1, b = 2.
// Device 0 injects all three (nothing bounds it), device 1 runs each backward as soon as
// its forward ends. By hand: dev1 F0 [2,4] B0 [4,8] F1 [8,9] B1 [9,11] F2 [11,12]
// B2 [12,14]; dev0 F0 F1 F2 [0,4], B0 [8,12] B1 [12,14] B2 [14,16]. 1F1B: 18.
TEST(CriticalPathTest, LongThenShortOnTwoDevicesExactly) {
  expect_orders(testing::long_then_short_problem(), "F0 F1 F2 B0 B1 B2 ", "F0 B0 F1 B1 F2 B2 ",
                16.0, 18.0);
}

// A held micro-batch keeps its stored bytes and its sent output (100 + 5 on stage 0; the
// last stage sends nothing): the limit of 225 bytes (+ 10 peak) lets device 0 hold two,
// so it injects F2 only after B0 freed mb 0. By hand: dev0 F0 [0,1] F1 [1,2] B0 [4,6]
// F2 [6,7] B1 [7,9] F3 [9,10] B2 [10,12] B3 [13,15].
TEST(CriticalPathTest, MemoryBoundsWhatADeviceHoldsExactly) {
  PipelineProblem p = fused(testing::uniform_problem(4, 2, 1.0, 2.0));
  for (auto& per_stage : p.costs) {
    per_stage[0].output_bytes = 5;
    per_stage[1].output_bytes = 0;
  }
  p.memory_limit_bytes = 225;
  const ScheduleOrder order = build(p);
  EXPECT_EQ(letters(order.device_ops[0]), "F0 F1 B0 F2 B1 F3 B2 B3 ");
  EXPECT_EQ(letters(order.device_ops[1]), "F0 B0 F1 B1 F2 B2 F3 B3 ");
  const SimResult r = simulate(p, order);
  EXPECT_DOUBLE_EQ(r.makespan_ms, 15.0);
  EXPECT_EQ(r.peak_memory_bytes[0], 2 * (100 + 5) + 10);  // the simulator counts the outputs too
  EXPECT_TRUE(r.fits_memory);
  // 215 bytes would hold two stored activations but not their outputs too: one at a time.
  p.memory_limit_bytes = 215;
  EXPECT_EQ(letters(build(p).device_ops[0]), "F0 B0 F1 B1 F2 B2 F3 B3 ");
  // Without the limit device 0 injects all four first.
  p.memory_limit_bytes = 0;
  EXPECT_EQ(letters(build(p).device_ops[0]), "F0 F1 F2 F3 B0 B1 B2 B3 ");
}

// With the split backward the W passes wait for idle time: device 1 runs I0 and I1 as
// soon as they are ready and both W's at the end; device 0 fills the wait for I1 with
// W0. By hand: dev0 F0 [0,1] F1 [1,2] I0 [3,4] W0 [4,5] I1 [5,6] W1 [6,7]; dev1 F0 [1,2]
// I0 [2,3] F1 [3,4] I1 [4,5] W0 [5,6] W1 [6,7]. 1F1B with B = I + W: 9.
TEST(CriticalPathTest, SplitBackwardDefersWeightPassesExactly) {
  expect_orders(testing::uniform_problem(2, 2, 1.0, 2.0), "F0 F1 I0 W0 I1 W1 ",
                "F0 I0 F1 I1 W0 W1 ", 7.0, 9.0);
}

TEST(CriticalPathTest, NeedsOneChunk) {
  std::string why_not;
  EXPECT_FALSE(make_schedule("critical-path")->build(testing::uniform_problem(4, 2, 1, 2, 2), &why_not));
  EXPECT_EQ(why_not, "critical-path needs layout.chunks == 1, got 2");
  EXPECT_TRUE(make_schedule("critical-path")->adaptive());
}

// Random heterogeneous micro-batches: every op once (the simulator checks), a memory
// limit that each micro-batch fits alone is never exceeded, the makespan respects the
// lower bound, device 0 injects in id order, and the same problem gives the same order.
TEST(CriticalPathTest, RandomHeterogeneousProblemsKeepMemoryAndBounds) {
  constexpr int kProblems = 3000;
  Simulator simulator;
  int limited = 0, tight = 0;
  for (int n = 0; n < kProblems; ++n) {
    const std::uint64_t seed = 7700 + static_cast<std::uint64_t>(n);
    Rng rng(seed);
    const int devices = static_cast<int>(rng.uniform_int(1, 8));
    const int m = static_cast<int>(rng.uniform_int(1, 40));
    PipelineProblem p = testing::random_problem(rng, m, devices, 1);
    if (n % 3 == 0) p = fused(std::move(p));
    if (rng.uniform() < 0.7) {
      // From exactly the largest single footprint up to a few micro-batches more.
      std::int64_t alone = 0;
      for (int mb = 0; mb < m; ++mb) {
        for (int s = 0; s < devices; ++s) {
          const StageCost& c = p.costs[mb][s];
          alone = std::max(alone, p.static_bytes[s] + c.held_bytes() + c.peak_bytes);
        }
      }
      const bool exact = rng.uniform() < 0.3;
      p.memory_limit_bytes = alone + (exact ? 0 : rng.uniform_int(0, 3000));
      ++limited;
      tight += exact;
    }
    SCOPED_TRACE(cat("seed ", seed, " devices ", devices, " m ", m));
    const ScheduleOrder order = build(p);
    SimResult r;
    ASSERT_NO_THROW(simulator.run(p, order, {}, &r));
    EXPECT_TRUE(r.fits_memory);
    if (p.memory_limit_bytes > 0) {
      for (std::int64_t peak : r.peak_memory_bytes) ASSERT_LE(peak, p.memory_limit_bytes);
    }
    ASSERT_GE(r.makespan_ms + 1e-9, makespan_lower_bound_ms(p));
    int next = 0;
    for (const PipelineOp& op : order.device_ops[0]) {
      if (op.kind == OpKind::F) {
        ASSERT_EQ(op.mb, next++);
      }
    }
    const bool split = n % 3 != 0;
    for (const auto& ops : order.device_ops) {
      ASSERT_EQ(ops.size(), static_cast<std::size_t>((split ? 3 : 2) * m));
      for (const PipelineOp& op : ops) ASSERT_NE(op.kind, split ? OpKind::B : OpKind::I);
    }
    ASSERT_EQ(build(p).device_ops, order.device_ops);
  }
  EXPECT_GT(limited, kProblems / 2);
  EXPECT_GT(tight, kProblems / 10);
}

// Unequal micro-batches under a limit that 1F1B's count ignores: the critical-path
// schedule fits where 1F1B does not, and beats it on the alternating long/short case.
TEST(CriticalPathTest, FitsWhere1F1BDoesNotAndHidesLongMicroBatches) {
  PipelineProblem p = fused(testing::uniform_problem(8, 4, 1.0, 2.0));
  p.memory_limit_bytes = 250;
  EXPECT_FALSE(simulate(p, *make_schedule("1f1b")->build(p, nullptr)).fits_memory);
  EXPECT_TRUE(simulate(p, build(p)).fits_memory);

  PipelineProblem alternating = fused(testing::uniform_problem(12, 4, 1.0, 2.0));
  for (int mb = 0; mb < 12; mb += 2) {
    for (StageCost& c : alternating.costs[mb]) {
      c.fwd_ms = 4.0;
      c.bwd_ms = 8.0;
    }
  }
  const double one_f_one_b =
      simulate(alternating, *make_schedule("1f1b")->build(alternating, nullptr)).makespan_ms;
  EXPECT_DOUBLE_EQ(one_f_one_b, 170.0);
  EXPECT_LT(simulate(alternating, build(alternating)).makespan_ms, one_f_one_b);
}

}  // namespace
}  // namespace dynapipe
