// Piece: one layer kind of a model as the trainer runs it -- a StageModel that holds just
// that piece -- fed a synthetic micro-batch of one shape. Private to runtime/profile/.
//
//   Piece piece(ProfileLayerKind::Layer, spec, /*seed=*/0);
//   piece.prepare({4, 256, 0}, Recompute::Selective);
//   at::Tensor out = piece.forward();            // hidden, or the loss for the head
//   backward(out, piece.grad());
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "dynapipe/cost/model_spec.h"
#include "dynapipe/cost/profile.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime::profile {

struct Shape {
  std::int64_t batch = 0, seqlen = 0, dec_seqlen = 0;  // dec_seqlen: T5 decoder only
};

class Piece {
 public:
  // The stage that holds only `kind`: embedding (enc 0..0), GPT layer / T5 encoder layer
  // (layer 0 without the embedding), T5 decoder layer (the last one, so no decoder
  // embedding comes with it; needs >= 2 decoder layers), head (after the last layer).
  // T5's head is the same module as GPT's and runs on [b, dec_seqlen, h]; it is built as
  // a GPT head stage of the same hidden and vocab, keyed by seqlen = dec_seqlen.
  Piece(ProfileLayerKind kind, const ModelSpec& spec, std::uint64_t seed);

  // Full rows (one sample per row, no padding, dense attention, every position labelled:
  // the most work a shape can carry), a random input activation and output gradient.
  void prepare(const Shape& shape, Recompute mode);
  at::Tensor forward();                          // the stage's hidden output or loss
  const at::Tensor& grad() const { return grad_; }  // undefined for the loss
  void clear_input_grad();                       // as a fresh receive buffer would be
  // One layer of the kind, as profile format v1 counts it (the head without its LM-head
  // weight, which the cost model adds as a token-table copy).
  std::int64_t parameter_bytes() const;

 private:
  ProfileLayerKind kind_;
  ModelSpec spec_;
  std::uint64_t seed_;
  std::shared_ptr<StageModel> stage_;
  MicroBatchTensors batch_;
  at::Tensor input_, grad_;
};

// Fused backward of `out` (grad undefined: a scalar loss). LibTorch errors become Internal.
void backward(const at::Tensor& out, const at::Tensor& grad);

}  // namespace dynapipe::runtime::profile
