// --partition: uniform, balanced and joint layer splits, and the planner and cost model
// following the chosen split.
#include "dynapipe/planner/layer_partition.h"

#include <gtest/gtest.h>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/layer_balance.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/data/samples_cache.h"
#include "dynapipe/planner/plan_options.h"
#include "dynapipe/planner/planner.h"

namespace dynapipe {
namespace {

PlanConfig t5_config(int pp) {
  PlanConfig config;
  config.model = load_model_spec("t5-small");
  config.samples_path = DYNAPIPE_SOURCE_DIR "/assets/flan_like_mix.jsonl.gz";
  config.cost_model = "analytic:a100-40g";
  config.pp = pp;
  config.max_seqlen = 1024;
  config.max_target_len = 128;
  config.global_batch_tokens = 16384;
  config.memory_limit_gib = 40;
  return config;
}

std::vector<GlobalBatch> first_batches(const PlanConfig& config, int count) {
  static const Dataset data = Dataset::load(config.samples_path, truncation_limits(config));
  return form_global_batches(data, config.global_batch_tokens, count);
}

// The summed estimates of `batches` planned on `layers`; fixed_layout false: with
// interleaving, as balanced compares its candidates.
double planned_ms(PlanConfig config, const std::vector<StageLayers>& layers, const std::vector<GlobalBatch>& batches,
                  bool fixed_layout = true) {
  config.stage_layers = layers;
  PlannerOptions options;
  options.fixed_layout = fixed_layout;
  options.verify = false;
  const Planner planner(config, options);
  double total = 0;
  for (const GlobalBatch& batch : batches) total += planner.plan_iteration(batch).est_iteration_ms;
  return total;
}

// The first `count` global batches of `config`'s own truncation (first_batches() keeps the
// first config's).
std::vector<GlobalBatch> own_batches(const PlanConfig& config, int count) {
  const Dataset data = Dataset::load(config.samples_path, truncation_limits(config));
  return form_global_batches(data, config.global_batch_tokens, count);
}

// The balanced split, checked to be the same when its candidates are planned on three
// threads as on one.
std::vector<StageLayers> balanced_on(const PlanConfig& config, const std::vector<GlobalBatch>& batches) {
  LayerPartitionOptions options;
  options.joint_batches = static_cast<int>(batches.size());
  const std::vector<StageLayers> one_thread = choose_stage_layers(config, LayerPartition::Balanced, batches, options);
  options.threads = 3;
  EXPECT_EQ(choose_stage_layers(config, LayerPartition::Balanced, batches, options), one_thread);
  return one_thread;
}

TEST(LayerPartitionTest, NamesRoundTrip) {
  for (const std::string& name : layer_partition_names()) {
    EXPECT_EQ(layer_partition_name(*parse_layer_partition(name)), name);
  }
  EXPECT_FALSE(parse_layer_partition("even").has_value());
}

TEST(LayerPartitionTest, UniformAndSingleStageAreEmpty) {
  EXPECT_TRUE(choose_stage_layers(t5_config(4), LayerPartition::Uniform, {}).empty());
  EXPECT_TRUE(choose_stage_layers(t5_config(1), LayerPartition::Balanced, {}).empty());
  // GPT-6.7B's head costs less than a layer: balanced comes out uniform, written as empty.
  PlanConfig gpt = t5_config(4);
  gpt.model = load_model_spec("gpt-6.7b");
  EXPECT_TRUE(choose_stage_layers(gpt, LayerPartition::Balanced, {}).empty());
}

TEST(LayerPartitionTest, BalancedFollowsTheCostModelAndThePlannerUsesIt) {
  // t5-small: encoder layers at 1024 tokens and decoder layers at 128 cost differently.
  PlanConfig config = t5_config(2);
  const std::vector<StageLayers> layers = choose_stage_layers(config, LayerPartition::Balanced, {});
  ASSERT_EQ(layers.size(), 2u);
  CostModelOptions options;
  const std::vector<double> units = layer_unit_ms(config.cost_model, config.model, options,
                                                  {{.batch = 1, .seqlen = 1024, .dec_seqlen = 128}}, {1.0});
  EXPECT_EQ(layers_per_stage(layers), balance_layer_counts(units, 2));
  EXPECT_NE(layers_per_stage(layers), (std::vector<int>{4, 4}));
  config.stage_layers = layers;
  const Planner planner(config);
  EXPECT_EQ(planner.cost_model().stages(), layers);
  EXPECT_EQ(planner.config().stage_layers, layers);
}

TEST(LayerPartitionTest, InterleavedKeepsEachDevicesLayersOfABalancedSplit) {
  PlanConfig config = t5_config(2);
  const std::vector<StageLayers> layers = choose_stage_layers(config, LayerPartition::Balanced, {});
  const std::vector<int> counts = layers_per_stage(layers);
  ASSERT_NE(counts, (std::vector<int>{4, 4}));
  config.stage_layers = layers;
  config.schedule = ScheduleKind::Interleaved;
  const Planner planner(config);
  EXPECT_EQ(planner.config().chunks, 2);
  const std::vector<StageLayers>& virtual_stages = planner.stage_layers();
  ASSERT_EQ(virtual_stages.size(), 4u);
  EXPECT_EQ(virtual_stages, assign_layers_interleaved(config.model, counts, 2));
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(virtual_stages[d].num_layers() + virtual_stages[d + 2].num_layers(), counts[d]) << d;
  }
  // Plans (verified, memory included) use the virtual stages.
  const IterationPlan plan = planner.plan_iteration(first_batches(config, 1).front());
  EXPECT_EQ(plan.replicas.front().estimates.front().fwd_ms.size(), 4u);
  // A split with a one-layer stage cannot be interleaved: Unsupported, naming the split.
  config.stage_layers = assign_layers(config.model, {1, 7});
  try {
    Planner p(config);
    ADD_FAILURE() << "interleaved accepted a one-layer stage";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("split 1,7"), std::string::npos) << e.what();
  }
}

TEST(LayerPartitionTest, BalancedWithDataRespectsEachStagesMemoryRuleAndBeatsUniform) {
  // T5-11B, 8 stages of 40 GiB, the mix's short targets: encoder layers do several times a
  // decoder layer's work, and the uniform split (6 each) is what fits by weights alone.
  PlanConfig config = t5_config(8);
  config.model = load_model_spec("t5-11b");
  config.max_target_len = 512;
  config.global_batch_tokens = 65536;
  const std::vector<GlobalBatch> batches = own_batches(config, 2);
  const std::vector<StageLayers> layers = balanced_on(config, batches);
  ASSERT_EQ(layers.size(), 8u);
  const std::vector<int> counts = layers_per_stage(layers);
  EXPECT_LT(counts.front(), 6);
  EXPECT_GT(counts.back(), 6);
  // Every stage keeps its weights plus 8 − s rows of --max-seqlen tokens (their stored
  // activations and the output sent on) under the limit, at least under full recompute (the
  // loosest of the rules balanced tries).
  const UnitMemory full = layer_unit_memory(config.cost_model, config.model, {},
                                            {.batch = 1, .seqlen = 1024, .dec_seqlen = 512}, Recompute::Full);
  int begin = 0;
  for (int s = 0; s < 8; ++s) {
    std::int64_t bytes = 0, peak = 0;
    for (int u = begin; u < begin + counts[s]; ++u) {
      bytes += full.static_bytes[u] + (8 - s) * full.stored_bytes[u];
      peak = std::max(peak, full.peak_bytes[u]);
    }
    if (s < 7) bytes += (8 - s) * full.output_bytes[begin + counts[s] - 1];
    EXPECT_LT(bytes + peak, std::int64_t{40} << 30) << "stage " << s;
    begin += counts[s];
  }
  EXPECT_EQ(begin, config.model.total_layers());
  EXPECT_LT(planned_ms(config, layers, batches), planned_ms(config, {}, batches));
}

TEST(LayerPartitionTest, BalancedKeepsUniformWhereItPlansFaster) {
  // GPT-6.7B pp 8 at 2048 tokens: the head makes the last stage the heaviest, and the
  // memory-ruled split of the mix's work moves layers (3,4,4,4,4,4,5,4), but zb1p plans
  // the uniform split faster on these batches, so balanced keeps it.
  PlanConfig config = t5_config(8);
  config.model = load_model_spec("gpt-6.7b");
  config.max_seqlen = 2048;
  config.max_target_len = 2048;
  config.global_batch_tokens = 65536;
  const std::vector<GlobalBatch> batches = own_batches(config, 2);
  EXPECT_TRUE(balanced_on(config, batches).empty());
  // Planned the way balanced compares (interleaving allowed), that split is slower.
  EXPECT_LT(planned_ms(config, {}, batches, /*fixed_layout=*/false),
            planned_ms(config, assign_layers(config.model, {3, 4, 4, 4, 4, 4, 5, 4}), batches, false));
}

// balanced also tries the memory-ruled splits of half the memory limit: at 80 GiB the
// full limit's split fills every stage (T5-11B pp 8 on the measured H100 profile, max
// seqlen 1024, targets 512: 4,4,4,4,4,4,12,12 at ~78 GiB each), half the limit's
// 4,5,4,5,5,8,8,9 plans 8% faster (balanced's four batches, 1056.4 against 1151.0 ms
// over simulate's three). On the first two batches balanced now chooses a split of half
// the limit, which plans them faster than the full limit's.
TEST(LayerPartitionTest, BalancedTriesTheSplitsOfHalfTheMemory) {
  PlanConfig config = t5_config(8);
  config.model = load_model_spec("t5-11b");
  config.strategy = Strategy::PackingVarlen;  // plans fastest of the strategies here
  config.cost_model = "profile:" DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h100.measured.json";
  config.max_target_len = 512;
  config.global_batch_tokens = 65536;
  config.memory_limit_gib = 80;
  const std::vector<GlobalBatch> batches = own_batches(config, 2);
  const std::vector<StageLayers> chosen = balanced_on(config, batches);
  const std::vector<StageLayers> full_limit = assign_layers(config.model, {4, 4, 4, 4, 4, 4, 12, 12});
  EXPECT_NE(chosen, full_limit);
  EXPECT_LT(planned_ms(config, chosen, batches, /*fixed_layout=*/false),
            0.95 * planned_ms(config, full_limit, batches, false));
}

TEST(LayerPartitionTest, ASamplesCacheReadsTheFileOnceForTheSplitAndTheBatches) {
  // `plan` and `simulate` pass one cache to the split and to their batches: one read.
  PlanOptions options;
  options.model = "gpt-6.7b";
  options.samples = DYNAPIPE_SOURCE_DIR "/assets/flan_like_mix.jsonl.gz";
  options.pp = 2;
  SamplesCache cache;
  const PlanConfig config = to_plan_config(options, 1, &cache);
  EXPECT_EQ(cache.reads(), 1u);
  EXPECT_EQ(config.stage_layers, to_plan_config(options).stage_layers);
  const std::vector<GlobalBatch> cached = partition_batches(options, config, &cache);
  const std::vector<GlobalBatch> read = partition_batches(options, config);
  ASSERT_EQ(cached.size(), read.size());
  for (std::size_t b = 0; b < read.size(); ++b) EXPECT_EQ(cached[b].samples.size(), read[b].samples.size());
  EXPECT_EQ(stage_layers_for(options, config, 1, &cache), config.stage_layers);
  EXPECT_EQ(cache.load(config.samples_path, truncation_limits(config))->samples().size(), 20000u);
  EXPECT_EQ(cache.reads(), 1u);
}

TEST(LayerPartitionTest, EachStrategyGetsItsOwnFasterSplit) {
  // T5-11B pp 4 at 80 GiB, max seqlen 1024 (targets 512): dynapipe's split is 8,9,13,18,
  // while packing-varlen plans faster on 9,9,14,16; stage_layers_for() gives each its own,
  // as `simulate` and `plan`'s comparison use them. (Before dynapipe ranked packing-varlen's
  // cuts that need a heavier recompute mode this test paired it with token-based, whose
  // 8,9,13,18 was then not dynapipe's 9,9,14,16.) (At GPT-6.7B pp 8 2048 packing-varlen
  // took its own split while its micro-batches were the most rows that fit; with its size
  // chosen by the objective, one row, it keeps dynapipe's.)
  PlanOptions options;
  options.model = "t5-11b";
  options.samples = DYNAPIPE_SOURCE_DIR "/assets/flan_like_mix.jsonl.gz";
  options.pp = 4;
  options.max_seqlen = 1024;
  options.max_target_len = 512;
  options.memory_limit_gib = 80;
  options.cost_model = "analytic:a100-80g";
  const PlanConfig dynapipe = to_plan_config(options);
  PlanConfig packing_varlen = dynapipe;
  packing_varlen.strategy = Strategy::PackingVarlen;
  packing_varlen.stage_layers = stage_layers_for(options, packing_varlen);
  EXPECT_EQ(layers_per_stage(dynapipe.stage_layers), (std::vector<int>{8, 9, 13, 18}));
  EXPECT_EQ(layers_per_stage(packing_varlen.stage_layers), (std::vector<int>{9, 9, 14, 16}));
  // Each plans faster on its own split, as balanced plans them (the first 4 batches).
  const std::vector<GlobalBatch> batches = own_batches(dynapipe, 4);
  // partition_batches() reads those batches once for every strategy (simulate, plan's
  // comparison): the same splits.
  const std::vector<GlobalBatch> read_once = partition_batches(options, dynapipe);
  ASSERT_EQ(read_once.size(), batches.size());
  auto ids = [](const GlobalBatch& batch) {
    std::vector<SampleId> out;
    for (const Sample& sample : batch.samples) out.push_back(sample.id);
    return out;
  };
  for (std::size_t b = 0; b < batches.size(); ++b) EXPECT_EQ(ids(read_once[b]), ids(batches[b]));
  EXPECT_EQ(stage_layers_for(options, packing_varlen, read_once), packing_varlen.stage_layers);
  EXPECT_EQ(stage_layers_for(options, dynapipe, read_once), dynapipe.stage_layers);
  PlanOptions uniform = options;
  uniform.partition = "uniform";
  EXPECT_TRUE(partition_batches(uniform, dynapipe).empty());
  PlanOptions unknown = options;
  unknown.partition = "magic";
  try {
    partition_batches(unknown, dynapipe);
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_STREQ(e.what(), "--partition must be one of uniform, balanced, joint, got \"magic\"");
  }
  PlannerOptions planner_options;
  planner_options.verify = false;
  auto planned = [&](PlanConfig config, const std::vector<StageLayers>& layers) {
    config.stage_layers = layers;
    const Planner planner(config, planner_options);
    double total = 0;
    for (const GlobalBatch& batch : batches) total += planner.plan_iteration(batch).est_iteration_ms;
    return total;
  };
  EXPECT_LT(planned(packing_varlen, packing_varlen.stage_layers), planned(packing_varlen, dynapipe.stage_layers));
  EXPECT_LT(planned(dynapipe, dynapipe.stage_layers), planned(dynapipe, packing_varlen.stage_layers));
}

TEST(LayerPartitionTest, BalancedKeepsUniformWhenOnlyUniformHoldsTheWeights) {
  // Find a config whose balanced split needs more static memory than the uniform one (which
  // one depends on the cost model's figures), then put the limit between the two.
  auto max_static = [](const PlanConfig& config, const std::vector<StageLayers>& layers) {
    CostModelOptions options;
    options.num_stages = config.pp;
    options.layers = layers;
    const auto cost = make_cost_model(config.cost_model, config.model, options);
    std::int64_t worst = 0;
    for (int s = 0; s < config.pp; ++s) worst = std::max(worst, cost->static_bytes(s));
    return worst;
  };
  bool tested = false;
  for (int pp : {2, 3, 4}) {
    for (std::int64_t target : {128, 1024}) {
      PlanConfig config = t5_config(pp);
      config.max_target_len = target;
      const std::vector<StageLayers> balanced = choose_stage_layers(config, LayerPartition::Balanced, {});
      if (balanced.empty() || tested) continue;
      const std::int64_t uniform_bytes = max_static(config, assign_layers_uniform(config.model, pp));
      const std::int64_t balanced_bytes = max_static(config, balanced);
      if (balanced_bytes <= uniform_bytes) continue;
      config.memory_limit_gib = static_cast<double>(uniform_bytes + balanced_bytes) / 2 / (1 << 30);
      EXPECT_TRUE(choose_stage_layers(config, LayerPartition::Balanced, {}).empty()) << pp << " " << target;
      config.memory_limit_gib = static_cast<double>(balanced_bytes) * 2 / (1 << 30);
      EXPECT_EQ(choose_stage_layers(config, LayerPartition::Balanced, {}), balanced);
      tested = true;
    }
  }
  EXPECT_TRUE(tested) << "no t5-small config whose balanced split holds more weights than the uniform one";
}

// joint scores splits as plan and simulate plan them (interleaving included): no worse
// than uniform or balanced by that measure, and a local optimum of it.
TEST(LayerPartitionTest, JointIsNoWorseThanUniformOrBalancedOnItsBatches) {
  PlanConfig config = t5_config(4);
  const std::vector<GlobalBatch> batches = first_batches(config, 2);
  LayerPartitionOptions options;
  options.joint_batches = 2;
  const std::vector<StageLayers> joint = choose_stage_layers(config, LayerPartition::Joint, batches, options);
  const std::vector<StageLayers> balanced = choose_stage_layers(config, LayerPartition::Balanced, batches, options);
  const double joint_ms = planned_ms(config, joint, batches, /*fixed_layout=*/false);
  EXPECT_LE(joint_ms, planned_ms(config, {}, batches, false));
  EXPECT_LE(joint_ms, planned_ms(config, balanced, batches, false));
  // A local optimum: any stage giving one layer to any other (a boundary move where they
  // are neighbours) plans no faster.
  const std::vector<int> counts = layers_per_stage(joint.empty() ? assign_layers_uniform(config.model, 4) : joint);
  for (int from = 0; from < 4; ++from) {
    for (int to = 0; to < 4; ++to) {
      if (from == to || counts[from] < 2) continue;
      std::vector<int> moved = counts;
      --moved[from];
      ++moved[to];
      EXPECT_GE(planned_ms(config, assign_layers(config.model, moved), batches, false), joint_ms * (1 - 1e-9));
    }
  }
  EXPECT_THROW(choose_stage_layers(config, LayerPartition::Joint, {}), Error);
}

// GPT-6.7B pp 8 at 40 GiB, 8192 (analytic A100): from the uniform split every boundary
// move plans slower, while giving stage 0's layer to stage 3 (three boundary moves at once)
// plans faster; joint stopped at the uniform split until it tried such transfers.
TEST(LayerPartitionTest, JointGivesALayerFurtherAwayWhereNoBoundaryMoveHelps) {
  PlanConfig config = t5_config(8);
  config.model = load_model_spec("gpt-6.7b");
  config.max_seqlen = 8192;
  config.max_target_len = 0;
  config.global_batch_tokens = 65536;
  const std::vector<GlobalBatch> batches = own_batches(config, 2);
  const std::vector<GlobalBatch> first(batches.begin(), batches.begin() + 1);
  LayerPartitionOptions options;
  options.joint_batches = 1;
  options.threads = 2;
  const double uniform_ms = planned_ms(config, {}, first, false);
  const std::vector<int> uniform = layers_per_stage(assign_layers_uniform(config.model, 8));
  for (int b = 0; b + 1 < 8; ++b) {
    for (int d : {-1, 1}) {
      std::vector<int> moved = uniform;
      moved[b] += d;
      moved[b + 1] -= d;
      EXPECT_GE(planned_ms(config, assign_layers(config.model, moved), first, false), uniform_ms);
    }
  }
  const std::vector<StageLayers> joint = choose_stage_layers(config, LayerPartition::Joint, first, options);
  ASSERT_FALSE(joint.empty());
  EXPECT_LT(planned_ms(config, joint, first, false), uniform_ms);
}

// GPT-6.7B pp 8 at 80 GiB, 4096, 131,072 tokens (analytic H100), the fourth global batch:
// from the uniform split a boundary move plans a little faster (4,4,4,4,4,5,3,4), where
// boundary moves tried before transfers stopped, while the last stage giving a layer to the
// second (4,5,4,4,4,4,4,3) plans much faster; joint takes the fastest of every boundary
// move and transfer in each round.
TEST(LayerPartitionTest, JointTakesTheFastestOfEveryMoveAndTransfer) {
  PlanConfig config = t5_config(8);
  config.model = load_model_spec("gpt-6.7b");
  config.cost_model = "analytic:h100-80g";
  config.memory_limit_gib = 80;
  config.max_seqlen = 4096;
  config.max_target_len = 0;
  config.global_batch_tokens = 131072;
  const std::vector<GlobalBatch> fourth = {own_batches(config, 4).at(3)};
  LayerPartitionOptions options;
  options.joint_batches = 1;
  options.threads = 2;
  const std::vector<StageLayers> joint = choose_stage_layers(config, LayerPartition::Joint, fourth, options);
  const std::vector<StageLayers> transfer = assign_layers(config.model, {4, 5, 4, 4, 4, 4, 4, 3});
  EXPECT_LE(planned_ms(config, joint, fourth, false), planned_ms(config, transfer, fourth, false) * (1 + 1e-9));
}

// Scored without interleaving, joint left the uniform split, on which T5-11B pp 4 plans
// interleaved, for 12,11,13,12 (analytic A100 80 GiB, 4096: 10,979.9 against 10,667.3 ms).
TEST(LayerPartitionTest, JointKeepsASplitInterleavingSuits) {
  PlanConfig config = t5_config(4);
  config.model = load_model_spec("t5-11b");
  config.cost_model = "analytic:a100-80g";
  config.memory_limit_gib = 80;
  config.max_seqlen = 4096;
  config.max_target_len = 0;
  config.global_batch_tokens = 65536;
  const std::vector<GlobalBatch> batches = own_batches(config, 2);
  LayerPartitionOptions options;
  options.joint_batches = 2;
  const std::vector<StageLayers> joint = choose_stage_layers(config, LayerPartition::Joint, batches, options);
  const std::vector<StageLayers> balanced = choose_stage_layers(config, LayerPartition::Balanced, batches, options);
  EXPECT_LE(planned_ms(config, joint, batches, false), planned_ms(config, balanced, batches, false));
}

// t5-tiny's four layers over two stages: balanced's time-only candidate is 1,3, which
// --schedule interleaved cannot run (two chunks a device), and joint's moves reach such
// splits too. Both used to throw Unsupported for the whole command, though the uniform 2,2
// runs; the candidates and moves the schedule cannot run are now passed over.
TEST(LayerPartitionTest, SplitsTheScheduleCannotRunArePassedOver) {
  PlanConfig config = t5_config(2);
  config.model = load_model_spec("t5-tiny");
  config.cost_model = "analytic:cpu";
  config.memory_limit_gib = 0;
  config.max_target_len = 0;
  config.global_batch_tokens = 8192;
  config.schedule = ScheduleKind::Interleaved;
  const std::vector<GlobalBatch> batches = own_batches(config, 2);
  LayerPartitionOptions options;
  options.joint_batches = 2;
  for (const LayerPartition partition : {LayerPartition::Balanced, LayerPartition::Joint}) {
    SCOPED_TRACE(std::string(layer_partition_name(partition)));
    std::vector<StageLayers> layers;
    ASSERT_NO_THROW(layers = choose_stage_layers(config, partition, batches, options));
    for (const int count : layers_per_stage(layers.empty() ? assign_layers_uniform(config.model, 2) : layers)) {
      EXPECT_GE(count, 2);
    }
    EXPECT_GT(planned_ms(config, layers, batches), 0);
  }
  // Where no split suits the schedule, the planner says why: four stages of one layer each.
  config.pp = 4;
  EXPECT_TRUE(choose_stage_layers(config, LayerPartition::Balanced, batches, options).empty());
}

}  // namespace
}  // namespace dynapipe
