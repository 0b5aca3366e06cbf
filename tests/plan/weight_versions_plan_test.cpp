// Asynchronous plans: add_weight_versions() over a lowered 1F1B, the verifier's weight
// version rules, and the codecs carrying the version field and the two new ops.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "dynapipe/core/error.h"
#include "dynapipe/plan/lowering.h"
#include "dynapipe/plan/plan_binary.h"
#include "dynapipe/plan/plan_json.h"
#include "dynapipe/plan/verifier.h"
#include "plan/test_pipelines.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using Op = InstructionOp;

testing::Lowered lowered_async(int devices, int mbs, WeightUpdate rule) {
  ScheduleOrder order = testing::one_f_one_b(devices, mbs);
  order.weight_update = rule;
  testing::Lowered l = testing::lower(order, {.num_devices = devices}, mbs);
  add_weight_versions(l.programs, l.order);
  return l;
}

VerifyOptions options_for(const testing::Lowered& l) {
  VerifyOptions options;
  options.layout = l.layout;
  options.num_microbatches = static_cast<int>(l.shapes.size());
  return options;
}

std::vector<Op> ops_of(const ExecutorProgram& program) {
  std::vector<Op> ops;
  for (const Instruction& in : program.instructions) ops.push_back(in.op);
  return ops;
}

std::string failure(const std::vector<ExecutorProgram>& programs, const VerifyOptions& options) {
  try {
    verify_programs(programs, options);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "verify_programs accepted a broken plan";
  return "";
}

TEST(WeightVersionsPlanTest, LoweredAsyncPlansVerifyForEveryRule) {
  for (WeightUpdate rule : {WeightUpdate::PerMicroBatch, WeightUpdate::VerticalSync,
                            WeightUpdate::TwoBuffer}) {
    for (int devices : {2, 3, 4}) {
      testing::Lowered l = lowered_async(devices, 7, rule);
      VerifyOptions options = options_for(l);
      options.weight_bytes.assign(devices, 100);
      options.stored_bytes.assign(7, std::vector<std::int64_t>(devices, 0));
      VerifyReport report = verify_programs(l.programs, options);
      for (const ExecutorProgram& p : l.programs) {
        const auto ops = ops_of(p);
        EXPECT_EQ(std::count(ops.begin(), ops.end(), Op::StashWeights),
                  std::count(ops.begin(), ops.end(), Op::FreeWeights));
        EXPECT_EQ(std::count(ops.begin(), ops.end(), Op::ReduceGrads), 0);
        const auto steps = std::count(ops.begin(), ops.end(), Op::OptimizerStep);
        EXPECT_EQ(steps, rule == WeightUpdate::TwoBuffer ? (7 + devices - 1) / devices : 7);
      }
    }
  }
}

TEST(WeightVersionsPlanTest, StepsFollowEachBackwardWithStashAndFree) {
  // The test 1F1B warms device 0 of 2 up with 2 forwards: F0 F1 B0 F2 B1 F3 B2 B3 (4 mbs).
  testing::Lowered l = lowered_async(2, 4, WeightUpdate::PerMicroBatch);
  std::vector<std::string> got;
  for (const Instruction& in : l.programs[0].instructions) {
    if (in.op == Op::Forward || in.op == Op::Backward) {
      got.push_back(cat(in.op == Op::Forward ? "F" : "B", in.mb, "v", in.version));
    } else if (in.op == Op::StashWeights || in.op == Op::FreeWeights) {
      got.push_back(cat(in.op == Op::StashWeights ? "stash" : "free", in.version));
    } else if (in.op == Op::OptimizerStep) {
      got.push_back("step");
    }
  }
  EXPECT_EQ(got, (std::vector<std::string>{"F0v0", "F1v0", "B0v0", "stash0", "step", "F2v1",
                                           "B1v0", "free0", "stash1", "step", "F3v2", "B2v1",
                                           "free1", "stash2", "step", "B3v2", "free2", "step"}));
}

TEST(WeightVersionsPlanTest, RejectsFreeingAVersionStillNeeded) {
  testing::Lowered l = lowered_async(2, 4, WeightUpdate::PerMicroBatch);
  auto& list = l.programs[0].instructions;
  // Free version 0 right after stashing it: B1 still runs on it.
  auto free0 = std::find_if(list.begin(), list.end(), [](const Instruction& in) {
    return in.op == Op::FreeWeights && in.version == 0;
  });
  ASSERT_NE(free0, list.end());
  const Instruction moved = *free0;
  list.erase(free0);
  auto stash0 = std::find_if(list.begin(), list.end(), [](const Instruction& in) {
    return in.op == Op::StashWeights && in.version == 0;
  });
  list.insert(stash0 + 1, moved);
  EXPECT_THAT(failure(l.programs, options_for(l)),
              HasSubstr("weight version 0 must be the current one (1) or stashed, got neither"));
}

TEST(WeightVersionsPlanTest, RejectsBackwardOnAnotherVersionAndLeftoverStash) {
  testing::Lowered l = lowered_async(2, 4, WeightUpdate::PerMicroBatch);
  auto& list = l.programs[0].instructions;
  auto b1 = std::find_if(list.begin(), list.end(), [](const Instruction& in) {
    return in.op == Op::Backward && in.mb == 1;
  });
  b1->version = 1;
  EXPECT_THAT(failure(l.programs, options_for(l)),
              HasSubstr("a backward must use its forward's weight version 0, got 1"));
  testing::Lowered kept = lowered_async(2, 4, WeightUpdate::PerMicroBatch);
  auto& kept_list = kept.programs[0].instructions;
  std::erase_if(kept_list, [](const Instruction& in) {
    return in.op == Op::FreeWeights && in.version == 2;
  });
  EXPECT_THAT(failure(kept.programs, options_for(kept)),
              HasSubstr("must free every stashed weight version by the end, got [2]"));
}

TEST(WeightVersionsPlanTest, VerifierCountsStashedCopiesInMemory) {
  testing::Lowered l = lowered_async(2, 4, WeightUpdate::PerMicroBatch);
  VerifyOptions options = options_for(l);
  options.stored_bytes.assign(4, std::vector<std::int64_t>(2, 0));
  options.bytes_per_element = 1;
  const auto without = verify_programs(l.programs, options).peak_memory_bytes;
  options.weight_bytes.assign(2, 1000000);
  const auto with = verify_programs(l.programs, options).peak_memory_bytes;
  // Device 0 holds one stashed copy at a time (free before stash), never two; the last
  // device none.
  EXPECT_GT(with[0], 1000000);
  EXPECT_LE(with[0], without[0] + 1000000);
  EXPECT_EQ(with[1], without[1]);
}

TEST(WeightVersionsPlanTest, CodecsCarryVersions) {
  ExecutionPlan plan = testing::sample_plan(ModelKind::Gpt, 2, 1, 1, 4);
  plan.config.schedule = ScheduleKind::PipeDream;
  plan.config.vertical_sync = true;
  testing::Lowered l = lowered_async(2, 4, WeightUpdate::VerticalSync);
  plan.iterations[0].replicas[0].executors = l.programs;
  plan.iterations[0].replicas[0].schedule = ScheduleKind::PipeDream;
  const ExecutionPlan from_json = plan_from_json(plan_to_json(plan), "test");
  EXPECT_TRUE(from_json.config.vertical_sync);
  EXPECT_EQ(from_json.iterations[0].replicas[0].executors, l.programs);
  const IterationPlan from_binary = decode_iteration(encode_iteration(plan.iterations[0]));
  EXPECT_EQ(from_binary.replicas[0].executors, l.programs);
  EXPECT_EQ(from_binary.replicas[0].schedule, ScheduleKind::PipeDream);
}

}  // namespace
}  // namespace dynapipe
