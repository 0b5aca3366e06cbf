#include <gtest/gtest.h>

#include "dynapipe/core/error.h"
#include "dynapipe/report/iteration_stats.h"
#include "dynapipe/report/table.h"

namespace dynapipe {
namespace {

TEST(TextTableTest, PadsColumnsToEqualWidth) {
  TextTable table({"name", "ms"});
  table.add_row({"dynapipe", "1.5"});
  EXPECT_EQ(table.to_markdown(),
            "| name     | ms  |\n"
            "|----------|-----|\n"
            "| dynapipe | 1.5 |\n");
}

TEST(TextTableTest, RejectsRowOfWrongWidth) {
  TextTable table({"a", "b"});
  EXPECT_THROW(table.add_row({"only one"}), Error);
}

TEST(IterationStatsTest, BubbleAndIdealFromTimeline) {
  // Two devices, makespan 4: device 0 busy 2 ms, device 1 busy 3 ms.
  ReplicaPlan replica;
  replica.est_iteration_ms = 4.0;
  replica.timeline = {{{0, 0, OpKind::F}, 0, 0.0, 1.0}, {{0, 1, OpKind::F}, 1, 1.0, 2.0},
                      {{0, 1, OpKind::B}, 1, 2.0, 4.0}, {{0, 0, OpKind::B}, 0, 3.0, 4.0}};
  replica.est_peak_memory_bytes = {10, 20};
  MicroBatch mb;
  mb.shape = {2, 8, 0};
  mb.real_tokens = 12;
  replica.microbatches = {mb};
  IterationPlan iteration;
  iteration.est_iteration_ms = 4.0;
  iteration.replicas = {replica};
  const IterationStats stats = iteration_stats(iteration, 2);
  EXPECT_DOUBLE_EQ(stats.ideal_ms, 2.5);
  EXPECT_DOUBLE_EQ(stats.busiest_ms, 3.0);
  EXPECT_DOUBLE_EQ(stats.bubble_fraction, 1.0 - 5.0 / 8.0);
  EXPECT_EQ(stats.peak_memory_bytes, (std::vector<std::int64_t>{10, 20}));
  EXPECT_EQ(stats.real_tokens, 12);
  EXPECT_EQ(stats.computed_tokens, 16);
}

TEST(IterationStatsTest, IdealAndBusiestComeFromTheSlowestReplica) {
  // Replica 0: makespan 3, devices busy 3 and 1 ms. Replica 1: makespan 5, devices busy 2
  // and 4 ms. The iteration takes replica 1's figures, not the larger busiest of replica 0.
  ReplicaPlan fast, slow;
  fast.est_iteration_ms = 3.0;
  fast.timeline = {{{0, 0, OpKind::F}, 0, 0.0, 3.0}, {{0, 0, OpKind::F}, 1, 2.0, 3.0}};
  slow.est_iteration_ms = 5.0;
  slow.timeline = {{{0, 0, OpKind::F}, 0, 0.0, 2.0}, {{0, 0, OpKind::B}, 1, 1.0, 5.0}};
  IterationPlan iteration;
  iteration.est_iteration_ms = 5.0;
  iteration.replicas = {fast, slow};
  const IterationStats stats = iteration_stats(iteration, 2);
  EXPECT_DOUBLE_EQ(stats.ideal_ms, 3.0);
  EXPECT_DOUBLE_EQ(stats.busiest_ms, 4.0);
  EXPECT_DOUBLE_EQ(stats.bubble_fraction, ((1.0 - 4.0 / 6.0) + (1.0 - 6.0 / 10.0)) / 2);
}

}  // namespace
}  // namespace dynapipe
