// Balanced layer splits: hand-checked min-max splits, brute force, the unit costs of the
// analytic model, and explicit splits flowing into the cost model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <functional>
#include <numeric>
#include <random>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/layer_balance.h"
#include "dynapipe/cost/model_spec.h"

namespace dynapipe {
namespace {

double max_stage(const std::vector<double>& units, const std::vector<int>& counts) {
  double worst = 0;
  int begin = 0;
  for (int c : counts) {
    worst = std::max(worst, std::accumulate(units.begin() + begin, units.begin() + begin + c, 0.0));
    begin += c;
  }
  return worst;
}

// Calls visit(counts) for every split of n layers into `stages` non-empty contiguous stages.
void for_each_split(int n, int stages, const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> counts;
  std::function<void(int)> search = [&](int left) {
    if (static_cast<int>(counts.size()) == stages) {
      if (left == 0) visit(counts);
      return;
    }
    for (int c = 1; c <= left; ++c) {
      counts.push_back(c);
      search(left - c);
      counts.pop_back();
    }
  };
  search(n);
}

// A random case of trial `trial`: 1..9 unit costs and a stage count that fits them.
struct RandomCase {
  int stages = 0;
  std::vector<double> units;
};
RandomCase random_case(std::mt19937& rng, int trial) {
  std::uniform_real_distribution<double> cost(0.1, 10.0);
  const int n = 1 + trial % 9;
  RandomCase c{.stages = 1 + static_cast<int>(rng() % n), .units = std::vector<double>(n)};
  for (double& u : c.units) u = cost(rng);
  return c;
}

TEST(LayerBalance, HeavyEndsGetFewerLayers) {
  EXPECT_EQ(balance_layer_counts({5, 1, 1, 1, 1, 5}, 3), (std::vector<int>{1, 4, 1}));
  EXPECT_EQ(balance_layer_counts({1, 1, 1, 1, 1, 1, 4}, 2), (std::vector<int>{5, 2}));
  EXPECT_EQ(balance_layer_counts({3, 3, 3}, 1), (std::vector<int>{3}));
  EXPECT_EQ(balance_layer_counts({3, 1, 2}, 3), (std::vector<int>{1, 1, 1}));
  EXPECT_THROW(balance_layer_counts({1, 1}, 3), Error);
  EXPECT_THROW(balance_layer_counts({1, 1}, 0), Error);
}

TEST(LayerBalance, EqualsBruteForceBottleneck) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const RandomCase c = random_case(rng, trial);
    const std::vector<double>& units = c.units;
    const int stages = c.stages, n = static_cast<int>(units.size());
    double best = 1e300;
    for_each_split(n, stages, [&](const std::vector<int>& counts) {
      best = std::min(best, max_stage(units, counts));
    });
    const std::vector<int> got = balance_layer_counts(units, stages);
    ASSERT_EQ(static_cast<int>(got.size()), stages);
    EXPECT_EQ(std::accumulate(got.begin(), got.end(), 0), n);
    EXPECT_NEAR(max_stage(units, got), best, best * 1e-9);
  }
}

// Bytes of stage `stage` over units [begin, end) under `rule` (sums, largest peak, and the
// output of its last unit held per micro-batch in flight unless it is the last stage).
std::int64_t stage_bytes(const StageMemoryRule& rule, int stage, int begin, int end) {
  std::int64_t bytes = 0, peak = 0;
  for (int u = begin; u < end; ++u) {
    bytes += rule.units.static_bytes[u] + rule.in_flight[stage] * rule.units.stored_bytes[u];
    peak = std::max(peak, rule.units.peak_bytes[u]);
  }
  const bool last_stage = stage + 1 == static_cast<int>(rule.in_flight.size());
  if (!last_stage && !rule.units.output_bytes.empty()) {
    bytes += rule.in_flight[stage] * rule.units.output_bytes[end - 1];
  }
  return bytes + peak;
}

// Six units storing 1 byte each (nothing static, no peak, nothing sent), two stages keeping
// 2 and 1 micro-batches in flight, under `limit_bytes`.
StageMemoryRule six_units_two_stages(std::int64_t limit_bytes) {
  StageMemoryRule rule;
  rule.units = {.static_bytes = std::vector<std::int64_t>(6, 0),
                .stored_bytes = std::vector<std::int64_t>(6, 1),
                .peak_bytes = std::vector<std::int64_t>(6, 0),
                .output_bytes = {}};
  rule.in_flight = {2, 1};
  rule.limit_bytes = limit_bytes;
  return rule;
}

TEST(LayerBalance, MemoryRuleMovesLayersToStagesWithFewerInFlight) {
  // Six equal units, each storing 1 byte per micro-batch; stage 0 keeps 2 in flight, stage 1
  // one. Under 5 bytes stage 0 holds at most 2 units (2·3 = 6 does not fit), stage 1 at most 4.
  StageMemoryRule rule = six_units_two_stages(5);
  const std::vector<double> units(6, 1.0);
  EXPECT_EQ(balance_layer_counts(units, 2), (std::vector<int>{3, 3}));
  EXPECT_EQ(balance_layer_counts(units, 2, rule), (std::vector<int>{2, 4}));
  // Static bytes and the largest peak count too: a 1-byte peak on unit 5 leaves stage 1
  // room for 3 units only (3 + 1 < 5), so nothing fits 6 units.
  rule.units.peak_bytes[5] = 1;
  EXPECT_EQ(balance_layer_counts(units, 2, rule), std::nullopt);
  rule.units.peak_bytes[5] = 0;
  rule.units.static_bytes[0] = 1;  // stage 0 now holds 1 unit (1 + 2·2 = 5 does not fit)
  EXPECT_EQ(balance_layer_counts(units, 2, rule), std::nullopt);
  rule.limit_bytes = 6;            // 1 + 2·2 = 5 fits; stage 1: 4 < 6
  EXPECT_EQ(balance_layer_counts(units, 2, rule), (std::vector<int>{2, 4}));
  rule.in_flight = {2};
  EXPECT_THROW(balance_layer_counts(units, 2, rule), Error);
}

TEST(LayerBalance, MemoryRuleHoldsTheSentOutputs) {
  // Six equal units storing 1 byte each, stage 0 with 2 in flight, stage 1 with 1, under 7
  // bytes: stage 0 fits 3 units (2·3 = 6), so the split is even. When unit 2 sends 1 byte
  // on, stage 0 over units 0–2 holds 2·(3 + 1) = 8: it takes 2 units (2·(2 + 1) = 6) and
  // stage 1 the other 4 (its own output is never sent: 4 < 7).
  StageMemoryRule rule = six_units_two_stages(7);
  const std::vector<double> units(6, 1.0);
  EXPECT_EQ(balance_layer_counts(units, 2, rule), (std::vector<int>{3, 3}));
  rule.units.output_bytes = {1, 1, 1, 1, 1, 1};
  EXPECT_EQ(balance_layer_counts(units, 2, rule), (std::vector<int>{2, 4}));
  rule.units.output_bytes = {1, 1};
  EXPECT_THROW(balance_layer_counts(units, 2, rule), Error);
}

TEST(LayerBalance, MemoryRuledSplitEqualsBruteForce) {
  // Every layer in exactly one stage, every stage within its rule, the slowest stage the
  // smallest among the splits that fit (nullopt exactly when none fits).
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const RandomCase c = random_case(rng, trial);
    const std::vector<double>& units = c.units;
    const int stages = c.stages, n = static_cast<int>(units.size());
    StageMemoryRule rule;
    for (int u = 0; u < n; ++u) {
      rule.units.static_bytes.push_back(static_cast<std::int64_t>(rng() % 20));
      rule.units.stored_bytes.push_back(static_cast<std::int64_t>(rng() % 10));
      rule.units.peak_bytes.push_back(static_cast<std::int64_t>(rng() % 10));
      rule.units.output_bytes.push_back(static_cast<std::int64_t>(rng() % 4));
    }
    for (int s = 0; s < stages; ++s) rule.in_flight.push_back(stages - s);
    rule.limit_bytes = 20 + static_cast<std::int64_t>(rng() % 60);
    auto fits = [&](const std::vector<int>& counts) {
      int begin = 0;
      for (int s = 0; s < static_cast<int>(counts.size()); ++s) {
        if (stage_bytes(rule, s, begin, begin + counts[s]) >= rule.limit_bytes) return false;
        begin += counts[s];
      }
      return true;
    };
    double best = std::numeric_limits<double>::infinity();
    for_each_split(n, stages, [&](const std::vector<int>& counts) {
      if (fits(counts)) best = std::min(best, max_stage(units, counts));
    });
    const std::optional<std::vector<int>> got = balance_layer_counts(units, stages, rule);
    ASSERT_EQ(got.has_value(), std::isfinite(best)) << trial;
    if (!got) continue;
    ASSERT_EQ(static_cast<int>(got->size()), stages);
    EXPECT_EQ(std::accumulate(got->begin(), got->end(), 0), n);
    for (int c : *got) EXPECT_GE(c, 1);
    EXPECT_TRUE(fits(*got)) << trial;
    EXPECT_NEAR(max_stage(units, *got), best, best * 1e-9) << trial;
  }
}

TEST(LayerBalance, UnitMemoryFollowsTheRecomputeMode) {
  const ModelSpec spec = load_model_spec("gpt-6.7b");
  const MicroBatchShape row{.batch = 1, .seqlen = 2048, .dec_seqlen = 0};
  const UnitMemory none = layer_unit_memory("analytic:a100-40g", spec, {}, row, Recompute::None);
  const UnitMemory full = layer_unit_memory("analytic:a100-40g", spec, {}, row, Recompute::Full);
  ASSERT_EQ(static_cast<int>(none.stored_bytes.size()), spec.total_layers());
  EXPECT_EQ(none.static_bytes, full.static_bytes);
  EXPECT_GT(none.static_bytes.front(), none.static_bytes[1]);  // the embedding rides on unit 0
  EXPECT_LT(full.stored_bytes[1], none.stored_bytes[1]);
  // Each layer sends its hidden states on (2,048 × 4,096 half-precision values); the head,
  // last, sends nothing.
  EXPECT_EQ(none.output_bytes[1], std::int64_t{2048} * 4096 * 2);
  EXPECT_EQ(none.output_bytes, full.output_bytes);
  EXPECT_EQ(none.output_bytes.back(), 0);
}

TEST(LayerBalance, UnitCostsCarryEmbeddingAndHead) {
  const ModelSpec spec = load_model_spec("gpt-6.7b");
  const std::vector<double> units =
      layer_unit_ms("analytic:a100-40g", spec, {}, {{.batch = 1, .seqlen = 2048, .dec_seqlen = 0}}, {1.0});
  ASSERT_EQ(static_cast<int>(units.size()), spec.total_layers());
  EXPECT_GT(units.front(), units[1]);
  EXPECT_GT(units.back(), units[1]);
  for (std::size_t l = 2; l + 1 < units.size(); ++l) EXPECT_DOUBLE_EQ(units[l], units[1]);
  // A GPT-6.7B head costs less than a layer: 8 layers per stage stays the best split.
  EXPECT_EQ(balance_layer_counts(units, 4), (std::vector<int>{8, 8, 8, 8}));
}

TEST(LayerBalance, T5WithShortTargetsMovesLayersToTheDecoderSide) {
  // Encoder layers at 1024 tokens cost more than decoder layers at 256: a uniform split's
  // all-encoder stages are the bottleneck; the balanced split gives them fewer layers.
  const ModelSpec spec = load_model_spec("t5-11b");
  const std::vector<double> units =
      layer_unit_ms("analytic:a100-40g", spec, {}, {{.batch = 1, .seqlen = 1024, .dec_seqlen = 256}}, {1.0});
  const std::vector<int> uniform = layers_per_stage(assign_layers_uniform(spec, 4));
  const std::vector<int> balanced = balance_layer_counts(units, 4);
  EXPECT_EQ(uniform, (std::vector<int>{12, 12, 12, 12}));
  EXPECT_LT(balanced.front(), 12);
  EXPECT_LT(max_stage(units, balanced), 0.9 * max_stage(units, uniform));
}

TEST(LayerBalance, ExplicitSplitReachesTheCostModel) {
  const ModelSpec spec = load_model_spec("t5-small");
  const std::vector<StageLayers> layers = assign_layers(spec, {spec.total_layers() - 3, 2, 1});
  EXPECT_TRUE(layers[0].has_embedding);
  EXPECT_TRUE(layers[2].has_head);
  EXPECT_EQ(layers_per_stage(layers), (std::vector<int>{spec.total_layers() - 3, 2, 1}));
  CostModelOptions options;
  options.num_stages = 3;
  options.layers = layers;
  const auto model = make_cost_model("analytic:a100-40g", spec, options);
  EXPECT_EQ(model->stages(), layers);
  EXPECT_GT(model->static_bytes(0), model->static_bytes(1));
  options.layers.pop_back();
  EXPECT_THROW(make_cost_model("analytic:a100-40g", spec, options), Error);
  options.layers = layers;
  std::swap(options.layers[0], options.layers[2]);
  EXPECT_THROW(make_cost_model("analytic:a100-40g", spec, options), Error);
  EXPECT_THROW(assign_layers(spec, {spec.total_layers(), 0}), Error);
  EXPECT_THROW(assign_layers(spec, {1, 1}), Error);
}

}  // namespace
}  // namespace dynapipe
