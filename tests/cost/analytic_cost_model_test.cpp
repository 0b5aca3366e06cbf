#include <optional>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/cost/cost_model.h"

namespace dynapipe {
namespace {

// GPT-6.7B and T5-11B as the issue-8 points split them, with tensor parallelism and with an
// uneven stage count: the shared and the general costing paths.
struct PaperModelCase {
  std::string model;
  CostModelOptions options;
};
const std::vector<PaperModelCase>& paper_model_cases() {
  static const std::vector<PaperModelCase> cases{{"gpt-6.7b", {.num_stages = 4}},
                                                 {"gpt-6.7b", {.num_stages = 4, .tp = 2}},
                                                 {"t5-11b", {.num_stages = 8}},
                                                 {"t5-11b", {.num_stages = 3}}};
  return cases;
}

// A random micro-batch of 1 + [0, extra_rows] rows of up to 16,000 tokens (T5: and up to
// 2,400 decoder tokens), multiples of 8, and a random attention density.
std::pair<MicroBatchShape, AttentionDensity> random_microbatch(Rng& rng, bool t5, int extra_rows) {
  const MicroBatchShape shape{.batch = 1 + rng.uniform_int(0, extra_rows),
                              .seqlen = 8 * rng.uniform_int(1, 2000),
                              .dec_seqlen = t5 ? 8 * rng.uniform_int(1, 300) : 0};
  const AttentionDensity density{.enc = rng.uniform(0.001, 1.0), .dec = rng.uniform(0.001, 1.0)};
  return {shape, density};
}

using ::testing::HasSubstr;

constexpr Recompute kModes[] = {Recompute::None, Recompute::Selective, Recompute::Full};

std::unique_ptr<CostModel> analytic(const std::string& model, int stages, const std::string& device = "a100-40g",
                                    int zero_shards = 1) {
  return make_cost_model("analytic:" + device, load_model_spec(model),
                         {.num_stages = stages, .zero_shards = zero_shards});
}

// stage_costs() costs each layer kind once for all stages; it must give exactly what
// stage_cost() gives per stage (GPT and T5, tensor parallel, uneven layer splits,
// sparse attention, every recompute mode).
TEST(AnalyticCostModelTest, StageCostsEqualsStageCostOnEveryStage) {
  struct Case {
    std::string model;
    int stages;
    int tp;
  };
  for (const Case& c : {Case{"gpt-6.7b", 4, 1}, Case{"gpt-6.7b", 3, 2}, Case{"t5-11b", 8, 1},
                        Case{"t5-11b", 5, 4}}) {
    auto m = make_cost_model("analytic:a100-40g", load_model_spec(c.model),
                             {.num_stages = c.stages, .tp = c.tp});
    const MicroBatchShape shape{.batch = 3, .seqlen = 700, .dec_seqlen = 130};
    const AttentionDensity density{.enc = 0.4, .dec = 0.7};
    std::vector<StageCost> all(static_cast<std::size_t>(c.stages));
    for (Recompute mode : kModes) {
      m->stage_costs(shape, density, mode, all);
      for (int s = 0; s < c.stages; ++s) {
        EXPECT_EQ(all[static_cast<std::size_t>(s)], m->stage_cost(s, shape, density, mode))
            << c.model << " pp " << c.stages << " tp " << c.tp << " stage " << s;
      }
    }
  }
}

// bottleneck_ms_and_bytes() is what the batching's segment scans call ~10^5 times per
// plan; it costs each distinct stage once and must give exactly (bit for bit) the
// reduction of stage_costs(): max over stages of fwd + bwd, stored then peak bytes.
// Uniform splits with repeated middle stages, uneven and explicit splits, tensor
// parallelism (the general path), varlen densities and every recompute mode.
TEST(AnalyticCostModelTest, BottleneckAndBytesEqualStageCostsExactly) {
  const ModelSpec t5 = load_model_spec("t5-11b");
  std::vector<PaperModelCase> cases{{"gpt-6.7b", {.num_stages = 4}},
                          {"gpt-6.7b", {.num_stages = 5}},
                          {"gpt-6.7b", {.num_stages = 4, .tp = 2}},
                          {"t5-11b", {.num_stages = 8}},
                          {"t5-11b", {.num_stages = 4, .tp = 4}}};
  cases.push_back({"t5-11b", {.num_stages = 8, .layers = assign_layers(t5, {4, 5, 4, 5, 5, 8, 8, 9})}});
  Rng rng(7);
  for (const PaperModelCase& c : cases) {
    auto m = make_cost_model("analytic:a100-40g", load_model_spec(c.model), c.options);
    const std::size_t p = static_cast<std::size_t>(m->num_stages());
    std::vector<StageCost> all(p), scratch(p);
    std::vector<std::int64_t> bytes(2 * p);
    for (int trial = 0; trial < 50; ++trial) {
      const auto [shape, density] = random_microbatch(rng, c.model == "t5-11b", 3);
      for (Recompute mode : kModes) {
        m->stage_costs(shape, density, mode, all);
        double expected = 0;
        for (const StageCost& sc : all) expected = std::max(expected, sc.fwd_ms + sc.bwd_ms);
        const double got = m->bottleneck_ms_and_bytes(shape, density, mode, scratch, bytes);
        ASSERT_EQ(got, expected) << c.model << " pp " << p << " trial " << trial;
        for (std::size_t s = 0; s < p; ++s) {
          ASSERT_EQ(bytes[s], all[s].held_bytes()) << c.model << " stage " << s;
          ASSERT_EQ(bytes[p + s], all[s].peak_bytes) << c.model << " stage " << s;
        }
      }
    }
  }
}

// bottleneck_ms_and_bytes_modes() costs several recompute modes of one micro-batch with
// the layers' shared terms computed once (the varlen scans cost none and selective
// together); each mode's time and bytes must equal the single-mode call bit for bit, in
// any order of the modes, on the shared path (tp 1) and the general one (tp > 1).
TEST(AnalyticCostModelTest, BottleneckForSeveralModesEqualsOneModeAtATimeExactly) {
  const std::vector<PaperModelCase>& cases = paper_model_cases();
  const std::vector<std::vector<Recompute>> mode_sets{
      {Recompute::None, Recompute::Selective},
      {Recompute::Selective, Recompute::None},
      {Recompute::None, Recompute::Selective, Recompute::Full},
      {Recompute::Full},
      {Recompute::Full, Recompute::None}};
  Rng rng(11);
  for (const PaperModelCase& c : cases) {
    auto m = make_cost_model("analytic:a100-40g", load_model_spec(c.model), c.options);
    const std::size_t p = static_cast<std::size_t>(m->num_stages());
    std::vector<StageCost> scratch(p);
    std::vector<std::int64_t> one(2 * p);
    for (int trial = 0; trial < 40; ++trial) {
      const auto [shape, density] = random_microbatch(rng, c.model == "t5-11b", 2);
      for (const std::vector<Recompute>& modes : mode_sets) {
        std::vector<double> times(modes.size());
        std::vector<std::int64_t> bytes(2 * p * modes.size());
        m->bottleneck_ms_and_bytes_modes(shape, density, modes, scratch, times, bytes);
        for (std::size_t k = 0; k < modes.size(); ++k) {
          const double expected = m->bottleneck_ms_and_bytes(shape, density, modes[k], scratch, one);
          ASSERT_EQ(times[k], expected) << c.model << " tp " << c.options.tp << " mode " << k;
          for (std::size_t i = 0; i < 2 * p; ++i) {
            ASSERT_EQ(bytes[2 * p * k + i], one[i]) << c.model << " mode " << k << " slot " << i;
          }
        }
      }
    }
  }
}

// bottleneck_ms_and_bytes_many() costs four micro-batches at a time in vector lanes (the
// layer formulas instantiated for them, which the varlen scans' costing runs on); each
// micro-batch's time and bytes must equal the one-at-a-time call bit for bit: on the
// presets with their own terms (cpu: the LibTorch runtime's memory; h100: fused
// attention), whole groups of four and a remainder, micro-batches without attention among
// them, and T5 ones without decoder tokens (costed alone: lanes need tokens), on the shared
// path (tp 1) and the general one (tp > 1).
TEST(AnalyticCostModelTest, BottleneckForManyMicroBatchesEqualsOneAtATimeExactly) {
  const std::vector<std::vector<Recompute>> mode_sets{{Recompute::None, Recompute::Selective},
                                                      {Recompute::Full}};
  Rng rng(13);
  for (const std::string device : {"a100-40g", "h100-80g", "cpu"}) {
    for (const PaperModelCase& c : paper_model_cases()) {
      auto m = make_cost_model("analytic:" + device, load_model_spec(c.model), c.options);
      const bool t5 = c.model == "t5-11b";
      const std::size_t p = static_cast<std::size_t>(m->num_stages());
      std::vector<StageCost> scratch(p);
      for (int trial = 0; trial < 12; ++trial) {
        const std::size_t count = static_cast<std::size_t>(1 + rng.uniform_int(0, 10));
        std::vector<MicroBatchShape> shapes;
        std::vector<AttentionDensity> densities;
        for (std::size_t j = 0; j < count; ++j) {
          auto [shape, density] = random_microbatch(rng, t5, 2);
          if (trial % 4 == 1 && j == count / 2) density = {.enc = 0, .dec = 0};
          if (t5 && trial % 4 == 2 && j == count / 2) shape.dec_seqlen = 0;
          shapes.push_back(shape);
          densities.push_back(density);
        }
        for (const std::vector<Recompute>& modes : mode_sets) {
          const std::size_t k = modes.size();
          std::vector<double> times(k * count), one_times(k);
          std::vector<std::int64_t> bytes(2 * p * k * count), one_bytes(2 * p * k);
          m->bottleneck_ms_and_bytes_many(shapes, densities, modes, scratch, times, bytes);
          for (std::size_t j = 0; j < count; ++j) {
            m->bottleneck_ms_and_bytes_modes(shapes[j], densities[j], modes, scratch, one_times, one_bytes);
            for (std::size_t i = 0; i < k; ++i) {  // by mode: mode i's results together
              ASSERT_EQ(times[count * i + j], one_times[i])
                  << device << " " << c.model << " tp " << c.options.tp << " micro-batch " << j << " of " << count;
              for (std::size_t slot = 0; slot < 2 * p; ++slot) {
                ASSERT_EQ(bytes[2 * p * (count * i + j) + slot], one_bytes[2 * p * i + slot])
                    << device << " " << c.model << " micro-batch " << j << " mode " << i << " slot " << slot;
              }
            }
          }
        }
      }
    }
  }
}

// affine_time_bound(): every stage's time is at least enc·tokens + dec·dec_tokens +
// fixed + enc_sq·S_enc + dec_sq·S_dec for any micro-batch (rows, unrounded lengths,
// attention, mode, tensor parallelism), S the attention the model charges it (density ·
// rows · length²: its samples' Σ L² for a varlen row, more for padded ones); the line is
// the model's own time without attention, and the squares' coefficient its cost of
// attention on a long row: tight there.
TEST(AnalyticCostModelTest, AffineTimeBoundHoldsForEveryMicroBatchAndIsTightWithoutAttention) {
  const std::vector<PaperModelCase>& cases = paper_model_cases();
  Rng rng(5);
  for (const PaperModelCase& c : cases) {
    auto m = make_cost_model("analytic:a100-40g", load_model_spec(c.model), c.options);
    const bool t5 = c.model == "t5-11b";
    for (Recompute mode : kModes) {
      const std::optional<AffineTimeBound> bound = m->affine_time_bound(mode);
      ASSERT_TRUE(bound.has_value()) << c.model;
      auto line = [&](int s, double enc, double dec, double enc_sq = 0, double dec_sq = 0) {
        return bound->work_ms(s, enc, dec, enc_sq, dec_sq) + bound->fixed_ms[s];
      };
      ASSERT_EQ(bound->enc_sq_ms.size(), static_cast<std::size_t>(m->num_stages()));
      ASSERT_EQ(bound->dec_sq_ms.size(), static_cast<std::size_t>(m->num_stages()));
      for (int s = 0; s < m->num_stages(); ++s) {
        EXPECT_GT(bound->enc_ms[s], 0) << c.model << " stage " << s;
        EXPECT_GT(bound->fixed_ms[s], 0) << c.model << " stage " << s;
        EXPECT_GE(bound->dec_sq_ms[s], 0) << c.model << " stage " << s;
        // Every stage of GPT and T5's encoder stages attend over the encoder tokens.
        if (!t5 || m->stages()[s].has_encoder()) {
          EXPECT_GT(bound->enc_sq_ms[s], 0) << c.model << " stage " << s;
        }
        // A long row: the attention's cost per score comes within 1% of the bound's.
        if (c.options.tp > 1) continue;
        const std::int64_t n = 65536;
        const double density = 1.0 / 64;
        const MicroBatchShape row{.batch = 1, .seqlen = n, .dec_seqlen = t5 ? n : 0};
        const StageCost flat = m->stage_cost(s, row, {.enc = 0, .dec = 0}, mode);
        const StageCost attended = m->stage_cost(s, row, {.enc = density, .dec = 0}, mode);
        const double squares = density * static_cast<double>(n) * static_cast<double>(n);
        const double extra = attended.fwd_ms + attended.bwd_ms - flat.fwd_ms - flat.bwd_ms;
        const double rounding = 1e-12 * (flat.fwd_ms + flat.bwd_ms);  // stages without it
        EXPECT_GE(extra + rounding, bound->enc_sq_ms[s] * squares) << c.model << " stage " << s;
        EXPECT_LE(extra, bound->enc_sq_ms[s] * squares * 1.01 + rounding)
            << c.model << " stage " << s;
      }
      for (int trial = 0; trial < 60; ++trial) {
        const MicroBatchShape shape{.batch = 1 + rng.uniform_int(0, 3),
                                    .seqlen = rng.uniform_int(1, 4000),
                                    .dec_seqlen = t5 ? rng.uniform_int(1, 600) : 0};
        const AttentionDensity density{.enc = rng.uniform(0.0, 1.0), .dec = rng.uniform(0.0, 1.0)};
        const double enc = static_cast<double>(shape.batch * shape.seqlen);
        const double dec = static_cast<double>(shape.batch * shape.dec_seqlen);
        const double enc_sq = density.enc * enc * static_cast<double>(shape.seqlen);
        const double dec_sq = density.dec * dec * static_cast<double>(shape.dec_seqlen);
        for (int s = 0; s < m->num_stages(); ++s) {
          const StageCost cost = m->stage_cost(s, shape, density, mode);
          ASSERT_GE(cost.fwd_ms + cost.bwd_ms, line(s, enc, dec, enc_sq, dec_sq))
              << c.model << " tp " << c.options.tp << " stage " << s << " trial " << trial;
        }
        if (c.options.tp > 1) continue;  // communication adds time: not tight
        // Rounded lengths and no attention: the model's time is the line itself.
        const MicroBatchShape rounded{.batch = shape.batch, .seqlen = 8 * (1 + shape.seqlen / 8),
                                      .dec_seqlen = t5 ? 8 * (1 + shape.dec_seqlen / 8) : 0};
        for (int s = 0; s < m->num_stages(); ++s) {
          const StageCost cost = m->stage_cost(s, rounded, {.enc = 0, .dec = 0}, mode);
          const double expected = line(s, static_cast<double>(rounded.batch * rounded.seqlen),
                                       static_cast<double>(rounded.batch * rounded.dec_seqlen));
          EXPECT_NEAR(cost.fwd_ms + cost.bwd_ms, expected, 1e-5 * expected)
              << c.model << " stage " << s << " trial " << trial;
        }
      }
    }
  }
}

TEST(AnalyticCostModelTest, DescribesItselfAndItsLayout) {
  auto m = analytic("gpt-6.7b", 4);
  EXPECT_EQ(m->describe(), "analytic:a100-40g");
  EXPECT_EQ(m->num_stages(), 4);
  EXPECT_EQ(m->model().name, "gpt-6.7b");
  EXPECT_EQ(m->device().peak_tflops, 312);
}

// The reference's A100 profile of GPT-6.7B, one layer (docs/cost-model.md): the model
// must stay within 30% of it.
TEST(AnalyticCostModelTest, Gpt67bLayerIsCloseToTheReferenceProfile) {
  auto m = analytic("gpt-6.7b", 32);  // stage 1 holds exactly one layer
  struct Reference {
    std::int64_t batch, seqlen;
    double fwd_ms, bwd_ms, stored_mb;
    Recompute mode;
  };
  const Reference refs[] = {
      {1, 512, 1.66, 2.49, 115.1, Recompute::None},  {8, 512, 9.04, 16.11, 919.6, Recompute::None},
      {1, 2048, 5.78, 9.65, 966.5, Recompute::None}, {1, 2048, 5.78, 11.39, 295.5, Recompute::Selective},
      {1, 2048, 5.78, 15.43, 27.0, Recompute::Full},
  };
  for (const Reference& r : refs) {
    SCOPED_TRACE(testing::Message() << "b=" << r.batch << " s=" << r.seqlen << " " << recompute_name(r.mode));
    const StageCost c = m->stage_cost(1, {.batch = r.batch, .seqlen = r.seqlen}, {}, r.mode);
    EXPECT_NEAR(c.fwd_ms, r.fwd_ms, 0.3 * r.fwd_ms);
    EXPECT_NEAR(c.bwd_ms, r.bwd_ms, 0.3 * r.bwd_ms);
    if (r.mode != Recompute::Full) {  // full: the reference stores more than the layer input
      EXPECT_NEAR(static_cast<double>(c.stored_bytes) / 1e6, r.stored_mb, 0.3 * r.stored_mb);
    }
  }
  // Bilinear-interpolation example of the reference: (3, 1536) -> 12.12 ms.
  EXPECT_NEAR(m->stage_cost(1, {.batch = 3, .seqlen = 1536}, {}, Recompute::None).fwd_ms, 12.12, 0.3 * 12.12);
}

TEST(AnalyticCostModelTest, KorthikantiActivationMemoryForOneLayer) {
  auto m = analytic("gpt-6.7b", 32);
  // s b h (34 + 5 a s / h) bytes, selective 34 s b h, full 2 s b h (bf16).
  const std::int64_t s = 1024, b = 2, h = 4096, a = 32;
  EXPECT_EQ(m->stage_cost(1, {.batch = b, .seqlen = s}, {}, Recompute::None).stored_bytes,
            s * b * h * 34 + 5 * a * s * s * b);
  EXPECT_EQ(m->stage_cost(1, {.batch = b, .seqlen = s}, {}, Recompute::Selective).stored_bytes, s * b * h * 34);
  EXPECT_EQ(m->stage_cost(1, {.batch = b, .seqlen = s}, {}, Recompute::Full).stored_bytes, 2 * s * b * h);
}

TEST(AnalyticCostModelTest, MonotoneInBatchAndSeqlenOnEveryStage) {
  for (const char* model : {"gpt-small", "t5-small"}) {
    for (const char* device : {"a100-40g", "cpu"}) {
      auto m = analytic(model, 3, device);
      for (int stage = 0; stage < 3; ++stage) {
        for (Recompute mode : kModes) {
          SCOPED_TRACE(testing::Message() << model << " " << device << " stage " << stage << " "
                                          << recompute_name(mode));
          for (std::int64_t b = 1; b <= 16; b *= 2) {
            for (std::int64_t s = 8; s <= 2048; s *= 2) {
              const MicroBatchShape shape{.batch = b, .seqlen = s, .dec_seqlen = s / 4};
              const StageCost c = m->stage_cost(stage, shape, {}, mode);
              for (const MicroBatchShape& bigger :
                   {MicroBatchShape{b + 1, s, s / 4}, MicroBatchShape{b, 2 * s, s / 4},
                    MicroBatchShape{b, s, s / 4 + 8}}) {
                const StageCost d = m->stage_cost(stage, bigger, {}, mode);
                EXPECT_GE(d.fwd_ms, c.fwd_ms);
                EXPECT_GE(d.bwd_ms, c.bwd_ms);
                EXPECT_GE(d.stored_bytes, c.stored_bytes);
                EXPECT_GE(d.peak_bytes, c.peak_bytes);
                EXPECT_GE(d.output_bytes, c.output_bytes);
              }
              EXPECT_GT(m->stage_cost(stage, {b + 1, s, s / 4}, {}, mode).fwd_ms, c.fwd_ms);
            }
          }
        }
      }
    }
  }
}

// Along a varlen row (samples added one at a time: tokens and Σ L² grow, the density may
// fall) what the batching's memory check adds up per stage, k·held + peak, never falls,
// for any k >= 1: the varlen scans find where a row stops fitting by bisection
// (VarlenScanner::advance_fit()). The peak alone can fall (the LibTorch runtime's
// backward peak, cpu preset, once a row's scores dominate it); what each sample adds to
// the held bytes outweighs that.
TEST(AnalyticCostModelTest, HeldPlusPeakGrowsAlongAVarlenRow) {
  Rng rng(23);
  for (const char* model : {"gpt-small", "t5-small", "gpt-6.7b", "t5-11b"}) {
    for (const char* device : {"a100-40g", "h100-80g", "cpu"}) {
      const bool t5 = std::string(model).starts_with("t5");
      auto m = analytic(model, 3, device);
      const std::size_t p = 3;
      std::vector<StageCost> scratch(p);
      std::vector<std::int64_t> before(2 * p), after(2 * p);
      for (Recompute mode : kModes) {
        SCOPED_TRACE(testing::Message() << model << " " << device << " " << recompute_name(mode));
        for (int row = 0; row < 20; ++row) {
          std::int64_t enc = 0, dec = 0;
          double enc_squares = 0, dec_squares = 0;
          for (int sample = 0; sample < 24; ++sample) {
            // Long and short samples mixed: a short one after long ones lowers the density.
            const std::int64_t len = rng.uniform_int(0, 2) == 0 ? rng.uniform_int(1000, 4000)
                                                                : rng.uniform_int(1, 64);
            const std::int64_t dec_len = t5 ? rng.uniform_int(1, 300) : 0;
            enc += len;
            dec += dec_len;
            enc_squares += static_cast<double>(len) * static_cast<double>(len);
            dec_squares += static_cast<double>(dec_len) * static_cast<double>(dec_len);
            const MicroBatchShape shape{.batch = 1, .seqlen = (enc + 7) / 8 * 8,
                                        .dec_seqlen = t5 ? (dec + 7) / 8 * 8 : 0};
            const auto square = [](std::int64_t n) { return static_cast<double>(n) * static_cast<double>(n); };
            const AttentionDensity density{.enc = enc_squares / square(shape.seqlen),
                                           .dec = t5 ? dec_squares / square(shape.dec_seqlen) : 1.0};
            m->bottleneck_ms_and_bytes(shape, density, mode, scratch, after);
            if (sample > 0) {
              for (std::size_t s = 0; s < p; ++s) {
                for (std::int64_t k : {1, 2, 8}) {
                  ASSERT_GE(k * after[s] + after[p + s], k * before[s] + before[p + s])
                      << "stage " << s << " k " << k << " sample " << sample;
                }
              }
            }
            before = after;
          }
        }
      }
    }
  }
}

TEST(AnalyticCostModelTest, SparseAttentionLowersTimeAndMemory) {
  auto gpt = analytic("gpt-small", 2);
  const MicroBatchShape shape{.batch = 4, .seqlen = 1024};
  const StageCost dense = gpt->stage_cost(0, shape, {}, Recompute::None);
  const StageCost half = gpt->stage_cost(0, shape, {.enc = 0.5}, Recompute::None);
  EXPECT_LT(half.fwd_ms, dense.fwd_ms);
  EXPECT_LT(half.bwd_ms, dense.bwd_ms);
  EXPECT_LT(half.stored_bytes, dense.stored_bytes);
  EXPECT_EQ(half.output_bytes, dense.output_bytes);

  // T5: the decoder density lowers the decoder stage; the encoder stage ignores it.
  auto t5 = analytic("t5-small", 2);
  const MicroBatchShape t5_shape{.batch = 4, .seqlen = 512, .dec_seqlen = 256};
  EXPECT_LT(t5->stage_cost(1, t5_shape, {.enc = 1, .dec = 0.25}, Recompute::None).fwd_ms,
            t5->stage_cost(1, t5_shape, {}, Recompute::None).fwd_ms);
  EXPECT_EQ(t5->stage_cost(0, t5_shape, {.enc = 1, .dec = 0.25}, Recompute::None),
            t5->stage_cost(0, t5_shape, {}, Recompute::None));
}

TEST(AnalyticCostModelTest, RecomputeTradesMemoryForBackwardTime) {
  for (const char* model : {"gpt-6.7b", "t5-11b"}) {
    auto m = analytic(model, 4);
    for (int stage = 0; stage < 4; ++stage) {
      SCOPED_TRACE(testing::Message() << model << " stage " << stage);
      const MicroBatchShape shape{.batch = 2, .seqlen = 1024, .dec_seqlen = 256};
      const StageCost none = m->stage_cost(stage, shape, {}, Recompute::None);
      const StageCost sel = m->stage_cost(stage, shape, {}, Recompute::Selective);
      const StageCost full = m->stage_cost(stage, shape, {}, Recompute::Full);
      EXPECT_GT(none.stored_bytes, sel.stored_bytes);
      EXPECT_GT(sel.stored_bytes, full.stored_bytes);
      EXPECT_LT(none.bwd_ms, sel.bwd_ms);
      EXPECT_LT(sel.bwd_ms, full.bwd_ms);
      EXPECT_EQ(none.fwd_ms, full.fwd_ms);
      // Recomputation is part of the input gradient; the weight gradient is unchanged.
      EXPECT_DOUBLE_EQ(none.bwd_weight_ms, full.bwd_weight_ms);
    }
  }
}

TEST(AnalyticCostModelTest, SplitBackwardAddsUpToTheFullBackward) {
  auto m = analytic("t5-small", 3, "cpu");
  for (int stage = 0; stage < 3; ++stage) {
    for (Recompute mode : kModes) {
      const StageCost c = m->stage_cost(stage, {.batch = 3, .seqlen = 200, .dec_seqlen = 40}, {}, mode);
      EXPECT_GT(c.bwd_input_ms, 0);
      EXPECT_GT(c.bwd_weight_ms, 0);
      EXPECT_DOUBLE_EQ(c.bwd_input_ms + c.bwd_weight_ms, c.bwd_ms);
    }
  }
}

TEST(AnalyticCostModelTest, ShapesAreRoundedToTheSeqlenMultiple) {
  auto m = analytic("gpt-small", 2);
  EXPECT_EQ(m->stage_cost(0, {.batch = 2, .seqlen = 97}, {}, Recompute::None),
            m->stage_cost(0, {.batch = 2, .seqlen = 104}, {}, Recompute::None));
  EXPECT_NE(m->stage_cost(0, {.batch = 2, .seqlen = 97}, {}, Recompute::None),
            m->stage_cost(0, {.batch = 2, .seqlen = 96}, {}, Recompute::None));
  auto coarse = make_cost_model("analytic:a100-40g", load_model_spec("gpt-small"),
                                {.num_stages = 2, .seqlen_multiple = 64});
  EXPECT_EQ(coarse->stage_cost(0, {.batch = 2, .seqlen = 65}, {}, Recompute::None),
            coarse->stage_cost(0, {.batch = 2, .seqlen = 128}, {}, Recompute::None));
}

TEST(AnalyticCostModelTest, OutputBytesCarryTheEncoderOutputThroughTheDecoder) {
  // t5-small (4 + 4 layers) at pp 4: enc, enc, dec, dec. bf16, hidden 256.
  auto m = analytic("t5-small", 4);
  const MicroBatchShape shape{.batch = 2, .seqlen = 100, .dec_seqlen = 30};  // -> 104, 32
  EXPECT_EQ(m->stage_cost(0, shape, {}, Recompute::None).output_bytes, 2 * 2 * 104 * 256);
  EXPECT_EQ(m->stage_cost(1, shape, {}, Recompute::None).output_bytes, 2 * 2 * 104 * 256);
  EXPECT_EQ(m->stage_cost(2, shape, {}, Recompute::None).output_bytes, 2 * 2 * (104 + 32) * 256);
  EXPECT_EQ(m->stage_cost(3, shape, {}, Recompute::None).output_bytes, 0);  // last stage

  auto gpt = analytic("gpt-tiny", 2, "cpu");  // fp32
  EXPECT_EQ(gpt->stage_cost(0, {.batch = 3, .seqlen = 64}, {}, Recompute::None).output_bytes, 4 * 3 * 64 * 128);
}

// analytic:cpu models what the LibTorch runtime's autograd graph keeps (fp32, no dropout
// masks, the softmax output per score, LayerNorm statistics), checked against measurements
// by bench/stage_memory_torch_bench.
TEST(AnalyticCostModelTest, CpuMemoryIsWhatTheLibTorchRuntimeKeeps) {
  auto gpt = analytic("gpt-tiny", 2, "cpu");  // stage 0: embedding + layers 0, 1
  const std::int64_t n = 2 * 64, h = 128, f = 512, scores = 2 * 4 * 64 * 64;
  // Per layer: LN, QKV, LN, fc1 inputs (4 x 4nh); Q, K, V and proj input (4 x 4nk);
  // GELU input and output (2 x 4nf); probabilities (4 per score); LN mean, rstd (16n).
  const std::int64_t layer = 16 * n * h + 16 * n * h + 8 * n * f + 4 * scores + 16 * n;
  const StageCost c = gpt->stage_cost(0, {.batch = 2, .seqlen = 64}, {}, Recompute::None);
  EXPECT_EQ(c.stored_bytes, 2 * layer + n * h);  // + the embedding's
  // Backward of attention: two score-sized gradients, less the MLP's released tensors.
  EXPECT_EQ(c.peak_bytes, std::max(2 * 4 * scores - 2 * 4 * n * (f + h), 2 * 4 * n * f));
  EXPECT_EQ(gpt->stage_cost(0, {.batch = 2, .seqlen = 64}, {}, Recompute::Selective).stored_bytes,
            2 * (layer - 4 * scores) + n * h);
}

TEST(AnalyticCostModelTest, LastStageHoldsTheLogitsForTheLoss) {
  auto m = analytic("gpt-6.7b", 2);
  const MicroBatchShape shape{.batch = 1, .seqlen = 2048};
  const std::int64_t logits_fp32 = 4LL * 2048 * 50304;
  const StageCost first = m->stage_cost(0, shape, {}, Recompute::Full);
  const StageCost last = m->stage_cost(1, shape, {}, Recompute::Full);
  EXPECT_GE(last.stored_bytes - first.stored_bytes, logits_fp32);
  EXPECT_GE(last.peak_bytes, logits_fp32);
}

TEST(AnalyticCostModelTest, StaticMemoryOfGpt67bAtPp4) {
  // Stage params: 8 layers of 201,379,840; stage 0 adds token + position tables
  // (50304 + 8192) x 4096; stage 3 adds the (tied) token table and the final LN.
  const std::int64_t layers = 8 * 201'379'840LL;
  const std::int64_t stage0 = layers + (50304 + 8192) * 4096LL;
  const std::int64_t stage3 = layers + 50304 * 4096LL + 2 * 4096;
  auto m = analytic("gpt-6.7b", 4);
  // Mixed-precision Adam: 16 bytes per parameter.
  EXPECT_EQ(m->static_bytes(0), 16 * stage0);
  EXPECT_EQ(m->static_bytes(1), 16 * layers);
  EXPECT_EQ(m->static_bytes(2), 16 * layers);
  EXPECT_EQ(m->static_bytes(3), 16 * stage3);
  // ZeRO-1 over 4 replicas: 2 + 2 + 12 / 4 = 7 bytes per parameter.
  EXPECT_EQ(analytic("gpt-6.7b", 4, "a100-40g", 4)->static_bytes(1), 7 * layers);
  // fp32 training (cpu): 4 + 4 + 8 / 2 = 12 bytes per parameter with 2 shards.
  EXPECT_EQ(analytic("gpt-6.7b", 4, "cpu", 2)->static_bytes(1), 12 * layers);
  EXPECT_EQ(model_state_bytes(10, 2, 3), 10 * 4 + 40);  // 120 / 3
  // One copy of the weights is the element size per parameter, whatever ZeRO shards.
  EXPECT_EQ(m->weight_bytes(0), 2 * stage0);
  EXPECT_EQ(m->weight_bytes(3), 2 * stage3);
  EXPECT_EQ(analytic("gpt-6.7b", 4, "a100-40g", 4)->weight_bytes(1), 2 * layers);
  EXPECT_EQ(analytic("gpt-6.7b", 4, "cpu", 2)->weight_bytes(1), 4 * layers);
  EXPECT_EQ(model_state_bytes(1, 2, 8), 4 + 2);         // 12 / 8 rounds up
}

TEST(AnalyticCostModelTest, CommunicationTimes) {
  auto m = analytic("gpt-6.7b", 4);
  EXPECT_DOUBLE_EQ(m->p2p_ms(0), 0);
  EXPECT_DOUBLE_EQ(m->p2p_ms(300'000'000), 0.005 + 1.0);  // 300 MB over 300 GB/s
  EXPECT_DOUBLE_EQ(m->allreduce_ms(1'000'000'000, 1), 0);
  // Ring: 2 (r - 1) / r of the bytes over the bus bandwidth + 2 (r - 1) latencies.
  EXPECT_DOUBLE_EQ(m->allreduce_ms(1'000'000'000, 4), 2 * 3 * 0.005 + 1.5 * 1e9 / 230e6);
}

TEST(AnalyticCostModelTest, DevicePresets) {
  EXPECT_EQ(device_preset_names(), (std::vector<std::string>{"a100-40g", "a100-80g", "h100-80g", "cpu"}));
  EXPECT_EQ(device_preset("a100-80g").memory_bytes, 80LL << 30);
  EXPECT_EQ(device_preset("cpu").bytes_per_element, 4);
  EXPECT_EQ(device_preset("cpu").memory_bytes, 24LL << 30);
  // Faster devices are faster.
  const MicroBatchShape shape{.batch = 4, .seqlen = 1024};
  EXPECT_LT(analytic("gpt-6.7b", 4, "h100-80g")->stage_cost(1, shape, {}, Recompute::None).fwd_ms,
            analytic("gpt-6.7b", 4, "a100-40g")->stage_cost(1, shape, {}, Recompute::None).fwd_ms);
  EXPECT_LT(analytic("gpt-6.7b", 4, "a100-80g")->stage_cost(1, shape, {}, Recompute::None).fwd_ms,
            analytic("gpt-6.7b", 4, "a100-40g")->stage_cost(1, shape, {}, Recompute::None).fwd_ms);
}

// Fused attention (the h100-80g preset) writes no scores: no bytes per score in memory,
// selective recomputation saves nothing, and backward recomputes QK^T.
TEST(AnalyticCostModelTest, FlashAttentionKeepsNoScores) {
  const ModelSpec gpt = load_model_spec("gpt-6.7b");
  DeviceSpec flash = device_preset("h100-80g");
  ASSERT_TRUE(flash.flash_attention);
  DeviceSpec unfused = flash;
  unfused.flash_attention = false;
  const CostModelOptions options{.num_stages = 4};
  const auto with_flash = make_analytic_cost_model(gpt, flash, options);
  const auto without = make_analytic_cost_model(gpt, unfused, options);
  auto stage = [](const CostModel& m, std::int64_t b, std::int64_t s, Recompute r) {
    return m.stage_cost(1, {.batch = b, .seqlen = s}, {}, r);
  };
  // The same tokens in rows of any length keep the same bytes (no s² term)...
  EXPECT_EQ(stage(*with_flash, 8, 1024, Recompute::None).stored_bytes,
            stage(*with_flash, 1, 8192, Recompute::None).stored_bytes);
  EXPECT_LT(stage(*without, 8, 1024, Recompute::None).stored_bytes,
            stage(*without, 1, 8192, Recompute::None).stored_bytes);
  // ...and selective recomputation keeps as much as none while costing more backward.
  const StageCost none = stage(*with_flash, 1, 8192, Recompute::None);
  const StageCost selective = stage(*with_flash, 1, 8192, Recompute::Selective);
  EXPECT_EQ(selective.stored_bytes, none.stored_bytes);
  EXPECT_GT(selective.bwd_input_ms, none.bwd_input_ms);
  // Forward: the same matmuls, no score traffic. The weight gradients do not change.
  const StageCost unfused_none = stage(*without, 1, 8192, Recompute::None);
  EXPECT_LT(none.fwd_ms, unfused_none.fwd_ms);
  EXPECT_EQ(none.bwd_weight_ms, unfused_none.bwd_weight_ms);
  // Halving the rows' length halves the attention and nothing else (the same tokens): the
  // input gradient loses 2.5 / backward_speedup of what the forward loses.
  const StageCost halves = stage(*with_flash, 2, 4096, Recompute::None);
  EXPECT_NEAR((none.bwd_input_ms - halves.bwd_input_ms) / (none.fwd_ms - halves.fwd_ms), 2.5 / flash.backward_speedup,
              1e-9);
}

TEST(AnalyticCostModelTest, BadSpecsAreNamed) {
  const ModelSpec gpt = load_model_spec("gpt-tiny");
  try {
    make_cost_model("analytic:tpu-v4", gpt, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_THAT(e.what(), HasSubstr("analytic:tpu-v4"));
    EXPECT_THAT(e.what(), HasSubstr("a100-40g"));
  }
  try {
    make_cost_model("/nonexistent/profile.json", gpt, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/profile.json"));
  }
  try {
    make_cost_model("analytic:cpu", gpt, {.num_stages = 2, .zero_shards = 0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("zero_shards must be >= 1, got 0"));
  }
  EXPECT_THROW(make_cost_model("analytic:cpu", gpt, {.num_stages = 5}), Error);
}

}  // namespace
}  // namespace dynapipe

namespace dynapipe {
namespace {

// Tensor parallelism without sequence parallelism (Korthikanti et al., Table 2): a layer
// stores s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes per device; FLOPs split t ways, plus four
// all-reduces of the hidden state per layer (two forward, two backward).
TEST(AnalyticTensorParallel, ShardsActivationsAndAddsAllReduces) {
  const ModelSpec spec = load_model_spec("gpt-6.7b");
  const double b = 1, s = 2048, h = spec.hidden, a = spec.heads;
  for (int t : {2, 4, 8}) {
    const auto one = make_cost_model("analytic:a100-40g", spec, {.num_stages = 32});
    const auto sharded = make_cost_model("analytic:a100-40g", spec, {.num_stages = 32, .tp = t});
    const StageCost c1 = one->stage_cost(1, {.batch = 1, .seqlen = 2048}, {}, Recompute::None);
    const StageCost ct = sharded->stage_cost(1, {.batch = 1, .seqlen = 2048}, {}, Recompute::None);
    EXPECT_NEAR(static_cast<double>(ct.stored_bytes), s * b * h * (10 + 24.0 / t + 5 * a * s / (h * t)), 1) << t;
    // One all-reduce of 2·s·h bytes over t ring members.
    const double allreduce = sharded->allreduce_ms(static_cast<std::int64_t>(2 * s * h), t);
    EXPECT_GT(allreduce, 0);
    EXPECT_GT(ct.fwd_ms, c1.fwd_ms / t + 2 * allreduce - 1e-9) << t;
    EXPECT_LT(ct.fwd_ms, c1.fwd_ms) << t;
    // Parameters of a layer split t ways (LayerNorm and the output biases replicated).
    EXPECT_NEAR(static_cast<double>(sharded->static_bytes(1)) / static_cast<double>(one->static_bytes(1)),
                1.0 / t, 0.002) << t;
  }
}

TEST(AnalyticTensorParallel, TpMustDivideTheHeads) {
  const ModelSpec spec = load_model_spec("gpt-6.7b");
  try {
    make_cost_model("analytic:a100-40g", spec, {.tp = 3});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("--tp must be >= 1 and divide the 32 attention heads"));
  }
}

}  // namespace
}  // namespace dynapipe
