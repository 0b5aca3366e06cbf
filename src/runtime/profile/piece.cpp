// Piece (piece.h): the stage model of one layer kind and its synthetic micro-batch.
#include "runtime/profile/piece.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>

#include "dynapipe/core/error.h"
#include "runtime/model/model.h"

namespace dynapipe::runtime::profile {

namespace {

StageLayers layers_for(ProfileLayerKind kind, const ModelSpec& spec) {
  StageLayers l;
  switch (kind) {
    case ProfileLayerKind::Embedding:
      l.has_embedding = true;
      break;
    case ProfileLayerKind::Layer:
    case ProfileLayerKind::Encoder:
      l.enc_end = 1;
      break;
    case ProfileLayerKind::Decoder:
      l.dec_begin = spec.dec_layers - 1;
      l.dec_end = spec.dec_layers;
      break;
    case ProfileLayerKind::Head:
      l.enc_begin = l.enc_end = spec.layers;
      l.has_head = true;
      break;
  }
  return l;
}

// T5's head (final LN + untied LM head + loss) is the module GPT's head stage runs.
ModelSpec spec_for(ProfileLayerKind kind, const ModelSpec& spec) {
  if (kind != ProfileLayerKind::Head || spec.kind != ModelKind::T5) return spec;
  ModelSpec gpt = spec;
  gpt.kind = ModelKind::Gpt;
  gpt.dec_layers = 0;
  return gpt;
}

at::Tensor positions(std::int64_t rows, std::int64_t len) {
  return at::arange(len, at::kLong).unsqueeze(0).expand({rows, len}).contiguous();
}

}  // namespace

Piece::Piece(ProfileLayerKind kind, const ModelSpec& spec, std::uint64_t seed)
    : kind_(kind), spec_(spec_for(kind, spec)), seed_(seed) {
  if (kind == ProfileLayerKind::Decoder && spec.dec_layers < 2) {
    throw Error(ErrorKind::InvalidArgument,
                cat("profile: model ", spec.name, " needs >= 2 decoder layers to measure one on its own"
                    " (the first one comes with the decoder embedding), got ", spec.dec_layers));
  }
  stage_ = make_stage_model(spec_, layers_for(kind, spec_), ModelOptions{.seed = seed});
}

void Piece::prepare(const Shape& shape, Recompute mode) {
  try {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + 1);
    const std::int64_t b = shape.batch, s = shape.seqlen, d = shape.dec_seqlen, h = spec_.hidden;
    const bool t5 = spec_.kind == ModelKind::T5;
    auto ids = [&](std::int64_t len) { return at::randint(0, spec_.vocab, {b, len}, gen, at::kLong); };
    stage_->set_recompute(mode);
    batch_ = MicroBatchTensors{};
    batch_.tokens = ids(s);
    batch_.segments = at::ones({b, s}, at::kLong);
    batch_.positions = positions(b, s);
    batch_.labels = ids(t5 ? d : s);
    if (t5) {
      batch_.dec_tokens = ids(d);
      batch_.dec_segments = at::ones({b, d}, at::kLong);
      batch_.dec_positions = positions(b, d);
    }
    batch_.mode = AttentionMode::Padded;
    batch_.loss_scale = 1.0 / static_cast<double>(b * (t5 ? d : s));
    input_ = grad_ = at::Tensor();
    if (kind_ == ProfileLayerKind::Decoder) {
      input_ = at::randn({b, s + d, h}, gen);
    } else if (kind_ != ProfileLayerKind::Embedding) {
      input_ = at::randn({b, s, h}, gen);
    }
    if (input_.defined()) input_.requires_grad_(true);
    if (kind_ != ProfileLayerKind::Head) {
      grad_ = at::randn(kind_ == ProfileLayerKind::Decoder ? std::vector<std::int64_t>{b, s + d, h}
                                                           : std::vector<std::int64_t>{b, s, h},
                        gen);
    }
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::Internal, cat("profile: prepare: ", e.what_without_backtrace()));
  }
}

at::Tensor Piece::forward() {
  StageOutput out = stage_->forward(input_, batch_);
  return out.loss.defined() ? out.loss : out.hidden;
}

void Piece::clear_input_grad() {
  if (input_.defined()) input_.mutable_grad().reset();
}

std::int64_t Piece::parameter_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& item : stage_->named_parameters()) {
    const std::string& name = item.key();
    if (kind_ == ProfileLayerKind::Head && name.ends_with("proj.weight")) continue;
    bytes += item.value().numel() * static_cast<std::int64_t>(item.value().element_size());
  }
  return bytes;
}

void backward(const at::Tensor& out, const at::Tensor& grad) {
  try {
    if (grad.defined()) {
      torch::autograd::backward({out}, {grad});
    } else {
      torch::autograd::backward({out});
    }
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::Internal, cat("profile: backward: ", e.what_without_backtrace()));
  }
}

}  // namespace dynapipe::runtime::profile
