// plan/ micro-benchmarks: lowering, verification and the codecs on a 64-micro-batch ×
// 8-stage 1F1B replica (the size the planner lowers and verifies for every plan).
//
//   build/bench/plan_bench --benchmark_filter=Verify
//
// TODO(plan): take the schedule from schedule/ once it lands; until then the test-local
// 1F1B generator + simulator stand in (tests/plan/test_pipelines.h).
#include <benchmark/benchmark.h>

#include "../tests/plan/test_pipelines.h"
#include "dynapipe/plan/plan_binary.h"
#include "dynapipe/plan/plan_json.h"
#include "dynapipe/plan/verifier.h"

namespace dynapipe {
namespace {

constexpr int kStages = 8;
constexpr int kMicrobatches = 64;

struct Fixture {
  PipelineLayout layout{.num_devices = kStages};
  ScheduleOrder order = testing::one_f_one_b(kStages, kMicrobatches);
  SimResult sim = testing::simulate(order, layout, kMicrobatches, 1.0, 0.1);
  LoweringInput input;
  Fixture() {
    input.model = ModelKind::Gpt;
    input.hidden = 4096;
    input.layout = layout;
    input.microbatches = testing::varied_shapes(kMicrobatches, ModelKind::Gpt);
    input.stages = testing::gpt_stages(kStages);
    input.order = &order;
    input.sim = &sim;
  }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

void BM_Lower(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(lower_to_programs(fixture().input));
}
BENCHMARK(BM_Lower)->Unit(benchmark::kMicrosecond);

void BM_Verify(benchmark::State& state) {
  std::vector<ExecutorProgram> programs = lower_to_programs(fixture().input);
  VerifyOptions options;
  options.layout = fixture().layout;
  options.num_microbatches = kMicrobatches;
  std::int64_t instructions = 0;
  for (const auto& p : programs) instructions += static_cast<std::int64_t>(p.instructions.size());
  for (auto _ : state) benchmark::DoNotOptimize(verify_programs(programs, options));
  state.counters["instructions"] = static_cast<double>(instructions);
}
BENCHMARK(BM_Verify)->Unit(benchmark::kMicrosecond);

IterationPlan iteration() {
  ExecutionPlan plan = testing::sample_plan(ModelKind::Gpt, kStages, 1, 1, kMicrobatches);
  return plan.iterations[0];
}

void BM_EncodeBinary(benchmark::State& state) {
  IterationPlan it = iteration();
  for (auto _ : state) benchmark::DoNotOptimize(encode_iteration(it));
  state.counters["bytes"] = static_cast<double>(encode_iteration(it).size());
}
BENCHMARK(BM_EncodeBinary)->Unit(benchmark::kMicrosecond);

void BM_DecodeBinary(benchmark::State& state) {
  std::string bytes = encode_iteration(iteration());
  for (auto _ : state) benchmark::DoNotOptimize(decode_iteration(bytes));
}
BENCHMARK(BM_DecodeBinary)->Unit(benchmark::kMicrosecond);

void BM_IterationToJson(benchmark::State& state) {
  IterationPlan it = iteration();
  for (auto _ : state) benchmark::DoNotOptimize(iteration_to_json(it, ModelKind::Gpt, -1));
  state.counters["bytes"] = static_cast<double>(iteration_to_json(it, ModelKind::Gpt, -1).size());
}
BENCHMARK(BM_IterationToJson)->Unit(benchmark::kMicrosecond);

void BM_IterationFromJson(benchmark::State& state) {
  std::string text = iteration_to_json(iteration(), ModelKind::Gpt, -1);
  for (auto _ : state) benchmark::DoNotOptimize(iteration_from_json(text, ModelKind::Gpt, "bench"));
}
BENCHMARK(BM_IterationFromJson)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace dynapipe

BENCHMARK_MAIN();
