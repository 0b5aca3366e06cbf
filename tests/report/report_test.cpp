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
  EXPECT_DOUBLE_EQ(stats.bubble_fraction, 1.0 - 5.0 / 8.0);
  EXPECT_EQ(stats.peak_memory_bytes, (std::vector<std::int64_t>{10, 20}));
  EXPECT_EQ(stats.real_tokens, 12);
  EXPECT_EQ(stats.computed_tokens, 16);
}

}  // namespace
}  // namespace dynapipe
