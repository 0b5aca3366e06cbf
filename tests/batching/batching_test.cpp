#include "dynapipe/batching/batching.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "batching/random_batches.h"
#include "dynapipe/batching/head_tail.h"
#include "dynapipe/batching/ordering.h"
#include "dynapipe/batching/varlen_regroup.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "support/fake_cost_model.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;

GlobalBatch gpt_batch(const std::vector<std::int32_t>& lengths) {
  GlobalBatch batch;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    batch.samples.push_back({.id = static_cast<SampleId>(k), .input_len = lengths[k]});
  }
  return batch;
}

std::vector<std::vector<SampleId>> ids_of(const std::vector<MicroBatch>& replica) {
  std::vector<std::vector<SampleId>> out;
  for (const MicroBatch& mb : replica) out.push_back(mb.sample_ids);
  return out;
}

std::vector<MicroBatchShape> shapes_of(const std::vector<MicroBatch>& replica) {
  std::vector<MicroBatchShape> out;
  for (const MicroBatch& mb : replica) out.push_back(mb.shape);
  return out;
}

template <typename F>
void expect_error(F&& f, ErrorKind kind, const std::string& substring) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one containing '" << substring << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(substring));
  }
}

TEST(StrategyTest, NamesRoundTrip) {
  for (std::string_view name : strategy_names()) {
    const std::optional<Strategy> parsed = parse_strategy(name);
    ASSERT_TRUE(parsed.has_value()) << name;
    EXPECT_EQ(strategy_name(*parsed), name);
  }
  EXPECT_EQ(strategy_names().size(), 7u);
  EXPECT_EQ(strategy_names().front(), "dynapipe");  // the default comes first
  EXPECT_EQ(parse_strategy("dynapipe-padded"), Strategy::DynaPipePadded);
  EXPECT_EQ(strategy_name(Strategy::PackingVarlen), "packing-varlen");
  EXPECT_FALSE(parse_strategy("Padding").has_value());
}

constexpr Strategy kPadded = Strategy::DynaPipePadded;

// The paper's formulation (dynapipe-padded) on the reference's fixtures.
TEST(DynaPipeTest, ReferenceFixtureFourStages) {
  const FakeCostModel model({.num_stages = 4});
  const GlobalBatch batch = gpt_batch({1000, 980, 500, 490, 480, 100, 90, 80});
  const BatchingResult result =
      make_microbatches(batch, model, {.strategy = kPadded, .num_stages = 4, .max_seqlen = 2048});
  ASSERT_EQ(result.replicas.size(), 1u);
  const std::vector<MicroBatch>& mbs = result.replicas[0];
  EXPECT_NEAR(result.objective_ms, 32.376, 1e-9);
  EXPECT_EQ(result.recompute, Recompute::None);
  EXPECT_FALSE(result.one_in_flight);
  EXPECT_EQ(ids_of(mbs), (std::vector<std::vector<SampleId>>{{0}, {1}, {2}, {3, 4}, {5, 6, 7}}));
  EXPECT_EQ(shapes_of(mbs), (std::vector<MicroBatchShape>{
                                {1, 1000, 0}, {1, 984, 0}, {1, 504, 0}, {2, 496, 0}, {3, 104, 0}}));
  for (std::size_t k = 0; k < mbs.size(); ++k) {
    EXPECT_EQ(mbs[k].id, static_cast<int>(k));
    EXPECT_TRUE(mbs[k].rows.empty());
    EXPECT_EQ(mbs[k].density, AttentionDensity{});
  }
  EXPECT_EQ(mbs[3].real_tokens, 970);
  EXPECT_EQ(mbs[3].target_tokens, 0);
}

TEST(DynaPipeTest, ReferenceThinningIsWorseThanExact) {
  const FakeCostModel model({.num_stages = 4});
  const GlobalBatch batch = gpt_batch({1000, 980, 500, 490, 480, 100, 90, 80});
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = kPadded, .num_stages = 4, .max_seqlen = 2048, .min_tmax_interval_ms = 5});
  // The thinned DP picks cuts 0,1,2,5 (its own threshold objective is 39.204); the
  // result reports that partition's real objective: 17.424 + 3·6.036.
  EXPECT_EQ(ids_of(result.replicas[0]),
            (std::vector<std::vector<SampleId>>{{0}, {1}, {2, 3, 4}, {5, 6, 7}}));
  EXPECT_NEAR(result.objective_ms, 35.532, 1e-9);
}

TEST(DynaPipeTest, ReferenceFixtureOneStage) {
  const FakeCostModel model({.num_stages = 1});
  // Shuffled on purpose: the DP sorts.
  const GlobalBatch batch = gpt_batch({300, 2048, 40, 1500, 700, 16, 1200, 120, 650, 64});
  const BatchingResult result =
      make_microbatches(batch, model, {.strategy = kPadded, .max_seqlen = 2048});
  EXPECT_NEAR(result.objective_ms, 28.944, 1e-9);
  EXPECT_EQ(ids_of(result.replicas[0]),
            (std::vector<std::vector<SampleId>>{{1}, {3, 6}, {4, 8, 0}, {7, 9, 2, 5}}));
}

TEST(DynaPipeTest, GptShapeCountsInputPlusTarget) {
  const FakeCostModel model({.num_stages = 1});
  GlobalBatch batch;
  batch.samples = {{.id = 3, .input_len = 10, .target_len = 7}};
  const BatchingResult result =
      make_microbatches(batch, model, {.strategy = kPadded, .max_seqlen = 64});
  ASSERT_EQ(result.replicas[0].size(), 1u);
  EXPECT_EQ(result.replicas[0][0].shape, (MicroBatchShape{1, 24, 0}));
  EXPECT_EQ(result.replicas[0][0].real_tokens, 17);
  EXPECT_EQ(result.replicas[0][0].target_tokens, 7);
}

TEST(DynaPipeTest, T5DecoderReadsBosPlusTarget) {
  const FakeCostModel model({.num_stages = 1});
  GlobalBatch batch;
  batch.samples = {{.id = 0, .input_len = 9, .target_len = 7},
                   {.id = 1, .input_len = 3, .target_len = 8}};
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = kPadded, .kind = ModelKind::T5, .max_seqlen = 64, .max_target_len = 16});
  ASSERT_EQ(result.replicas[0].size(), 1u);  // one micro-batch beats two at p = 1
  // enc round8(9) = 16; dec round8(max(7, 8) + 1) = 16.
  EXPECT_EQ(result.replicas[0][0].shape, (MicroBatchShape{2, 16, 16}));
  EXPECT_EQ(result.replicas[0][0].real_tokens, 27);
  EXPECT_EQ(result.replicas[0][0].target_tokens, 15);
}

// dynapipe (varlen): the same fixture with block-diagonal micro-batches, hand-checked.
// t = 3·(0.5 + 0.001·round8(Σ L)). The longest sample alone costs 4.5 ms, so the best
// partition keeps every micro-batch within 1000 tokens with as few as possible:
// 1000 | 980 | 500+490 (992) | 480+100+90+80 (752): Σ t = 6 + 0.003·3728 = 17.184,
// objective 17.184 + 3·4.5 = 30.684 (padded: 32.376).
TEST(DynaPipeVarlenTest, ReferenceFixtureFourStages) {
  const FakeCostModel model({.num_stages = 4});
  const GlobalBatch batch = gpt_batch({1000, 980, 500, 490, 480, 100, 90, 80});
  const BatchingResult result =
      make_microbatches(batch, model, {.num_stages = 4, .max_seqlen = 2048});
  const std::vector<MicroBatch>& mbs = result.replicas[0];
  EXPECT_NEAR(result.objective_ms, 30.684, 1e-9);
  EXPECT_EQ(ids_of(mbs), (std::vector<std::vector<SampleId>>{{0}, {1}, {2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(shapes_of(mbs), (std::vector<MicroBatchShape>{
                                {1, 1000, 0}, {1, 984, 0}, {1, 992, 0}, {1, 752, 0}}));
  for (const MicroBatch& mb : mbs) {
    EXPECT_EQ(mb.rows, (std::vector<std::vector<SampleId>>{mb.sample_ids}));  // one row
  }
  EXPECT_DOUBLE_EQ(mbs[2].density.enc, (500.0 * 500 + 490.0 * 490) / (992.0 * 992));
  EXPECT_EQ(mbs[2].density.dec, 1.0);
  EXPECT_EQ(padding_efficiency(result), 3720.0 / 3728.0);
}

TEST(DynaPipeVarlenTest, TokensMayExceedMaxSeqlenAndT5SumsBothSides) {
  const FakeCostModel model({.num_stages = 1});
  // p = 1: one micro-batch of all samples is optimal, 4·60 = 240 tokens > max_seqlen 64.
  const BatchingResult gpt = make_microbatches(gpt_batch({60, 60, 60, 60}), model, {.max_seqlen = 64});
  ASSERT_EQ(gpt.replicas[0].size(), 1u);
  EXPECT_EQ(gpt.replicas[0][0].shape, (MicroBatchShape{1, 240, 0}));
  GlobalBatch batch;
  batch.samples = {{.id = 0, .input_len = 9, .target_len = 7},
                   {.id = 1, .input_len = 3, .target_len = 8}};
  const BatchingResult t5 = make_microbatches(
      batch, model, {.kind = ModelKind::T5, .max_seqlen = 64, .max_target_len = 16});
  ASSERT_EQ(t5.replicas[0].size(), 1u);
  const MicroBatch& mb = t5.replicas[0][0];
  // enc round8(9 + 3) = 16; dec round8((7 + 1) + (8 + 1)) = 24.
  EXPECT_EQ(mb.shape, (MicroBatchShape{1, 16, 24}));
  EXPECT_DOUBLE_EQ(mb.density.enc, (81.0 + 9.0) / 256.0);
  EXPECT_DOUBLE_EQ(mb.density.dec, (64.0 + 81.0) / 576.0);
  EXPECT_EQ(mb.real_tokens, 27);
}

// lone_samples_alone: a sample that fits alone but not with k_s copies in flight stands
// alone, the other micro-batches keep the rule. p = 2, 100 B/token stored without
// recomputation, 2 B/token sent on from stage 0: the 1000-token sample holds 102,000 B on
// stage 0, 204,000 with two in flight, over the 150,000 limit.
TEST(DynaPipeVarlenTest, LoneSamplesStandAloneUnderThePipelinedRule) {
  const FakeCostModel model({.num_stages = 2, .bytes_per_token = 100, .full_bytes_per_token = 10});
  const GlobalBatch batch = gpt_batch({1000, 100, 100, 100, 100});
  BatchingOptions options{.num_stages = 2, .memory_limit_bytes = 150'000, .max_seqlen = 1024,
                          .recompute = Recompute::None};
  EXPECT_EQ(count_lone_samples(batch, model, options, 2), 1);
  // Without it no cut keeps two in flight: the one-in-flight rule for every micro-batch.
  EXPECT_TRUE(make_microbatches(batch, model, options).one_in_flight);
  options.lone_samples_alone = true;
  const BatchingResult lone = make_microbatches(batch, model, options);
  EXPECT_FALSE(lone.one_in_flight);
  EXPECT_EQ(lone.recompute, Recompute::None);
  // The long sample alone (t = 3·1.5), the four short ones together (3·0.9; 81,600 B with
  // two in flight): 4.5 + 2.7 + (p − 1)·4.5.
  ASSERT_EQ(lone.replicas[0].size(), 2u);
  EXPECT_EQ(lone.replicas[0][0].sample_ids, (std::vector<SampleId>{0}));
  EXPECT_EQ(lone.replicas[0][1].sample_ids.size(), 4u);
  EXPECT_NEAR(lone.objective_ms, 11.7, 1e-9);
  // Where every sample keeps two in flight nothing is lone.
  options.memory_limit_bytes = 210'000;
  EXPECT_EQ(count_lone_samples(batch, model, options, 2), 0);
  // Only the varlen DP knows the rule.
  options.strategy = Strategy::TokenBased;
  EXPECT_THROW(make_microbatches(batch, model, options), Error);
}

// The schedule-aware options: zb1p-like k_s = p on every stage sizes micro-batches for
// stage p − 1 holding p of them; a smaller bubble weight favours fewer, larger ones.
TEST(DynaPipeVarlenTest, InFlightAndBubbleWeightShapeTheCuts) {
  const FakeCostModel model({.num_stages = 4, .bytes_per_token = 100, .full_bytes_per_token = 100});
  const GlobalBatch batch = gpt_batch({1000, 980, 500, 490, 480, 100, 90, 80});
  // 1F1B: stage 0 holds 4 micro-batches of at most 1000 tokens → 400,000 bytes.
  BatchingOptions options{.num_stages = 4, .memory_limit_bytes = 400'000, .max_seqlen = 2048};
  EXPECT_NEAR(make_microbatches(batch, model, options).objective_ms, 30.684, 1e-9);
  options.in_flight = {4, 4, 4, 4};
  EXPECT_NEAR(make_microbatches(batch, model, options).objective_ms, 30.684, 1e-9);
  options.memory_limit_bytes = 399'999;  // 1000 tokens no longer fit 4 in flight
  const BatchingResult one = make_microbatches(batch, model, options);
  EXPECT_TRUE(one.one_in_flight);
  options = {.num_stages = 4, .max_seqlen = 2048, .bubble_weight = 0.1};
  // Σ t dominates: 1000+980 | 500+490+480+100+90+80 → 1984 and 1744 tokens:
  // Σ t = 3 + 0.003·3728 = 14.184, max 3·(0.5 + 1.984) = 7.452, 14.184 + 0.3·7.452.
  const BatchingResult wide = make_microbatches(batch, model, options);
  EXPECT_EQ(wide.replicas[0].size(), 2u);
  EXPECT_NEAR(wide.objective_ms, 14.184 + 0.3 * 7.452, 1e-9);
}

// Slowest first; the fastest micro-batch with two or more samples becomes a head and a
// tail half. DP cut (varlen fixture): {0} 4.5 ms, {1} 4.452, {2, 3} 4.476,
// {4, 5, 6, 7} 3.756 → head {4, 5} | {0} | {2, 3} | {1} | tail {6, 7}.
TEST(HeadTailTest, SlowestFirstFastestSplitIntoHeadAndTail) {
  const FakeCostModel model({.num_stages = 4});
  const GlobalBatch batch = gpt_batch({1000, 980, 500, 490, 480, 100, 90, 80});
  const BatchingOptions options{.num_stages = 4, .max_seqlen = 2048};
  const BatchingResult result = make_microbatches(batch, model, options);
  const std::vector<MicroBatch> mbs =
      split_head_and_tail(batch, result.replicas[0], model, result.recompute, options);
  EXPECT_EQ(ids_of(mbs), (std::vector<std::vector<SampleId>>{{4, 5}, {0}, {2, 3}, {1}, {6, 7}}));
  EXPECT_EQ(shapes_of(mbs), (std::vector<MicroBatchShape>{
                                {1, 584, 0}, {1, 1000, 0}, {1, 992, 0}, {1, 984, 0}, {1, 176, 0}}));
  for (std::size_t k = 0; k < mbs.size(); ++k) {
    EXPECT_EQ(mbs[k].id, static_cast<int>(k));
    EXPECT_EQ(mbs[k].rows, (std::vector<std::vector<SampleId>>{mbs[k].sample_ids}));
  }
  // Nothing to split (one sample each): only the order changes, slowest first.
  std::vector<MicroBatch> singles(2);
  singles[0].sample_ids = {0};
  singles[0].shape = {1, 104, 0};
  singles[1].sample_ids = {1};
  singles[1].shape = {1, 304, 0};
  EXPECT_EQ(ids_of(split_head_and_tail(gpt_batch({100, 300}), singles, model, Recompute::None,
                                       options)),
            (std::vector<std::vector<SampleId>>{{1}, {0}}));
}

TEST(PaddingTest, DataOrderFixedBatchPaddedToMaxSeqlen) {
  const FakeCostModel model({.num_stages = 1});
  const GlobalBatch batch = gpt_batch({5, 60, 7, 33, 12});
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = Strategy::Padding, .max_seqlen = 60, .fixed_batch = 2});
  EXPECT_EQ(ids_of(result.replicas[0]), (std::vector<std::vector<SampleId>>{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ(shapes_of(result.replicas[0]),
            (std::vector<MicroBatchShape>{{2, 64, 0}, {2, 64, 0}, {1, 64, 0}}));
  // 117 real tokens of 5·64 computed.
  EXPECT_NEAR(padding_efficiency(result), 117.0 / 320.0, 1e-12);
}

TEST(PaddingTest, LargestBatchThatFitsAndStridedReplicas) {
  // One stage: memory = static 1000 + 10 bytes/token stored + 0 peak; 64-token rows.
  const FakeCostModel model({.num_stages = 1, .bytes_per_token = 10, .full_bytes_per_token = 10,
                             .static_bytes = 1000});
  const GlobalBatch batch = gpt_batch({5, 60, 7, 33, 12, 1, 2, 3});
  // 3 rows = 1000 + 1920 <= 3000 < 1000 + 2560.
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = Strategy::Padding, .dp = 2, .memory_limit_bytes = 3000, .max_seqlen = 64});
  ASSERT_EQ(result.replicas.size(), 2u);
  EXPECT_EQ(ids_of(result.replicas[0]), (std::vector<std::vector<SampleId>>{{0, 2, 4}, {6}}));
  EXPECT_EQ(ids_of(result.replicas[1]), (std::vector<std::vector<SampleId>>{{1, 3, 5}, {7}}));
  EXPECT_EQ(result.replicas[0][0].shape, (MicroBatchShape{3, 64, 0}));
}

TEST(PaddingTest, RowsPerMicroBatchMinimiseTheObjectiveNotTheMostThatFit) {
  // Four stages, no memory limit: all 8 rows fit in one micro-batch. A micro-batch of b
  // 64-token rows takes 3·(0.5 + 0.064·b) ms; objective Σt + 3·max t:
  // b = 8: 3.036 + 9.108 = 12.144; b = 4: 4.536 + 6.804 = 11.34 (the best);
  // b = 5 (5, 3): 4.536 + 7.38 = 11.916; b = 2: 7.536 + 5.652 = 13.188.
  const FakeCostModel model({.num_stages = 4});
  const GlobalBatch batch = gpt_batch({5, 60, 7, 33, 12, 1, 2, 3});
  BatchingOptions options{.strategy = Strategy::Padding, .num_stages = 4, .max_seqlen = 64};
  const BatchingResult chosen = make_microbatches(batch, model, options);
  EXPECT_EQ(shapes_of(chosen.replicas[0]),
            (std::vector<MicroBatchShape>{{4, 64, 0}, {4, 64, 0}}));
  EXPECT_NEAR(chosen.objective_ms, 11.34, 1e-9);
  // A size the user fixes is kept.
  options.fixed_batch = 8;
  const BatchingResult fixed = make_microbatches(batch, model, options);
  EXPECT_EQ(shapes_of(fixed.replicas[0]), (std::vector<MicroBatchShape>{{8, 64, 0}}));
  EXPECT_NEAR(fixed.objective_ms, 12.144, 1e-9);
}

TEST(PackingTest, FirstFitInDataOrderDenseRows) {
  const FakeCostModel model({.num_stages = 1});
  const GlobalBatch batch = gpt_batch({2, 5, 6, 3, 4});
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = Strategy::Packing, .max_seqlen = 10, .seqlen_multiple = 1, .fixed_batch = 2});
  ASSERT_EQ(result.replicas[0].size(), 1u);
  const MicroBatch& mb = result.replicas[0][0];
  EXPECT_EQ(mb.rows, (std::vector<std::vector<SampleId>>{{0, 1, 3}, {2, 4}}));
  EXPECT_EQ(mb.sample_ids, (std::vector<SampleId>{0, 1, 3, 2, 4}));
  EXPECT_EQ(mb.shape, (MicroBatchShape{2, 10, 0}));
  EXPECT_EQ(mb.density, AttentionDensity{});
  EXPECT_EQ(mb.real_tokens, 20);
}

TEST(PackingTest, VarlenBestFitDecreasingWithDensity) {
  const FakeCostModel model({.num_stages = 1});
  const GlobalBatch batch = gpt_batch({2, 5, 6, 3, 4});
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = Strategy::PackingVarlen, .max_seqlen = 10, .seqlen_multiple = 1,
       .fixed_batch = 2});
  ASSERT_EQ(result.replicas[0].size(), 1u);
  const MicroBatch& mb = result.replicas[0][0];
  // 6 opens row 0, 5 row 1; 4 joins the fuller row 0; 3 and 2 fill row 1.
  EXPECT_EQ(mb.rows, (std::vector<std::vector<SampleId>>{{2, 4}, {1, 3, 0}}));
  EXPECT_EQ(mb.shape, (MicroBatchShape{2, 10, 0}));
  EXPECT_NEAR(mb.density.enc, (36.0 + 16 + 25 + 9 + 4) / (2 * 100.0), 1e-12);
}

TEST(PackingTest, T5RowsRespectBothCapacities) {
  const FakeCostModel model({.num_stages = 1});
  GlobalBatch batch;
  // Inputs would all fit in one 16-token row, targets (+1 bos each) in 8 do not.
  batch.samples = {{.id = 0, .input_len = 4, .target_len = 3},
                   {.id = 1, .input_len = 4, .target_len = 3},
                   {.id = 2, .input_len = 4, .target_len = 2}};
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = Strategy::Packing, .kind = ModelKind::T5, .max_seqlen = 16,
       .max_target_len = 7, .seqlen_multiple = 1, .fixed_batch = 4});
  const MicroBatch& mb = result.replicas[0][0];
  EXPECT_EQ(mb.rows, (std::vector<std::vector<SampleId>>{{0, 1}, {2}}));
  EXPECT_EQ(mb.shape, (MicroBatchShape{2, 8, 8}));
}

TEST(TokenBasedTest, GrowsWhilePaddedTokensFitTheBudget) {
  const FakeCostModel model({.num_stages = 1});
  const GlobalBatch batch = gpt_batch({40, 100, 30, 90, 50});
  const BatchingResult result = make_microbatches(
      batch, model, {.strategy = Strategy::TokenBased, .max_seqlen = 128, .token_budget = 200});
  // Sorted 100, 90, 50, 40, 30 → rounded 104 | 96, 56 (192) | 40, 32 (80).
  EXPECT_EQ(ids_of(result.replicas[0]), (std::vector<std::vector<SampleId>>{{1}, {3, 4}, {0, 2}}));
  EXPECT_EQ(shapes_of(result.replicas[0]),
            (std::vector<MicroBatchShape>{{1, 104, 0}, {2, 96, 0}, {2, 40, 0}}));
}

// Memory stops the first micro-batch before the budget: 1, 2 and 4 samples are probed
// (4 × 104 tokens do not fit), then 3 by bisection.
TEST(TokenBasedTest, MemoryEndsAMicroBatchBeforeTheBudget) {
  const FakeCostModel model({.num_stages = 1, .bytes_per_token = 100});
  const GlobalBatch batch = gpt_batch({40, 100, 30, 90, 50});
  const BatchingResult result = make_microbatches(
      batch, model,
      {.strategy = Strategy::TokenBased, .memory_limit_bytes = 40'000, .max_seqlen = 128,
       .token_budget = 1000, .recompute = Recompute::None});
  // Sorted 100, 90, 50, 40, 30: 3 × 104 = 312 tokens (31,200 B) | 40, 32 → 2 × 40.
  EXPECT_EQ(ids_of(result.replicas[0]), (std::vector<std::vector<SampleId>>{{1, 3, 4}, {0, 2}}));
  EXPECT_EQ(shapes_of(result.replicas[0]), (std::vector<MicroBatchShape>{{3, 104, 0}, {2, 40, 0}}));
}

TEST(VarlenRegroupTest, TokenBasedCutRunsAsOneUnpaddedRowPerMicroBatch) {
  const FakeCostModel model({.num_stages = 1});
  const GlobalBatch batch = gpt_batch({40, 100, 30, 90, 50});
  const BatchingOptions options{.strategy = Strategy::TokenBased, .max_seqlen = 128,
                                .token_budget = 200};
  const BatchingResult theirs = make_microbatches(batch, model, options);
  const std::vector<MicroBatch> ours = as_varlen_microbatches(batch, theirs.replicas[0], options, model);
  // Same samples in the same micro-batches, one row of their tokens rounded up to 8:
  // 100 → 104 | 90 + 50 → 144 | 40 + 30 → 72 (token-based computes 104 | 192 | 80).
  EXPECT_EQ(ids_of(ours), ids_of(theirs.replicas[0]));
  EXPECT_EQ(shapes_of(ours), (std::vector<MicroBatchShape>{{1, 104, 0}, {1, 144, 0}, {1, 72, 0}}));
  for (std::size_t k = 0; k < ours.size(); ++k) {
    EXPECT_EQ(ours[k].id, static_cast<int>(k));
    EXPECT_EQ(ours[k].rows, (std::vector<std::vector<SampleId>>{ours[k].sample_ids}));
    EXPECT_EQ(ours[k].real_tokens, theirs.replicas[0][k].real_tokens);
    EXPECT_LE(ours[k].shape.tokens(), theirs.replicas[0][k].shape.tokens());
  }
  // Block-diagonal attention: 90² + 50² of the row's 144², not dense.
  EXPECT_NEAR(ours[1].density.enc, (90.0 * 90 + 50.0 * 50) / (144.0 * 144), 1e-12);
}

// The regrouping finds each sample by id, wherever the batch holds it; an id the batch
// does not hold is an internal error naming it.
TEST(VarlenRegroupTest, SamplesAreFoundByIdAndAMissingOneIsNamed) {
  const FakeCostModel model({.num_stages = 1});
  GlobalBatch batch = gpt_batch({40, 100, 30});
  batch.samples[0].id = 70;  // ids out of order: 70, 1, 5
  batch.samples[2].id = 5;
  const BatchingOptions options{.strategy = Strategy::TokenBased, .max_seqlen = 128};
  MicroBatch mb;
  mb.sample_ids = {5, 70};
  const std::vector<MicroBatch> ours = as_varlen_microbatches(batch, {mb}, options, model);
  // 30 + 40 tokens in one row, rounded up to 72.
  EXPECT_EQ(ours[0].sample_ids, (std::vector<SampleId>{5, 70}));
  EXPECT_EQ(ours[0].shape, (MicroBatchShape{1, 72, 0}));
  mb.sample_ids = {1, 77};
  expect_error([&] { as_varlen_microbatches(batch, {mb}, options, model); }, ErrorKind::Internal,
               "as_varlen_microbatches: sample 77 not in the batch");
}

// Where the cost model makes lone samples dense (CostModel::lone_samples_dense()), the
// regrouped form keeps a one-sample micro-batch as one dense row: no rows, density 1.
TEST(VarlenRegroupTest, LoneSampleStaysDenseWhereTheModelSaysSo) {
  const FakeCostModel model({.num_stages = 1, .varlen_fixed_ms = 0.2, .lone_samples_dense = true});
  const GlobalBatch batch = gpt_batch({40, 100, 30, 90, 50});
  const BatchingOptions options{.strategy = Strategy::TokenBased, .max_seqlen = 128,
                                .token_budget = 200};
  const BatchingResult theirs = make_microbatches(batch, model, options);
  const std::vector<MicroBatch> ours = as_varlen_microbatches(batch, theirs.replicas[0], options, model);
  ASSERT_EQ(ids_of(ours), (std::vector<std::vector<SampleId>>{{1}, {3, 4}, {0, 2}}));
  EXPECT_TRUE(ours[0].rows.empty());
  EXPECT_EQ(ours[0].density, AttentionDensity{});
  EXPECT_EQ(ours[0].shape, (MicroBatchShape{1, 104, 0}));
  EXPECT_EQ(ours[1].rows, (std::vector<std::vector<SampleId>>{{3, 4}}));
  EXPECT_LT(ours[1].density.enc, 1.0);
}

// The memory rule to the byte with many micro-batches in flight (the varlen rows keep, per
// segment and stage, the most in flight that fit: ShapeCosts::most_in_flight()). One stage
// holding k = 1000, 3 B/token held, 5 B/token peak, 7 B static: two 64-token samples in one
// row need 7 + 1000·384 + 640 = 384,647 bytes. At that limit they share a micro-batch; one
// byte below they stand alone (192,327 bytes each); at 192,326 not even alone under k =
// 1000, so one in flight.
TEST(DynaPipeVarlenTest, TheMemoryRuleHoldsToTheByteWithManyInFlight) {
  const FakeCostModel model(
      {.num_stages = 1, .bytes_per_token = 3, .peak_bytes_per_token = 5, .static_bytes = 7});
  const GlobalBatch batch = gpt_batch({64, 64});
  BatchingOptions options{.num_stages = 1, .memory_limit_bytes = 384'647, .max_seqlen = 1024,
                          .recompute = Recompute::None, .in_flight = {1000}};
  const BatchingResult shared = make_microbatches(batch, model, options);
  EXPECT_FALSE(shared.one_in_flight);
  EXPECT_EQ(ids_of(shared.replicas[0]), (std::vector<std::vector<SampleId>>{{0, 1}}));
  options.memory_limit_bytes = 384'646;
  const BatchingResult alone = make_microbatches(batch, model, options);
  EXPECT_FALSE(alone.one_in_flight);
  EXPECT_EQ(alone.replicas[0].size(), 2u);
  options.memory_limit_bytes = 192'326;
  const BatchingResult one = make_microbatches(batch, model, options);
  EXPECT_TRUE(one.one_in_flight);
  EXPECT_EQ(ids_of(one.replicas[0]), (std::vector<std::vector<SampleId>>{{0, 1}}));
}

// The DP prices a lone sample in the form its micro-batch takes. One stage, 1 byte per
// token against 1,050 bytes: 1001 (1008 rounded) fits only alone. fwd + bwd = 3·(0.5 +
// 0.001·tokens, +1 for a varlen row): 1001 alone 4.524 ms dense, 7.524 as a varlen row
// (density 1001²/1008²); 97 + 97 in one varlen row (200 tokens) 5.1, each alone 1.812
// dense, 4.812 varlen. Priced dense, the 97s stand alone too: 4.524 + 2·1.812; priced
// varlen they would share a row.
TEST(DynaPipeVarlenTest, LoneSamplesAreCostedAndMadeDenseWhereTheModelSaysSo) {
  FakeCostParams params{.num_stages = 1, .bytes_per_token = 1, .varlen_fixed_ms = 1.0,
                        .lone_samples_dense = true};
  const GlobalBatch batch = gpt_batch({97, 1001, 97});
  const BatchingOptions options{.strategy = Strategy::DynaPipe, .memory_limit_bytes = 1050,
                                .max_seqlen = 1024, .recompute = Recompute::None,
                                .varlen_order = VarlenOrder::Sorted};
  const BatchingResult dense = make_microbatches(batch, FakeCostModel(params), options);
  ASSERT_EQ(dense.replicas.size(), 1u);
  const std::vector<MicroBatch>& cut = dense.replicas[0];
  ASSERT_EQ(cut.size(), 3u);
  for (const MicroBatch& mb : cut) {
    ASSERT_EQ(mb.sample_ids.size(), 1u);
    EXPECT_TRUE(mb.rows.empty());
    EXPECT_EQ(mb.density, AttentionDensity{});
    EXPECT_EQ(mb.shape, (MicroBatchShape{1, mb.sample_ids[0] == 1 ? 1008 : 104, 0}));
  }
  EXPECT_NEAR(dense.objective_ms, 4.524 + 2 * 1.812, 1e-9);
  // Lone samples varlen: the 97s share one row, 7.524 + 5.1.
  params.lone_samples_dense = false;
  const BatchingResult varlen = make_microbatches(batch, FakeCostModel(params), options);
  ASSERT_EQ(varlen.replicas[0].size(), 2u);
  EXPECT_NEAR(varlen.objective_ms, 7.524 + 5.1, 1e-9);
}

TEST(BatchingTest, InfeasibleSampleIsNamed) {
  const FakeCostModel model({.num_stages = 2, .bytes_per_token = 100,
                             .full_bytes_per_token = 10, .static_bytes = 1000});
  const GlobalBatch batch = gpt_batch({50, 900, 60});
  // Sample 1 alone, full recompute, on stage 0: 1000 static + 10·904 stored + 2·904 of
  // sent output = 11848 bytes > 10000.
  expect_error([&] {
    make_microbatches(batch, model, {.num_stages = 2, .memory_limit_bytes = 10000,
                                     .max_seqlen = 1024});
  }, ErrorKind::Infeasible, "sample 1 alone (input_len 900, target_len 0, shape 1x904+0) must be "
                            "<= memory_limit_bytes 10000, got 11848 bytes on stage 0");
  expect_error([&] {
    make_microbatches(batch, model, {.strategy = Strategy::Padding, .num_stages = 2,
                                     .memory_limit_bytes = 10000, .max_seqlen = 1024});
  }, ErrorKind::Infeasible, "one padded row");
}

TEST(BatchingTest, FallsBackToRecomputeThenToOneInFlight) {
  // p = 2: stage 0 holds 2 in flight. Stored 100 B/token (none), 10 (full).
  const FakeCostModel model({.num_stages = 2, .bytes_per_token = 100,
                             .full_bytes_per_token = 10, .static_bytes = 0});
  const GlobalBatch batch = gpt_batch({64, 64});
  // One 64-token sample: none needs 2·6400 > 10000, full 2·640: recompute full.
  const BatchingResult full = make_microbatches(
      batch, model, {.num_stages = 2, .memory_limit_bytes = 10000, .max_seqlen = 64});
  EXPECT_EQ(full.recompute, Recompute::Full);
  EXPECT_FALSE(full.one_in_flight);
  // With 1000 bytes nothing fits two in flight, one does with full recompute.
  const BatchingResult one = make_microbatches(
      batch, model, {.num_stages = 2, .memory_limit_bytes = 1000, .max_seqlen = 64});
  EXPECT_TRUE(one.one_in_flight);
  EXPECT_EQ(one.recompute, Recompute::Full);
}

TEST(BatchingTest, RejectsBadInput) {
  const FakeCostModel model({.num_stages = 2});
  const GlobalBatch batch = gpt_batch({10, 20});
  expect_error([&] { make_microbatches(batch, model, {.num_stages = 2, .dp = 0}); },
               ErrorKind::InvalidArgument, "dp must be >= 1, got 0");
  expect_error([&] { make_microbatches(batch, model, {.num_stages = 3}); },
               ErrorKind::InvalidArgument, "stage count must equal num_stages 3, got 2");
  expect_error([&] { make_microbatches(batch, model, {.num_stages = 2, .max_seqlen = 16}); },
               ErrorKind::InvalidArgument, "sample 1: input_len + target_len must be <= max_seqlen 16");
  expect_error([&] { make_microbatches(batch, model, {.kind = ModelKind::T5, .num_stages = 2}); },
               ErrorKind::InvalidArgument, "max_target_len must be >= 1 for t5, got 0");
  GlobalBatch twice = batch;
  twice.samples[1].id = 0;
  expect_error([&] { make_microbatches(twice, model, {.num_stages = 2}); },
               ErrorKind::InvalidArgument, "sample ids must be unique, got 0 twice");
}

// A cache remembers that the samples passed their checks only under the limits it checked:
// the same batch under a smaller max_seqlen is checked, and refused, again.
TEST(BatchingTest, ACacheChecksTheSamplesAgainUnderOtherLimits) {
  const FakeCostModel model({.num_stages = 2});
  const GlobalBatch batch = gpt_batch({10, 20});
  BatchingCache cache;
  EXPECT_NO_THROW(make_microbatches(batch, model, {.num_stages = 2, .max_seqlen = 32}, &cache));
  EXPECT_NO_THROW(make_microbatches(batch, model,
                                    {.strategy = Strategy::TokenBased, .num_stages = 2, .max_seqlen = 32}, &cache));
  expect_error([&] { make_microbatches(batch, model, {.num_stages = 2, .max_seqlen = 16}, &cache); },
               ErrorKind::InvalidArgument, "sample 1: input_len + target_len must be <= max_seqlen 16");
}

TEST(BatchingTest, EveryReplicaGetsWorkOrTheBatchIsRefused) {
  // One stage, plenty of memory: one micro-batch would hold all three samples, but two
  // replicas each need one.
  const FakeCostModel model({.num_stages = 1});
  const GlobalBatch three = gpt_batch({5, 60, 7});
  for (Strategy strategy : {Strategy::DynaPipe, Strategy::Padding, Strategy::Packing,
                            Strategy::PackingVarlen, Strategy::TokenBased,
                            Strategy::DynaPipePadded}) {
    const BatchingResult result =
        make_microbatches(three, model, {.strategy = strategy, .dp = 2, .max_seqlen = 64});
    ASSERT_EQ(result.replicas.size(), 2u);
    EXPECT_FALSE(result.replicas[0].empty()) << strategy_name(strategy);
    EXPECT_FALSE(result.replicas[1].empty()) << strategy_name(strategy);
  }
  expect_error([&] { make_microbatches(three, model, {.dp = 4, .max_seqlen = 64}); },
               ErrorKind::Infeasible, "3 samples cannot feed --dp 4 replicas");
}

TEST(BatchingTest, EmptyBatchGivesEmptyReplicas) {
  const FakeCostModel model({.num_stages = 1});
  const BatchingResult result = make_microbatches(GlobalBatch{}, model, {.dp = 3});
  EXPECT_EQ(result.replicas.size(), 3u);
  EXPECT_EQ(result.objective_ms, 0);
  EXPECT_EQ(padding_efficiency(result), 1.0);
}

// ---- Properties on random batches ---------------------------------------------------

struct RandomCase {
  GlobalBatch batch;
  BatchingOptions options;
  FakeCostParams params;
};

RandomCase random_case(std::uint64_t seed) {
  Rng rng(seed * 7919 + 13);
  RandomCase c;
  const bool t5 = rng.uniform_int(0, 1) == 1;
  const int count = static_cast<int>(rng.uniform_int(1, 48));
  const int stages[] = {1, 2, 4, 8};
  c.options.kind = t5 ? ModelKind::T5 : ModelKind::Gpt;
  c.options.num_stages = stages[rng.uniform_int(0, 3)];
  c.options.dp = static_cast<int>(rng.uniform_int(1, 3));
  c.options.max_seqlen = 2048;
  c.options.max_target_len = t5 ? 512 : 0;
  c.batch = t5 ? testing::random_t5_batch(seed, count, 2048, 512)
               : testing::random_gpt_batch(seed, count, 2048);
  c.params = {.num_stages = c.options.num_stages,
              .fixed_ms = rng.uniform(0.05, 2.0),
              .ms_per_token = rng.uniform(1e-4, 2e-3),
              .ms_per_attention = rng.uniform(0, 1e-6),
              .bytes_per_token = 1000,
              .bytes_per_attention = 1,
              .full_bytes_per_token = 100,
              .peak_bytes_per_token = 200,
              .static_bytes = 1'000'000};
  for (int s = 0; s < c.options.num_stages; ++s) c.params.stage_scale.push_back(rng.uniform(0.8, 1.2));
  // Mostly limited: from "only one full-recompute row in flight" to roomy.
  if (rng.uniform() < 0.8) c.options.memory_limit_bytes = rng.uniform_int(3'000'000, 80'000'000);
  // Planned for another schedule than 1F1B (zb1p-like: p in flight everywhere, a smaller
  // bubble) in a quarter of the cases.
  if (rng.uniform() < 0.25) {
    c.options.in_flight.assign(static_cast<std::size_t>(c.options.num_stages), c.options.num_stages);
    c.options.bubble_weight = rng.uniform(0.2, 1.0);
  }
  return c;
}

// Up to 200 short samples, where the DP's bounds and token-based's fit matter most.
GlobalBatch many_short_samples(const RandomCase& c, std::uint64_t seed) {
  const int count = 40 + static_cast<int>(seed % 160);
  return c.options.kind == ModelKind::T5 ? testing::random_t5_batch(seed, count, 256, 64)
                                         : testing::random_gpt_batch(seed, count, 256);
}

// make_microbatches() of the case on `model`; nullopt where it is infeasible (any other
// error fails the test).
std::optional<BatchingResult> plan_case(const RandomCase& c, const CostModel& model, std::uint64_t seed) {
  try {
    return make_microbatches(c.batch, model, c.options);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Infeasible) << "seed " << seed << ": " << e.what();
    return std::nullopt;
  }
}

// Every sample exactly once; every micro-batch's fields consistent with its members;
// memory within the limit under the declared rule; the objective recomputes.
void check_result(const RandomCase& c, const FakeCostModel& model, const BatchingResult& r,
                  std::uint64_t seed) {
  const BatchingOptions& o = c.options;
  ASSERT_EQ(r.replicas.size(), static_cast<std::size_t>(o.dp));
  std::multiset<SampleId> seen;
  double objective = 0;
  for (const auto& replica : r.replicas) {
    ASSERT_FALSE(replica.empty()) << "every replica must get work (seed " << seed << ")";
    std::vector<double> times;
    for (std::size_t k = 0; k < replica.size(); ++k) {
      const MicroBatch& mb = replica[k];
      ASSERT_EQ(mb.id, static_cast<int>(k));
      ASSERT_FALSE(mb.sample_ids.empty());
      std::int64_t real = 0, target = 0, enc = 0, dec = 0;
      for (SampleId id : mb.sample_ids) {
        seen.insert(id);
        const Sample& s = c.batch.samples[static_cast<std::size_t>(id)];
        real += s.input_len + s.target_len;
        target += s.target_len;
        enc = std::max<std::int64_t>(enc, o.kind == ModelKind::Gpt ? s.input_len + s.target_len : s.input_len);
        dec = std::max<std::int64_t>(dec, o.kind == ModelKind::Gpt ? 0 : s.target_len + 1);
      }
      ASSERT_EQ(mb.real_tokens, real);
      ASSERT_EQ(mb.target_tokens, target);
      ASSERT_EQ(mb.shape.seqlen % o.seqlen_multiple, 0);
      ASSERT_EQ(mb.shape.dec_seqlen % o.seqlen_multiple, 0);
      if (mb.rows.empty()) {
        ASSERT_EQ(mb.shape.batch, static_cast<std::int64_t>(mb.sample_ids.size()));
        ASSERT_GE(mb.shape.seqlen, enc);
        ASSERT_GE(mb.shape.dec_seqlen, dec);
      } else if (o.strategy == Strategy::DynaPipe) {  // one varlen row of every member
        ASSERT_EQ(mb.rows, (std::vector<std::vector<SampleId>>{mb.sample_ids}));
        ASSERT_EQ(mb.shape.batch, 1);
        std::int64_t enc_sum = 0, dec_sum = 0;
        for (SampleId id : mb.sample_ids) {
          const Sample& s = c.batch.samples[static_cast<std::size_t>(id)];
          enc_sum += o.kind == ModelKind::Gpt ? s.input_len + s.target_len : s.input_len;
          dec_sum += o.kind == ModelKind::Gpt ? 0 : s.target_len + 1;
        }
        ASSERT_EQ(mb.shape.seqlen, round_up(enc_sum, o.seqlen_multiple));
        ASSERT_EQ(mb.shape.dec_seqlen, round_up(dec_sum, o.seqlen_multiple));
        ASSERT_LE(mb.density.enc, 1.0);
        ASSERT_LE(mb.density.dec, 1.0);
      } else {
        ASSERT_EQ(mb.shape.batch, static_cast<std::int64_t>(mb.rows.size()));
        ASSERT_LE(mb.shape.seqlen, round_up(o.max_seqlen, o.seqlen_multiple));
      }
      for (int s = 0; s < o.num_stages; ++s) {
        const StageCost cost = model.stage_cost(s, mb.shape, mb.density, r.recompute);
        const std::int64_t k_s = r.one_in_flight       ? 1
                                 : o.in_flight.empty() ? o.num_stages - s
                                                       : o.in_flight[static_cast<std::size_t>(s)];
        if (o.memory_limit_bytes > 0) {
          ASSERT_LE(model.static_bytes(s) + k_s * cost.stored_bytes + cost.peak_bytes,
                    o.memory_limit_bytes)
              << "seed " << seed << " stage " << s;
        }
      }
      times.push_back(microbatch_time_ms(model, mb, r.recompute));
    }
    objective = std::max(objective, pipeline_objective_ms(times, o.num_stages, o.bubble_weight));
  }
  std::multiset<SampleId> all;
  for (const Sample& s : c.batch.samples) all.insert(s.id);
  ASSERT_EQ(seen, all) << "seed " << seed;
  ASSERT_NEAR(r.objective_ms, objective, 1e-6 * std::max(1.0, objective)) << "seed " << seed;
}

TEST(BatchingPropertyTest, EveryStrategyCoversFitsAndIsDeterministic) {
  constexpr Strategy kStrategies[] = {Strategy::DynaPipePadded, Strategy::Padding,
                                      Strategy::Packing,        Strategy::PackingVarlen,
                                      Strategy::TokenBased,     Strategy::DynaPipe};
  int compared_padding = 0, compared_token = 0, compared_varlen = 0, compared_rows = 0;
  for (std::uint64_t seed = 1; seed <= 1500; ++seed) {
    RandomCase c = random_case(seed);
    const FakeCostModel model(c.params);
    std::optional<BatchingResult> results[6];
    for (int s = 0; s < 6; ++s) {
      c.options.strategy = kStrategies[s];
      try {
        results[s] = make_microbatches(c.batch, model, c.options);
      } catch (const Error& e) {
        // Only a memory limit too small for one sample (or padded row) may refuse.
        ASSERT_EQ(e.kind(), ErrorKind::Infeasible) << "seed " << seed << ": " << e.what();
        continue;
      }
      ASSERT_NO_FATAL_FAILURE(check_result(c, model, *results[s], seed))
          << strategy_name(kStrategies[s]);
    }
    // Same cost model, same memory rule: dynapipe-padded is never worse than padding (its
    // sorted shards can copy padding's micro-batch sizes at lower lengths) and, with one
    // replica, never worse than token-based (a consecutive partition of the same order).
    // Varlen dynapipe, one replica, never worse than dynapipe-padded: the same segment
    // costs no more as one block-diagonal row (round8(Σ L) <= b·round8(max L), Σ L² <=
    // b·max L²), so every padded partition has a varlen one at most as slow.
    const auto& dyna = results[0];
    if (dyna && results[1] && dyna->one_in_flight == results[1]->one_in_flight) {
      EXPECT_LE(dyna->objective_ms, results[1]->objective_ms * (1 + 1e-12)) << "seed " << seed;
      ++compared_padding;
    }
    if (dyna && results[4] && c.options.dp == 1 &&
        dyna->one_in_flight == results[4]->one_in_flight) {
      EXPECT_LE(dyna->objective_ms, results[4]->objective_ms * (1 + 1e-12)) << "seed " << seed;
      ++compared_token;
    }
    const auto& varlen = results[5];
    if (dyna && varlen && c.options.dp == 1) {
      ASSERT_TRUE(!varlen->one_in_flight || dyna->one_in_flight) << "seed " << seed;
      if (varlen->one_in_flight == dyna->one_in_flight) {
        EXPECT_LE(varlen->objective_ms, dyna->objective_ms * (1 + 1e-12)) << "seed " << seed;
        ++compared_varlen;
      }
    }
    // ... and never worse than packing-varlen: its micro-batches are runs of the packed-rows
    // order, each no faster and no lighter than the same samples in one varlen row.
    const auto& rows = results[3];
    if (varlen && rows && c.options.dp == 1 && varlen->one_in_flight == rows->one_in_flight) {
      EXPECT_LE(varlen->objective_ms, rows->objective_ms * (1 + 1e-12)) << "seed " << seed;
      ++compared_rows;
    }
    if (seed % 10 == 0 && dyna) {  // determinism
      c.options.strategy = Strategy::DynaPipePadded;
      const BatchingResult again = make_microbatches(c.batch, model, c.options);
      ASSERT_EQ(again.objective_ms, dyna->objective_ms);
      for (std::size_t r = 0; r < again.replicas.size(); ++r) {
        ASSERT_EQ(ids_of(again.replicas[r]), ids_of(dyna->replicas[r]));
        ASSERT_EQ(shapes_of(again.replicas[r]), shapes_of(dyna->replicas[r]));
      }
    }
  }
  EXPECT_GT(compared_padding, 1000);
  EXPECT_GT(compared_token, 300);
  EXPECT_GT(compared_varlen, 300);
  EXPECT_GT(compared_rows, 300);
}

// A micro-batch of `members` as the DP strategies form it, built here independently:
// padded rows (dynapipe-padded) or one block-diagonal row (dynapipe; a lone sample one
// dense row where the model says so).
MicroBatch brute_force_microbatch(const RandomCase& c, const std::vector<std::size_t>& members) {
  const bool dense_alone = members.size() == 1 && c.params.lone_samples_dense;
  const bool gpt = c.options.kind == ModelKind::Gpt;
  std::int64_t enc = 0, dec = 0, enc_sum = 0, dec_sum = 0;
  double enc_sq = 0, dec_sq = 0;
  for (std::size_t k : members) {
    const Sample& s = c.batch.samples[k];
    const std::int64_t e = gpt ? s.input_len + s.target_len : s.input_len;
    const std::int64_t d = gpt ? 0 : s.target_len + 1;
    enc = std::max(enc, e);
    dec = std::max(dec, d);
    enc_sum += e;
    dec_sum += d;
    enc_sq += static_cast<double>(e * e);
    dec_sq += static_cast<double>(d * d);
  }
  MicroBatch mb;
  if (c.options.strategy == Strategy::DynaPipePadded || dense_alone) {
    mb.shape = {static_cast<std::int64_t>(members.size()), round_up(enc, 8), round_up(dec, 8)};
    return mb;
  }
  mb.shape = {1, round_up(enc_sum, 8), round_up(dec_sum, 8)};
  const double se = static_cast<double>(mb.shape.seqlen), sd = static_cast<double>(mb.shape.dec_seqlen);
  mb.density.enc = enc_sq / (se * se);
  if (!gpt) mb.density.dec = dec_sq / (sd * sd);
  return mb;
}

// End to end, one replica: each DP strategy's result equals the best over every cut set
// of the sorted order, every recompute mode, under the first memory rule that admits
// any, for the random schedule options (in-flight counts, bubble weight) of the case.
// A third of the cases cost micro-batches past 1,024 tokens superlinearly: a model that
// is not subadditive, whose merged rows must not prune (CostModel::subadditive()). A
// fifth make a micro-batch faster at token counts divisible by 64: not monotone, so no
// scan may stop at the first segment over a cap (CostModel::monotone()). A seventh give
// varlen rows a fixed time and make lone samples dense (CostModel::lone_samples_dense()).
// padding and the packings (packing-megatron too) with no size given: no fixed size beats
// their choice under the same memory rule (they try every size up to the most that fit).
TEST(BatchingPropertyTest, FixedSizeStrategiesChooseTheBestSize) {
  int compared = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    RandomCase c = random_case(seed);
    const FakeCostModel model(c.params);
    for (Strategy strategy : {Strategy::Padding, Strategy::Packing, Strategy::PackingVarlen,
                              Strategy::PackingMegatron}) {
      c.options.strategy = strategy;
      c.options.fixed_batch = 0;
      std::optional<BatchingResult> chosen;
      try {
        chosen = make_microbatches(c.batch, model, c.options);
      } catch (const Error& e) {
        ASSERT_EQ(e.kind(), ErrorKind::Infeasible) << "seed " << seed << ": " << e.what();
        continue;
      }
      for (std::int64_t size = 1; size <= 8; ++size) {
        BatchingOptions fixed = c.options;
        fixed.fixed_batch = size;
        try {
          const BatchingResult other = make_microbatches(c.batch, model, fixed);
          if (other.one_in_flight != chosen->one_in_flight) continue;
          EXPECT_LE(chosen->objective_ms, other.objective_ms * (1 + 1e-12))
              << strategy_name(strategy) << " seed " << seed << " size " << size;
          ++compared;
        } catch (const Error& e) {
          ASSERT_EQ(e.kind(), ErrorKind::Infeasible) << "seed " << seed << ": " << e.what();
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
}

// The best objective over every cut set of `orders` under one memory rule, each segment
// in `mode`, or (mode unset: mixed recompute) in the lightest mode whose rule it fits;
// +inf if no cut set fits.
double brute_force_objective(const RandomCase& c, const FakeCostModel& model,
                             const std::vector<std::vector<std::size_t>>& orders,
                             bool one_in_flight, std::optional<Recompute> mode) {
  const int n = static_cast<int>(orders[0].size()), p = c.options.num_stages;
  const std::int64_t dec_capacity =
      c.options.kind == ModelKind::T5 ? c.options.max_target_len + 1 : 0;
  auto fits_in = [&](const MicroBatch& mb, Recompute rc) {
    for (int s = 0; s < p && c.options.memory_limit_bytes > 0; ++s) {
      const StageCost cost = model.stage_cost(s, mb.shape, mb.density, rc);
      const std::int64_t k_s = one_in_flight              ? 1
                               : c.options.in_flight.empty() ? p - s
                                                             : c.options.in_flight[s];
      if (model.static_bytes(s) + k_s * cost.stored_bytes + cost.peak_bytes >
          c.options.memory_limit_bytes) {
        return false;
      }
    }
    return true;
  };
  double best = std::numeric_limits<double>::infinity();
  for (const std::vector<std::size_t>& order : orders) {
    for (std::uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
      std::vector<double> times;
      bool fits = true;
      for (int begin = 0; begin < n && fits;) {
        int end = begin + 1;
        while (end < n && !(mask & (1u << (end - 1)))) ++end;
        const std::vector<std::size_t> members(order.begin() + begin, order.begin() + end);
        if (c.options.varlen_row_capacity && members.size() > 1) {
          std::int64_t enc = 0, dec = 0;
          for (std::size_t k : members) {
            const Sample& s = c.batch.samples[k];
            enc += c.options.kind == ModelKind::Gpt ? s.input_len + s.target_len : s.input_len;
            dec += c.options.kind == ModelKind::Gpt ? 0 : s.target_len + 1;
          }
          if (enc > c.options.max_seqlen || (dec_capacity > 0 && dec > dec_capacity)) {
            fits = false;
            break;
          }
        }
        const MicroBatch mb = brute_force_microbatch(c, members);
        std::optional<Recompute> runs_in;
        for (Recompute rc : kRecomputeModes) {
          if ((!mode || rc == *mode) && fits_in(mb, rc)) {
            runs_in = rc;
            break;
          }
        }
        fits = runs_in.has_value();
        if (fits) times.push_back(microbatch_time_ms(model, mb, *runs_in));
        begin = end;
      }
      if (fits) best = std::min(best, pipeline_objective_ms(times, p, c.options.bubble_weight));
    }
  }
  return best;
}

// Both DP strategies, and dynapipe in mixed recompute (BatchingOptions::mixed_recompute:
// each segment in the lightest mode whose memory rule it fits, every mode's segments in
// one DP), against brute force.
TEST(BatchingPropertyTest, DynaPipeEqualsBruteForceOverCutsAndRecompute) {
  int checked = 0, checked_mixed = 0;
  for (std::uint64_t seed = 1; seed <= 600; ++seed) {
    RandomCase c = random_case(seed);
    if (seed % 3 == 0) {
      c.params.superlinear_ms = 1e-5;
      c.params.superlinear_from = 1024;
    }
    if (seed % 5 == 0) c.params.dip_ms = c.params.fixed_ms * 0.9;  // and not monotone
    if (seed % 7 == 3) {  // varlen rows pay a fixed time; lone samples run dense
      c.params.varlen_fixed_ms = c.params.fixed_ms * 0.5;
      c.params.lone_samples_dense = true;
    }
    c.options.dp = 1;
    c.options.strategy = seed % 2 == 0 ? Strategy::DynaPipe : Strategy::DynaPipePadded;
    c.options.mixed_recompute = seed % 6 == 2 || seed % 6 == 4;  // dynapipe only
    // dynapipe within packing-varlen's row capacity in a quarter of its cases.
    c.options.varlen_row_capacity = seed % 4 == 0;
    const std::size_t cap = seed % 4 < 2 ? 12 : 10;  // 2^11 cut sets at most; keeps it short
    c.batch.samples.resize(std::min(c.batch.samples.size(), cap));
    const FakeCostModel model(c.params);
    BatchingResult got;
    try {
      got = make_microbatches(c.batch, model, c.options);
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::Infeasible);
      continue;
    }
    // dynapipe cuts both varlen orders and keeps the better.
    std::vector<std::vector<std::size_t>> orders{order_samples(
        c.batch.samples, c.options.kind, c.options.kind == ModelKind::T5 ? 64 : 1)};
    if (c.options.strategy == Strategy::DynaPipe) {
      orders.push_back(order_packed_rows(c.batch.samples, c.options.kind, c.options.max_seqlen,
                                         c.options.kind == ModelKind::T5 ? c.options.max_target_len + 1 : 0));
    }
    double expected = std::numeric_limits<double>::infinity();
    for (bool one_in_flight : {false, true}) {
      if (c.options.mixed_recompute) {
        expected = brute_force_objective(c, model, orders, one_in_flight, std::nullopt);
      } else {
        for (Recompute rc : kRecomputeModes) {
          expected = std::min(expected, brute_force_objective(c, model, orders, one_in_flight, rc));
        }
      }
      if (expected < std::numeric_limits<double>::infinity()) {
        ASSERT_EQ(got.one_in_flight, one_in_flight) << "seed " << seed;
        break;
      }
    }
    ASSERT_NEAR(got.objective_ms, expected, 1e-9 * std::max(1.0, expected)) << "seed " << seed;
    ++(c.options.mixed_recompute ? checked_mixed : checked);
  }
  EXPECT_GT(checked, 300);
  EXPECT_GT(checked_mixed, 120);
}

// One cache over many calls on the same batch (other memory rules, bubble weights,
// recompute limits, strategies) gives exactly the results of fresh calls.
TEST(BatchingPropertyTest, CacheGivesTheSameResults) {
  for (std::uint64_t seed = 1; seed <= 150; ++seed) {
    RandomCase c = random_case(seed);
    c.options.strategy = Strategy::DynaPipe;
    const FakeCostModel model(c.params);
    BatchingCache cache;
    // Later variants start from the cuts earlier ones left in the cache: a cut from
    // another rule, weight or capacity must be re-checked under the variant's own. The
    // baselines' last: packing-varlen takes the packing dynapipe's packed-rows order made
    // (on each replica's shard where dp > 1, which that order is not), under two rules,
    // and packing and token-based the sorted order.
    for (int variant = 0; variant < 10; ++variant) {
      BatchingOptions o = c.options;
      if (variant == 1) o.in_flight.assign(static_cast<std::size_t>(o.num_stages), o.num_stages);
      if (variant == 2) o.bubble_weight = 0.3;
      if (variant == 3) o.varlen_order = VarlenOrder::PackedRows;
      if (variant == 4) {
        o.varlen_order = VarlenOrder::PackedRows;
        o.varlen_row_capacity = true;
      }
      if (variant == 5) o.bubble_weight = 3;
      if (variant >= 6) o.strategy = Strategy::PackingVarlen;
      if (variant == 7) o.in_flight.assign(static_cast<std::size_t>(o.num_stages), o.num_stages);
      if (variant == 8) o.strategy = Strategy::Packing;
      if (variant == 9) o.strategy = Strategy::TokenBased;
      std::optional<BatchingResult> fresh, cached;
      try {
        fresh = make_microbatches(c.batch, model, o);
      } catch (const Error& e) {
        ASSERT_EQ(e.kind(), ErrorKind::Infeasible);
      }
      try {
        cached = make_microbatches(c.batch, model, o, &cache);
      } catch (const Error& e) {
        ASSERT_EQ(e.kind(), ErrorKind::Infeasible);
      }
      ASSERT_EQ(fresh.has_value(), cached.has_value()) << "seed " << seed;
      if (!fresh) continue;
      ASSERT_EQ(fresh->objective_ms, cached->objective_ms)
          << "seed " << seed << " variant " << variant;
      for (std::size_t r = 0; r < fresh->replicas.size(); ++r) {
        ASSERT_EQ(ids_of(fresh->replicas[r]), ids_of(cached->replicas[r])) << "seed " << seed;
      }
    }
  }
}

// Two caches, one per varlen order (the planner's first DPs on two threads), then one
// absorbing the other: both orders' DPs again on it give the fresh results and cost what
// they cost again on their own caches, so the absorbed rows were kept; absorbing into an
// empty cache too.
TEST(BatchingPropertyTest, AbsorbedCacheKeepsTheOtherOrdersRows) {
  int checked = 0;
  for (std::uint64_t seed = 1; seed <= 120; ++seed) {
    RandomCase c = random_case(seed);
    c.options.strategy = Strategy::DynaPipe;
    const FakeCostModel model(c.params);
    BatchingOptions sorted = c.options, packed = c.options;
    sorted.varlen_order = VarlenOrder::Sorted;
    packed.varlen_order = VarlenOrder::PackedRows;
    auto plan = [&](const BatchingOptions& o, BatchingCache* cache) -> std::optional<BatchingResult> {
      try {
        return make_microbatches(c.batch, model, o, cache);
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Infeasible) << "seed " << seed << ": " << e.what();
        return std::nullopt;
      }
    };
    const std::optional<BatchingResult> fresh_sorted = plan(sorted, nullptr);
    const std::optional<BatchingResult> fresh_packed = plan(packed, nullptr);
    if (!fresh_sorted || !fresh_packed) continue;
    // What both DPs cost again on their own caches (a repeat still asks the model for a
    // few bounds): on the merged cache they must cost exactly that.
    std::int64_t repeat_calls = 0;
    {
      BatchingCache first, second;
      plan(sorted, &first);
      plan(packed, &second);
      const std::int64_t before = model.calls();
      plan(sorted, &first);
      plan(packed, &second);
      repeat_calls = model.calls() - before;
    }
    for (const bool into_empty : {false, true}) {
      BatchingCache first, second;
      plan(sorted, &first);
      plan(packed, &second);
      // The sorted order's cache takes the other's, as the planner's does; or both go
      // into a fresh one.
      BatchingCache empty;
      BatchingCache& merged = into_empty ? empty : first;
      if (into_empty) merged.absorb(std::move(first));
      merged.absorb(std::move(second));
      const std::int64_t before = model.calls();
      const std::optional<BatchingResult> again_sorted = plan(sorted, &merged);
      const std::optional<BatchingResult> again_packed = plan(packed, &merged);
      EXPECT_EQ(model.calls() - before, repeat_calls) << "seed " << seed << ": rows lost in the merge";
      ASSERT_TRUE(again_sorted && again_packed) << "seed " << seed;
      for (const auto& [fresh, again] : {std::pair{&*fresh_sorted, &*again_sorted},
                                         std::pair{&*fresh_packed, &*again_packed}}) {
        ASSERT_EQ(fresh->objective_ms, again->objective_ms) << "seed " << seed;
        for (std::size_t r = 0; r < fresh->replicas.size(); ++r) {
          ASSERT_EQ(ids_of(fresh->replicas[r]), ids_of(again->replicas[r])) << "seed " << seed;
        }
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 60);
}

// The cost model's affine time bound (cost_model.h) prunes recompute modes and caps
// segment times before any segment is costed; it must change no result, only the work:
// the same objectives and cuts with and without it, and fewer cost-model calls with it.
// Its attention term (the samples' squared lengths, which every partition pays) tightens
// it: again the same results, and fewer calls than without that term.
TEST(BatchingPropertyTest, AffineTimeBoundChangesNoResultAndSavesCosting) {
  std::int64_t calls_with = 0, calls_without = 0, calls_without_squares = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    RandomCase c = random_case(seed);
    c.options.strategy = seed % 3 == 0 ? Strategy::DynaPipePadded : Strategy::DynaPipe;
    c.options.varlen_row_capacity = seed % 5 == 0 && c.options.strategy == Strategy::DynaPipe;
    c.batch = many_short_samples(c, seed);  // where the bound works
    FakeCostParams without = c.params, without_squares = c.params;
    without.affine_bound = false;
    without_squares.affine_squares = false;
    const FakeCostModel with_model(c.params), without_model(without),
        without_squares_model(without_squares);
    const std::optional<BatchingResult> with = plan_case(c, with_model, seed);
    const std::optional<BatchingResult> plain = plan_case(c, without_model, seed);
    const std::optional<BatchingResult> tokens_only = plan_case(c, without_squares_model, seed);
    calls_with += with_model.calls();
    calls_without += without_model.calls();
    calls_without_squares += without_squares_model.calls();
    ASSERT_EQ(with.has_value(), plain.has_value()) << "seed " << seed;
    ASSERT_EQ(with.has_value(), tokens_only.has_value()) << "seed " << seed;
    if (!with) continue;
    for (const BatchingResult* other : {&*plain, &*tokens_only}) {
      ASSERT_EQ(with->objective_ms, other->objective_ms) << "seed " << seed;
      ASSERT_EQ(with->recompute, other->recompute) << "seed " << seed;
      for (std::size_t r = 0; r < with->replicas.size(); ++r) {
        ASSERT_EQ(ids_of(with->replicas[r]), ids_of(other->replicas[r])) << "seed " << seed;
      }
    }
  }
  EXPECT_LT(calls_with, calls_without_squares);
  EXPECT_LT(calls_without_squares, calls_without);
}

// Token-based finds where memory ends a micro-batch by galloping and bisection where the
// cost model is monotone, by a walk over every sample otherwise (here: the same model
// with small dips in time, and the same memory): the same cuts, in fewer costed shapes.
TEST(BatchingPropertyTest, TokenBasedGallopsToTheWalksCuts) {
  std::int64_t calls_gallop = 0, calls_walk = 0;
  int memory_bound = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    RandomCase c = random_case(seed);
    c.options.strategy = Strategy::TokenBased;
    c.options.token_budget = std::int64_t{256} << (seed % 9);
    c.batch = many_short_samples(c, seed);
    FakeCostParams walk_params = c.params;
    walk_params.dip_ms = 1e-3;
    const FakeCostModel gallop_model(c.params), walk_model(walk_params);
    ASSERT_TRUE(gallop_model.monotone() && !walk_model.monotone());
    const std::optional<BatchingResult> gallop = plan_case(c, gallop_model, seed);
    const std::optional<BatchingResult> walk = plan_case(c, walk_model, seed);
    calls_gallop += gallop_model.calls();
    calls_walk += walk_model.calls();
    ASSERT_EQ(gallop.has_value(), walk.has_value()) << "seed " << seed;
    if (!gallop) continue;
    ASSERT_EQ(gallop->recompute, walk->recompute) << "seed " << seed;
    for (std::size_t r = 0; r < gallop->replicas.size(); ++r) {
      ASSERT_EQ(ids_of(gallop->replicas[r]), ids_of(walk->replicas[r])) << "seed " << seed;
      for (const MicroBatch& mb : gallop->replicas[r]) {
        memory_bound += mb.shape.tokens() + mb.shape.seqlen + mb.shape.dec_seqlen <= c.options.token_budget;
      }
    }
  }
  EXPECT_GT(memory_bound, 100);  // micro-batches another sample would have fitted by budget
  EXPECT_LT(calls_gallop, calls_walk);
}

// Every sample fits alone, or the first that does not is named: where the cost model is
// monotone only the samples no other exceeds on both sides are costed first, otherwise
// every sample (here: the same model with small dips in time, the same memory). The same
// outcome and message, for GPT and T5 and memory limits around the longest samples'.
TEST(BatchingPropertyTest, AloneCheckOfTheLongestSamplesNamesTheSameSample) {
  int refused = 0, planned = 0, refused_not_longest_input = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    RandomCase c = random_case(seed);
    c.options.strategy = seed % 4 == 0 ? Strategy::TokenBased : Strategy::DynaPipe;
    c.options.dp = 1;
    // T5 targets as long as inputs, so that a shorter input can need more memory alone.
    if (c.options.kind == ModelKind::T5) {
      c.options.max_seqlen = 1024;
      c.options.max_target_len = 1024;
      c.batch = testing::random_t5_batch(seed, 40, 1024, 1024);
    }
    // Full recompute, one in flight: 1,000,000 static bytes and ~300 per token.
    Rng rng(seed);
    c.options.memory_limit_bytes = rng.uniform_int(1'200'000, 1'700'000);
    FakeCostParams walk_params = c.params;
    walk_params.dip_ms = 1e-3;
    const FakeCostModel monotone_model(c.params), walk_model(walk_params);
    auto outcome = [&](const FakeCostModel& model) -> std::string {
      try {
        make_microbatches(c.batch, model, c.options);
        return "planned";
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::Infeasible) return std::string("unexpected: ") + e.what();
        return e.what();
      }
    };
    const std::string got = outcome(monotone_model);
    ASSERT_EQ(got, outcome(walk_model)) << "seed " << seed;
    if (got == "planned") {
      ++planned;
      continue;
    }
    ++refused;
    std::int32_t longest = 0;
    for (const Sample& sample : c.batch.samples) longest = std::max(longest, sample.input_len);
    if (got.find(cat("(input_len ", longest, ",")) == std::string::npos) ++refused_not_longest_input;
  }
  EXPECT_GT(refused, 50);  // both outcomes are exercised
  EXPECT_GT(planned, 50);
  EXPECT_GT(refused_not_longest_input, 10);  // a sample the longest input does not cover
}

// dynapipe with varlen_padded_cut (one replica, one recompute mode): exactly
// dynapipe-padded's cut, each micro-batch one varlen row of the same members, no slower
// and within memory; so the result's objective is never above dynapipe-padded's.
TEST(BatchingPropertyTest, PaddedCutIsDynaPipePaddedsCutRunVarlen) {
  int compared = 0, faster = 0;
  for (std::uint64_t seed = 1; seed <= 600; ++seed) {
    RandomCase c = random_case(seed);
    c.options.dp = 1;
    const Recompute modes[] = {Recompute::None, Recompute::Selective, Recompute::Full};
    c.options.recompute = modes[seed % 3];
    const FakeCostModel model(c.params);
    BatchingOptions padded = c.options;
    padded.strategy = Strategy::DynaPipePadded;
    BatchingOptions cut = c.options;
    cut.strategy = Strategy::DynaPipe;
    cut.varlen_order = VarlenOrder::Sorted;
    cut.varlen_padded_cut = true;
    BatchingResult want;
    try {
      want = make_microbatches(c.batch, model, padded);
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::Infeasible);
      continue;  // a padded row too large; its varlen row may still fit
    }
    const BatchingResult got = make_microbatches(c.batch, model, cut);
    c.options = cut;
    check_result(c, model, got, seed);
    ASSERT_EQ(got.one_in_flight, want.one_in_flight) << "seed " << seed;
    ASSERT_EQ(ids_of(got.replicas[0]), ids_of(want.replicas[0])) << "seed " << seed;
    for (std::size_t k = 0; k < got.replicas[0].size(); ++k) {
      ASSERT_LE(microbatch_time_ms(model, got.replicas[0][k], got.recompute),
                microbatch_time_ms(model, want.replicas[0][k], want.recompute) * (1 + 1e-12))
          << "seed " << seed << " micro-batch " << k;
    }
    ASSERT_LE(got.objective_ms, want.objective_ms * (1 + 1e-12)) << "seed " << seed;
    if (got.objective_ms < want.objective_ms * 0.999) ++faster;
    ++compared;
  }
  EXPECT_GT(compared, 450);
  EXPECT_GT(faster, compared / 4);  // the varlen rows pad nothing: usually strictly faster
}

TEST(BatchingPropertyTest, AutoReplicaSplitIsTheBetterOfBoth) {
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    RandomCase c = random_case(seed);
    c.options.dp = 2 + static_cast<int>(seed % 3);
    const FakeCostModel model(c.params);
    double objective[3];
    bool ok = true;
    for (ReplicaSplit split : {ReplicaSplit::Auto, ReplicaSplit::Microbatches, ReplicaSplit::Samples}) {
      c.options.replica_split = split;
      try {
        const BatchingResult r = make_microbatches(c.batch, model, c.options);
        check_result(c, model, r, seed);
        objective[static_cast<int>(split)] = r.objective_ms;
      } catch (const Error& e) {
        ASSERT_EQ(e.kind(), ErrorKind::Infeasible);
        ok = false;
      }
    }
    if (!ok) continue;
    EXPECT_LE(objective[0], std::min(objective[1], objective[2]) * (1 + 1e-12)) << "seed " << seed;
  }
}

}  // namespace
}  // namespace dynapipe
