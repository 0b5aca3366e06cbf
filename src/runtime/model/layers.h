// Building blocks of the GPT and T5 stage models: a linear layer whose weight gradient
// can be deferred (split backward), activation checkpointing, segment-aware attention
// (dense mask or per-sample "varlen"), and pre-LN transformer blocks.
// Private to runtime/model/. Not thread-safe: one stage model is driven by one thread.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dynapipe/core/model_kind.h"
#include "dynapipe/cost/model_spec.h"
#include "runtime/model/varlen_attention.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime::model {

// Seeds a parameter group's generator from (model seed, what it is, which layer), so a
// layer's initial weights do not depend on which stage holds it.
enum class InitTag : std::uint64_t { EncEmbedding = 1, DecEmbedding, EncLayer, DecLayer, EncFinalNorm, Head };
at::Generator init_generator(std::uint64_t seed, InitTag tag, std::int64_t index);

// y = x Wᵀ + b through a custom autograd function: in the fused backward it returns dX,
// dW, db; while a backward_input() is active it returns dX only and stashes (X, dY) in
// the active DeferredWeightGrads.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(std::int64_t in, std::int64_t out, bool bias);
  void init(at::Generator& gen, double stddev);  // weight ~ N(0, stddev), bias = 0
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
};

class LayerNormImpl : public torch::nn::Module {
 public:
  explicit LayerNormImpl(std::int64_t dim);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
};

// Runs body(inputs) without storing its activations; backward re-runs it with grad
// enabled (restoring the CPU RNG state when `restore_rng`, so dropout masks repeat)
// and backpropagates into `inputs` and `params`. `params` are passed so that the output
// requires grad even when no input does, and so their gradients flow back through the
// outer graph (not by a nested backward).
using CheckpointBody = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
std::vector<at::Tensor> checkpoint(CheckpointBody body, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& params, bool restore_rng);

// Which tokens may attend to which, for one attention (self or cross) of a micro-batch.
// Dense modes: `mask` [b, 1, sq, sk] bool and `keep` [b, 1, sq, 1] float (0 for a query
// without any key). Varlen: matched spans of one sample each, and their batched plan
// (varlen_attention.h), built once and shared by every layer.
struct AttentionLayout {
  AttentionMode mode = AttentionMode::Padded;
  bool causal = false;
  std::int64_t rows = 0, q_len = 0, k_len = 0;
  at::Tensor mask, keep;    // dense modes
  std::vector<Span> spans;  // varlen; sorted by (row, q_start)
  VarlenPlan varlen;        // varlen
};
// Self-attention over one sequence: a token attends to tokens of its own segment
// (segment 0 = padding attends to nothing), causally when `causal`.
AttentionLayout make_self_layout(const at::Tensor& segments, bool causal, AttentionMode mode);
// T5 cross-attention: decoder segment k attends encoder segment k of the same row.
AttentionLayout make_cross_layout(const at::Tensor& dec_segments, const at::Tensor& enc_segments,
                                  AttentionMode mode);

// softmax(q kᵀ / √d) v restricted by the layout. q [b, nh, sq, d], k/v [b, nh, sk, d].
at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionLayout& layout);

// What a block needs besides its input: how to attend, and how to store activations.
struct BlockContext {
  // Shared: a checkpoint's backward (recompute) still needs them after forward returned.
  std::shared_ptr<const AttentionLayout> self;
  std::shared_ptr<const AttentionLayout> cross;  // T5 decoder blocks only
  Recompute recompute = Recompute::None;
  double dropout = 0.0;
  bool training = true;
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelSpec& spec, bool cross);
  void init(at::Generator& gen, double stddev, double out_stddev);
  // x_q [b, sq, h]; x_kv [b, sk, h] (cross) or undefined (self).
  at::Tensor forward(const at::Tensor& x_q, const at::Tensor& x_kv,
                     const std::shared_ptr<const AttentionLayout>& layout, const BlockContext& ctx);

 private:
  bool cross_;
  std::int64_t heads_, head_dim_;
  std::shared_ptr<LinearImpl> q_, kv_, qkv_, out_;
};

enum class BlockKind { Gpt, Encoder, Decoder };

// Pre-LN transformer block: x += attn(ln(x)); [x += cross(ln(x), enc)]; x += mlp(ln(x)).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelSpec& spec, BlockKind kind);
  void init(at::Generator& gen, int total_layers);
  // enc_out: encoder output for Decoder blocks, undefined otherwise.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& enc_out, const BlockContext& ctx);

 private:
  BlockKind kind_;
  std::shared_ptr<LayerNormImpl> ln_self_, ln_cross_, ln_mlp_;
  std::shared_ptr<AttentionImpl> self_, cross_;
  std::shared_ptr<LinearImpl> fc1_, fc2_;
};

}  // namespace dynapipe::runtime::model
