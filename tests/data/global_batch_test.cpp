#include "dynapipe/data/global_batch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dynapipe/core/rng.h"
#include "test_util.h"

namespace dynapipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_data::expect_error;

std::vector<SampleId> ids_of(const GlobalBatch& batch) {
  std::vector<SampleId> ids;
  for (const Sample& s : batch.samples) ids.push_back(s.id);
  return ids;
}

// Samples with ids 0.. and the given input+target token counts (target 1).
std::vector<Sample> samples_of(const std::vector<std::int32_t>& tokens) {
  std::vector<Sample> samples;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    samples.push_back({static_cast<SampleId>(i), tokens[i] - 1, 1, -1});
  }
  return samples;
}

TEST(GlobalBatchTest, FillsUpToTheBudgetInFileOrder) {
  // Budget 10: [4 6] [5 5] [3 3 3] [9] and the partial [2].
  const auto batches =
      form_global_batches(samples_of({4, 6, 5, 5, 3, 3, 3, 9, 2}), {}, 10);
  ASSERT_EQ(batches.size(), 5u);
  EXPECT_THAT(ids_of(batches[0]), ElementsAre(0, 1));
  EXPECT_THAT(ids_of(batches[1]), ElementsAre(2, 3));
  EXPECT_THAT(ids_of(batches[2]), ElementsAre(4, 5, 6));
  EXPECT_THAT(ids_of(batches[3]), ElementsAre(7));
  EXPECT_THAT(ids_of(batches[4]), ElementsAre(8));
  for (std::size_t i = 0; i < batches.size(); ++i) EXPECT_EQ(batches[i].index, static_cast<std::int64_t>(i));
}

TEST(GlobalBatchTest, OversizeSampleFormsABatchAlone) {
  const auto batches = form_global_batches(samples_of({3, 25, 4, 30, 40, 2, 2}), {}, 10);
  // [3] [25] [4] [30] [40] [2 2]: an oversize sample closes the batch before it and
  // the one after it starts fresh.
  ASSERT_EQ(batches.size(), 6u);
  EXPECT_THAT(ids_of(batches[0]), ElementsAre(0));
  EXPECT_THAT(ids_of(batches[1]), ElementsAre(1));
  EXPECT_THAT(ids_of(batches[2]), ElementsAre(2));
  EXPECT_THAT(ids_of(batches[3]), ElementsAre(3));
  EXPECT_THAT(ids_of(batches[4]), ElementsAre(4));
  EXPECT_THAT(ids_of(batches[5]), ElementsAre(5, 6));
}

TEST(GlobalBatchTest, LastPartialBatchIsKeptAndOversizeFirstSampleToo) {
  auto batches = form_global_batches(samples_of({40, 2, 2}), {}, 10);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_THAT(ids_of(batches[0]), ElementsAre(0));
  EXPECT_THAT(ids_of(batches[1]), ElementsAre(1, 2));
}

TEST(GlobalBatchTest, TruncatedIdsGoToTheirBatch) {
  const auto batches = form_global_batches(samples_of({5, 5, 5, 5}), {3, 0, 1}, 10);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_THAT(batches[0].truncated_ids, ElementsAre(0, 1));
  EXPECT_THAT(batches[1].truncated_ids, ElementsAre(3));
}

TEST(GlobalBatchTest, MaxBatchesStopsEarly) {
  const auto samples = samples_of({5, 5, 5, 5, 5});
  EXPECT_EQ(form_global_batches(samples, {}, 5, 2).size(), 2u);
  EXPECT_EQ(form_global_batches(samples, {}, 5, 0).size(), 5u);
  EXPECT_EQ(form_global_batches(samples, {}, 5, 9).size(), 5u);
  EXPECT_THAT(ids_of(form_global_batches(samples, {}, 10, 2).back()), ElementsAre(2, 3));
}

TEST(GlobalBatchTest, RejectsBadArguments) {
  expect_error([] { form_global_batches(samples_of({1}), {}, 0); }, ErrorKind::InvalidArgument,
               HasSubstr("global_batch_tokens must be >= 1, got 0"));
  expect_error([] { form_global_batches(samples_of({1}), {}, 5, -1); }, ErrorKind::InvalidArgument,
               HasSubstr("max_batches must be >= 0 (0: all), got -1"));
  EXPECT_TRUE(form_global_batches(std::vector<Sample>{}, {}, 5).empty());
}

TEST(GlobalBatchTest, PropertyEverySampleOnceInOrderWithinBudget) {
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    SCOPED_TRACE(cat("seed ", seed));
    Rng rng(seed);
    const std::int64_t budget = rng.uniform_int(1, 5000);
    std::vector<Sample> samples;
    const std::int64_t n = rng.uniform_int(1, 400);
    for (std::int64_t i = 0; i < n; ++i) {
      // Ids out of order on purpose: file order, not id order, is what counts.
      samples.push_back({rng.uniform_int(0, 1) == 0 ? i : 10000 - i,
                         static_cast<std::int32_t>(rng.uniform_int(1, 3000)),
                         static_cast<std::int32_t>(rng.uniform_int(1, 300)), -1});
    }
    const auto batches = form_global_batches(samples, {}, budget);
    std::size_t next = 0;
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const GlobalBatch& batch = batches[b];
      ASSERT_FALSE(batch.samples.empty());
      std::int64_t tokens = 0;
      for (const Sample& s : batch.samples) {
        ASSERT_LT(next, samples.size());
        EXPECT_EQ(s.id, samples[next++].id);
        tokens += s.input_len + s.target_len;
      }
      if (batch.samples.size() > 1) {
        EXPECT_LE(tokens, budget);
      }
      // Maximal: the next batch's first sample did not fit.
      if (b + 1 < batches.size()) {
        const Sample& first = batches[b + 1].samples.front();
        EXPECT_GT(tokens + first.input_len + first.target_len, budget);
      }
    }
    EXPECT_EQ(next, samples.size());
  }
}

}  // namespace
}  // namespace dynapipe
