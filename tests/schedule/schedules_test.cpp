#include "dynapipe/schedule/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "dynapipe/core/error.h"
#include "dynapipe/schedule/simulator.h"
#include "schedule/schedule_test_util.h"

namespace dynapipe {
namespace {

using testing::letters;

using ::testing::HasSubstr;
using testing::uniform_problem;

SimResult run(const std::string& name, const PipelineProblem& problem) {
  std::string why_not;
  auto order = make_schedule(name)->build(problem, &why_not);
  if (!order) throw Error(ErrorKind::Internal, name + " did not build: " + why_not);
  return simulate(problem, *order);
}

double mean_bubble(const SimResult& r) {
  auto b = bubble_fractions(r);
  return std::accumulate(b.begin(), b.end(), 0.0) / static_cast<double>(b.size());
}

TEST(ScheduleTest, RegistryKnowsTheContractNames) {
  EXPECT_EQ(schedule_names(), (std::vector<std::string>{"gpipe", "1f1b", "interleaved", "cyclic",
                                                        "wait-free-cyclic", "zb1p",
                                                        "critical-path"}));
  for (const std::string& name : schedule_names()) EXPECT_EQ(make_schedule(name)->name(), name);
  try {
    make_schedule("2f2b");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("schedule must be one of gpipe, 1f1b"));
    EXPECT_THAT(e.what(), HasSubstr("got \"2f2b\""));
  }
  EXPECT_TRUE(make_schedule("cyclic")->adaptive());
  EXPECT_FALSE(make_schedule("1f1b")->adaptive());
  EXPECT_TRUE(make_schedule("interleaved")->needs_virtual_stages());
}

TEST(ScheduleTest, LayoutsThatDoNotApplyAreValuesNotErrors) {
  std::string why;
  EXPECT_FALSE(make_schedule("interleaved")->build(uniform_problem(4, 2, 1, 1), &why));
  EXPECT_EQ(why, "interleaved needs layout.chunks >= 2, got 1");
  EXPECT_FALSE(make_schedule("1f1b")->build(uniform_problem(4, 2, 1, 1, 2), &why));
  EXPECT_EQ(why, "1f1b needs layout.chunks == 1, got 2");
  EXPECT_FALSE(make_schedule("zb1p")->build(uniform_problem(4, 2, 1, 1, 2), &why));
  PipelineProblem unsplit = uniform_problem(4, 2, 1, 1);
  for (auto& per_stage : unsplit.costs) {
    for (auto& c : per_stage) c.bwd_input_ms = c.bwd_weight_ms = 0;
  }
  EXPECT_FALSE(make_schedule("zb1p")->build(unsplit, &why));
  EXPECT_THAT(why, HasSubstr("split backward"));
  EXPECT_TRUE(make_schedule("gpipe")->build(uniform_problem(4, 2, 1, 1, 2), nullptr));
  EXPECT_TRUE(make_schedule("cyclic")->build(uniform_problem(4, 2, 1, 1, 2), nullptr));
}

TEST(ScheduleTest, OneFOneBWarmsUpLikeMegatron) {
  auto order = make_schedule("1f1b")->build(uniform_problem(5, 3, 1, 2), nullptr);
  EXPECT_EQ(letters(order->device_ops[0]), "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4 ");
  EXPECT_EQ(letters(order->device_ops[1]), "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4 ");
  EXPECT_EQ(letters(order->device_ops[2]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 ");
  // Fewer micro-batches than the warm-up.
  order = make_schedule("1f1b")->build(uniform_problem(1, 3, 1, 2), nullptr);
  EXPECT_EQ(letters(order->device_ops[0]), "F0 B0 ");
}

TEST(ScheduleTest, GpipeRunsAllForwardsThenBackwardsInReverse) {
  auto order = make_schedule("gpipe")->build(uniform_problem(3, 2, 1, 2), nullptr);
  EXPECT_EQ(letters(order->device_ops[1]), "F0 F1 F2 B2 B1 B0 ");
}

TEST(ScheduleTest, InterleavedHasSmallerBubbleThanOneFOneB) {
  // The same model: 8 layers' worth of work per device, split into 2 chunks.
  for (int m : {4, 8, 16}) {
    const PipelineProblem plain = uniform_problem(m, 4, 2.0, 4.0);
    const PipelineProblem interleaved = uniform_problem(m, 4, 1.0, 2.0, /*chunks=*/2);
    ASSERT_DOUBLE_EQ(ideal_makespan_ms(plain), ideal_makespan_ms(interleaved));
    const SimResult a = run("1f1b", plain), b = run("interleaved", interleaved);
    EXPECT_LT(b.makespan_ms, a.makespan_ms) << "m=" << m;
    EXPECT_LT(mean_bubble(b), mean_bubble(a)) << "m=" << m;
    // Megatron's bubble for m a multiple of p: (p - 1) (f + b) / chunks.
    EXPECT_DOUBLE_EQ(b.makespan_ms, m * 6.0 + 3 * 6.0 / 2) << "m=" << m;
  }
}

TEST(ScheduleTest, InterleavedHandlesMicroBatchCountsNotAMultipleOfTheDevices) {
  for (int m : {1, 2, 3, 5, 6, 7, 9, 13}) {
    for (int chunks : {2, 3}) {
      const PipelineProblem p = uniform_problem(m, 4, 1.0, 2.0, chunks);
      const SimResult r = run("interleaved", p);  // builds, completes
      EXPECT_GE(r.makespan_ms, makespan_lower_bound_ms(p) - 1e-9);
    }
  }
}

TEST(ScheduleTest, ZeroBubbleCutsTheOneFOneBBubbleToAboutAThird) {
  // f = i = w: ZB-H1's bubble is (p - 1)(f + i - w) against 1F1B's (p - 1)(f + i + w).
  for (int p : {2, 4, 8}) {
    const int m = 3 * p;
    const PipelineProblem problem = uniform_problem(m, p, 1.0, 2.0);
    const double ideal = ideal_makespan_ms(problem);
    const double one_f_one_b = run("1f1b", problem).makespan_ms - ideal;
    const SimResult zb = run("zb1p", problem);
    const double zero_bubble = zb.makespan_ms - ideal;
    EXPECT_DOUBLE_EQ(one_f_one_b, 3.0 * (p - 1));
    EXPECT_GE(zero_bubble / one_f_one_b, 0.25) << "p=" << p;
    EXPECT_LE(zero_bubble / one_f_one_b, 0.5) << "p=" << p;
    // Same peak activation memory as 1F1B (stage 0's).
    const SimResult ofob = run("1f1b", problem);
    EXPECT_LE(*std::max_element(zb.peak_memory_bytes.begin(), zb.peak_memory_bytes.end()),
              *std::max_element(ofob.peak_memory_bytes.begin(), ofob.peak_memory_bytes.end()));
  }
}

TEST(ScheduleTest, ZeroBubbleDefersWeightGradientsToIdleTime) {
  auto order = make_schedule("zb1p")->build(uniform_problem(4, 2, 1.0, 2.0), nullptr);
  // The last stage runs I right after its F and defers W while it waits for the next F.
  EXPECT_EQ(letters(order->device_ops[1]), "F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3 ");
  EXPECT_EQ(letters(order->device_ops[0]), "F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3 ");
}

// Two kinds of micro-batches alternate: 1F1B pairs each long forward with a short
// backward and stalls; the cyclic order adapts.
PipelineProblem alternating_problem() {
  PipelineProblem p = uniform_problem(12, 4, 1.0, 2.0);
  for (int mb = 0; mb < 12; mb += 2) {
    for (auto& c : p.costs[mb]) {
      c.fwd_ms = 4.0;
      c.bwd_ms = 8.0;
    }
  }
  return p;
}

TEST(ScheduleTest, CyclicWithUnlimitedMemoryIsNoWorseThanOneFOneB) {
  const PipelineProblem p = alternating_problem();
  const double one_f_one_b = run("1f1b", p).makespan_ms;
  const double wait_free = run("wait-free-cyclic", p).makespan_ms;
  const double cyclic = run("cyclic", p).makespan_ms;
  EXPECT_LE(wait_free, one_f_one_b);
  EXPECT_LE(wait_free, cyclic);  // dropping the barriers never hurts the same order
}

TEST(ScheduleTest, CyclicAndWaitFreeShareTheOrder) {
  const PipelineProblem p = alternating_problem();
  auto a = make_schedule("cyclic")->build(p, nullptr);
  auto b = make_schedule("wait-free-cyclic")->build(p, nullptr);
  EXPECT_EQ(a->device_ops, b->device_ops);
  EXPECT_FALSE(a->op_cycle.empty());
  EXPECT_TRUE(b->op_cycle.empty());
}

TEST(ScheduleTest, MemoryAwareInjectionKeepsPeakUnderTheLimit) {
  // Stage 0 holds 100 bytes per micro-batch in flight; 1F1B keeps 4 there (410 bytes
  // with the transient), the limit allows 2.
  PipelineProblem p = uniform_problem(8, 4, 1.0, 2.0);
  p.memory_limit_bytes = 250;
  const SimResult ofob = run("1f1b", p);
  EXPECT_FALSE(ofob.fits_memory);
  EXPECT_EQ(ofob.peak_memory_bytes[0], 410);
  for (const char* name : {"cyclic", "wait-free-cyclic"}) {
    const SimResult r = run(name, p);
    EXPECT_TRUE(r.fits_memory) << name;
    for (std::int64_t peak : r.peak_memory_bytes) EXPECT_LE(peak, 250) << name;
  }
  // Without the limit the cyclic schedule fills the pipeline.
  p.memory_limit_bytes = 0;
  EXPECT_GT(run("cyclic", p).peak_memory_bytes[0], 250);
}

// The admission counts what a micro-batch holds: its stored bytes and its sent output (5
// bytes on the first three stages). At 215 bytes two stored activations would fit with the
// transient (210) but not their outputs too (220): one micro-batch at a time on stage 0.
TEST(ScheduleTest, MemoryAwareInjectionCountsTheSentOutputs) {
  PipelineProblem p = uniform_problem(8, 4, 1.0, 2.0);
  for (auto& per_stage : p.costs) {
    for (int s = 0; s + 1 < 4; ++s) per_stage[s].output_bytes = 5;
  }
  p.memory_limit_bytes = 215;
  for (const char* name : {"cyclic", "wait-free-cyclic"}) {
    const SimResult r = run(name, p);
    EXPECT_TRUE(r.fits_memory) << name;
    EXPECT_EQ(r.peak_memory_bytes[0], 100 + 5 + 10) << name;
  }
  p.memory_limit_bytes = 220;  // two fit
  EXPECT_EQ(run("wait-free-cyclic", p).peak_memory_bytes[0], 2 * (100 + 5) + 10);
}

TEST(ScheduleTest, CyclicAdmitsMicroBatchZeroEvenWhenItCannotFit) {
  PipelineProblem p = uniform_problem(3, 2, 1.0, 2.0);
  p.memory_limit_bytes = 50;  // below one micro-batch
  const SimResult r = run("wait-free-cyclic", p);  // completes
  EXPECT_FALSE(r.fits_memory);
  EXPECT_EQ(r.peak_memory_bytes[0], 110);  // one at a time
}

}  // namespace
}  // namespace dynapipe
