// make_pipeline_problem / make_search_candidates over a fixed-table CostModel. Built
// only once the cost module has a library (CostModel's out-of-line members live there).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "dynapipe/core/error.h"
#include "dynapipe/schedule/schedule_search.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;

// Time and memory proportional to tokens; recompute trades memory for backward time.
class FixedCostModel final : public CostModel {
 public:
  explicit FixedCostModel(int num_stages, std::string device = "fixed") : stages_(num_stages) {
    device_.name = std::move(device);
    device_.link_latency_ms = 0.02;
    device_.link_bandwidth_gbs = 10;
  }
  const ModelSpec& model() const override { return model_; }
  const DeviceSpec& device() const override { return device_; }
  const std::vector<StageLayers>& stages() const override { return stages_; }
  StageCost stage_cost(int stage, const MicroBatchShape& shape, const AttentionDensity&,
                       Recompute recompute) const override {
    const double tokens = static_cast<double>(shape.tokens());
    const double factor = recompute == Recompute::None ? 1.0
                          : recompute == Recompute::Selective ? 0.6 : 0.25;
    StageCost c;
    c.fwd_ms = tokens * 1e-3 * (stage + 1);
    c.bwd_ms = 2 * c.fwd_ms * (recompute == Recompute::Full ? 1.5 : 1.0);
    c.bwd_input_ms = c.bwd_ms / 2;
    c.bwd_weight_ms = c.bwd_ms / 2;
    c.stored_bytes = static_cast<std::int64_t>(tokens * 1000 * factor);
    c.peak_bytes = static_cast<std::int64_t>(tokens * 100);
    c.output_bytes = static_cast<std::int64_t>(tokens * 10);
    return c;
  }
  std::int64_t static_bytes(int stage) const override { return 1'000'000 * (stage + 1); }
  std::int64_t weight_bytes(int stage) const override { return 250'000 * (stage + 1); }
  double p2p_ms(std::int64_t bytes) const override { return bytes * 1e-7; }
  double allreduce_ms(std::int64_t, int) const override { return 0; }
  std::string describe() const override { return "fixed"; }

 private:
  ModelSpec model_;
  DeviceSpec device_;
  std::vector<StageLayers> stages_;
};

std::vector<MicroBatch> microbatches(const std::vector<std::int64_t>& seqlens) {
  std::vector<MicroBatch> out;
  for (std::size_t i = 0; i < seqlens.size(); ++i) {
    MicroBatch mb;
    mb.id = static_cast<int>(i);
    mb.shape = {.batch = 2, .seqlen = seqlens[i]};
    out.push_back(mb);
  }
  return out;
}

TEST(CostBridgeTest, BuildsTheProblemFromTheCostModel) {
  const FixedCostModel model(4);
  const auto mbs = microbatches({128, 512, 256});
  const PipelineProblem p =
      make_pipeline_problem(model, mbs, Recompute::Full, {2, 2}, 123456789);
  EXPECT_EQ(p.num_microbatches(), 3);
  EXPECT_EQ(p.num_stages(), 4);
  // Device 0 holds virtual stages 0 and 2.
  EXPECT_EQ(p.static_bytes, (std::vector<std::int64_t>{1'000'000 + 3'000'000,
                                                       2'000'000 + 4'000'000}));
  EXPECT_EQ(p.weight_bytes, (std::vector<std::int64_t>{250'000 + 750'000, 500'000 + 1'000'000}));
  EXPECT_EQ(p.memory_limit_bytes, 123456789);
  EXPECT_DOUBLE_EQ(p.link_latency_ms, 0.02);
  EXPECT_DOUBLE_EQ(p.link_bandwidth_gbs, 10);
  EXPECT_DOUBLE_EQ(p.costs[1][3].fwd_ms, 1024 * 1e-3 * 4);
  EXPECT_EQ(p.costs[1][3].stored_bytes, 1024 * 1000 / 4);
}

TEST(CostBridgeTest, RejectsMismatchedLayoutsAndIds) {
  const FixedCostModel model(4);
  auto mbs = microbatches({128, 256});
  try {
    make_pipeline_problem(model, mbs, Recompute::None, {4, 2}, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("must equal layout.num_stages() (8), got 4"));
  }
  mbs[1].id = 5;
  EXPECT_THROW(make_pipeline_problem(model, mbs, Recompute::None, {4, 1}, 0), Error);
}

TEST(CostBridgeTest, AutoCandidatesCoverScheduleTimesRecompute) {
  const FixedCostModel model(4), interleaved(8);
  const auto mbs = microbatches({128, 512, 256, 64, 1024, 32});
  auto without = make_search_candidates(ScheduleKind::Auto, model, nullptr, mbs, 4, 0);
  EXPECT_EQ(without.size(), 6u * 3u);  // no interleaved without virtual stages
  auto with = make_search_candidates(ScheduleKind::Auto, model, &interleaved, mbs, 4, 0);
  ASSERT_EQ(with.size(), 7u * 3u);
  EXPECT_EQ(with[2].schedule, ScheduleKind::Interleaved);
  EXPECT_EQ(with[2].problem->layout.chunks, 2);
  EXPECT_EQ(with[6].schedule, ScheduleKind::CriticalPath);
  EXPECT_EQ(with[7].recompute, Recompute::Selective);
  const SearchResult r = search_schedule(with);
  EXPECT_TRUE(r.sim.fits_memory);
  EXPECT_EQ(make_search_candidates(ScheduleKind::OneFOneB, model, nullptr, mbs, 4, 0).size(), 3u);
  EXPECT_THROW(make_search_candidates(ScheduleKind::Interleaved, model, nullptr, mbs, 4, 0), Error);
}

// auto leaves critical-path out where the plan is for the CPU runtime (its eager forwards
// measured slower there than their estimate); by name it is still a candidate.
TEST(CostBridgeTest, AutoOnTheCpuDeviceLeavesCriticalPathOut) {
  const FixedCostModel cpu(4, "cpu"), gpu(4, "a100-40g");
  const auto mbs = microbatches({128, 512, 256, 64});
  auto schedules = [&](const CostModel& model) {
    std::vector<ScheduleKind> kinds;
    for (const auto& c : make_search_candidates(ScheduleKind::Auto, model, nullptr, mbs, 4, 0)) {
      if (c.recompute == Recompute::None) kinds.push_back(c.schedule);
    }
    return kinds;
  };
  EXPECT_THAT(schedules(gpu), ::testing::Contains(ScheduleKind::CriticalPath));
  EXPECT_THAT(schedules(cpu), ::testing::Not(::testing::Contains(ScheduleKind::CriticalPath)));
  EXPECT_EQ(schedules(cpu).size() + 1, schedules(gpu).size());
  EXPECT_EQ(make_search_candidates(ScheduleKind::CriticalPath, cpu, nullptr, mbs, 4, 0).size(), 3u);
}

// Each micro-batch's lightest mode under 1F1B's rule, by hand (4 stages, 6 MB; T = 2 ·
// seqlen tokens; stage s holds static (s + 1) MB + (4 − s) · (stored + 10 T) + peak 100 T,
// stored = 1000 T · 1 / 0.6 / 0.25): seqlen 128 fits without recomputation, 768 in
// selective (stage 3: 5.09 MB; none: stage 0 7.36 MB), 1024 in full only (selective:
// stage 0 6.2 MB), 4096 in none (full: stage 0 10.3 MB), so it gets the ceiling.
TEST(CostBridgeTest, LightestFittingModesGivesEachMicroBatchItsLightestFit) {
  const FixedCostModel model(4);
  const auto mbs = microbatches({128, 768, 1024, 4096});
  using enum Recompute;
  EXPECT_EQ(lightest_fitting_modes(model, mbs, Full, 6'000'000),
            (std::vector<Recompute>{None, Selective, Full, Full}));
  EXPECT_EQ(lightest_fitting_modes(model, mbs, Selective, 6'000'000),
            (std::vector<Recompute>{None, Selective, Selective, Selective}));
  EXPECT_EQ(lightest_fitting_modes(model, mbs, Full, 0), std::vector<Recompute>(4, None));
}

// With `mixed`, a mode whose micro-batches fit lighter ones gets each schedule on that mix
// first, then on its own problem; the mix's problem costs each micro-batch in its mode.
TEST(CostBridgeTest, MixedCandidatesPutTheMixBeforeTheModesOwnProblem) {
  const FixedCostModel model(4);
  const auto mbs = microbatches({128, 768, 1024, 4096});
  const auto one = make_search_candidates(ScheduleKind::OneFOneB, model, nullptr, mbs, 4,
                                          6'000'000);
  const auto mixed = make_search_candidates(ScheduleKind::OneFOneB, model, nullptr, mbs, 4,
                                            6'000'000, /*mixed=*/true);
  using enum Recompute;
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(mixed.size(), 5u);  // none alone (nothing lighter), selective and full mixed
  EXPECT_EQ(mixed[0].recompute, None);
  EXPECT_TRUE(mixed[0].modes.empty());
  EXPECT_EQ(mixed[1].recompute, Selective);
  EXPECT_EQ(mixed[1].modes, (std::vector<Recompute>{None, Selective, Selective, Selective}));
  EXPECT_TRUE(mixed[2].modes.empty());
  EXPECT_EQ(mixed[3].recompute, Full);
  EXPECT_EQ(mixed[3].modes, (std::vector<Recompute>{None, Selective, Full, Full}));
  // Micro-batch 0 runs without recomputation in the full mix: the none problem's costs.
  EXPECT_EQ(mixed[3].problem->costs[0][0].stored_bytes, one[0].problem->costs[0][0].stored_bytes);
  EXPECT_EQ(mixed[3].problem->costs[1][2].stored_bytes, one[1].problem->costs[1][2].stored_bytes);
  EXPECT_EQ(mixed[3].problem->costs[2][1].stored_bytes, one[2].problem->costs[2][1].stored_bytes);
  EXPECT_EQ(mixed[4].problem->costs[0][0].stored_bytes, one[2].problem->costs[0][0].stored_bytes);
  const auto mix_only = make_mode_candidates(ScheduleKind::OneFOneB, model, nullptr, mbs, Full,
                                             4, 6'000'000, /*mixed=*/true, /*mix_only=*/true);
  ASSERT_EQ(mix_only.size(), 1u);
  EXPECT_EQ(mix_only[0].modes, mixed[3].modes);
}

TEST(CostBridgeTest, TightMemoryPicksRecomputation) {
  const FixedCostModel model(4);
  const auto mbs = microbatches({512, 512, 512, 512, 512, 512, 512, 512});
  // Stage 3: 4 MB static + one micro-batch in flight (1.024 MB stored, 0.1 MB peak)
  // exceeds 5 MB; selective recompute stores 0.61 MB and fits.
  auto candidates = make_search_candidates(ScheduleKind::OneFOneB, model, nullptr, mbs, 4, 5'000'000);
  const SearchResult r = search_schedule(candidates);
  EXPECT_EQ(r.recompute, Recompute::Selective);
  EXPECT_TRUE(r.sim.fits_memory);
}

}  // namespace
}  // namespace dynapipe
