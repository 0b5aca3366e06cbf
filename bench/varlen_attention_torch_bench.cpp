// Varlen attention, forward + backward of one causal self-attention over one packed row of
// FLAN-like samples (assets/flan_like_mix.jsonl.gz in file order, truncated to 1024 tokens,
// gpt-tiny's 4 heads of 32), computed four ways:
//   loop     one matmul/softmax/matmul per sample (the runtime before batching)
//   batched  samples of similar length share one call (runtime/model/varlen_attention.h);
//            the second argument is the per-call overhead used to group, in score
//            elements (-1 = kDefaultGroupOverhead)
//   packed   dense attention over the whole row with a block-diagonal mask
//   padded   one row per sample, padded to the longest, dense mask (the padding baseline)
// Mixes: 0 = the file's mix (mostly short, some long), 1 = only samples of <= 64 tokens.
// Layouts (spans, groups, masks) are built before timing: a stage builds them once per
// micro-batch for all its layers.
//
//   build/bench/varlen_attention_torch_bench --benchmark_repetitions=5
//       (add --benchmark_report_aggregates_only=true for medians only)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dynapipe/cost/model_spec.h"
#include "dynapipe/data/dataset.h"
#include "runtime/exec/host_allocator.h"
#include "runtime/model/layers.h"

namespace dynapipe::runtime::model {
namespace {

constexpr std::int64_t kRowTokens = 4096;

struct Row {
  std::vector<std::int64_t> lengths;
  at::Tensor segments;         // [1, kRowTokens]
  at::Tensor padded_segments;  // [samples, longest]
};

Row make_row(int mix) {
  TruncationLimits limits;
  limits.max_seqlen = 1024;
  const Dataset data = Dataset::load(DYNAPIPE_SOURCE_DIR "/assets/flan_like_mix.jsonl.gz", limits);
  Row row;
  std::int64_t used = 0;
  for (const Sample& s : data.samples()) {
    const std::int64_t len = s.input_len + s.target_len;
    if (mix == 1 && len > 64) continue;
    if (used + len > kRowTokens) break;
    row.lengths.push_back(len);
    used += len;
  }
  row.segments = at::zeros({1, kRowTokens}, at::kLong);
  const std::int64_t longest = *std::max_element(row.lengths.begin(), row.lengths.end());
  const auto n = static_cast<std::int64_t>(row.lengths.size());
  row.padded_segments = at::zeros({n, longest}, at::kLong);
  std::int64_t start = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    row.segments[0].narrow(0, start, row.lengths[i]).fill_(i + 1);
    row.padded_segments[i].narrow(0, 0, row.lengths[i]).fill_(1);
    start += row.lengths[i];
  }
  return row;
}

const Row& row_of(int mix) {
  static const Row flan = make_row(0), short_only = make_row(1);
  return mix == 0 ? flan : short_only;
}

void attention_step(benchmark::State& state, int method) {
  at::set_num_threads(1);
  // Freed pages kept, as a training rank keeps them (runtime/exec/host_allocator.h).
  runtime::keep_freed_host_memory(true);
  const Row& row = row_of(static_cast<int>(state.range(0)));
  const double overhead = state.range(1) < 0 ? kDefaultGroupOverhead : static_cast<double>(state.range(1));
  const ModelSpec spec = load_model_spec("gpt-tiny");
  const std::int64_t heads = spec.heads, dim = spec.head_dim();
  const at::Tensor& seg = method == 3 ? row.padded_segments : row.segments;
  at::manual_seed(1);
  // q, k, v cut from one projection output, as the model's attention does.
  const std::int64_t rows = seg.size(0), len = seg.size(1);
  at::Tensor qkv = at::randn({rows, len, 3, heads, dim}).requires_grad_(true);
  at::Tensor grad = at::randn({rows, heads, len, dim});
  // Layouts are built once per micro-batch and shared by every layer: not timed.
  const AttentionLayout layout = make_self_layout(seg, true, method >= 2 ? AttentionMode::Packed : AttentionMode::Varlen);
  const VarlenPlan plan = plan_varlen(layout.spans, true, layout.rows, layout.q_len, layout.k_len, overhead);
  state.counters["calls"] = static_cast<double>(method == 1 ? plan.groups.size() : method == 0 ? layout.spans.size() : 1);
  for (auto _ : state) {
    at::Tensor parts = qkv.permute({2, 0, 3, 1, 4});
    at::Tensor q = parts[0], k = parts[1], v = parts[2];
    at::Tensor out = method == 0   ? varlen_attention_loop(q, k, v, layout.spans, true)
                     : method == 1 ? varlen_attention(q, k, v, plan)
                                   : attention_core(q, k, v, layout);
    torch::autograd::backward({out}, {grad});
    qkv.mutable_grad().reset();
  }
  state.counters["samples"] = static_cast<double>(row.lengths.size());
}

void BM_Loop(benchmark::State& s) { attention_step(s, 0); }
void BM_Batched(benchmark::State& s) { attention_step(s, 1); }
void BM_DensePacked(benchmark::State& s) { attention_step(s, 2); }
void BM_DensePadded(benchmark::State& s) { attention_step(s, 3); }

BENCHMARK(BM_Loop)->ArgsProduct({{0, 1}, {0}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Batched)->ArgsProduct({{0, 1}, {-1, 0, 1024, 16384, 65536, 1000000000}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DensePacked)->ArgsProduct({{0, 1}, {0}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DensePadded)->ArgsProduct({{0, 1}, {0}})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dynapipe::runtime::model

BENCHMARK_MAIN();
