// --cost-model a100-measured: the artifact's measurements land in the profiled model
// unchanged at table points, interpolate between them, and bad models/degrees fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/artifact_profile.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/profile.h"

namespace dynapipe {
namespace {

constexpr double kMb = 1e6;

// One layer per stage: stage 1 of GPT-6.7B is a bare transformer layer.
std::unique_ptr<CostModel> gpt_per_layer(int tp) {
  const ModelSpec spec = load_model_spec("gpt-6.7b");
  return make_cost_model("a100-measured", spec, {.num_stages = spec.total_layers(), .tp = tp});
}

StageCost layer(const CostModel& m, std::int64_t b, std::int64_t s, Recompute r) {
  return m.stage_cost(1, {.batch = b, .seqlen = s}, {}, r);
}

TEST(A100Measured, GptLayerEqualsTheMeasurementAtTablePoints) {
  const auto m = gpt_per_layer(1);
  // Artifact, tp 1, recompute none, seqlen 2048, mbs 1: fwd 5.78 ms, bwd 9.65 ms,
  // stored 966.55 MB, peak 3344.22 MB (its peak includes the stored activation).
  const StageCost c = layer(*m, 1, 2048, Recompute::None);
  EXPECT_DOUBLE_EQ(c.fwd_ms, 5.78);
  EXPECT_DOUBLE_EQ(c.bwd_ms, 9.65);
  EXPECT_EQ(c.stored_bytes, 966'550'000);
  EXPECT_EQ(c.peak_bytes, 3'344'220'000 - 966'550'000);
  // Full recompute at 2048 x 4: fwd 22.36, bwd 59.74, stored 107.54 MB.
  const StageCost full = layer(*m, 4, 2048, Recompute::Full);
  EXPECT_DOUBLE_EQ(full.fwd_ms, 22.36);
  EXPECT_DOUBLE_EQ(full.bwd_ms, 59.74);
  EXPECT_EQ(full.stored_bytes, 107'540'000);
}

TEST(A100Measured, TensorParallelTablesAreUsed) {
  const auto m = gpt_per_layer(8);
  const StageCost c = layer(*m, 1, 2048, Recompute::None);
  EXPECT_DOUBLE_EQ(c.fwd_ms, 2.14);
  EXPECT_DOUBLE_EQ(c.bwd_ms, 2.29);
  EXPECT_EQ(c.stored_bytes, 199'270'000);
  // Parameters per device: 50.39 MB of fp16 per layer at tp 8 -> 16 bytes per parameter.
  EXPECT_NEAR(static_cast<double>(m->static_bytes(1)), 50.39095744680852 * kMb / 2 * 16, 16);
}

TEST(A100Measured, InterpolatesLinearlyBetweenTablePoints) {
  const auto m = gpt_per_layer(1);
  // Halfway between seqlen 2048 (5.78) and 4096 (15.24) at mbs 1.
  EXPECT_NEAR(layer(*m, 1, 3072, Recompute::None).fwd_ms, (5.78 + 15.24) / 2, 1e-9);
  // Halfway between mbs 2 (11.29) and 4 (22.37) at seqlen 2048.
  EXPECT_NEAR(layer(*m, 3, 2048, Recompute::None).fwd_ms, (11.29 + 22.37) / 2, 1e-9);
  EXPECT_NEAR(static_cast<double>(layer(*m, 3, 2048, Recompute::None).stored_bytes),
              (1932.95 + 3865.77) / 2 * kMb, 1);
}

TEST(A100Measured, ShapesAboveTheLargestMeasuredBatchAreOutOfMemory) {
  const auto m = gpt_per_layer(1);
  // tp 1, none: seqlen 8192 was measured at mbs 1 only.
  EXPECT_EQ(layer(*m, 2, 8192, Recompute::None).stored_bytes, kInfeasibleBytes);
  EXPECT_LT(layer(*m, 1, 8192, Recompute::None).stored_bytes, kInfeasibleBytes);
}

// A varlen row longer than the tables (GPT-6.7B tp 8: 8192 tokens measured) costs as the
// same tokens in rows of 8192, at the same Σ L²: two samples of 8192 in one 16,384-token
// row are two rows of 8192 tokens, each dense. Extrapolating the dense 16,384-token row
// and removing half its attention would cost it more.
TEST(A100Measured, LongVarlenRowsFoldOntoTheLongestMeasuredLength) {
  const auto m = gpt_per_layer(8);
  for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    const StageCost row = m->stage_cost(1, {.batch = 1, .seqlen = 16384}, {.enc = 0.5}, r);
    const StageCost rows = m->stage_cost(1, {.batch = 2, .seqlen = 8192}, {.enc = 1}, r);
    EXPECT_DOUBLE_EQ(row.fwd_ms, rows.fwd_ms);
    EXPECT_DOUBLE_EQ(row.bwd_ms, rows.bwd_ms);
    EXPECT_EQ(row.stored_bytes, rows.stored_bytes);
    EXPECT_EQ(row.peak_bytes, rows.peak_bytes);
    // Four samples of 4096: the same tokens, a quarter of the attention of one dense row.
    const StageCost sparser = m->stage_cost(1, {.batch = 1, .seqlen = 16384}, {.enc = 0.25}, r);
    EXPECT_LT(sparser.fwd_ms, row.fwd_ms);
    EXPECT_EQ(sparser.fwd_ms, m->stage_cost(1, {.batch = 2, .seqlen = 8192}, {.enc = 0.5}, r).fwd_ms);
  }
  // A dense row that long cannot fold: it is extrapolated as before.
  const StageCost dense = m->stage_cost(1, {.batch = 1, .seqlen = 16384}, {}, Recompute::None);
  EXPECT_GT(dense.fwd_ms, m->stage_cost(1, {.batch = 2, .seqlen = 8192}, {}, Recompute::None).fwd_ms);
}

TEST(A100Measured, T5KeepsTheMedianOfRepeatedMeasurements) {
  const ModelSpec spec = load_model_spec("t5-11b");
  const auto m = make_cost_model("a100-measured", spec, {.num_stages = spec.total_layers()});
  // Stage 1 is encoder layer 1. The artifact measured encoder 512 x 4 (tp 1, none) eight
  // times: 7.67 7.69 7.72 7.73 7.74 7.75 7.75 7.94 ms -> median 7.735.
  EXPECT_NEAR(m->stage_cost(1, {.batch = 4, .seqlen = 512, .dec_seqlen = 128}, {}, Recompute::None).fwd_ms,
              7.735, 1e-9);
  // Stage 30 is a decoder layer: (512, 128) x 2 forward 2.4 ms.
  EXPECT_NEAR(m->stage_cost(30, {.batch = 2, .seqlen = 512, .dec_seqlen = 128}, {}, Recompute::None).fwd_ms,
              2.4, 1e-9);
  // (4096, 4096) was never measured: out of memory.
  EXPECT_EQ(m->stage_cost(30, {.batch = 1, .seqlen = 4096, .dec_seqlen = 4096}, {}, Recompute::None).stored_bytes,
            kInfeasibleBytes);
}

TEST(A100Measured, RejectsOtherModelsAndDegrees) {
  const ModelSpec tiny = load_model_spec("gpt-tiny");
  try {
    make_cost_model("a100-measured", tiny, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("gpt-6.7b and t5-11b only"), std::string::npos) << e.what();
  }
  const ModelSpec gpt = load_model_spec("gpt-6.7b");
  EXPECT_THROW(make_cost_model("a100-measured", gpt, {.tp = 3}), Error);  // 32 heads
  try {
    make_cost_model("a100-measured", gpt, {.tp = 16});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one of 1, 2, 4, 8"), std::string::npos) << e.what();
  }
}

TEST(A100Measured, ImportedProfileRoundTripsThroughTheFormat) {
  const std::string path = a100_measured_dir() + "/gpt-6.7b.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  const Profile p = import_artifact_profile(text.str(), path, load_model_spec("gpt-6.7b"), 2);
  EXPECT_EQ(parse_profile(profile_to_json(p), "rt"), p);
  EXPECT_EQ(p.tensor_parallel, 2);
}

}  // namespace
}  // namespace dynapipe

namespace dynapipe {
namespace {

// The analytic a100-40g preset against the measured GPT-6.7B layer at tp 1 over the whole
// measured grid (every seqlen x mbs that fit, three recompute modes): median |error| of
// forward + backward time <= 10% and of stored activation <= 15% (docs/cost-model.md).
TEST(A100Measured, AnalyticPresetMatchesTheMeasuredGrid) {
  const ModelSpec spec = load_model_spec("gpt-6.7b");
  const auto measured = make_cost_model("a100-measured", spec, {.num_stages = 32});
  const auto analytic = make_cost_model("analytic:a100-40g", spec, {.num_stages = 32});
  std::vector<double> time_errors, memory_errors;
  for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    for (std::int64_t s : {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192}) {
      for (std::int64_t b = 1; b <= 2048; b *= 2) {
        const StageCost m = measured->stage_cost(1, {.batch = b, .seqlen = s}, {}, mode);
        if (m.stored_bytes >= kInfeasibleBytes) break;
        const StageCost a = analytic->stage_cost(1, {.batch = b, .seqlen = s}, {}, mode);
        time_errors.push_back(std::abs((a.fwd_ms + a.bwd_ms) / (m.fwd_ms + m.bwd_ms) - 1));
        memory_errors.push_back(
            std::abs(static_cast<double>(a.stored_bytes) / static_cast<double>(m.stored_bytes) - 1));
      }
    }
  }
  ASSERT_EQ(time_errors.size(), 218u);  // 72 shapes without recompute, 73 with selective and full
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  EXPECT_LE(median(time_errors), 0.10);
  EXPECT_LE(median(memory_errors), 0.15);
}

}  // namespace
}  // namespace dynapipe
