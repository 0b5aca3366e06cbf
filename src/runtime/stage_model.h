// StageModel: the part of a GPT or T5 model one pipeline stage runs, in LibTorch.
// Private to runtime/ (includes torch). The seam between models/ (what a stage
// computes) and the executor (when, and with which tensors from which peer).
//
// Attention never mixes samples: every token carries a segment id (0 = padding, k >= 1 =
// k-th sample of its row) and a position that restarts per sample; a token attends only
// to tokens of its own segment (causally for GPT and the T5 decoder). AttentionMode
// chooses how that is computed: a [b, s, s] mask over the padded shape (Padded, Packed),
// or segment by segment without a mask (Varlen) -- same values, different work.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/cost/model_spec.h"

namespace dynapipe::runtime {

enum class AttentionMode { Padded, Packed, Varlen };

// Tensors of one micro-batch, built from its samples (collate()). All int64, [batch, len].
struct MicroBatchTensors {
  torch::Tensor tokens;        // GPT: input ++ target; T5: encoder input
  torch::Tensor segments;      // segment id per token (0 = pad)
  torch::Tensor positions;     // restart at 0 for each sample
  torch::Tensor labels;        // next-token targets; -100 where there is no loss.
                               // GPT: aligned with tokens; T5: aligned with dec_tokens
  torch::Tensor dec_tokens;    // T5 only: decoder input (bos ++ target[:-1])
  torch::Tensor dec_segments;  // T5 only
  torch::Tensor dec_positions; // T5 only
  AttentionMode mode = AttentionMode::Padded;
  // Loss of this micro-batch = sum(token losses) * loss_scale, with loss_scale =
  // 1 / (target tokens of the whole global batch, all replicas), so the summed loss
  // is independent of how the batch was split.
  double loss_scale = 1.0;
};

struct StageOutput {
  torch::Tensor hidden;  // activation for the next stage (undefined on the last stage)
  torch::Tensor loss;    // scalar, last stage only: sum of scaled token losses
};

class StageModel : public torch::nn::Module {
 public:
  // `input` is the activation received from the previous stage (undefined on stage 0).
  // T5 stages that hold decoder layers receive and send [b, enc_len + dec_len, h]: the
  // encoder output and the decoder hidden state concatenated on the sequence axis.
  // Throws dynapipe::Error (LibTorch errors are rethrown with the stage as context).
  virtual StageOutput forward(const torch::Tensor& input, const MicroBatchTensors& batch) = 0;

  // Activation recomputation used by later forward() calls (the executor sets each
  // micro-batch's mode before its forward). Recompute is transparent to the caller: backward() of the forward's
  // output re-runs what was not stored (docs/models-runtime.md). Default: None.
  void set_recompute(Recompute mode) { recompute_ = mode; }
  Recompute recompute() const { return recompute_; }

 protected:
  Recompute recompute_ = Recompute::None;
};

// Split backward for zero-bubble schedules (BackwardInput, then BackwardWeight later).
// backward_input() runs autograd from `output` like output.backward(grad), so inputs
// get .grad and small parameters (norms, embeddings) get their gradients at once, but
// the weight and bias gradients of every linear layer are deferred: their (input,
// output-grad) pairs are kept in the returned handle until flush() accumulates
// dW = dYᵀX (and db = Σ dY) into .grad. Flushing once gives the same .grad as the
// fused backward (up to float summation order). Not thread-safe: run the backward on
// the thread that will not run another backward of the same model concurrently.
//
//   auto w = backward_input(out.hidden, grad_from_next_stage);  // I
//   send(input.grad()); ...
//   w.flush();                                                    // W
class DeferredWeightGrads {
 public:
  struct Entry {
    torch::Tensor input;        // X, [..., in]
    torch::Tensor output_grad;  // dY, [..., out]
    torch::Tensor weight;       // [out, in]
    torch::Tensor bias;         // [out] or undefined
  };
  DeferredWeightGrads() = default;
  DeferredWeightGrads(DeferredWeightGrads&&) = default;
  DeferredWeightGrads& operator=(DeferredWeightGrads&&) = default;
  // Accumulates every deferred dW/db into its parameter's .grad and releases the
  // stashed tensors. Idempotent: a second call does nothing.
  void flush();
  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  // Called by the linear layers' backward while a backward_input() is running.
  void add(Entry entry) { entries_.push_back(std::move(entry)); }

 private:
  std::vector<Entry> entries_;
};

// `grad` undefined means ones (a scalar loss). Rethrows LibTorch errors as dynapipe::Error.
DeferredWeightGrads backward_input(const torch::Tensor& output, const torch::Tensor& grad = {});

}  // namespace dynapipe::runtime
