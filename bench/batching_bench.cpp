// Planning time of make_microbatches() (ordering + segment table + exact DP over the
// three recompute modes and the memory rules) for GPT-6.7B-like global batches.
//
//   build/bench/batching_bench --benchmark_repetitions=10 --benchmark_report_aggregates_only
//
// BM_Batching_DynaPipe/<tokens>/<p>/<limited>: a global batch of ~<tokens> tokens
// (FLAN-like lengths, mean ~140 tokens, max 2048), p pipeline stages, and a 40 GiB
// device (limited = 1) or no memory limit (0).
//
// The cost model is cost/'s analytic model of GPT-6.7B on an A100-40GB (make_cost_model).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "dynapipe/batching/batching.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/model_spec.h"

namespace dynapipe {
namespace {

// GPT-6.7B (the gpt-6.7b preset, docs/models.md) on the analytic A100-40GB model, p stages.
std::unique_ptr<CostModel> gpt_6_7b(int num_stages) {
  CostModelOptions options;
  options.num_stages = num_stages;
  return make_cost_model("analytic:a100-40g", load_model_spec("gpt-6.7b"), options);
}

// FLAN-like mixture: log-normal lengths around task medians, truncated to 2048; samples
// are added while the batch stays within `tokens` (docs/data.md, global batches).
GlobalBatch flan_like_batch(std::int64_t tokens, std::uint64_t seed) {
  static constexpr double kMedians[] = {12, 32, 64, 100, 180, 320};
  Rng rng(seed);
  GlobalBatch batch;
  std::int64_t total = 0;
  for (SampleId id = 0;; ++id) {
    const double x = std::exp(rng.normal(std::log(kMedians[rng.uniform_int(0, 5)]), 0.6));
    const auto length = static_cast<std::int32_t>(std::clamp(std::floor(x), 1.0, 2048.0));
    if (total + length > tokens) break;
    total += length;
    batch.samples.push_back({.id = id, .input_len = length - length / 8,
                             .target_len = length / 8});
  }
  return batch;
}

void BM_Batching_DynaPipe(benchmark::State& state) {
  const std::int64_t tokens = state.range(0);
  const int stages = static_cast<int>(state.range(1));
  const bool limited = state.range(2) != 0;
  const auto cost = gpt_6_7b(stages);
  const CostModel& model = *cost;
  const GlobalBatch batch = flan_like_batch(tokens, 42);
  const BatchingOptions options{.num_stages = stages,
                                .memory_limit_bytes = limited ? 40 * kGiB : 0,
                                .max_seqlen = 2048};
  BatchingResult result;
  for (auto _ : state) {
    result = make_microbatches(batch, model, options);
    benchmark::DoNotOptimize(result);
  }
  state.counters["samples"] = static_cast<double>(batch.samples.size());
  state.counters["microbatches"] = static_cast<double>(result.replicas[0].size());
  state.counters["objective_ms"] = result.objective_ms;
  state.counters["recompute"] = static_cast<double>(result.recompute);
}
BENCHMARK(BM_Batching_DynaPipe)
    ->ArgsProduct({{16384, 65536, 262144}, {4, 8}, {1, 0}})
    ->Unit(benchmark::kMillisecond);

// dp replicas: the time of each split and, in counters, the objectives of both splits
// and of the strategies' baselines on the same batch (ms).
void BM_Batching_ReplicaSplit(benchmark::State& state) {
  const int dp = static_cast<int>(state.range(0));
  const auto cost = gpt_6_7b(4);
  const CostModel& model = *cost;
  const GlobalBatch batch = flan_like_batch(65536 * dp, 11);
  BatchingOptions options{.num_stages = 4, .dp = dp, .memory_limit_bytes = 40 * kGiB,
                          .max_seqlen = 2048};
  for (auto _ : state) benchmark::DoNotOptimize(make_microbatches(batch, model, options));
  options.replica_split = ReplicaSplit::Microbatches;
  state.counters["by_microbatches"] = make_microbatches(batch, model, options).objective_ms;
  options.replica_split = ReplicaSplit::Samples;
  state.counters["by_samples"] = make_microbatches(batch, model, options).objective_ms;
  options.replica_split = ReplicaSplit::Auto;
  for (Strategy s : {Strategy::Padding, Strategy::Packing, Strategy::PackingVarlen,
                     Strategy::TokenBased}) {
    options.strategy = s;
    state.counters[std::string(strategy_name(s))] = make_microbatches(batch, model, options).objective_ms;
  }
}
BENCHMARK(BM_Batching_ReplicaSplit)->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond);

// Scaling with N at p = 4, 40 GiB.
void BM_Batching_DynaPipeScaling(benchmark::State& state) {
  const auto cost = gpt_6_7b(4);
  const CostModel& model = *cost;
  const GlobalBatch batch = flan_like_batch(state.range(0), 7);
  const BatchingOptions options{.num_stages = 4, .memory_limit_bytes = 40 * kGiB,
                                .max_seqlen = 2048};
  for (auto _ : state) benchmark::DoNotOptimize(make_microbatches(batch, model, options));
  state.counters["samples"] = static_cast<double>(batch.samples.size());
  state.SetComplexityN(static_cast<std::int64_t>(batch.samples.size()));
}
BENCHMARK(BM_Batching_DynaPipeScaling)
    ->RangeMultiplier(2)
    ->Range(8192, 524288)
    ->Unit(benchmark::kMillisecond)
    ->Complexity();

}  // namespace
}  // namespace dynapipe

BENCHMARK_MAIN();
