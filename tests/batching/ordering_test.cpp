#include "dynapipe/batching/ordering.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "batching/random_batches.h"
#include "dynapipe/batching/dp_partitioner.h"
#include "support/fake_cost_model.h"

namespace dynapipe {
namespace {

TEST(OrderingTest, GptSortsByTotalLengthDescendingTiesById) {
  const std::vector<Sample> samples{
      {.id = 5, .input_len = 10, .target_len = 5},  // 15
      {.id = 2, .input_len = 20, .target_len = 0},  // 20
      {.id = 1, .input_len = 7, .target_len = 8},   // 15
      {.id = 9, .input_len = 1, .target_len = 1},   // 2
  };
  EXPECT_EQ(order_samples(samples, ModelKind::Gpt, 64), (std::vector<std::size_t>{1, 2, 0, 3}));
}

TEST(OrderingTest, T5SnakesThroughInputBuckets) {
  const std::vector<Sample> samples{
      {.id = 0, .input_len = 120, .target_len = 3},   // bucket 2 (of 64)
      {.id = 1, .input_len = 100, .target_len = 40},  // bucket 2
      {.id = 2, .input_len = 60, .target_len = 5},    // bucket 1
      {.id = 3, .input_len = 10, .target_len = 30},   // bucket 1
      {.id = 4, .input_len = 128, .target_len = 9},   // bucket 2
  };
  // Bucket 2 by target descending (40, 9, 3), then bucket 1 ascending (5, 30).
  EXPECT_EQ(order_samples(samples, ModelKind::T5, 64),
            (std::vector<std::size_t>{1, 4, 0, 2, 3}));
  EXPECT_EQ(order_lexicographic(samples), (std::vector<std::size_t>{4, 0, 1, 2, 3}));
}

// The exact DP objective of cutting `order` into consecutive micro-batches, no memory
// limit, every stage costing the same.
double dp_objective(const FakeCostModel& model, const std::vector<Sample>& samples,
                    const std::vector<std::size_t>& order, int num_stages) {
  const int n = static_cast<int>(order.size());
  SegmentTable table(n);
  for (int i = 0; i < n; ++i) {
    std::int64_t enc = 0, dec = 0;
    for (int j = i; j < n; ++j) {
      enc = std::max<std::int64_t>(enc, samples[order[j]].input_len);
      dec = std::max<std::int64_t>(dec, samples[order[j]].target_len + 1);
      const StageCost c = model.stage_cost(
          0, {.batch = j - i + 1, .seqlen = (enc + 7) / 8 * 8, .dec_seqlen = (dec + 7) / 8 * 8},
          {}, Recompute::None);
      table.push(i, c.fwd_ms + c.bwd_ms);
    }
  }
  return solve_partition(table, {.num_stages = num_stages}).objective_ms;
}

// Over many FLAN-like T5 batches, the snake order gives fewer padded tokens (groups of 8
// consecutive samples) and a lower exact DP objective than the lexicographic sort.
TEST(OrderingTest, T5SnakeBeatsLexicographicOnPaddingAndObjective) {
  const FakeCostModel model({.num_stages = 1, .fixed_ms = 1.0, .ms_per_token = 0.001,
                             .ms_per_attention = 1e-6});
  double snake_objective = 0, lex_objective = 0;
  std::int64_t snake_padded = 0, lex_padded = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    const GlobalBatch batch = testing::random_t5_batch(seed, 300, 2048, 512);
    for (bool snake : {true, false}) {
      const std::vector<std::size_t> order = snake ? order_samples(batch.samples, ModelKind::T5, 64)
                                                   : order_lexicographic(batch.samples);
      std::int64_t padded = 0;
      for (std::size_t begin = 0; begin < order.size(); begin += 8) {
        std::int64_t enc = 0, dec = 0, count = 0;
        for (std::size_t k = begin; k < std::min(order.size(), begin + 8); ++k, ++count) {
          enc = std::max<std::int64_t>(enc, batch.samples[order[k]].input_len);
          dec = std::max<std::int64_t>(dec, batch.samples[order[k]].target_len + 1);
        }
        padded += count * ((enc + 7) / 8 * 8 + (dec + 7) / 8 * 8);
      }
      (snake ? snake_padded : lex_padded) += padded;
      (snake ? snake_objective : lex_objective) += dp_objective(model, batch.samples, order, 4);
    }
  }
  EXPECT_LT(snake_padded, lex_padded * 0.97);
  EXPECT_LT(snake_objective, lex_objective * 0.98);
}

}  // namespace
}  // namespace dynapipe
