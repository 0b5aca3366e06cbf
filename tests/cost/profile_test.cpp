#include "dynapipe/cost/profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "dynapipe/core/error.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr Recompute kModes[] = {Recompute::None, Recompute::Selective, Recompute::Full};

std::string asset(const std::string& name) { return std::string(DYNAPIPE_SOURCE_DIR) + "/assets/profiles/" + name; }

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("dynapipe_profile_test_" + name);
  std::ofstream(path) << text;
  return path.string();
}

template <typename Body>
void expect_error(Body body, ErrorKind kind, std::initializer_list<std::string> fragments) {
  try {
    body();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& f : fragments) EXPECT_THAT(e.what(), HasSubstr(f));
  }
}

// An analytic model with one layer per stage, sampled on `grid`.
Profile analytic_profile(const std::string& model, const ProfileGrid& grid, const std::string& device = "cpu") {
  const ModelSpec spec = load_model_spec(model);
  auto per_layer = make_cost_model("analytic:" + device, spec, {.num_stages = spec.total_layers()});
  return build_profile(*per_layer, grid);
}

const ProfileGrid kGrid{.batches = {1, 2, 4, 8}, .seqlens = {64, 128, 256, 512, 1024}, .dec_seqlens = {32, 64, 128}};

// A GPT profile whose layer table has only the given points (each in all three modes);
// embedding and head cost nothing. Values are fwd_ms; stored = 1000 x fwd.
Profile hand_profile(const std::vector<std::tuple<std::int64_t, std::int64_t, double>>& layer_points) {
  Profile p;
  p.model = load_model_spec("gpt-tiny");
  p.device.name = "hand";
  p.device.bytes_per_element = 2;
  auto zero = [](std::int64_t b, std::int64_t s) {
    return ProfilePoint{.batch = b, .seqlen = s, .fwd_ms = 0, .bwd_ms = 0, .bwd_input_ms = {}, .bwd_weight_ms = {}, .stored_bytes = 0, .peak_bytes = 0};
  };
  ProfileLayer embedding{.kind = ProfileLayerKind::Embedding, .parameter_bytes = 0, .points = {}};
  ProfileLayer head{.kind = ProfileLayerKind::Head, .parameter_bytes = 0, .points = {}};
  for (std::int64_t b : {1, 1000}) {
    for (std::int64_t s : {1, 100000}) {
      embedding.points[0].push_back(zero(b, s));
      head.points[0].push_back(zero(b, s));
    }
  }
  ProfileLayer layer{.kind = ProfileLayerKind::Layer, .parameter_bytes = 100, .points = {}};
  for (const auto& [b, s, fwd] : layer_points) {
    for (auto& list : layer.points) {
      list.push_back(ProfilePoint{.batch = b, .seqlen = s, .fwd_ms = fwd, .bwd_ms = 2 * fwd, .bwd_input_ms = {}, .bwd_weight_ms = {},
                                  .stored_bytes = static_cast<std::int64_t>(1000 * fwd), .peak_bytes = 7});
    }
  }
  p.layers = {embedding, layer, head};
  return p;
}

// The reference's bilinear example (GPT-6.7B, A100, one layer forward).
const std::vector<std::tuple<std::int64_t, std::int64_t, double>> kReferenceCell = {
    {2, 1024, 5.04}, {4, 1024, 9.78}, {2, 2048, 11.29}, {4, 2048, 22.37}};

// gpt-tiny has 4 layers: at pp 4, stage 1 is one pure layer.
double layer_fwd(const CostModel& m, std::int64_t b, std::int64_t s) {
  return m.stage_cost(1, {.batch = b, .seqlen = s}, {}, Recompute::None).fwd_ms;
}

TEST(ProfileTest, JsonRoundTripIsExact) {
  for (const char* model : {"gpt-tiny", "t5-tiny"}) {
    const Profile p = analytic_profile(model, kGrid);
    const std::string json = profile_to_json(p);
    EXPECT_EQ(parse_profile(json, "round trip"), p) << model;
    EXPECT_EQ(profile_to_json(parse_profile(json, "round trip")), json);
  }
  // A point without the split backward stays without it.
  Profile hand = hand_profile(kReferenceCell);
  EXPECT_FALSE(hand.layers[1].points[0][0].bwd_input_ms.has_value());
  EXPECT_EQ(parse_profile(profile_to_json(hand), "hand"), hand);
}

TEST(ProfileTest, BundledExamplesParseAndMatchTheirModels) {
  for (const char* model : {"gpt-tiny", "t5-tiny"}) {
    const std::string path = asset(std::string(model) + ".cpu.json");
    const Profile p = load_profile(path);
    EXPECT_EQ(p.model, load_model_spec(model));
    EXPECT_EQ(p.device.bytes_per_element, 4);
    auto m = make_cost_model(path, load_model_spec(model), {.num_stages = 2});
    EXPECT_EQ(m->describe(), "profile:" + path);
    EXPECT_EQ(m->device().name, "cpu");
    const StageCost c = m->stage_cost(1, {.batch = 3, .seqlen = 300, .dec_seqlen = 50}, {}, Recompute::None);
    EXPECT_GT(c.fwd_ms, 0);
    EXPECT_GT(c.stored_bytes, 0);
    // "profile:<path>" is accepted too.
    EXPECT_NO_THROW(make_cost_model("profile:" + path, load_model_spec(model), {.num_stages = 2}));
  }
}

// Built from the analytic model, the profiled model reproduces it at grid points for
// every stage layout, and stays close between them.
TEST(ProfileTest, ProfiledAgreesWithItsAnalyticSourceAtGridPoints) {
  for (const char* model : {"gpt-tiny", "t5-tiny"}) {
    const ModelSpec spec = load_model_spec(model);
    const Profile profile = analytic_profile(model, kGrid);
    for (int pp = 1; pp <= spec.total_layers(); ++pp) {
      auto analytic = make_cost_model("analytic:cpu", spec, {.num_stages = pp, .zero_shards = 2});
      auto profiled = make_profiled_cost_model(profile, {.num_stages = pp, .zero_shards = 2});
      for (int stage = 0; stage < pp; ++stage) {
        EXPECT_EQ(profiled->static_bytes(stage), analytic->static_bytes(stage));
        EXPECT_EQ(profiled->weight_bytes(stage), analytic->weight_bytes(stage));
        for (Recompute mode : kModes) {
          for (std::int64_t b : kGrid.batches) {
            for (std::int64_t s : kGrid.seqlens) {
              for (std::int64_t d : {32, 128}) {
                SCOPED_TRACE(testing::Message() << model << " pp " << pp << " stage " << stage << " "
                                                << recompute_name(mode) << " b " << b << " s " << s << " d " << d);
                const MicroBatchShape shape{.batch = b, .seqlen = s, .dec_seqlen = d};
                const StageCost a = analytic->stage_cost(stage, shape, {}, mode);
                const StageCost p = profiled->stage_cost(stage, shape, {}, mode);
                EXPECT_NEAR(p.fwd_ms, a.fwd_ms, 1e-9 * a.fwd_ms);
                EXPECT_NEAR(p.bwd_ms, a.bwd_ms, 1e-9 * a.bwd_ms);
                EXPECT_NEAR(p.bwd_input_ms, a.bwd_input_ms, 1e-9 * a.bwd_ms);
                EXPECT_NEAR(p.bwd_weight_ms, a.bwd_weight_ms, 1e-9 * a.bwd_ms);
                EXPECT_NEAR(p.stored_bytes, a.stored_bytes, 8);  // per-part rounding to bytes
                EXPECT_EQ(p.peak_bytes, a.peak_bytes);
                EXPECT_EQ(p.output_bytes, a.output_bytes);
              }
            }
          }
        }
      }
    }
  }
}

TEST(ProfileTest, ProfiledIsCloseToItsAnalyticSourceBetweenGridPoints) {
  for (const char* model : {"gpt-tiny", "t5-tiny"}) {
    const ModelSpec spec = load_model_spec(model);
    auto analytic = make_cost_model("analytic:cpu", spec, {.num_stages = 2});
    auto profiled = make_profiled_cost_model(analytic_profile(model, kGrid), {.num_stages = 2});
    for (int stage = 0; stage < 2; ++stage) {
      for (const MicroBatchShape& shape : {MicroBatchShape{3, 96, 48}, MicroBatchShape{6, 384, 96},
                                           MicroBatchShape{5, 768, 40}, MicroBatchShape{1, 200, 100}}) {
        SCOPED_TRACE(testing::Message() << model << " stage " << stage << " b " << shape.batch << " s "
                                        << shape.seqlen << " d " << shape.dec_seqlen);
        const StageCost a = analytic->stage_cost(stage, shape, {}, Recompute::None);
        const StageCost p = profiled->stage_cost(stage, shape, {}, Recompute::None);
        // Interpolating a function with an s^2 term linearly over-estimates it, by at
        // most the quadratic part's chord gap.
        EXPECT_NEAR(p.fwd_ms, a.fwd_ms, 0.1 * a.fwd_ms);
        EXPECT_NEAR(p.bwd_ms, a.bwd_ms, 0.1 * a.bwd_ms);
        EXPECT_NEAR(static_cast<double>(p.stored_bytes), static_cast<double>(a.stored_bytes), 0.1 * a.stored_bytes);
        EXPECT_GE(p.fwd_ms, a.fwd_ms * 0.999);
      }
    }
  }
}

// device.runtime_bytes (optional) is per rank: every stage's static bytes grow by it, and
// it survives the JSON round trip; without it the file is as before.
TEST(ProfileTest, RuntimeBytesAddToEveryStagesStaticBytes) {
  Profile profile = analytic_profile("gpt-tiny", kGrid);
  EXPECT_EQ(profile_to_json(profile).find("runtime_bytes"), std::string::npos);
  auto without = make_profiled_cost_model(profile, {.num_stages = 2});
  profile.runtime_bytes = 40 << 20;
  const Profile again = parse_profile(profile_to_json(profile), "p.json");
  EXPECT_EQ(again.runtime_bytes, 40 << 20);
  auto with = make_profiled_cost_model(again, {.num_stages = 2});
  for (int stage = 0; stage < 2; ++stage) {
    EXPECT_EQ(with->static_bytes(stage) - without->static_bytes(stage), 40 << 20);
    EXPECT_EQ(with->weight_bytes(stage), without->weight_bytes(stage));  // not the weights
  }
}

TEST(ProfileTest, InterpolationIsBilinearInsideTheGrid) {
  auto m = make_profiled_cost_model(hand_profile(kReferenceCell), {.num_stages = 4, .seqlen_multiple = 1});
  EXPECT_NEAR(layer_fwd(*m, 2, 1024), 5.04, 1e-12);  // grid points are exact
  EXPECT_NEAR(layer_fwd(*m, 4, 2048), 22.37, 1e-12);
  EXPECT_NEAR(layer_fwd(*m, 3, 1536), (7.41 + 16.83) / 2, 1e-12);  // 12.12, as in the reference
  EXPECT_NEAR(layer_fwd(*m, 3, 1024), (5.04 + 9.78) / 2, 1e-12);  // linear along an edge
  EXPECT_NEAR(layer_fwd(*m, 2, 1280), 5.04 + 0.25 * (11.29 - 5.04), 1e-12);
  const StageCost c = m->stage_cost(1, {.batch = 3, .seqlen = 1536}, {}, Recompute::Selective);
  EXPECT_NEAR(c.bwd_ms, 2 * 12.12, 1e-9);
  EXPECT_EQ(c.stored_bytes, 12120);
  EXPECT_EQ(c.peak_bytes, 7);
  // Without bwd_input/bwd_weight in the profile, a third of the backward is the weight part.
  EXPECT_NEAR(c.bwd_weight_ms, 2 * 12.12 / 3, 1e-9);
  EXPECT_NEAR(c.bwd_input_ms + c.bwd_weight_ms, c.bwd_ms, 1e-9);
  // Every layer on a stage counts; the peak is the largest single one.
  auto two = make_profiled_cost_model(hand_profile(kReferenceCell), {.num_stages = 2, .seqlen_multiple = 1});
  const StageCost s = two->stage_cost(0, {.batch = 3, .seqlen = 1536}, {}, Recompute::None);
  EXPECT_NEAR(s.fwd_ms, 2 * 12.12, 1e-9);
  EXPECT_EQ(s.stored_bytes, 2 * 12120);
  EXPECT_EQ(s.peak_bytes, 7);
}

TEST(ProfileTest, ExtrapolatesLinearlyBeyondTheGrid) {
  auto m = make_profiled_cost_model(hand_profile(kReferenceCell), {.num_stages = 4, .seqlen_multiple = 1});
  EXPECT_NEAR(layer_fwd(*m, 8, 2048), 22.37 + 2 * (22.37 - 11.29), 1e-9);
  EXPECT_NEAR(layer_fwd(*m, 1, 1024), 5.04 - (9.78 - 5.04) / 2, 1e-9);
  EXPECT_NEAR(layer_fwd(*m, 2, 4096), 11.29 + 2 * (11.29 - 5.04), 1e-9);
  // Never below zero.
  EXPECT_EQ(layer_fwd(*m, 1, 16), 0);
}

TEST(ProfileTest, WarnsWhenTheLengthsInUseArePastTheMeasuredGrid) {
  // The stack table measured seqlens up to 2048 (the embedding and head tables up to
  // 100000 do not count: the layers are what grows quadratically).
  auto m = make_profiled_cost_model(hand_profile(kReferenceCell), {.num_stages = 4}, "p.json");
  EXPECT_EQ(m->extrapolation_warning(2048, 0), "");
  EXPECT_EQ(m->extrapolation_warning(1000, 0), "");
  EXPECT_EQ(m->extrapolation_warning(2049, 0),
            "warning: profile:p.json measured lengths up to 2048, --max-seqlen is 2049: longer micro-batches are "
            "extrapolated linearly (attention grows quadratically, so they are underestimated); measure up to them "
            "with dynapipe profile --max-seqlen 2049");
  // T5: encoder and decoder lengths separately (kGrid: encoder 1024, decoder 128).
  auto t5 = make_profiled_cost_model(analytic_profile("t5-tiny", kGrid), {.num_stages = 2}, "t5.json");
  EXPECT_EQ(t5->extrapolation_warning(1024, 128), "");
  const std::string decoder = t5->extrapolation_warning(1024, 256);
  EXPECT_THAT(decoder, HasSubstr("measured decoder lengths up to 128, --max-target-len is 256:"));
  EXPECT_THAT(decoder, ::testing::Not(HasSubstr("encoder")));
  EXPECT_THAT(t5->extrapolation_warning(2048, 256),
              HasSubstr("measured encoder lengths up to 1024, --max-seqlen is 2048; decoder lengths up to 128, "
                        "--max-target-len is 256:"));
  EXPECT_THAT(decoder, ::testing::EndsWith("dynapipe profile --max-seqlen 1024 --max-target-len 256"));
  // The analytic model has no grid.
  auto analytic = make_cost_model("analytic:cpu", load_model_spec("gpt-tiny"), {.num_stages = 2});
  EXPECT_EQ(analytic->extrapolation_warning(1 << 20, 0), "");
}

TEST(ProfileTest, DoublingLengthsEndAtTheLengthInUse) {
  EXPECT_EQ(doubling_lengths(64, 2048), (std::vector<std::int64_t>{64, 128, 256, 512, 1024, 2048}));
  EXPECT_EQ(doubling_lengths(64, 1000), (std::vector<std::int64_t>{64, 128, 256, 512, 1000}));
  EXPECT_EQ(doubling_lengths(32, 32), (std::vector<std::int64_t>{32}));
  EXPECT_THROW(doubling_lengths(64, 63), Error);
  EXPECT_THROW(doubling_lengths(0, 8), Error);
}

TEST(ProfileTest, MissingPointsAboveTheLargestBatchAreOutOfMemory) {
  // (4, 128) did not fit when profiled; (1, 64) was not run.
  auto m = make_profiled_cost_model(
      hand_profile({{2, 64, 2.0}, {4, 64, 4.0}, {1, 128, 1.5}, {2, 128, 3.0}}), {.num_stages = 4, .seqlen_multiple = 1});
  auto at = [&](std::int64_t b, std::int64_t s) {
    return m->stage_cost(1, {.batch = b, .seqlen = s}, {}, Recompute::None);
  };
  EXPECT_EQ(at(2, 128).stored_bytes, 3000);          // measured
  EXPECT_EQ(at(4, 128).stored_bytes, kInfeasibleBytes);
  EXPECT_EQ(at(4, 128).peak_bytes, kInfeasibleBytes);
  EXPECT_EQ(at(3, 128).stored_bytes, kInfeasibleBytes);  // its cell touches the OOM point
  EXPECT_EQ(at(3, 96).stored_bytes, kInfeasibleBytes);
  EXPECT_NEAR(at(4, 128).fwd_ms, 6.0, 1e-9);         // time extrapolated along the batch axis
  EXPECT_EQ(at(4, 64).stored_bytes, 4000);           // other rows are unaffected
  EXPECT_EQ(at(3, 64).stored_bytes, 3000);
  // The unmeasured (1, 64) is extrapolated from (2, 64) and (4, 64), not out of memory.
  EXPECT_NEAR(at(1, 64).fwd_ms, 1.0, 1e-9);
  EXPECT_EQ(at(1, 64).stored_bytes, 1000);
  EXPECT_EQ(at(1, 96).stored_bytes, 1250);
}

TEST(ProfileTest, SparseAttentionRemovesTheQuadraticPart) {
  // A purely linear table has no attention part to remove.
  auto linear = make_profiled_cost_model(hand_profile({{1, 64, 1.0}, {2, 64, 2.0}, {1, 128, 2.0}, {2, 128, 4.0}}),
                                         {.num_stages = 4, .seqlen_multiple = 1});
  EXPECT_NEAR(linear->stage_cost(1, {.batch = 2, .seqlen = 128}, {.enc = 0.3}, Recompute::None).fwd_ms, 4.0, 1e-9);
  // A table of c(s) = s + s^2 / 100: half density removes half of the s^2 term.
  std::vector<std::tuple<std::int64_t, std::int64_t, double>> points;
  for (std::int64_t b : {1, 2}) {
    for (std::int64_t s : {50, 100, 200}) points.emplace_back(b, s, b * (s + s * s / 100.0));
  }
  auto quadratic = make_profiled_cost_model(hand_profile(points), {.num_stages = 4, .seqlen_multiple = 1});
  EXPECT_NEAR(quadratic->stage_cost(1, {.batch = 1, .seqlen = 200}, {.enc = 0.5}, Recompute::None).fwd_ms,
              200 + 200, 1e-9);
  // A fixed cost per micro-batch (launches, a small shape's low efficiency) is not
  // attention: c = 50 + b (s + s^2 / 100) at half density is 50 + 200 + 200. Halving the
  // length alone would count the 50 against attention and remove only 195 of 400.
  for (auto& [b, s, ms] : points) ms += 50;
  auto with_fixed = make_profiled_cost_model(hand_profile(points), {.num_stages = 4, .seqlen_multiple = 1});
  EXPECT_NEAR(with_fixed->stage_cost(1, {.batch = 1, .seqlen = 200}, {.enc = 0.5}, Recompute::None).fwd_ms,
              50 + 200 + 200, 1e-9);
  EXPECT_NEAR(with_fixed->stage_cost(1, {.batch = 1, .seqlen = 200}, {.enc = 0.25}, Recompute::None).fwd_ms,
              50 + 200 + 100, 1e-9);
  // From the analytic source: lower, as in the analytic model.
  auto profiled = make_profiled_cost_model(analytic_profile("t5-tiny", kGrid), {.num_stages = 2});
  const MicroBatchShape shape{.batch = 4, .seqlen = 512, .dec_seqlen = 128};
  EXPECT_LT(profiled->stage_cost(0, shape, {.enc = 0.5, .dec = 1}, Recompute::None).fwd_ms,
            profiled->stage_cost(0, shape, {}, Recompute::None).fwd_ms);
  EXPECT_LT(profiled->stage_cost(1, shape, {.enc = 1, .dec = 0.5}, Recompute::None).fwd_ms,
            profiled->stage_cost(1, shape, {}, Recompute::None).fwd_ms);
}

// A layer's fixed varlen cost (`varlen_fixed_ms`) is charged once per transformer layer
// to every micro-batch whose rows run the varlen kernels (a density below 1), to nothing
// else; a recomputed forward pays it again, and its backward part is input gradient.
TEST(ProfileTest, VarlenFixedCostIsChargedToVarlenMicroBatchesOnly) {
  Profile p = analytic_profile("t5-tiny", kGrid);
  const auto plain = make_profiled_cost_model(p, {.num_stages = 2});
  ASSERT_EQ(p.layers[2].kind, ProfileLayerKind::Decoder);
  p.layers[1].varlen_fwd_ms = 0.25;  // encoder
  p.layers[2].varlen_fwd_ms = 0.5;   // decoder
  p.layers[2].varlen_bwd_ms = 0.125;
  const auto fixed = make_profiled_cost_model(p, {.num_stages = 2});
  EXPECT_TRUE(fixed->varlen_costs_extra());
  EXPECT_FALSE(plain->varlen_costs_extra());
  const MicroBatchShape shape{.batch = 2, .seqlen = 512, .dec_seqlen = 128};
  const int enc_layers = 2, dec_layers = 2;  // t5-tiny: stage 0 the encoder, stage 1 the decoder
  ASSERT_EQ(fixed->stages()[0].enc_end - fixed->stages()[0].enc_begin, enc_layers);
  ASSERT_EQ(fixed->stages()[1].dec_end - fixed->stages()[1].dec_begin, dec_layers);
  for (Recompute mode : kModes) {
    // Dense: unchanged.
    const StageCost dense = fixed->stage_cost(1, shape, {}, mode);
    EXPECT_EQ(dense.fwd_ms, plain->stage_cost(1, shape, {}, mode).fwd_ms);
    EXPECT_EQ(dense.bwd_ms, plain->stage_cost(1, shape, {}, mode).bwd_ms);
    for (const AttentionDensity density : {AttentionDensity{.enc = 0.5, .dec = 1}, AttentionDensity{.enc = 1, .dec = 0.25}}) {
      const double again = mode == Recompute::None ? 0 : 1;
      const StageCost with = fixed->stage_cost(1, shape, density, mode);
      const StageCost without = plain->stage_cost(1, shape, density, mode);
      EXPECT_NEAR(with.fwd_ms, without.fwd_ms + dec_layers * 0.5, 1e-9);
      EXPECT_NEAR(with.bwd_ms, without.bwd_ms + dec_layers * (0.125 + again * 0.5), 1e-9);
      EXPECT_NEAR(with.bwd_input_ms, without.bwd_input_ms + dec_layers * (0.125 + again * 0.5), 1e-9);
      EXPECT_NEAR(with.bwd_weight_ms, without.bwd_weight_ms, 1e-9);
      EXPECT_EQ(with.stored_bytes, without.stored_bytes);
      const StageCost encoder = fixed->stage_cost(0, shape, density, mode);
      EXPECT_NEAR(encoder.fwd_ms, plain->stage_cost(0, shape, density, mode).fwd_ms + enc_layers * 0.25, 1e-9);
    }
  }
  // The field round-trips and is written only where set.
  const std::string json = profile_to_json(p);
  EXPECT_EQ(parse_profile(json, "p.json"), p);
  EXPECT_THAT(json, HasSubstr("\"kind\": \"decoder\", \"parameter_bytes\": "));
  EXPECT_THAT(json, HasSubstr("\"varlen_fixed_ms\": {\"fwd\":0.5,\"bwd\":0.125}"));
  EXPECT_THAT(profile_to_json(analytic_profile("t5-tiny", kGrid)), Not(HasSubstr("varlen_fixed_ms")));
  // Bad input names the path.
  std::string head = json;
  const auto at = head.find("\"points\"", head.find("\"kind\": \"head\""));
  head.insert(at, "\"varlen_fixed_ms\": {\"fwd\": 1, \"bwd\": 1}, ");
  expect_error([&] { parse_profile(head, "p.json"); }, ErrorKind::ParseError,
               {"p.json: layers[3].varlen_fixed_ms must be absent for embedding and head"});
  std::string negative = json;
  negative.replace(negative.find("\"fwd\":0.5"), 9, "\"fwd\":-0.5");
  expect_error([&] { parse_profile(negative, "p.json"); }, ErrorKind::ParseError,
               {"p.json: layers[2].varlen_fixed_ms.fwd must be a finite number >= 0"});
}

// Packed rows on a measured H100 (assets/profiles/gpt-6.7b.h100.measured.json, one
// GPT-6.7B layer, bf16, flash attention; bench/gpu_profile.py --varlen-check, 20 repeats,
// offsets made once per packing; docs/RESULTS.md): b rows of s tokens holding samples back
// to back under varlen flash attention, 2-16 equal ones per row or mixed lengths, given by
// their density Σ L² / (b s²). Within 4.3% of every one.
TEST(ProfileTest, PackedRowsCostAsMeasuredOnAnH100) {
  const Profile h100 = load_profile(asset("gpt-6.7b.h100.measured.json"));
  const ModelSpec& model = h100.model;
  auto m = make_profiled_cost_model(h100, {.num_stages = model.total_layers()}, "h100");
  auto layer = [&](std::int64_t b, std::int64_t s, double density) {
    return m->stage_cost(1, {.batch = b, .seqlen = s}, {.enc = density}, Recompute::None);
  };
  struct Measured {
    std::int64_t batch, seqlen;
    double density, fwd_ms, bwd_ms;
  };
  const Measured measured[] = {
      {8, 2048, 0.500000, 10.869, 23.125}, {8, 2048, 0.250000, 10.987, 22.927}, {8, 2048, 0.125000, 10.820, 23.099},
      {8, 2048, 0.062500, 10.509, 22.206}, {8, 2048, 0.179480, 10.743, 22.738}, {8, 2048, 0.217027, 10.994, 22.979},
      {8, 2048, 0.161191, 11.072, 23.177}, {8, 2048, 0.232010, 10.981, 23.221}, {4, 4096, 0.500000, 11.527, 24.735},
      {4, 4096, 0.250000, 11.065, 23.500}, {4, 4096, 0.125000, 10.999, 23.142}, {4, 4096, 0.062500, 10.832, 22.841},
      {4, 4096, 0.202298, 11.104, 23.610}, {4, 4096, 0.152072, 11.062, 23.322}, {4, 4096, 0.176821, 11.090, 23.402},
      {4, 4096, 0.112086, 11.041, 23.019}, {2, 8192, 0.500000, 12.164, 26.980}, {2, 8192, 0.250000, 11.388, 24.648},
      {2, 8192, 0.125000, 11.055, 23.542}, {2, 8192, 0.062500, 10.911, 22.961}, {2, 8192, 0.148275, 11.210, 23.917},
      {2, 8192, 0.485532, 12.356, 27.197}, {2, 8192, 0.268585, 11.584, 25.211}, {2, 8192, 0.208362, 11.351, 24.488},
  };
  for (const Measured& row : measured) {
    const StageCost c = layer(row.batch, row.seqlen, row.density);
    EXPECT_NEAR(c.fwd_ms / row.fwd_ms, 1.0, 0.05) << row.batch << "x" << row.seqlen << " density " << row.density;
    EXPECT_NEAR(c.bwd_ms / row.bwd_ms, 1.0, 0.05) << row.batch << "x" << row.seqlen << " density " << row.density;
  }
  // The same tokens and the same sum of squared lengths cost the same however they are cut
  // into rows: one row of 8192 holding four samples of 2048 = four dense rows of 2048.
  EXPECT_DOUBLE_EQ(layer(1, 8192, 0.25).fwd_ms, layer(4, 2048, 1.0).fwd_ms);
  EXPECT_DOUBLE_EQ(layer(2, 4096, 0.5).bwd_ms, layer(4, 2048, 1.0).bwd_ms);
  // Below 4,096 tokens the fixed part of a micro-batch dominates; attention still shrinks.
  EXPECT_LT(layer(1, 2048, 0.25).fwd_ms, layer(1, 2048, 1.0).fwd_ms);
  // Memory: flash attention keeps no scores, so a sparse row keeps what a dense one does.
  EXPECT_NEAR(static_cast<double>(layer(2, 8192, 0.125).stored_bytes),
              static_cast<double>(layer(2, 8192, 1.0).stored_bytes), 0.01 * static_cast<double>(layer(2, 8192, 1.0).stored_bytes));
}

// The same check for T5-11B (assets/profiles/t5-11b.h100.measured.json; encoder layers
// on rows of s tokens, decoder layers on s encoder and s / 8 decoder tokens per row, the
// decoder tokens shared in proportion to the samples' encoder lengths; 20 repeats, within
// the tables' lengths). The encoder within 5.8%; the decoder within 5.5% on equal samples
// and up to 12% under on the backward of mixed ones (its self- and cross-attention share
// one density, √(ρ_enc·ρ_dec)).
TEST(ProfileTest, PackedT5RowsCostAsMeasuredOnAnH100) {
  const Profile h100 = load_profile(asset("t5-11b.h100.measured.json"));
  auto m = make_profiled_cost_model(h100, {.num_stages = h100.model.total_layers()}, "h100");
  struct Measured {
    bool decoder;
    std::int64_t batch, seqlen, dec_seqlen;
    double enc_density, dec_density, fwd_ms, bwd_ms;
  };
  const Measured measured[] = {
      {false, 8, 2048, 0, 0.250000, 1.000000, 13.599, 31.146},
      {true, 8, 2048, 256, 0.250000, 0.250000, 6.024, 10.391},
      {false, 8, 2048, 0, 0.062500, 1.000000, 12.597, 27.548},
      {true, 8, 2048, 256, 0.062500, 0.062500, 6.055, 11.899},
      {false, 8, 2048, 0, 0.179480, 1.000000, 13.605, 31.466},
      {true, 8, 2048, 256, 0.179480, 0.188896, 6.180, 12.174},
      {false, 8, 2048, 0, 0.217027, 1.000000, 13.896, 31.821},
      {true, 8, 2048, 256, 0.217027, 0.223450, 6.076, 11.910},
      {false, 8, 2048, 0, 0.161191, 1.000000, 13.305, 31.165},
      {true, 8, 2048, 256, 0.161191, 0.170010, 6.087, 12.257},
      {false, 4, 4096, 0, 0.250000, 1.000000, 14.997, 35.945},
      {true, 4, 4096, 512, 0.250000, 0.250000, 5.828, 10.993},
      {false, 4, 4096, 0, 0.062500, 1.000000, 12.943, 29.016},
      {true, 4, 4096, 512, 0.062500, 0.062500, 5.949, 11.054},
      {false, 4, 4096, 0, 0.214221, 1.000000, 14.959, 36.181},
      {true, 4, 4096, 512, 0.214221, 0.217443, 6.268, 11.962},
      {false, 4, 4096, 0, 0.249916, 1.000000, 15.337, 37.627},
      {true, 4, 4096, 512, 0.249916, 0.254425, 6.171, 12.015},
      {false, 4, 4096, 0, 0.202298, 1.000000, 14.821, 35.366},
      {true, 4, 4096, 512, 0.202298, 0.204611, 5.990, 11.387},
  };
  for (const Measured& row : measured) {
    // Stage 1 is encoder layer 1; stage 30 a decoder layer without the decoder embedding.
    const int stage = row.decoder ? 30 : 1;
    const StageCost c = m->stage_cost(stage, {.batch = row.batch, .seqlen = row.seqlen, .dec_seqlen = row.decoder ? row.dec_seqlen : 128},
                                      {.enc = row.enc_density, .dec = row.dec_density}, Recompute::None);
    EXPECT_NEAR(c.fwd_ms / row.fwd_ms, 1.0, 0.12) << (row.decoder ? "decoder " : "encoder ") << row.batch << "x" << row.seqlen;
    EXPECT_NEAR(c.bwd_ms / row.bwd_ms, 1.0, 0.12) << (row.decoder ? "decoder " : "encoder ") << row.batch << "x" << row.seqlen;
  }
}

TEST(ProfileTest, MalformedProfilesNameTheJsonPath) {
  const std::string good = profile_to_json(analytic_profile("gpt-tiny", kGrid));
  auto broken = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  expect_error([&] { parse_profile(broken("dynapipe-profile", "dynapipe-plan"), "p.json"); }, ErrorKind::ParseError,
               {"p.json: format must be \"dynapipe-profile\"", "\"dynapipe-plan\""});
  expect_error([&] { parse_profile(broken("\"version\": 1", "\"version\": 2"), "p.json"); }, ErrorKind::ParseError,
               {"p.json: version must be 1, got 2"});
  expect_error([&] { parse_profile(broken("{\"batch\":1,\"seqlen\":64,\"fwd_ms\":", "{\"batch\":1,\"seqlen\":64,\"fwd_ms\":-"),
                                   "p.json"); },
               ErrorKind::ParseError, {"layers[0].points.none[0].fwd_ms must be a finite number >= 0"});
  expect_error([&] { parse_profile(broken("\"selective\":", "\"selectiv\":"), "p.json"); }, ErrorKind::ParseError,
               {"p.json: layers[1].points.selectiv must be absent (not a field here; the fields are none, selective, full), got [{"});
  expect_error([&] { parse_profile(broken("\"kind\": \"head\"", "\"kind\": \"encoder\""), "p.json"); },
               ErrorKind::ParseError, {"layers[2].kind must be one of embedding, layer, head for a gpt model"});
  expect_error([&] { parse_profile(broken("\"stored_bytes\":", "\"stored\":"), "p.json"); }, ErrorKind::ParseError,
               {"p.json: layers[0].points.none[0].stored must be absent (not a field here; the fields are batch, seqlen,"});
  expect_error([&] { parse_profile(broken("\"hidden\":128", "\"hidden\":0"), "p.json"); }, ErrorKind::ParseError,
               {"model.hidden must be an integer in [1,"});
  expect_error([&] { parse_profile(good.substr(0, good.size() / 2), "p.json"); }, ErrorKind::ParseError,
               {"p.json: ", " must be valid JSON, got parse error at line "});
  expect_error([&] { parse_profile(broken("{\"batch\":1,", "{\"batch\":\"1\","), "p.json"); }, ErrorKind::ParseError,
               {"p.json: layers[0].points.none[0].batch must be an integer >= 1, got \"1\""});
  expect_error([&] { parse_profile(broken("{\"batch\":1,\"seqlen\":64,\"fwd_ms\":", "{\"batch\":1,\"seqlen\":64,\"fwd_ms\":1e999,\"x\":"),
                                   "p.json"); },
               ErrorKind::ParseError, {"p.json: layers[0].points.none[0].fwd_ms must be a number a double can hold, got 1e999"});
  expect_error([&] { parse_profile(broken("\"bytes_per_element\": 4", "\"bytes_per_element\": 9"), "p.json"); },
               ErrorKind::ParseError, {"p.json: bytes_per_element must be an integer in [1, 8], got 9"});

  Profile p = analytic_profile("gpt-tiny", kGrid);
  p.layers.pop_back();  // no head
  expect_error([&] { parse_profile(profile_to_json(p), "p.json"); }, ErrorKind::ParseError,
               {"layers must be a list with a \"head\" entry"});
  p = analytic_profile("gpt-tiny", kGrid);
  p.layers[1].points[2].clear();  // no full-recompute table
  expect_error([&] { parse_profile(profile_to_json(p), "p.json"); }, ErrorKind::ParseError,
               {"layers[1].points.full must be a list of points"});
  p = analytic_profile("gpt-tiny", kGrid);
  p.layers[1].points[0].push_back(p.layers[1].points[0].front());
  expect_error([&] { parse_profile(profile_to_json(p), "p.json"); }, ErrorKind::ParseError,
               {"layers[1].points.none[20]", "duplicate batch 1, seqlen 64"});
  p = analytic_profile("gpt-tiny", {.batches = {1, 2}, .seqlens = {64, 128}, .dec_seqlens = {}});
  p.layers[1].points[0].resize(2);  // batch 1 only
  expect_error([&] { parse_profile(profile_to_json(p), "p.json"); }, ErrorKind::ParseError,
               {"layers[1].points.none must be points with at least 2 distinct batch values"});
  p = analytic_profile("t5-tiny", kGrid);
  auto& dec = p.layers[2].points[0];
  std::erase_if(dec, [](const ProfilePoint& q) { return q.seqlen == 128 && q.dec_seqlen == 64; });
  expect_error([&] { parse_profile(profile_to_json(p), "p.json"); }, ErrorKind::ParseError,
               {"layers[2].points.none", "(128, 64) has none"});
}

TEST(ProfileTest, FactoryChecksTheProfileAgainstTheModel) {
  const std::string path = asset("gpt-tiny.cpu.json");
  expect_error([&] { make_cost_model(path, load_model_spec("gpt-small"), {.num_stages = 2}); },
               ErrorKind::InvalidArgument, {path, "'gpt-tiny'", "'gpt-small'", "hidden 128 vs 256"});
  const std::string bad = write_temp("bad.json", "{\"format\": \"dynapipe-profile\"}");
  expect_error([&] { make_cost_model(bad, load_model_spec("gpt-tiny"), {}); }, ErrorKind::ParseError,
               {bad, "version must be present"});
  // Same shape from a differently named model file: accepted, reported under the new name.
  ModelSpec renamed = load_model_spec("gpt-tiny");
  renamed.name = "my-gpt";
  EXPECT_EQ(make_cost_model(path, renamed, {})->model().name, "my-gpt");
}

TEST(ProfileTest, BuildProfileNeedsOneLayerPerStage) {
  const ModelSpec spec = load_model_spec("gpt-tiny");
  auto two = make_cost_model("analytic:cpu", spec, {.num_stages = 2});
  expect_error([&] { build_profile(*two, kGrid); }, ErrorKind::InvalidArgument, {"one stage per layer (4), got 2"});
  auto four = make_cost_model("analytic:cpu", spec, {.num_stages = 4});
  expect_error([&] { build_profile(*four, {.batches = {1}, .seqlens = {64, 128}, .dec_seqlens = {}}); },
               ErrorKind::InvalidArgument, {"batches must have >= 2 distinct values"});
}

}  // namespace
}  // namespace dynapipe
