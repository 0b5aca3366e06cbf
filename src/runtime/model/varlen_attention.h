// Varlen attention: softmax(q kᵀ/√d) v where each sample's queries see only its own keys
// (one matched query span and key span per sample), without a mask over the whole row.
//
// Spans of similar lengths share one batched call: they are gathered into
// [n, heads, q_pad, dim] (padded inside the group, with a mask), run through one
// matmul/softmax/matmul, and scattered back. Which spans share a group is decided once per
// layout (every layer of a stage reuses it) by an exact partition of the spans sorted by
// size that minimises Σ over groups (overhead + n · q_pad · k_pad).
//
//   VarlenPlan plan = plan_varlen(spans, /*causal=*/true, rows, len, len);
//   at::Tensor out = varlen_attention(q, k, v, plan);  // [rows, heads, len, dim]
//
// Private to runtime/model/. Gradients flow through index_select / index_copy.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dynapipe::runtime::model {

// Fill value for masked attention scores. Finite on purpose: a query with no key at all
// (padding) then gets a uniform softmax instead of NaN, and its output is zeroed anyway.
inline constexpr double kMaskedScore = -1e9;

// One sample's attention: queries [q_start, q_start + q_len) of `row` attend keys
// [k_start, k_start + k_len) of the same row (causally when the layout is causal; causal
// spans have q_start == k_start and q_len == k_len).
struct Span {
  std::int64_t row = 0, q_start = 0, q_len = 0, k_start = 0, k_len = 0;
};

// Cost of one batched call in padded score elements (q_pad · k_pad per sample), i.e. how
// many elements of attention work the fixed per-call overhead is worth. Measured with
// bench/varlen_attention_torch_bench on gpt-tiny shapes (docs/RESULTS.md).
inline constexpr double kDefaultGroupOverhead = 16384.0;

// The spans' partition into groups (indices into `spans`) minimising
// Σ_g (overhead + |g| · max q_len · max k_len). Exact for self-attention spans (the optimum
// is a run of the spans sorted by length); for cross-attention spans, the best run
// partition of three orders (by area; by √2 class of k_len then q_len; and the converse).
std::vector<std::vector<std::size_t>> group_spans(const std::vector<Span>& spans, double overhead);

// The gather/scatter indices of one group. Flat token index = row · len + position. A
// group of one span needs no gather: it runs on views of q, k, v.
struct SpanGroup {
  std::int64_t count = 0, q_pad = 0, k_pad = 0;
  Span single;         // count == 1: the span
  at::Tensor q_index;  // count > 1: [count · q_pad] long; padding slots repeat the span's first query
  at::Tensor k_index;  // count > 1: [count · k_pad] long; padding slots repeat the span's first key
  at::Tensor q_real;   // [Σ q_len] long: real query slots within count · q_pad; undefined if all
  at::Tensor mask;     // [count or 1, 1, q_pad, k_pad] bool, true = masked; undefined if none
};

struct VarlenPlan {
  std::int64_t rows = 0, q_len = 0, k_len = 0;
  std::vector<SpanGroup> groups;
  at::Tensor out_index;  // [Σ q_len] long: flat query token of each output, groups in order
};

VarlenPlan plan_varlen(const std::vector<Span>& spans, bool causal, std::int64_t rows,
                       std::int64_t q_len, std::int64_t k_len,
                       double overhead = kDefaultGroupOverhead);

// q [rows, heads, q_len, dim], k/v [rows, heads, k_len, dim] -> [rows, heads, q_len, dim];
// queries outside every span (padding) get zeros.
at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const VarlenPlan& plan);

// The same values computed one span at a time (one small matmul/softmax/matmul per sample).
// Kept as the reference for tests and the baseline of the bench.
at::Tensor varlen_attention_loop(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::vector<Span>& spans, bool causal);

}  // namespace dynapipe::runtime::model
