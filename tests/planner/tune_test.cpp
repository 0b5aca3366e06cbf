// dynapipe tune's search: the layouts of a GPU count, the best point per strategy is the
// best feasible one and replans to the same figure, bad options are named.
#include "dynapipe/planner/tune.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dynapipe/core/error.h"
#include "dynapipe/data/synth.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/batching/megatron_packing.h"
#include "dynapipe/planner/planner.h"

namespace dynapipe {
namespace {

std::vector<TuneLayout> layouts(std::initializer_list<TuneLayout> list) { return list; }

TEST(TuneTest, LayoutsOfEightGpus) {
  // gpt-6.7b: 32 heads, 32 layers: every (tp, pp) pair of divisors of 8.
  EXPECT_EQ(tune_layouts(load_model_spec("gpt-6.7b"), 8),
            layouts({{1, 1, 8}, {1, 2, 4}, {1, 4, 2}, {1, 8, 1}, {2, 1, 4}, {2, 2, 2}, {2, 4, 1},
                     {4, 1, 2}, {4, 2, 1}, {8, 1, 1}}));
  // gpt-tiny: 4 heads (no tp 8), 4 layers (no pp 8).
  EXPECT_EQ(tune_layouts(load_model_spec("gpt-tiny"), 8),
            layouts({{1, 1, 8}, {1, 2, 4}, {1, 4, 2}, {2, 1, 4}, {2, 2, 2}, {2, 4, 1}, {4, 1, 2}, {4, 2, 1}}));
  EXPECT_EQ(tune_layouts(load_model_spec("gpt-tiny"), 3), layouts({{1, 1, 3}, {1, 3, 1}}));
  EXPECT_THROW(tune_layouts(load_model_spec("gpt-tiny"), 0), Error);
}

TuneOptions small_options() {
  TuneOptions options;
  options.base.model = load_model_spec("gpt-small");
  options.base.cost_model = "analytic:a100-40g";
  options.base.max_seqlen = 1024;
  options.base.max_target_len = 1024;
  options.base.global_batch_tokens = 16384;
  options.gpus = 4;
  options.iterations = 1;
  options.strategies = {"dynapipe", "packing-megatron"};
  return options;
}

std::vector<Sample> small_samples() {
  SynthOptions synth;
  synth.mixture = "flan-zsopt";
  synth.num_samples = 400;
  std::vector<Sample> samples = generate_synthetic_samples(synth).samples;
  for (Sample& s : samples) {  // truncate to the 1024-token limit (GPT: input + target)
    s.target_len = std::min(s.target_len, 64);
    s.input_len = std::min(s.input_len, 1024 - s.target_len);
  }
  return samples;
}

TEST(TuneTest, BestIsTheFastestFeasiblePointAndReplansTheSame) {
  const TuneOptions options = small_options();
  const std::vector<Sample> samples = small_samples();
  int calls = 0;
  TuneOptions with_progress = options;
  with_progress.progress = [&](int done, int total) {
    ++calls;
    EXPECT_LE(done, total);
  };
  const TuneResult r = tune(samples, {}, with_progress);
  EXPECT_EQ(calls, r.points_tried.at("dynapipe") + r.points_tried.at("packing-megatron"));
  EXPECT_EQ(r.points_tried.at("dynapipe"), static_cast<int>(r.layouts.size()));
  ASSERT_EQ(r.best.size(), 2u);
  for (const auto& [name, best] : r.best) {
    for (const TunePoint& p : r.feasible) {
      if (p.strategy == name) {
        EXPECT_LE(p.est_tokens_per_s, best.est_tokens_per_s) << name;
      }
    }
  }
  // packing-megatron fixes a micro-batch size and a recompute mode.
  const TunePoint& megatron = r.best.at("packing-megatron");
  EXPECT_GE(megatron.micro_batch_size, 1);
  ASSERT_TRUE(megatron.recompute.has_value());
  EXPECT_EQ(megatron.schedule, "1f1b");

  // The winner's configuration planned directly gives the same estimate.
  PlanConfig config = options.base;
  config.strategy = Strategy::PackingMegatron;
  config.tp = megatron.layout.tp;
  config.pp = megatron.layout.pp;
  config.dp = megatron.layout.dp;
  config.micro_batch_size = megatron.micro_batch_size;
  config.recompute = megatron.recompute;
  const Planner planner(config);
  const auto batches = form_megatron_global_batches(
      samples, {}, {.kind = ModelKind::Gpt, .max_seqlen = 1024, .max_target_len = 1024}, 16384, 1);
  const PlanSummary summary = summarize({planner.plan_iteration(batches.at(0))});
  EXPECT_DOUBLE_EQ(summary.est_tokens_per_s, megatron.est_tokens_per_s);
}

TEST(TuneTest, TheResultIsTheSameForAnyThreadCount) {
  TuneOptions options = small_options();
  options.iterations = 2;
  const std::vector<Sample> samples = small_samples();
  const TuneResult one = tune(samples, {}, options);
  options.threads = 3;
  std::vector<int> done_seen;
  int total_seen = 0;
  options.progress = [&](int done, int total) {  // one call at a time: no lock needed here
    done_seen.push_back(done);
    total_seen = total;
  };
  const TuneResult three = tune(samples, {}, options);

  ASSERT_EQ(one.feasible.size(), three.feasible.size());
  ASSERT_GT(one.feasible.size(), 3u);
  for (std::size_t k = 0; k < one.feasible.size(); ++k) {
    const TunePoint &a = one.feasible[k], &b = three.feasible[k];
    EXPECT_EQ(a.strategy, b.strategy) << k;
    EXPECT_EQ(a.layout, b.layout) << k;
    EXPECT_EQ(a.micro_batch_size, b.micro_batch_size) << k;
    EXPECT_EQ(a.recompute, b.recompute) << k;
    EXPECT_EQ(a.schedule, b.schedule) << k;
    EXPECT_EQ(a.est_iteration_ms, b.est_iteration_ms) << k;  // bit for bit
    EXPECT_EQ(a.est_tokens_per_s, b.est_tokens_per_s) << k;
  }
  EXPECT_EQ(one.points_tried, three.points_tried);
  EXPECT_EQ(one.points_feasible, three.points_feasible);
  for (const auto& [name, best] : one.best) {
    EXPECT_EQ(best.layout, three.best.at(name).layout) << name;
    EXPECT_EQ(best.est_tokens_per_s, three.best.at(name).est_tokens_per_s) << name;
  }
  // Every point reported once, counting up.
  int tried = 0;
  for (const auto& [name, count] : one.points_tried) tried += count;
  EXPECT_EQ(total_seen, tried);
  ASSERT_EQ(static_cast<int>(done_seen.size()), tried);
  for (int k = 0; k < tried; ++k) EXPECT_EQ(done_seen[k], k + 1);

  options.threads = -1;
  EXPECT_THROW(tune(samples, {}, options), Error);
}

TEST(TuneTest, LayoutsWithoutMeasurementsAreLeftOut) {
  TuneOptions options = small_options();
  options.base.model = load_model_spec("gpt-6.7b");
  options.base.cost_model = "a100-measured";  // tp 1, 2, 4, 8 only
  options.base.memory_limit_gib = 35.16;
  options.gpus = 16;
  options.strategies = {"packing-varlen"};
  const TuneResult r = tune(small_samples(), {}, options);
  EXPECT_EQ(r.layouts.size(), tune_layouts(options.base.model, 16).size() - 1);  // (16, 1, 1)
  for (const TuneLayout& layout : r.layouts) EXPECT_LE(layout.tp, 8);
  EXPECT_EQ(r.best.count("packing-varlen"), 1u);
}

TEST(TuneTest, BadOptionsAreNamed) {
  TuneOptions options = small_options();
  options.strategies = {"dynapipe", "packin"};
  try {
    tune(small_samples(), {}, options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("got \"packin\""));
  }
  options = small_options();
  options.gpus = 0;
  EXPECT_THROW(tune(small_samples(), {}, options), Error);
}

}  // namespace
}  // namespace dynapipe
