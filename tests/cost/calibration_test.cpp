#include "dynapipe/cost/calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "dynapipe/core/error.h"

namespace dynapipe {
namespace {

std::shared_ptr<const CostModel> gpt_tiny(int stages) {
  return make_cost_model("analytic:cpu", load_model_spec("gpt-tiny"), {.num_stages = stages});
}

TEST(CalibrationTest, UncalibratedModelAnswersLikeItsBase) {
  auto base = gpt_tiny(2);
  auto calibration = std::make_shared<CostCalibration>(2);
  auto model = make_calibrated_cost_model(base, calibration);
  const MicroBatchShape shape{.batch = 4, .seqlen = 256};
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(model->stage_cost(s, shape, {}, Recompute::None), base->stage_cost(s, shape, {}, Recompute::None));
    EXPECT_EQ(model->static_bytes(s), base->static_bytes(s));
  }
  EXPECT_EQ(model->describe(), base->describe());
}

TEST(CalibrationTest, StageCostsScalesEveryStageAsStageCostDoes) {
  auto calibration = std::make_shared<CostCalibration>(3, 1.0);
  calibration->observe(1, {.measured_ms = 2, .base_ms = 1}, {.measured_ms = 3, .base_ms = 1});
  auto model = make_calibrated_cost_model(gpt_tiny(3), calibration);
  const MicroBatchShape shape{.batch = 2, .seqlen = 384};
  std::vector<StageCost> all(3);
  model->stage_costs(shape, {.enc = 0.5}, Recompute::Selective, all);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(all[static_cast<std::size_t>(s)],
              model->stage_cost(s, shape, {.enc = 0.5}, Recompute::Selective));
  }
  EXPECT_NE(all[1], gpt_tiny(3)->stage_cost(1, shape, {.enc = 0.5}, Recompute::Selective));
}

TEST(CalibrationTest, FirstObservationIsTakenWholeThenSmoothedGeometrically) {
  CostCalibration c(2, 0.5);
  c.observe(1, {.measured_ms = 30, .base_ms = 10}, {.measured_ms = 10, .base_ms = 20});
  EXPECT_DOUBLE_EQ(c.forward_factor(1), 3.0);
  EXPECT_DOUBLE_EQ(c.backward_factor(1), 0.5);
  EXPECT_DOUBLE_EQ(c.forward_factor(0), 1.0) << "other stages untouched";
  // sqrt(3 * 12) = 6: half way in log space.
  c.observe(1, {.measured_ms = 120, .base_ms = 10}, {});
  EXPECT_NEAR(c.forward_factor(1), 6.0, 1e-12);
  EXPECT_DOUBLE_EQ(c.backward_factor(1), 0.5) << "an empty observation changes nothing";
  EXPECT_EQ(c.describe(), "stage 0: fwd x1.00 bwd x1.00 mem x1.00, stage 1: fwd x6.00 bwd x0.50 mem x1.00");
}

TEST(CalibrationTest, ScalesTimesNotActivationMemory) {
  auto base = gpt_tiny(2);
  auto calibration = std::make_shared<CostCalibration>(2, 1.0);
  calibration->observe(0, {.measured_ms = 2, .base_ms = 1}, {.measured_ms = 3, .base_ms = 1});
  auto model = make_calibrated_cost_model(base, calibration);
  const MicroBatchShape shape{.batch = 2, .seqlen = 512};
  const StageCost b = base->stage_cost(0, shape, {}, Recompute::Full);
  const StageCost c = model->stage_cost(0, shape, {}, Recompute::Full);
  EXPECT_DOUBLE_EQ(c.fwd_ms, 2 * b.fwd_ms);
  EXPECT_DOUBLE_EQ(c.bwd_ms, 3 * b.bwd_ms);
  EXPECT_DOUBLE_EQ(c.bwd_input_ms, 3 * b.bwd_input_ms);
  EXPECT_DOUBLE_EQ(c.bwd_weight_ms, 3 * b.bwd_weight_ms);
  EXPECT_EQ(c.stored_bytes, b.stored_bytes);
  EXPECT_EQ(c.peak_bytes, b.peak_bytes);
  EXPECT_EQ(c.output_bytes, b.output_bytes);
  EXPECT_EQ(model->stage_cost(1, shape, {}, Recompute::Full), base->stage_cost(1, shape, {}, Recompute::Full));
}

// A fake feed of measured peaks: 100 MiB static, the model's activations 50 MiB, measured
// 175 MiB -> the activations are 1.5x the model's; then 250 MiB (3x) -> sqrt(1.5 * 3).
TEST(CalibrationTest, MeasuredPeaksScaleTheActivationBytes) {
  const double mib = 1 << 20;
  auto base = gpt_tiny(2);
  auto calibration = std::make_shared<CostCalibration>(2, 0.5);
  auto model = make_calibrated_cost_model(base, calibration);
  calibration->observe_memory(1, {.measured_bytes = 175 * mib, .static_bytes = 100 * mib, .activation_bytes = 50 * mib});
  EXPECT_DOUBLE_EQ(calibration->memory_factor(1), 1.5);
  EXPECT_DOUBLE_EQ(calibration->memory_factor(0), 1.0) << "other stages untouched";
  const MicroBatchShape shape{.batch = 2, .seqlen = 512};
  const StageCost b = base->stage_cost(1, shape, {}, Recompute::None);
  StageCost c = model->stage_cost(1, shape, {}, Recompute::None);
  EXPECT_EQ(c.stored_bytes, std::llround(1.5 * static_cast<double>(b.stored_bytes)));
  EXPECT_EQ(c.peak_bytes, std::llround(1.5 * static_cast<double>(b.peak_bytes)));
  EXPECT_EQ(c.output_bytes, b.output_bytes) << "transfers are not activations kept";
  EXPECT_DOUBLE_EQ(c.fwd_ms, b.fwd_ms);
  EXPECT_EQ(model->static_bytes(1), base->static_bytes(1));
  calibration->observe_memory(1, {.measured_bytes = 250 * mib, .static_bytes = 100 * mib, .activation_bytes = 50 * mib});
  EXPECT_NEAR(calibration->memory_factor(1), std::sqrt(4.5), 1e-12);
  // Not usable: measured at or below static, no activations estimated.
  calibration->observe_memory(1, {.measured_bytes = 90 * mib, .static_bytes = 100 * mib, .activation_bytes = 50 * mib});
  calibration->observe_memory(1, {.measured_bytes = 200 * mib, .static_bytes = 100 * mib, .activation_bytes = 0});
  EXPECT_NEAR(calibration->memory_factor(1), std::sqrt(4.5), 1e-12);
  EXPECT_EQ(calibration->describe(), "stage 0: fwd x1.00 bwd x1.00 mem x1.00, stage 1: fwd x1.00 bwd x1.00 mem x2.12");
  EXPECT_THROW(calibration->observe_memory(2, {}), Error);
}

TEST(CalibrationTest, ConvergesToTheMeasuredRatio) {
  CostCalibration c(1, 0.5);
  for (int step = 0; step < 30; ++step) {
    const double noise = step % 2 == 0 ? 1.1 : 1 / 1.1;
    c.observe(0, {.measured_ms = 40 * noise, .base_ms = 10}, {.measured_ms = 25, .base_ms = 10});
  }
  EXPECT_NEAR(c.forward_factor(0), 4.0, 4.0 * 0.06);
  EXPECT_DOUBLE_EQ(c.backward_factor(0), 2.5);
}

TEST(CalibrationTest, ReadersAndAWriterOnThreads) {
  auto calibration = std::make_shared<CostCalibration>(2);
  auto model = make_calibrated_cost_model(gpt_tiny(2), calibration);
  std::thread writer([&] {
    for (int k = 1; k <= 2000; ++k) calibration->observe(k % 2, {.measured_ms = 2.0 * k, .base_ms = 1.0 * k}, {});
  });
  double last = 0;
  for (int k = 0; k < 2000; ++k) last = model->stage_cost(0, {.batch = 1, .seqlen = 64}, {}, Recompute::None).fwd_ms;
  writer.join();
  EXPECT_GT(last, 0);
  EXPECT_DOUBLE_EQ(calibration->forward_factor(0), 2.0);
}

TEST(CalibrationTest, RejectsBadArguments) {
  EXPECT_THROW(CostCalibration(0), Error);
  EXPECT_THROW(CostCalibration(2, 0.0), Error);
  EXPECT_THROW(CostCalibration(2, 1.5), Error);
  CostCalibration c(2);
  EXPECT_THROW(c.observe(2, {}, {}), Error);
  EXPECT_THROW(make_calibrated_cost_model(gpt_tiny(3), std::make_shared<CostCalibration>(2)), Error);
}

}  // namespace
}  // namespace dynapipe
