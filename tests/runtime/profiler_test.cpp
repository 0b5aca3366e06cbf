// `dynapipe profile`'s measurement: the allocator tracker, and tiny grids of gpt-tiny and
// t5-tiny that must be sane, round-trip through the format and plan.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/cost/profile.h"
#include "dynapipe/runtime/profiler.h"
#include "runtime/profile/memory_tracker.h"

namespace dynapipe::runtime {
namespace {

TEST(ProfilerTest, MemoryTrackerSeesAllocationsAndFrees) {
  profile::MemoryTracker tracker;
  tracker.start();
  {
    at::Tensor a = at::empty({1 << 18}, at::kFloat);  // 1 MiB
    EXPECT_GE(tracker.current(), std::int64_t{1} << 20);
    {
      at::Tensor b = at::empty({1 << 19}, at::kFloat);  // 2 MiB, freed at once
    }
    EXPECT_GE(tracker.peak(), std::int64_t{3} << 20);
  }
  EXPECT_EQ(tracker.current(), 0);
  tracker.stop();
  at::Tensor untracked = at::empty({1 << 18}, at::kFloat);
  EXPECT_EQ(tracker.current(), 0);
}

ProfilerOptions tiny_grid() {
  ProfilerOptions o;
  o.grid = {{1, 2}, {16, 32}, {8, 16}};
  o.warmup = 1;
  o.repeats = 1;
  return o;
}

// A point with every coordinate <= another's stores no more.
void expect_monotone_stored(const std::vector<ProfilePoint>& points) {
  for (const ProfilePoint& a : points) {
    for (const ProfilePoint& b : points) {
      if (a.batch <= b.batch && a.seqlen <= b.seqlen && a.dec_seqlen <= b.dec_seqlen) {
        EXPECT_LE(a.stored_bytes, b.stored_bytes)
            << "b " << a.batch << " s " << a.seqlen << " d " << a.dec_seqlen << " vs b " << b.batch
            << " s " << b.seqlen << " d " << b.dec_seqlen;
      }
    }
  }
}

void check_profile(const std::string& model, std::size_t kinds) {
  const ModelSpec spec = load_model_spec(model);
  int calls = 0;
  ProfilerOptions options = tiny_grid();
  options.progress = [&](const ProfileProgress& p) {
    ++calls;
    EXPECT_EQ(p.done, calls);
    EXPECT_LE(p.done, p.total);
  };
  const Profile p = measure_profile(spec, options);
  EXPECT_GT(calls, 0);
  ASSERT_EQ(p.layers.size(), kinds);
  for (const ProfileLayer& layer : p.layers) {
    SCOPED_TRACE(std::string(profile_layer_kind_name(layer.kind)));
    EXPECT_GT(layer.parameter_bytes, 0);
    const bool modes = layer.kind != ProfileLayerKind::Embedding && layer.kind != ProfileLayerKind::Head;
    for (int mode = 0; mode < 3; ++mode) {
      const auto& points = layer.points[mode];
      if (!modes && mode > 0) {
        EXPECT_TRUE(points.empty());
        continue;
      }
      const std::size_t per_row = layer.kind == ProfileLayerKind::Decoder ? 8 : 4;
      EXPECT_EQ(points.size(), layer.kind == ProfileLayerKind::Embedding && spec.kind == ModelKind::T5
                                   ? 6u : per_row);
      for (const ProfilePoint& pt : points) {
        EXPECT_GT(pt.fwd_ms, 0);
        EXPECT_GT(pt.bwd_ms, 0);
        ASSERT_TRUE(pt.bwd_input_ms && pt.bwd_weight_ms);
        EXPECT_GE(*pt.bwd_input_ms, 0);
        EXPECT_GE(*pt.bwd_weight_ms, 0);
        EXPECT_GT(pt.stored_bytes, 0);
        EXPECT_GE(pt.peak_bytes, 0);
      }
      expect_monotone_stored(points);
    }
    if (modes) {
      // Recomputation stores less: full < selective <= none, shape by shape.
      for (std::size_t i = 0; i < layer.points[0].size(); ++i) {
        EXPECT_LT(layer.points[2][i].stored_bytes, layer.points[1][i].stored_bytes);
        EXPECT_LT(layer.points[1][i].stored_bytes, layer.points[0][i].stored_bytes);
      }
    }
  }
  const Profile again = parse_profile(profile_to_json(p), "measured");
  EXPECT_EQ(again, p);
  auto cost = make_profiled_cost_model(again, {.num_stages = 2});
  for (int stage = 0; stage < 2; ++stage) {
    const StageCost c = cost->stage_cost(stage, {.batch = 2, .seqlen = 24, .dec_seqlen = 12}, {},
                                         Recompute::Selective);
    EXPECT_GT(c.fwd_ms, 0);
    EXPECT_GT(c.bwd_ms, 0);
    EXPECT_GT(c.stored_bytes, 0);
  }
}

TEST(ProfilerTest, GptTinyTinyGrid) { check_profile("gpt-tiny", 3); }
TEST(ProfilerTest, T5TinyTinyGrid) { check_profile("t5-tiny", 4); }

TEST(ProfilerTest, RejectsBadOptions) {
  const ModelSpec gpt = load_model_spec("gpt-tiny");
  ProfilerOptions o = tiny_grid();
  o.grid.batches = {4};
  EXPECT_THROW(measure_profile(gpt, o), Error);
  o = tiny_grid();
  o.grid.seqlens = {};
  EXPECT_THROW(measure_profile(gpt, o), Error);
  o = tiny_grid();
  o.grid.seqlens = {16, gpt.max_positions + 1};
  EXPECT_THROW(measure_profile(gpt, o), Error);
  o = tiny_grid();
  o.repeats = 0;
  EXPECT_THROW(measure_profile(gpt, o), Error);
}

TEST(ProfilerTest, MemoryLimitSkipsTheRowsTail) {
  const ModelSpec gpt = load_model_spec("gpt-tiny");
  ProfilerOptions o = tiny_grid();
  o.grid.batches = {1, 2, 64};
  // Fits b = 1, 2 of every kind at these lengths but not b = 64 of the layer without
  // recomputation (about 32 MiB stored).
  o.memory_limit_bytes = std::int64_t{8} << 20;
  const Profile p = measure_profile(gpt, o);
  const ProfileLayer* layer = p.find(ProfileLayerKind::Layer);
  ASSERT_NE(layer, nullptr);
  std::set<std::int64_t> batches;
  for (const ProfilePoint& pt : layer->points[0]) {
    batches.insert(pt.batch);
    EXPECT_LE(pt.stored_bytes + pt.peak_bytes, o.memory_limit_bytes);
  }
  EXPECT_EQ(batches, (std::set<std::int64_t>{1, 2}));
  EXPECT_EQ(p.device.memory_bytes, o.memory_limit_bytes);
}

// Whole-stage mode: the profiled model's stage sums at every measured shape are the
// measured stage times (the analytic tables are scaled to them), for both families.
void check_stage_profile(const std::string& model, int pp, StageProfilerOptions o,
                         std::size_t shapes) {
  const ModelSpec spec = load_model_spec(model);
  o.pp = pp;
  o.warmup = 0;
  o.repeats = 1;
  int calls = 0;
  o.progress = [&](const ProfileProgress& p) {
    EXPECT_EQ(p.done, ++calls);
    EXPECT_EQ(p.total, static_cast<int>(shapes));
  };
  const StageProfile r = measure_stage_profile(spec, o);
  ASSERT_EQ(r.measurements.size(), shapes);
  const Profile again = parse_profile(profile_to_json(r.profile), "stage.json");
  const auto cost = make_profiled_cost_model(again, {.num_stages = pp});
  std::vector<StageCost> stages(static_cast<std::size_t>(pp));
  for (const StageMeasurement& m : r.measurements) {
    SCOPED_TRACE(cat("b ", m.batch, " s ", m.seqlen, " d ", m.dec_seqlen));
    EXPECT_LE(m.batch * (m.seqlen + m.dec_seqlen), std::max(o.max_tokens, m.seqlen + m.dec_seqlen));
    ASSERT_EQ(m.fwd_ms.size(), static_cast<std::size_t>(pp));
    double fwd = 0, bwd = 0, est_fwd = 0, est_bwd = 0;
    for (int s = 0; s < pp; ++s) {
      EXPECT_GT(m.fwd_ms[s], 0);
      EXPECT_GT(m.bwd_ms[s], 0);
      fwd += m.fwd_ms[s];
      bwd += m.bwd_ms[s];
    }
    cost->stage_costs({.batch = m.batch, .seqlen = m.seqlen, .dec_seqlen = m.dec_seqlen}, {},
                      Recompute::None, stages);
    for (const StageCost& c : stages) {
      est_fwd += c.fwd_ms;
      est_bwd += c.bwd_ms;
    }
    EXPECT_NEAR(est_fwd, fwd, 1e-3 + 1e-6 * fwd);
    EXPECT_NEAR(est_bwd, bwd, 1e-3 + 1e-6 * bwd);
  }
}

TEST(StageProfilerTest, GptTwoStagesSumToTheMeasuredStages) {
  StageProfilerOptions o;
  o.seqlens = {16, 32};
  o.max_tokens = 64;  // s 16: 1 and 4 rows; s 32: 1 and 2
  check_stage_profile("gpt-tiny", 2, o, 4);
}

TEST(StageProfilerTest, T5OneStageSumsToTheMeasuredStage) {
  StageProfilerOptions o;
  o.seqlens = {16, 32};
  // Every encoder length is a decoder length too (as the default grids are), so each shape
  // pairs equal lengths: the head and decoder embedding are read at the measured ratio.
  o.dec_seqlens = {8, 16, 32};
  o.max_tokens = 64;  // (16, 16): 1 and 2 rows; (32, 32): 1
  check_stage_profile("t5-tiny", 1, o, 3);
}

TEST(StageProfilerTest, RejectsBadOptions) {
  const ModelSpec spec = load_model_spec("gpt-tiny");
  auto message = [&](StageProfilerOptions o) {
    try {
      o.validate(spec);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  StageProfilerOptions o;
  o.pp = 5;
  EXPECT_EQ(message(o), "--pp must be in [1, 4] (the model's layers), got 5");
  o = {};
  o.seqlens = {64};
  EXPECT_EQ(message(o), "--seqlens must hold at least two distinct values, got '64'");
  o = {};
  o.modes = {Recompute::Full};
  EXPECT_EQ(message(o), "--stage-recompute must include none (embedding and head tables scale with it)");
  o = {};
  o.max_tokens = 0;
  EXPECT_EQ(message(o), "--max-tokens must be >= 1, got 0");
}

}  // namespace
}  // namespace dynapipe::runtime
