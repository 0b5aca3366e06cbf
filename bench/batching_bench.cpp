// Planning time of make_microbatches() (ordering + segment table + exact DP over the
// three recompute modes and the memory rules) for GPT-6.7B-like global batches.
//
//   build/bench/batching_bench --benchmark_repetitions=10 --benchmark_report_aggregates_only
//
// BM_Batching_DynaPipe/<tokens>/<p>/<limited>: a global batch of ~<tokens> tokens
// (FLAN-like lengths, mean ~140 tokens, max 2048), p pipeline stages, and a 40 GiB
// device (limited = 1) or no memory limit (0).
//
// The cost model is a FLOP/byte model of GPT-6.7B on an A100 written here
// (Gpt67bLikeCostModel) because cost/'s analytic model was not in main when this bench
// was written. TODO(cost lands): use make_cost_model("analytic:a100-40g", gpt-6.7b).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "dynapipe/batching/batching.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/cost_model.h"

namespace dynapipe {
namespace {

class Gpt67bLikeCostModel final : public CostModel {
 public:
  explicit Gpt67bLikeCostModel(int num_stages)
      : stages_(static_cast<std::size_t>(num_stages)), layers_per_stage_(32.0 / num_stages) {
    spec_.name = "gpt-6.7b-like";
    device_.name = "a100-40g-like";
  }
  const ModelSpec& model() const override { return spec_; }
  const DeviceSpec& device() const override { return device_; }
  const std::vector<StageLayers>& stages() const override { return stages_; }

  StageCost stage_cost(int stage, const MicroBatchShape& shape, const AttentionDensity& density,
                       Recompute recompute) const override {
    constexpr double kHidden = 4096, kHeads = 32, kVocab = 50304;
    constexpr double kFlops = 312e12 * 0.5;  // half of A100 bf16 peak
    constexpr double kLayerOverheadMs = 0.03;
    const double b = static_cast<double>(shape.batch), s = static_cast<double>(shape.seqlen);
    const double matmul = 24 * b * s * kHidden * kHidden;
    const double attention = 4 * b * s * s * kHidden * density.enc;
    const double layer_fwd_ms = (matmul + attention) / kFlops * 1e3 + kLayerOverheadMs;
    double fwd_ms = layers_per_stage_ * layer_fwd_ms;
    if (stage + 1 == num_stages()) fwd_ms += 2 * b * s * kHidden * kVocab / kFlops * 1e3;
    StageCost cost;
    cost.fwd_ms = fwd_ms;
    cost.bwd_ms = 2 * fwd_ms;
    const double per_layer_tokens = layers_per_stage_ * b * s;
    switch (recompute) {
      case Recompute::None:
        cost.stored_bytes = static_cast<std::int64_t>(
            per_layer_tokens * 34 * kHidden + layers_per_stage_ * 5 * kHeads * b * s * s);
        break;
      case Recompute::Selective:
        cost.bwd_ms += layers_per_stage_ * attention / kFlops * 1e3;
        cost.stored_bytes = static_cast<std::int64_t>(per_layer_tokens * 34 * kHidden);
        break;
      case Recompute::Full:
        cost.bwd_ms += fwd_ms;
        cost.stored_bytes = static_cast<std::int64_t>(per_layer_tokens * 2 * kHidden);
        break;
    }
    cost.peak_bytes = static_cast<std::int64_t>(b * s * (16 * kHidden + 2 * kHeads * s));
    cost.output_bytes = static_cast<std::int64_t>(2 * b * s * kHidden);
    return cost;
  }
  std::int64_t static_bytes(int stage) const override {
    const double layers = layers_per_stage_ * 12 * 4096.0 * 4096.0 * 16;
    const double embedding = (stage == 0 || stage + 1 == num_stages()) ? 50304.0 * 4096 * 16 : 0;
    return static_cast<std::int64_t>(layers + embedding);
  }
  double p2p_ms(std::int64_t) const override { return 0; }
  double allreduce_ms(std::int64_t, int) const override { return 0; }
  std::string describe() const override { return "gpt-6.7b-like (bench)"; }

 private:
  ModelSpec spec_;
  DeviceSpec device_;
  std::vector<StageLayers> stages_;
  double layers_per_stage_;
};

// FLAN-like mixture: log-normal lengths around task medians, truncated to 2048; samples
// are added while the batch stays within `tokens` (CONTRACTS.md global-batch rule).
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
  const Gpt67bLikeCostModel model(stages);
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
  const Gpt67bLikeCostModel model(4);
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
  const Gpt67bLikeCostModel model(4);
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
