// Replicated stages: splitting stage programs into stage-replica programs. An exact small
// case, then random pipelines (schedule, stages, micro-batches, replications, dp) checked
// for the properties: the programs verify, every micro-batch runs exactly once on each
// stage, on stage-replica mb mod r, and messages go to the rank that holds the neighbour.
#include "dynapipe/plan/replicate_stages.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/plan/verifier.h"
#include "plan/test_pipelines.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using Op = InstructionOp;

std::set<int> forward_mbs(const ExecutorProgram& program) {
  std::set<int> mbs;
  for (const Instruction& in : program.instructions) {
    if (in.op == Op::Forward) mbs.insert(in.mb);
  }
  return mbs;
}

int count_ops(const ExecutorProgram& program, Op op) {
  int n = 0;
  for (const Instruction& in : program.instructions) n += in.op == op;
  return n;
}

VerifyOptions verify_options(const testing::Lowered& lowered, const std::vector<int>& replicas) {
  VerifyOptions options;
  options.layout = lowered.layout;
  options.num_microbatches = static_cast<int>(lowered.shapes.size());
  options.stage_replicas = replicas;
  return options;
}

// 2 stages x 3 micro-batches, 1F1B, stage 0 on two ranks: rank 0 runs mb 0 and 2, rank 1
// runs mb 1, rank 2 (stage 1) runs all three and answers each mb's rank; stage 0's ranks
// all-reduce their gradients, stage 1 (alone) does not.
TEST(ReplicateStagesTest, TwoOneSplitsStageZeroRoundRobin) {
  testing::Lowered lowered = testing::lower(testing::one_f_one_b(2, 3), {.num_devices = 2}, 3);
  const RankLayout ranks{.pp = 2, .dp = 1, .stage_replicas = {2, 1}};
  std::vector<ExecutorProgram> programs = replicate_stages(lowered.programs, ranks);
  ASSERT_EQ(programs.size(), 3u);
  EXPECT_EQ(forward_mbs(programs[0]), (std::set<int>{0, 2}));
  EXPECT_EQ(forward_mbs(programs[1]), (std::set<int>{1}));
  EXPECT_EQ(forward_mbs(programs[2]), (std::set<int>{0, 1, 2}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(programs[r].rank, r);
    EXPECT_EQ(programs[r].device, r < 2 ? 0 : 1);
    EXPECT_EQ(programs[r].stage_replica, r < 2 ? r : 0);
  }
  EXPECT_EQ(count_ops(programs[0], Op::ReduceGrads), 1);
  EXPECT_EQ(count_ops(programs[1], Op::ReduceGrads), 1);
  EXPECT_EQ(count_ops(programs[2], Op::ReduceGrads), 0);
  for (const Instruction& in : programs[2].instructions) {
    if (in.op == Op::SendGradStart) {
      EXPECT_EQ(in.peer, in.mb % 2) << to_string(in);
    }
  }
  // Buffers are renumbered densely: the largest id is below the number of distinct ids.
  std::set<int> ids;
  for (const Instruction& in : programs[1].instructions) {
    if (in.buffer >= 0) ids.insert(in.buffer);
  }
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(*ids.rbegin(), static_cast<int>(ids.size()) - 1);
  EXPECT_NO_THROW(verify_programs(programs, verify_options(lowered, {2, 1})));
}

// The verifier holds the round robin: split programs checked as if unreplicated fail on
// their ranks, and a stage-replica running another's micro-batch is named.
TEST(ReplicateStagesTest, VerifierRejectsWrongReplicaAssignments) {
  testing::Lowered lowered = testing::lower(testing::one_f_one_b(2, 3), {.num_devices = 2}, 3);
  std::vector<ExecutorProgram> programs =
      replicate_stages(lowered.programs, RankLayout{.pp = 2, .dp = 1, .stage_replicas = {1, 2}});
  ASSERT_EQ(programs.size(), 3u);
  EXPECT_THROW(verify_programs(programs, verify_options(lowered, {})), Error);
  std::swap(programs[1].instructions, programs[2].instructions);  // ranks 1 and 2 swap work
  try {
    verify_programs(programs, verify_options(lowered, {1, 2}));
    FAIL() << "swapped stage-replica programs verified";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("must run on stage-replica"));
  }
}

TEST(ReplicateStagesTest, RejectsProgramsThatDoNotMatchTheLayout) {
  testing::Lowered lowered = testing::lower(testing::one_f_one_b(2, 2), {.num_devices = 2}, 2);
  try {
    replicate_stages(lowered.programs, RankLayout{.pp = 3, .dp = 1, .stage_replicas = {1, 1, 2}});
    FAIL() << "3-stage layout accepted 2 programs";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("programs must have one per stage (3), got 2"));
  }
}

// Random pipelines: every property, for every replica of dp 1 or 2.
TEST(ReplicateStagesTest, RandomPipelinesVerifyAndRunEveryMicroBatchOnceRoundRobin) {
  Rng rng(2026);
  for (int trial = 0; trial < 200; ++trial) {
    const int devices = static_cast<int>(rng.uniform_int(1, 4));
    const int mbs = static_cast<int>(rng.uniform_int(1, 8));
    const int dp = static_cast<int>(rng.uniform_int(1, 2));
    const int kind = static_cast<int>(rng.uniform_int(0, 2));
    const ModelKind model = rng.uniform_int(0, 1) == 0 ? ModelKind::Gpt : ModelKind::T5;
    std::vector<int> replicas;
    for (int d = 0; d < devices; ++d) replicas.push_back(static_cast<int>(rng.uniform_int(1, 3)));
    const RankLayout ranks{.pp = devices, .dp = dp, .stage_replicas = replicas};
    const std::string what = cat("trial ", trial, ": pp ", devices, " mbs ", mbs, " dp ", dp,
                                 " schedule ", kind, " replicas ", join(replicas, ","));
    std::vector<ExecutorProgram> all;
    testing::Lowered lowered;
    for (int replica = 0; replica < dp; ++replica) {
      ScheduleOrder order = kind == 0   ? testing::one_f_one_b(devices, mbs)
                            : kind == 1 ? testing::gpipe(devices, mbs)
                                        : testing::one_f_one_b(devices, mbs, /*split=*/true);
      lowered =
          testing::lower(std::move(order), {.num_devices = devices}, mbs, model, replica, dp, 0.5);
      std::vector<ExecutorProgram> programs = replicate_stages(lowered.programs, ranks);
      ASSERT_EQ(static_cast<int>(programs.size()), ranks.ranks_per_replica()) << what;
      std::map<std::pair<int, int>, int> runs;  // (mb, stage) -> forwards
      for (const ExecutorProgram& p : programs) {
        ASSERT_EQ(p.rank, ranks.rank_of(replica, p.device, p.stage_replica)) << what;
        ASSERT_EQ(ranks.stage_of(p.rank), p.device) << what;
        ASSERT_EQ(ranks.stage_replica_of(p.rank), p.stage_replica) << what;
        EXPECT_EQ(count_ops(p, Op::ReduceGrads), ranks.stage_group_size(p.device) > 1 ? 1 : 0)
            << what;
        for (const Instruction& in : p.instructions) {
          if (in.mb >= 0) {
            ASSERT_EQ(in.mb % replicas[p.device], p.stage_replica) << what << " " << to_string(in);
          }
          if (in.peer >= 0) {
            const int peer_stage = ranks.stage_of(in.peer);
            EXPECT_EQ(ranks.replica_of(in.peer), replica) << what;
            EXPECT_EQ(std::abs(peer_stage - p.device), 1) << what;
            EXPECT_EQ(ranks.stage_replica_of(in.peer), in.mb % replicas[peer_stage])
                << what << " " << to_string(in);
          }
          if (in.op == Op::Forward) ++runs[{in.mb, in.stage}];
        }
      }
      ASSERT_EQ(static_cast<int>(runs.size()), mbs * devices) << what;
      for (const auto& [key, count] : runs) EXPECT_EQ(count, 1) << what;
      all.insert(all.end(), programs.begin(), programs.end());
    }
    ASSERT_NO_THROW(verify_programs(all, verify_options(lowered, replicas))) << what;
  }
}

}  // namespace
}  // namespace dynapipe
