// packing-megatron: next-fit rows in data order, full-length padding, rows-based global
// batches, fixed rows per micro-batch and one recompute mode.
#include "dynapipe/batching/megatron_packing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "dynapipe/batching/batching.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "support/fake_cost_model.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;

std::vector<Sample> gpt_samples(const std::vector<std::int32_t>& lengths) {
  std::vector<Sample> out;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    out.push_back({.id = static_cast<SampleId>(k), .input_len = lengths[k]});
  }
  return out;
}

TEST(MegatronPackingTest, NextFitClosesARowForGood) {
  // Capacity 10: 6 | 6 3 | 3 (first-fit would reuse row 0 for the last 3: two rows).
  const auto rows = pack_next_fit(gpt_samples({6, 6, 3, 3}), {.max_seqlen = 10});
  EXPECT_EQ(rows, (std::vector<std::vector<std::size_t>>{{0}, {1, 2}, {3}}));
}

TEST(MegatronPackingTest, T5RowsRespectTheDecoderLength) {
  // Encoder 10, decoder 4: (input, target + 1) = (2, 2), (2, 3) -> the decoder overflows.
  std::vector<Sample> samples = {{.id = 0, .input_len = 2, .target_len = 1},
                                 {.id = 1, .input_len = 2, .target_len = 2},
                                 {.id = 2, .input_len = 2, .target_len = 1}};
  const MegatronRows t5{.kind = ModelKind::T5, .max_seqlen = 10, .max_target_len = 4};
  EXPECT_EQ(pack_next_fit(samples, t5), (std::vector<std::vector<std::size_t>>{{0}, {1}, {2}}));
  EXPECT_EQ(t5.row_tokens(), 14);
}

TEST(MegatronPackingTest, GlobalBatchesCountPaddedRows) {
  // Rows of 10 tokens, 25-token budget -> 2 rows per global batch.
  const std::vector<Sample> samples = gpt_samples({6, 6, 3, 3, 9, 1, 10});
  // Rows: {6} {6,3} {3} {9,1} {10}.
  const auto batches = form_megatron_global_batches(samples, {3}, {.max_seqlen = 10}, 25);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].samples.size(), 3u);  // rows {6} {6,3}
  EXPECT_EQ(batches[1].samples.size(), 3u);  // rows {3} {9,1}
  EXPECT_EQ(batches[1].truncated_ids, (std::vector<SampleId>{3}));
  EXPECT_EQ(batches[2].samples.size(), 1u);
  EXPECT_EQ(batches[2].index, 2);
  EXPECT_EQ(form_megatron_global_batches(samples, {}, {.max_seqlen = 10}, 25, 1).size(), 1u);
  EXPECT_THROW(form_megatron_global_batches(gpt_samples({11}), {}, {.max_seqlen = 10}, 25), Error);
}

TEST(MegatronPackingTest, MicroBatchesAreFullRowsDealtToReplicas) {
  const FakeCostModel model({.num_stages = 1});
  GlobalBatch batch;
  batch.samples = gpt_samples({6, 6, 3, 3, 9, 1, 10});
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = Strategy::PackingMegatron, .dp = 2, .max_seqlen = 10, .seqlen_multiple = 8,
       .fixed_batch = 2, .recompute = Recompute::Selective});
  EXPECT_EQ(result.recompute, Recompute::Selective);
  // Rows {0} {1,2} {3} {4,5} {6}: micro-batches of 2 rows, k-th to replica k mod 2.
  ASSERT_EQ(result.replicas[0].size(), 2u);
  ASSERT_EQ(result.replicas[1].size(), 1u);
  EXPECT_EQ(result.replicas[0][0].rows, (std::vector<std::vector<SampleId>>{{0}, {1, 2}}));
  EXPECT_EQ(result.replicas[1][0].rows, (std::vector<std::vector<SampleId>>{{3}, {4, 5}}));
  EXPECT_EQ(result.replicas[0][1].rows, (std::vector<std::vector<SampleId>>{{6}}));
  // Every row padded to max_seqlen (rounded to 8): 16 tokens, dense attention.
  EXPECT_EQ(result.replicas[0][0].shape, (MicroBatchShape{2, 16, 0}));
  EXPECT_EQ(result.replicas[0][1].shape, (MicroBatchShape{1, 16, 0}));
  EXPECT_EQ(result.replicas[0][0].density, AttentionDensity{});
  EXPECT_NEAR(padding_efficiency(result), 38.0 / 80.0, 1e-12);
}

TEST(MegatronPackingTest, AMicroBatchSizeThatDoesNotFitIsNamed) {
  // 1000 bytes per token stored, 2 stages: stage 0 keeps 2 in flight.
  const FakeCostModel model({.num_stages = 2, .bytes_per_token = 1000, .full_bytes_per_token = 1000});
  GlobalBatch batch;
  batch.samples = gpt_samples({6, 6, 3, 3});
  BatchingOptions options{.strategy = Strategy::PackingMegatron, .num_stages = 2,
                          .memory_limit_bytes = 100'000, .max_seqlen = 16, .fixed_batch = 4,
                          .recompute = Recompute::None};
  try {
    make_microbatches(batch, model, options);
    FAIL() << "expected Infeasible";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Infeasible);
    EXPECT_THAT(e.what(), HasSubstr("--micro-batch-size 4 (rows of 16 tokens) must fit --memory-limit"));
  }
  // Rows {6,6,3} {3}; 2 rows: 2 in flight x 2 x 16 x 1000 = 64,000 bytes fit.
  options.fixed_batch = 2;
  const BatchingResult fits = make_microbatches(batch, model, options);
  ASSERT_EQ(fits.replicas[0].size(), 1u);
  EXPECT_EQ(fits.replicas[0][0].shape, (MicroBatchShape{2, 16, 0}));
}

// Random lengths: every sample exactly once, rows within capacity, fixed shapes.
TEST(MegatronPackingTest, RandomBatchesCoverEverySampleOnce) {
  Rng rng(7);
  const FakeCostModel model({.num_stages = 2});
  int planned = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<std::int32_t> lengths;
    const int n = static_cast<int>(rng.uniform_int(2, 60));
    for (int i = 0; i < n; ++i) lengths.push_back(static_cast<std::int32_t>(rng.uniform_int(1, 64)));
    GlobalBatch batch;
    batch.samples = gpt_samples(lengths);
    const int dp = static_cast<int>(rng.uniform_int(1, 2));
    BatchingResult result;
    try {
      result = make_microbatches(batch, model,
                                 {.strategy = Strategy::PackingMegatron, .num_stages = 2, .dp = dp,
                                  .max_seqlen = 64, .fixed_batch = rng.uniform_int(1, 4)});
    } catch (const Error& e) {
      // Fewer micro-batches than replicas: a replica would idle.
      ASSERT_EQ(e.kind(), ErrorKind::Infeasible) << e.what();
      ASSERT_EQ(dp, 2);
      continue;
    }
    ++planned;
    std::multiset<SampleId> seen;
    for (const auto& replica : result.replicas) {
      for (const MicroBatch& mb : replica) {
        EXPECT_EQ(mb.shape.seqlen, 64);
        for (const auto& row : mb.rows) {
          std::int64_t used = 0;
          for (SampleId id : row) used += lengths[static_cast<std::size_t>(id)];
          EXPECT_LE(used, 64);
        }
        seen.insert(mb.sample_ids.begin(), mb.sample_ids.end());
      }
    }
    ASSERT_EQ(seen.size(), lengths.size());
    for (std::size_t k = 0; k < lengths.size(); ++k) EXPECT_EQ(seen.count(static_cast<SampleId>(k)), 1u);
  }
  EXPECT_GT(planned, 150);
}

}  // namespace
}  // namespace dynapipe
