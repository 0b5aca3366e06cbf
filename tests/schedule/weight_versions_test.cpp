// The asynchronous schedules' weight versions (weight_versions.h) on exact small cases,
// and the simulator's memory with stashed versions.
#include "dynapipe/schedule/weight_versions.h"

#include <gtest/gtest.h>

#include <map>

#include "dynapipe/schedule/schedule.h"
#include "dynapipe/schedule/simulator.h"
#include "schedule/schedule_test_util.h"

namespace dynapipe {
namespace {

PipelineProblem problem(int m, int devices, bool vertical_sync = false) {
  PipelineProblem p = testing::uniform_problem(m, devices, 1.0, 2.0);
  for (auto& per_stage : p.costs) {
    for (StageCost& c : per_stage) {
      c.stored_bytes = 10;
      c.peak_bytes = 0;
    }
  }
  p.static_bytes.assign(devices, 1000);
  p.weight_bytes.assign(devices, 100);
  p.vertical_sync = vertical_sync;
  return p;
}

ScheduleOrder build(ScheduleKind kind, const PipelineProblem& p) {
  return *make_schedule(kind)->build(p, nullptr);
}

// Versions of the forwards of one device, in its order.
std::vector<int> forward_versions(const ScheduleOrder& order, const WeightVersionPlan& plan,
                                  int d) {
  std::vector<int> versions;
  for (std::size_t k = 0; k < order.device_ops[d].size(); ++k) {
    if (order.device_ops[d][k].kind == OpKind::F) {
      versions.push_back(plan.devices[d].ops[k].version);
    }
  }
  return versions;
}

// Each B uses its F's version, and steps follow the rule's backwards.
void expect_backward_uses_forward_version(const ScheduleOrder& order,
                                          const WeightVersionPlan& plan) {
  for (std::size_t d = 0; d < order.device_ops.size(); ++d) {
    std::map<int, int> fwd;
    for (std::size_t k = 0; k < order.device_ops[d].size(); ++k) {
      const PipelineOp& op = order.device_ops[d][k];
      if (op.kind == OpKind::F) fwd[op.mb] = plan.devices[d].ops[k].version;
      if (op.kind == OpKind::B) {
        EXPECT_EQ(plan.devices[d].ops[k].version, fwd.at(op.mb)) << op_name(op);
      }
    }
  }
}

TEST(WeightVersionsTest, AsyncSchedulesAreOptInAndUseTheOneFOneBOrder) {
  for (ScheduleKind kind : schedule_kinds()) EXPECT_FALSE(is_async_schedule(kind));
  EXPECT_EQ(*parse_schedule_kind("pipedream"), ScheduleKind::PipeDream);
  EXPECT_EQ(*parse_schedule_kind("pipedream-2bw"), ScheduleKind::PipeDream2BW);
  const PipelineProblem p = problem(5, 3);
  const ScheduleOrder pd = build(ScheduleKind::PipeDream, p);
  EXPECT_EQ(pd.device_ops, build(ScheduleKind::OneFOneB, p).device_ops);
  EXPECT_EQ(pd.weight_update, WeightUpdate::PerMicroBatch);
  EXPECT_EQ(build(ScheduleKind::PipeDream, problem(5, 3, true)).weight_update,
            WeightUpdate::VerticalSync);
  EXPECT_EQ(build(ScheduleKind::PipeDream2BW, p).weight_update, WeightUpdate::TwoBuffer);
}

TEST(WeightVersionsTest, PipeDreamStashesOneVersionPerMicroBatchInFlight) {
  const ScheduleOrder order = build(ScheduleKind::PipeDream, problem(5, 3));
  const WeightVersionPlan plan = weight_versions(order);
  // Device d's forward of micro-batch i runs after max(0, i - (D - 1 - d)) backwards.
  EXPECT_EQ(forward_versions(order, plan, 0), (std::vector<int>{0, 0, 0, 1, 2}));
  EXPECT_EQ(forward_versions(order, plan, 1), (std::vector<int>{0, 0, 1, 2, 3}));
  EXPECT_EQ(forward_versions(order, plan, 2), (std::vector<int>{0, 1, 2, 3, 4}));
  expect_backward_uses_forward_version(order, plan);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(plan.devices[d].steps, 5);
  EXPECT_EQ(plan.devices[0].max_stashed, 2);
  EXPECT_EQ(plan.devices[1].max_stashed, 1);
  EXPECT_EQ(plan.devices[2].max_stashed, 0);
  // Device 0: F0 F1 F2 B0 F3 B1 F4 B2 B3 B4. B2 frees version 0, then stashes version 2.
  const VersionedOp& b2 = plan.devices[0].ops[7];
  EXPECT_EQ(b2.version, 0);
  EXPECT_EQ(b2.free_after, std::vector<int>{0});
  EXPECT_TRUE(b2.stash_before);
  EXPECT_TRUE(b2.step_after);
}

TEST(WeightVersionsTest, VerticalSyncUsesTheFirstStagesVersionEverywhere) {
  const ScheduleOrder order = build(ScheduleKind::PipeDream, problem(5, 3, true));
  const WeightVersionPlan plan = weight_versions(order);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(forward_versions(order, plan, d), (std::vector<int>{0, 0, 0, 1, 2})) << d;
  }
  expect_backward_uses_forward_version(order, plan);
  // The last stage is ahead by two steps: it keeps two older versions.
  EXPECT_EQ(plan.devices[2].max_stashed, 2);
}

TEST(WeightVersionsTest, TwoBufferUsesTheVersionBeforeAndKeepsOneCopy) {
  const ScheduleOrder order = build(ScheduleKind::PipeDream2BW, problem(7, 3));
  const WeightVersionPlan plan = weight_versions(order);
  // Groups of 3 micro-batches: {0,1,2} and {3,4,5} use version 0, {6} version 1.
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(forward_versions(order, plan, d), (std::vector<int>{0, 0, 0, 0, 0, 0, 1})) << d;
    EXPECT_EQ(plan.devices[d].steps, 3) << d;
    EXPECT_EQ(plan.devices[d].max_stashed, 1) << d;  // two buffers
  }
  expect_backward_uses_forward_version(order, plan);
}

TEST(WeightVersionsTest, SimulatorCountsStashedVersions) {
  const PipelineProblem p = problem(5, 3);
  const SimResult sync = simulate(p, build(ScheduleKind::OneFOneB, p));
  const SimResult async = simulate(p, build(ScheduleKind::PipeDream, p));
  // 1F1B, device 0: static 1000 + three stored micro-batches.
  EXPECT_EQ(sync.peak_memory_bytes[0], 1030);
  // pipedream, device 0: during F4 three micro-batches are stored and versions 0 and 1
  // are stashed: 1000 + 30 + 2 * 100.
  EXPECT_EQ(async.peak_memory_bytes[0], 1230);
  EXPECT_EQ(async.peak_op[0], (PipelineOp{4, 0, OpKind::F}));
  // Device 1 stashes one version at a time (B1 frees version 0 before it stashes
  // version 1): at most two stored micro-batches and one copy, 1000 + 20 + 100.
  EXPECT_EQ(async.peak_memory_bytes[1], 1120);
  EXPECT_EQ(async.peak_memory_bytes[2], 1010);  // the last stage never stashes
  EXPECT_EQ(sync.makespan_ms, async.makespan_ms);  // same order, same time
}

}  // namespace
}  // namespace dynapipe
