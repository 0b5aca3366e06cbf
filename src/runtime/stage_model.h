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
#include "dynapipe/cost/model_spec.h"

namespace dynapipe::runtime {

enum class AttentionMode { Padded, Packed, Varlen };

// Tensors of one micro-batch, built from its samples (collate()). All int64, [batch, len].
struct MicroBatchTensors {
  torch::Tensor tokens;        // GPT: input ++ target; T5: encoder input
  torch::Tensor segments;      // segment id per token (0 = pad)
  torch::Tensor positions;     // restart at 0 for each sample
  torch::Tensor labels;        // next-token targets; -100 where there is no loss
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
  virtual StageOutput forward(const torch::Tensor& input, const MicroBatchTensors& batch) = 0;
};

}  // namespace dynapipe::runtime
