#include "dynapipe/schedule/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/schedule/schedule.h"
#include "schedule/schedule_test_util.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using testing::uniform_problem;

PipelineOp F(int mb, int s) { return {mb, s, OpKind::F}; }
PipelineOp B(int mb, int s) { return {mb, s, OpKind::B}; }
PipelineOp I(int mb, int s) { return {mb, s, OpKind::I}; }
PipelineOp W(int mb, int s) { return {mb, s, OpKind::W}; }

// The timeline entries of one device, in order.
std::vector<TimedOp> on_device(const SimResult& r, int device) {
  std::vector<TimedOp> ops;
  for (const TimedOp& t : r.timeline) {
    if (t.device == device) ops.push_back(t);
  }
  return ops;
}

void expect_timed(const TimedOp& t, PipelineOp op, double start, double end) {
  EXPECT_EQ(t.op, op) << op_name(t.op) << " vs " << op_name(op);
  EXPECT_DOUBLE_EQ(t.start_ms, start) << op_name(op);
  EXPECT_DOUBLE_EQ(t.end_ms, end) << op_name(op);
}

ScheduleOrder one_f_one_b_2x2() {
  ScheduleOrder order;
  order.device_ops = {{F(0, 0), F(1, 0), B(0, 0), B(1, 0)},
                      {F(0, 1), B(0, 1), F(1, 1), B(1, 1)}};
  return order;
}

// Replicated stages: stage 0 (F 2 ms, B 4 ms) on two simulated devices taking micro-batches
// round robin (0 and 2; 1 and 3), stage 1 (F 1, B 2) on one; GPipe over 4 micro-batches.
// Stage 0's replicas overlap their work: 18 ms against 27 ms on one device, and each holds
// two micro-batches' activations instead of four.
TEST(SimulatorTest, ReplicatedStageRunsOnDevicesOfItsOwn) {
  PipelineProblem p = uniform_problem(4, 2, 1.0, 2.0);
  for (auto& per_stage : p.costs) {
    per_stage[0].fwd_ms = 2.0;
    per_stage[0].bwd_ms = 4.0;
  }
  ScheduleOrder plain;
  plain.device_ops = {{F(0, 0), F(1, 0), F(2, 0), F(3, 0), B(0, 0), B(1, 0), B(2, 0), B(3, 0)},
                      {F(0, 1), F(1, 1), F(2, 1), F(3, 1), B(0, 1), B(1, 1), B(2, 1), B(3, 1)}};
  EXPECT_DOUBLE_EQ(simulate(p, plain).makespan_ms, 27.0);
  p.stage_replicas = {2, 1};
  ASSERT_EQ(p.num_sim_devices(), 3);
  EXPECT_EQ(p.sim_device_of(F(3, 0)), 1);
  EXPECT_EQ(p.sim_device_of(F(3, 1)), 2);
  ScheduleOrder split;
  split.device_ops = {{F(0, 0), F(2, 0), B(0, 0), B(2, 0)},
                      {F(1, 0), F(3, 0), B(1, 0), B(3, 0)},
                      plain.device_ops[1]};
  SimResult r = simulate(p, split);
  EXPECT_DOUBLE_EQ(r.makespan_ms, 18.0);
  auto a = on_device(r, 0), b = on_device(r, 1), last = on_device(r, 2);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  expect_timed(a[0], F(0, 0), 0, 2);
  expect_timed(b[0], F(1, 0), 0, 2);
  expect_timed(last[1], F(1, 1), 3, 4);
  expect_timed(a[2], B(0, 0), 8, 12);
  expect_timed(b[3], B(3, 0), 14, 18);
  EXPECT_EQ(r.busy_ms, (std::vector<double>{12.0, 12.0, 12.0}));
  EXPECT_EQ(r.peak_memory_bytes, (std::vector<std::int64_t>{210, 210, 410}));
  for (const Transfer& t : r.transfers) {
    EXPECT_EQ(t.from_device == 2 ? t.to_device : t.from_device, t.mb % 2);
  }
  // An op on another stage-replica's device is named.
  std::swap(split.device_ops[0][0], split.device_ops[1][0]);
  try {
    simulate(p, split);
    FAIL() << "F(1, 0) on device 0 accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("F(mb 1, stage 0) must be on device 1, got device 0"));
  }
}

TEST(SimulatorTest, TinyOneFOneBTimelineWithoutCommunication) {
  PipelineProblem p = uniform_problem(2, 2, 1.0, 2.0);
  SimResult r = simulate(p, one_f_one_b_2x2());
  EXPECT_DOUBLE_EQ(r.makespan_ms, 9.0);  // (m + p - 1)(f + b)
  auto d0 = on_device(r, 0), d1 = on_device(r, 1);
  ASSERT_EQ(d0.size(), 4u);
  ASSERT_EQ(d1.size(), 4u);
  expect_timed(d0[0], F(0, 0), 0, 1);
  expect_timed(d0[1], F(1, 0), 1, 2);
  expect_timed(d0[2], B(0, 0), 4, 6);
  expect_timed(d0[3], B(1, 0), 7, 9);
  expect_timed(d1[0], F(0, 1), 1, 2);
  expect_timed(d1[1], B(0, 1), 2, 4);
  expect_timed(d1[2], F(1, 1), 4, 5);
  expect_timed(d1[3], B(1, 1), 5, 7);
  EXPECT_EQ(r.busy_ms, (std::vector<double>{6.0, 6.0}));
  // Free messages between devices are still messages: the plan must send them.
  ASSERT_EQ(r.transfers.size(), 4u);
  for (const Transfer& t : r.transfers) EXPECT_DOUBLE_EQ(t.send_ms, t.arrive_ms);
}

TEST(SimulatorTest, TinyOneFOneBTimelineWithCommunication) {
  PipelineProblem p = uniform_problem(2, 2, 1.0, 2.0);
  p.link_latency_ms = 0.5;
  p.link_bandwidth_gbs = 1.0;  // 1000 bytes: 0.001 ms
  for (auto& per_stage : p.costs) {
    for (auto& c : per_stage) c.output_bytes = 1'000'000;  // 1 ms at 1 GB/s
  }
  ASSERT_DOUBLE_EQ(p.p2p_ms(1'000'000), 1.5);
  SimResult r = simulate(p, one_f_one_b_2x2());
  // d0: F0 [0,1] -> arrives 2.5; F1 [1,2] -> link busy until 2.5 -> arrives 4.
  // d1: F0 [2.5,3.5] B0 [3.5,5.5] -> grad arrives 7; F1 [5.5,6.5] B1 [6.5,8.5] -> 10.
  // d0: B0 [7,9] B1 [10,12].
  auto d0 = on_device(r, 0), d1 = on_device(r, 1);
  expect_timed(d0[0], F(0, 0), 0, 1);
  expect_timed(d0[1], F(1, 0), 1, 2);
  expect_timed(d0[2], B(0, 0), 7, 9);
  expect_timed(d0[3], B(1, 0), 10, 12);
  expect_timed(d1[0], F(0, 1), 2.5, 3.5);
  expect_timed(d1[1], B(0, 1), 3.5, 5.5);
  expect_timed(d1[2], F(1, 1), 5.5, 6.5);
  expect_timed(d1[3], B(1, 1), 6.5, 8.5);
  EXPECT_DOUBLE_EQ(r.makespan_ms, 12.0);

  ASSERT_EQ(r.transfers.size(), 4u);
  const Transfer& act1 = r.transfers[1];
  EXPECT_EQ(act1.mb, 1);
  EXPECT_FALSE(act1.is_grad);
  EXPECT_EQ(act1.from_stage, 0);
  EXPECT_EQ(act1.to_stage, 1);
  EXPECT_EQ(act1.from_device, 0);
  EXPECT_EQ(act1.to_device, 1);
  EXPECT_EQ(act1.bytes, 1'000'000);
  EXPECT_DOUBLE_EQ(act1.send_ms, 2.0);
  EXPECT_DOUBLE_EQ(act1.arrive_ms, 4.0);  // waited for the link (FIFO)
  const Transfer& grad0 = r.transfers[2];
  EXPECT_TRUE(grad0.is_grad);
  EXPECT_EQ(grad0.from_device, 1);
  EXPECT_DOUBLE_EQ(grad0.send_ms, 5.5);
  EXPECT_DOUBLE_EQ(grad0.arrive_ms, 7.0);
}

TEST(SimulatorTest, ClosedFormsForEqualMicroBatches) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 5, 8, 16}) {
      const PipelineProblem problem = uniform_problem(m, p, 1.5, 2.5);
      for (const char* name : {"gpipe", "1f1b"}) {
        auto order = make_schedule(name)->build(problem, nullptr);
        ASSERT_TRUE(order);
        EXPECT_DOUBLE_EQ(simulate(problem, *order).makespan_ms, (m + p - 1) * 4.0)
            << name << " p=" << p << " m=" << m;
      }
    }
  }
}

TEST(SimulatorTest, CommunicationAddsTwoHopsPerStageBoundaryToGpipe) {
  // Latency-only links, hop h <= f: F(k, s) starts at k f + s (f + h) (by induction on
  // k and s; the link is free again before the next message), so the forward wave
  // reaches the last stage (p - 1) h late, and the backward wave mirrors it:
  // makespan = (m + p - 1)(f + b) + 2 (p - 1) h.
  for (int p : {2, 4, 8}) {
    const int m = 8;
    PipelineProblem problem = uniform_problem(m, p, 1.0, 1.5);
    for (auto& per_stage : problem.costs) {
      for (auto& c : per_stage) c.output_bytes = 0;
    }
    problem.link_latency_ms = 0.25;
    problem.link_bandwidth_gbs = 100;
    auto order = make_schedule("gpipe")->build(problem, nullptr);
    ASSERT_TRUE(order);
    const SimResult r = simulate(problem, *order);
    EXPECT_DOUBLE_EQ(r.makespan_ms, (m + p - 1) * 2.5 + 2 * (p - 1) * 0.25) << "p=" << p;
    EXPECT_EQ(r.transfers.size(), static_cast<std::size_t>(2 * m * (p - 1)));
  }
}

TEST(SimulatorTest, LinksCarryOneMessageAtATime) {
  PipelineProblem p = uniform_problem(2, 2, 1.0, 1.0);
  p.link_latency_ms = 3.0;
  p.link_bandwidth_gbs = 1;  // latency only: the messages are empty
  for (auto& per_stage : p.costs) {
    for (auto& c : per_stage) c.output_bytes = 0;
  }
  auto order = make_schedule("gpipe")->build(p, nullptr);
  const SimResult r = simulate(p, *order);
  // F(0,0) [0,1] -> link [1,4]; F(1,0) [1,2] waits for the link -> [4,7].
  auto d1 = on_device(r, 1);
  expect_timed(d1[0], F(0, 1), 4, 5);
  expect_timed(d1[1], F(1, 1), 7, 8);
}

TEST(SimulatorTest, MemoryFollowsEachDevicesOrder) {
  PipelineProblem p = uniform_problem(4, 2, 1.0, 2.0);
  p.static_bytes = {1000, 2000};
  auto order = make_schedule("1f1b")->build(p, nullptr);
  const SimResult r = simulate(p, *order);
  // Device 0 holds two micro-batches (warm-up 1 + the steady F) at the second F.
  EXPECT_EQ(r.peak_memory_bytes[0], 1000 + 2 * 100 + 10);
  EXPECT_EQ(r.peak_op[0], F(1, 0));
  EXPECT_EQ(r.peak_memory_bytes[1], 2000 + 100 + 10);
  EXPECT_TRUE(r.fits_memory);
  p.memory_limit_bytes = 1209;
  EXPECT_FALSE(simulate(p, *order).fits_memory);
  p.memory_limit_bytes = 2110;
  EXPECT_TRUE(simulate(p, *order).fits_memory);
}

TEST(SimulatorTest, SplitBackwardFreesAtW) {
  PipelineProblem p = uniform_problem(2, 1, 1.0, 2.0);
  ScheduleOrder order;
  order.device_ops = {{F(0, 0), F(1, 0), I(0, 0), I(1, 0), W(0, 0), W(1, 0)}};
  const SimResult r = simulate(p, order);
  EXPECT_EQ(r.peak_memory_bytes[0], 2 * 100 + 10);
  EXPECT_DOUBLE_EQ(r.makespan_ms, 2 * 1.0 + 4 * 1.0);
}

// A forward's sent output (7 bytes on stage 0; the last stage sends none) is held with its
// 100 stored bytes until right before the backward of its (mb, stage), as the lowered plan
// holds it: 1F1B's second forward on device 0 peaks at 2 · (100 + 7) + 10 = 224. With the
// split backward I frees the output and W the stored bytes: F0 I0 F1 peaks at 100 (mb 0's
// stored) + 107 + 10 = 217, where freeing the output only at W would give 224.
TEST(SimulatorTest, SentOutputsAreHeldUntilTheirBackward) {
  PipelineProblem p = uniform_problem(2, 2, 1.0, 2.0);
  for (auto& per_stage : p.costs) per_stage[0].output_bytes = 7;
  const SimResult fused = simulate(p, one_f_one_b_2x2());
  EXPECT_EQ(fused.peak_memory_bytes, (std::vector<std::int64_t>{224, 110}));
  EXPECT_EQ(fused.peak_op[0], F(1, 0));
  p.memory_limit_bytes = 223;
  EXPECT_FALSE(simulate(p, one_f_one_b_2x2()).fits_memory);
  p.memory_limit_bytes = 0;
  ScheduleOrder split;
  split.device_ops = {{F(0, 0), I(0, 0), F(1, 0), W(0, 0), I(1, 0), W(1, 0)},
                      {F(0, 1), I(0, 1), F(1, 1), I(1, 1), W(0, 1), W(1, 1)}};
  EXPECT_EQ(simulate(p, split).peak_memory_bytes[0], 100 + 107 + 10);
}

TEST(SimulatorTest, CycleBarriersDelayTheNextCycle) {
  PipelineProblem p = uniform_problem(1, 2, 1.0, 1.0);
  p.costs[0][0].fwd_ms = 5.0;
  ScheduleOrder order;
  order.device_ops = {{F(0, 0), B(0, 0)}, {F(0, 1), B(0, 1)}};
  order.op_cycle = {{0, 3}, {1, 2}};
  const SimResult r = simulate(p, order);
  auto d0 = on_device(r, 0), d1 = on_device(r, 1);
  expect_timed(d1[0], F(0, 1), 5, 6);
  expect_timed(d1[1], B(0, 1), 6, 7);
  expect_timed(d0[1], B(0, 0), 7, 8);
  // A barrier that the data dependencies would not need: B(0,0) alone in cycle 5 after
  // an empty cycle 4 still only waits for cycle 3's end.
  order.op_cycle = {{0, 5}, {1, 3}};
  EXPECT_DOUBLE_EQ(simulate(p, order).makespan_ms, 8.0);
}

TEST(SimulatorTest, PlantedDeadlockIsNamed) {
  PipelineProblem p = uniform_problem(2, 2, 1.0, 1.0);
  ScheduleOrder order = one_f_one_b_2x2();
  // Device 1 runs B(1,1) before F(1,1), and its B(0,1) after F(1,1), while device 0
  // waits for B(0,1)'s gradient before it sends anything else: B(1,1) waits forever.
  order.device_ops[1] = {F(0, 1), B(1, 1), F(1, 1), B(0, 1)};
  try {
    simulate(p, order);
    FAIL() << "expected a deadlock";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("deadlock"));
    EXPECT_THAT(e.what(), HasSubstr("device 1 at B(mb 1, stage 1) waits for F(mb 1, stage 1)"));
    EXPECT_THAT(e.what(), HasSubstr("device 0 at B(mb 0, stage 0) waits for the backward"));
  }
  // B before its own F on a single device.
  PipelineProblem single = uniform_problem(1, 1, 1.0, 1.0);
  ScheduleOrder bad;
  bad.device_ops = {{B(0, 0), F(0, 0)}};
  EXPECT_THROW(simulate(single, bad), Error);
}

TEST(SimulatorTest, RejectsMalformedOrders) {
  PipelineProblem p = uniform_problem(1, 2, 1.0, 1.0);
  auto expect_invalid = [&](ScheduleOrder order, const std::string& text) {
    try {
      simulate(p, order);
      FAIL() << "expected InvalidArgument containing " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr(text));
    }
  };
  ScheduleOrder order;
  order.device_ops = {{F(0, 0), B(0, 0)}, {F(0, 1), B(0, 1)}};
  EXPECT_NO_THROW(simulate(p, order));
  ScheduleOrder wrong_device = order;
  std::swap(wrong_device.device_ops[0][0], wrong_device.device_ops[1][0]);
  expect_invalid(wrong_device, "F(mb 0, stage 1) must be on device 1, got device 0");
  ScheduleOrder duplicate = order;
  duplicate.device_ops[0].push_back(F(0, 0));
  expect_invalid(duplicate, "F(mb 0, stage 0) must appear once");
  ScheduleOrder missing = order;
  missing.device_ops[1].pop_back();
  expect_invalid(missing, "micro-batch 0 on stage 1 must have F and either B or both I and W");
  ScheduleOrder mixed = order;
  mixed.device_ops[1].push_back(I(0, 1));
  expect_invalid(mixed, "got F B I");
  ScheduleOrder out_of_range = order;
  out_of_range.device_ops[0].push_back(F(3, 0));
  expect_invalid(out_of_range, "mb in [0, 1)");
  ScheduleOrder too_few;
  too_few.device_ops = {{F(0, 0), B(0, 0)}};
  expect_invalid(too_few, "one op list per device (2), got 1");
}

TEST(SimulatorTest, RejectsInconsistentProblems) {
  PipelineProblem p = uniform_problem(1, 2, 1.0, 1.0);
  ScheduleOrder order;
  order.device_ops = {{F(0, 0), B(0, 0)}, {F(0, 1), B(0, 1)}};
  PipelineProblem bad = p;
  bad.static_bytes.pop_back();
  EXPECT_THROW(simulate(bad, order), Error);
  bad = p;
  bad.costs[0][1].fwd_ms = -1;
  try {
    simulate(bad, order);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("costs[0][1] must have non-negative times"));
  }
}

TEST(SimulatorTest, PointToPointTime) {
  PipelineProblem p;
  EXPECT_DOUBLE_EQ(p.p2p_ms(1 << 30), 0.0);  // bandwidth 0: free
  p.link_latency_ms = 0.01;
  p.link_bandwidth_gbs = 12.5;
  EXPECT_DOUBLE_EQ(p.p2p_ms(1'250'000), 0.11);  // 1.25 MB at 100 Gbps + latency
}

TEST(SimulatorTest, LowerBoundsAndBubbles) {
  const PipelineProblem p = uniform_problem(8, 4, 1.0, 2.0);
  EXPECT_DOUBLE_EQ(ideal_makespan_ms(p), 8 * 3.0);
  // The last device's work starts after three forwards (fill) and, where every backward
  // runs whole (B = 2), its last backward leaves three below it (drain): 3 + 24 + 6, 1F1B's
  // makespan exactly. Split (I = W = 1), the drain's W can fill the device's own idle time.
  EXPECT_DOUBLE_EQ(makespan_lower_bound_ms(p), 3 + 8 * 3.0);
  EXPECT_DOUBLE_EQ(makespan_lower_bound_ms(p, /*whole_backward=*/true), 3 + 8 * 3.0 + 6);
  auto order = make_schedule("1f1b")->build(p, nullptr);
  const SimResult r = simulate(p, *order);
  EXPECT_DOUBLE_EQ(r.makespan_ms, makespan_lower_bound_ms(p, true));
  for (double bubble : bubble_fractions(r)) {
    EXPECT_DOUBLE_EQ(bubble, 1.0 - 24.0 / 33.0);  // (p - 1) / (m + p - 1)
  }
  const PipelineProblem one = uniform_problem(1, 4, 1.0, 2.0);
  // One micro-batch's chain: F + I per stage (W is off the chain when the cost model
  // splits the backward), 4 x (1 + 1).
  EXPECT_DOUBLE_EQ(makespan_lower_bound_ms(one), 8.0);
  EXPECT_EQ(bubble_fractions(SimResult{}), std::vector<double>{});
}

TEST(SimulatorTest, BothLowerBoundsInOnePass) {
  // As LowerBoundsAndBubbles: fill + work, and + drain where backwards run whole.
  const MakespanLowerBounds pipeline = makespan_lower_bounds_ms(uniform_problem(8, 4, 1.0, 2.0));
  EXPECT_DOUBLE_EQ(pipeline.split_ms, 3 + 8 * 3.0);
  EXPECT_DOUBLE_EQ(pipeline.whole_ms, 3 + 8 * 3.0 + 6);
  // Interleaved (two chunks per device): no fill or drain term, so both are a device's
  // work, 4 micro-batches x 2 chunks x (1 + 2).
  const MakespanLowerBounds interleaved = makespan_lower_bounds_ms(uniform_problem(4, 2, 1.0, 2.0, 2));
  EXPECT_DOUBLE_EQ(interleaved.split_ms, 24.0);
  EXPECT_DOUBLE_EQ(interleaved.whole_ms, 24.0);
  const MakespanLowerBounds none = makespan_lower_bounds_ms(uniform_problem(0, 3, 1.0, 1.0));
  EXPECT_EQ(none.split_ms, 0.0);
  EXPECT_EQ(none.whole_ms, 0.0);
}

TEST(SimulatorTest, EmptyProblemTakesNoTime) {
  const PipelineProblem p = uniform_problem(0, 3, 1.0, 1.0);
  for (const std::string& name : schedule_names()) {
    if (name == "interleaved") continue;
    auto order = make_schedule(name)->build(p, nullptr);
    ASSERT_TRUE(order) << name;
    EXPECT_DOUBLE_EQ(simulate(p, *order).makespan_ms, 0.0) << name;
  }
}

}  // namespace
}  // namespace dynapipe

namespace dynapipe {
namespace {

// stop_at_ms: a run stops once an op ends at or after the bound (its makespan is at least
// that), and a bound above the makespan changes nothing. Random problems and schedules.
TEST(SimulatorTest, StopAtBoundsTheMakespanFromBelow) {
  Rng rng(7);
  Simulator simulator;
  for (int trial = 0; trial < 200; ++trial) {
    const int devices = static_cast<int>(rng.uniform_int(1, 4));
    const int m = static_cast<int>(rng.uniform_int(1, 8));
    const PipelineProblem problem = testing::random_problem(rng, m, devices, 1);
    const auto order = make_schedule(ScheduleKind::OneFOneB)->build(problem, nullptr);
    ASSERT_TRUE(order.has_value());
    SimResult full, bounded;
    simulator.run(problem, *order, SimOptions{.record = false}, &full);
    ASSERT_FALSE(full.stopped);
    simulator.run(problem, *order, SimOptions{.record = false, .stop_at_ms = full.makespan_ms * 1.01},
                  &bounded);
    EXPECT_FALSE(bounded.stopped);
    EXPECT_EQ(bounded.makespan_ms, full.makespan_ms);
    EXPECT_EQ(bounded.peak_memory_bytes, full.peak_memory_bytes);
    // At the makespan itself (a tie cannot win a search) and below it, the run stops.
    simulator.run(problem, *order, SimOptions{.record = false, .stop_at_ms = full.makespan_ms},
                  &bounded);
    EXPECT_TRUE(bounded.stopped);
    simulator.run(problem, *order, SimOptions{.record = false, .stop_at_ms = full.makespan_ms * 0.5},
                  &bounded);
    EXPECT_TRUE(bounded.stopped);
  }
}

}  // namespace
}  // namespace dynapipe
