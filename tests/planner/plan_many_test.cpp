// plan_many(): every request's iterations on a pool of threads give what planning them in
// order gives, progress ends each request once, and a request's error is its first
// failing iteration's.
#include "dynapipe/planner/plan_many.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/plan/plan_json.h"

namespace dynapipe {
namespace {

PlanConfig gpt_small(Strategy strategy) {
  PlanConfig config;
  config.model = load_model_spec("gpt-small");
  config.strategy = strategy;
  config.cost_model = "analytic:a100-40g";
  config.pp = 2;
  config.max_seqlen = 4096;
  config.max_target_len = 4096;
  config.global_batch_tokens = 8192;
  config.memory_limit_gib = 8;
  return config;
}

// One global batch per list of input lengths (target 16 each), sample ids counting up.
std::vector<GlobalBatch> batches(const std::vector<std::vector<int>>& lengths) {
  std::vector<GlobalBatch> out;
  SampleId id = 0;
  for (const std::vector<int>& batch : lengths) {
    GlobalBatch& b = out.emplace_back();
    b.index = static_cast<std::int64_t>(out.size()) - 1;
    for (int input : batch) b.samples.push_back({.id = id++, .input_len = input, .target_len = 16});
  }
  return out;
}

TEST(PlanManyTest, TheSamePlansAsInOrderWithProgressPerIteration) {
  const Planner dynapipe(gpt_small(Strategy::DynaPipe));
  const Planner token_based(gpt_small(Strategy::TokenBased));
  const std::vector<GlobalBatch> a = batches({{100, 2000, 300, 40, 900}, {4000, 50, 60}, {700, 700, 700}});
  const std::vector<GlobalBatch> b = batches({{1500, 30, 30, 30}, {3000, 1000}});
  const std::vector<PlanRequest> requests = {{&dynapipe, a}, {&token_based, b}, {&dynapipe, b}};
  for (int threads : {1, 3}) {
    std::map<std::size_t, std::vector<std::size_t>> lefts;
    const std::vector<PlannedIterations> out =
        plan_many(requests, threads, [&](std::size_t r, std::size_t left) { lefts[r].push_back(left); });
    ASSERT_EQ(out.size(), requests.size());
    for (std::size_t r = 0; r < requests.size(); ++r) {
      ASSERT_FALSE(out[r].error) << r;
      ASSERT_EQ(out[r].iterations.size(), requests[r].batches.size()) << r;
      for (std::size_t i = 0; i < out[r].iterations.size(); ++i) {
        // Bit for bit the plan of planning it alone, but for the measured planning time.
        IterationPlan alone = requests[r].planner->plan_iteration(requests[r].batches[i]);
        IterationPlan got = out[r].iterations[i];
        alone.planning_ms = got.planning_ms = 0;
        EXPECT_EQ(iteration_to_json(got, ModelKind::Gpt, -1), iteration_to_json(alone, ModelKind::Gpt, -1))
            << r << " " << i;
      }
      // One call per iteration, counting down to 0.
      std::vector<std::size_t> expected;
      for (std::size_t left = requests[r].batches.size(); left-- > 0;) expected.push_back(left);
      EXPECT_EQ(lefts[r], expected) << r << ", " << threads << " threads";
    }
  }
}

TEST(PlanManyTest, ARequestFailsWithItsFirstFailingIteration) {
  PlanConfig config = gpt_small(Strategy::DynaPipe);
  config.max_seqlen = config.max_target_len = 65536;
  const Planner planner(config);
  // Iterations 1 and 2 each hold a sample too large for 8 GiB (ids 2 and 3); the other
  // request is fine and still planned.
  const std::vector<GlobalBatch> bad = batches({{100, 200}, {65000}, {65000}, {300}});
  const std::vector<GlobalBatch> good = batches({{100, 200}});
  const std::vector<PlanRequest> requests = {{&planner, bad}, {&planner, good}};
  for (int threads : {1, 4}) {
    std::map<std::size_t, std::size_t> calls;
    const std::vector<PlannedIterations> out =
        plan_many(requests, threads, [&](std::size_t r, std::size_t) { ++calls[r]; });
    ASSERT_TRUE(out[0].error);
    EXPECT_TRUE(out[0].iterations.empty());
    try {
      std::rethrow_exception(out[0].error);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Infeasible);
      EXPECT_THAT(e.what(), ::testing::HasSubstr("sample 2 "));
    }
    EXPECT_FALSE(out[1].error);
    EXPECT_EQ(out[1].iterations.size(), 1u);
    EXPECT_EQ(calls[0], bad.size()) << "every iteration ends once, skipped ones too";
    EXPECT_EQ(calls[1], 1u);
  }
}

}  // namespace
}  // namespace dynapipe
