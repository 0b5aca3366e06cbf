// TransformerStage: the StageModel of GPT and T5 (model.h), and make_stage_model().
//
// GPT stage : [embedding] -> blocks enc_begin..enc_end (causal) -> [final LN + head + loss]
// T5 stage  : [enc embedding] -> encoder blocks (bidirectional) -> [encoder final LN if it
//             holds the last encoder layer] -> [dec embedding: the decoder starts here]
//             -> decoder blocks (causal self, cross over the encoder output)
//             -> [final LN + head + loss]
// A T5 stage with decoder layers sends cat(enc_out, dec_hidden) along the sequence axis
// so the next stage has the encoder output for its cross-attention.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <string>

#include "dynapipe/core/error.h"
#include "runtime/model/layers.h"
#include "runtime/model/model.h"

namespace dynapipe::runtime {

void ModelOptions::validate() const {
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw Error(ErrorKind::InvalidArgument,
                cat("model options: dropout must be in [0, 1), got ", dropout));
  }
}

namespace model {
namespace {

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(std::int64_t vocab, std::int64_t positions, std::int64_t hidden) {
    tokens_ = register_parameter("tokens", at::empty({vocab, hidden}));
    positions_ = register_parameter("positions", at::empty({positions, hidden}));
  }
  void init(at::Generator gen) {
    at::NoGradGuard no_grad;
    tokens_.normal_(0.0, 0.02, gen);
    positions_.normal_(0.0, 0.01, gen);
  }
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& positions, const char* what) {
    check_range(tokens, tokens_.size(0), what, "token id");
    check_range(positions, positions_.size(0), what, "position");
    return at::embedding(tokens_, tokens) + at::embedding(positions_, positions);
  }

 private:
  static void check_range(const at::Tensor& ids, std::int64_t limit, const char* what,
                          const char* name) {
    if (ids.numel() == 0) return;
    const std::int64_t lo = ids.min().item<std::int64_t>(), hi = ids.max().item<std::int64_t>();
    if (lo < 0 || hi >= limit) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(what, ": ", name, " must be in [0, ", limit, "), got ", lo < 0 ? lo : hi,
                      name[0] == 'p' ? " (raise max_positions or lower --max-seqlen)" : ""));
    }
  }
  at::Tensor tokens_, positions_;
};

class HeadImpl : public torch::nn::Module {
 public:
  HeadImpl(std::int64_t hidden, std::int64_t vocab) {
    norm_ = register_module("norm", std::make_shared<LayerNormImpl>(hidden));
    proj_ = register_module("proj", std::make_shared<LinearImpl>(hidden, vocab, false));
  }
  void init(at::Generator gen) { proj_->init(gen, 0.02); }
  // Sum of token cross-entropies where labels != -100, times loss_scale. Only labelled
  // positions go through the vocabulary projection.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& labels, double loss_scale) {
    const std::int64_t h = x.size(-1);
    at::Tensor flat_labels = labels.reshape({-1});
    at::Tensor index = flat_labels.ne(-100).nonzero().reshape({-1});
    if (index.numel() == 0) return x.sum() * 0.0;  // keeps the graph connected
    at::Tensor sel = norm_->forward(x.reshape({-1, h}).index_select(0, index));
    at::Tensor logits = proj_->forward(sel);
    at::Tensor loss = at::cross_entropy_loss(logits, flat_labels.index_select(0, index), {},
                                             at::Reduction::Sum, -100);
    return loss * loss_scale;
  }

 private:
  std::shared_ptr<LayerNormImpl> norm_;
  std::shared_ptr<LinearImpl> proj_;
};

struct Layouts {
  std::shared_ptr<const AttentionLayout> enc_self, dec_self, cross;
};

class TransformerStage : public StageModel {
 public:
  TransformerStage(const ModelSpec& spec, const StageLayers& layers, const ModelOptions& options)
      : spec_(spec), layers_(layers), options_(options) {
    recompute_ = options.recompute;
    const bool t5 = spec.kind == ModelKind::T5;
    const std::int64_t h = spec.hidden;
    if (layers.has_embedding) {
      embedding_ = register_module("embedding",
                                   std::make_shared<EmbeddingImpl>(spec.vocab, spec.max_positions, h));
      embedding_->init(init_generator(options.seed, InitTag::EncEmbedding, 0));
    }
    for (int i = layers.enc_begin; i < layers.enc_end; ++i) {
      auto block = std::make_shared<BlockImpl>(spec, t5 ? BlockKind::Encoder : BlockKind::Gpt);
      at::Generator gen = init_generator(options.seed, InitTag::EncLayer, i);
      block->init(gen, spec.layers);
      enc_blocks_.push_back(register_module(cat("enc_layer_", i), block));
    }
    if (t5 && layers.has_encoder() && layers.enc_end == spec.layers) {
      enc_final_norm_ = register_module("enc_final_norm", std::make_shared<LayerNormImpl>(h));
    }
    if (layers.has_dec_embedding) {
      dec_embedding_ = register_module(
          "dec_embedding", std::make_shared<EmbeddingImpl>(spec.vocab, spec.max_positions, h));
      dec_embedding_->init(init_generator(options.seed, InitTag::DecEmbedding, 0));
    }
    for (int i = layers.dec_begin; i < layers.dec_end; ++i) {
      auto block = std::make_shared<BlockImpl>(spec, BlockKind::Decoder);
      at::Generator gen = init_generator(options.seed, InitTag::DecLayer, i);
      block->init(gen, spec.dec_layers);
      dec_blocks_.push_back(register_module(cat("dec_layer_", i), block));
    }
    if (layers.has_head) {
      head_ = register_module("head", std::make_shared<HeadImpl>(h, spec.vocab));
      head_->init(init_generator(options.seed, InitTag::Head, 0));
    }
  }

  StageOutput forward(const torch::Tensor& input, const MicroBatchTensors& batch) override {
    try {
      return forward_impl(input, batch);
    } catch (const c10::Error& e) {
      throw Error(ErrorKind::Internal, cat(describe(), ": forward: ", e.what_without_backtrace()));
    }
  }

 private:
  std::string describe() const {
    return cat(model_kind_name(spec_.kind), " stage (enc layers ", layers_.enc_begin, "..",
               layers_.enc_end, ", dec layers ", layers_.dec_begin, "..", layers_.dec_end, ")");
  }

  BlockContext context(const std::shared_ptr<const AttentionLayout>& self,
                       const std::shared_ptr<const AttentionLayout>& cross) const {
    BlockContext ctx;
    ctx.self = self;
    ctx.cross = cross;
    ctx.recompute = recompute_ == Recompute::Full ? Recompute::None : recompute_;
    ctx.dropout = options_.dropout;
    ctx.training = is_training();
    return ctx;
  }

  at::Tensor run_block(const std::shared_ptr<BlockImpl>& block, const at::Tensor& x,
                       const at::Tensor& enc_out, const BlockContext& ctx) {
    if (recompute_ != Recompute::Full) return block->forward(x, enc_out, ctx);
    // Store only the block's inputs; the body (and its dropout masks) reruns in backward.
    std::vector<at::Tensor> inputs{x};
    if (enc_out.defined()) inputs.push_back(enc_out);
    return checkpoint(
        [block, ctx](const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{
              block->forward(in[0], in.size() > 1 ? in[1] : at::Tensor(), ctx)};
        },
        inputs, block->parameters(), /*restore_rng=*/ctx.dropout > 0.0 && ctx.training)[0];
  }

  at::Tensor drop(const at::Tensor& x) const {
    return options_.dropout > 0.0 ? at::dropout(x, options_.dropout, is_training()) : x;
  }

  void require_input(const at::Tensor& input, std::int64_t rows, std::int64_t len) const {
    if (!input.defined() || input.dim() != 3 || input.size(0) != rows || input.size(1) != len ||
        input.size(2) != spec_.hidden) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(describe(), ": input activation must be [", rows, ", ", len, ", ",
                      spec_.hidden, "], got ", input.defined() ? cat(input.sizes()) : "none"));
    }
  }

  StageOutput forward_impl(const at::Tensor& input, const MicroBatchTensors& batch) {
    const std::int64_t rows = batch.tokens.size(0), len = batch.tokens.size(1);
    if (spec_.kind == ModelKind::Gpt) {
      at::Tensor x;
      if (embedding_) {
        x = drop(embedding_->forward(batch.tokens, batch.positions, "gpt embedding"));
      } else {
        require_input(input, rows, len);
        x = input;
      }
      // No layout for a stage without blocks (an embedding- or head-only stage).
      if (!enc_blocks_.empty()) {
        auto self = std::make_shared<const AttentionLayout>(
            make_self_layout(batch.segments, /*causal=*/true, batch.mode));
        BlockContext ctx = context(self, nullptr);
        for (auto& block : enc_blocks_) x = run_block(block, x, at::Tensor(), ctx);
      }
      if (head_) return {at::Tensor(), head_->forward(x, batch.labels, batch.loss_scale)};
      return {x, at::Tensor()};
    }

    // T5.
    at::Tensor enc;  // encoder hidden state / output, [b, E, h]
    if (embedding_) {
      enc = drop(embedding_->forward(batch.tokens, batch.positions, "t5 encoder embedding"));
    } else if (layers_.has_encoder() || layers_.has_dec_embedding) {
      require_input(input, rows, len);
      enc = input;
    }
    if (!enc_blocks_.empty()) {
      auto self = std::make_shared<const AttentionLayout>(
          make_self_layout(batch.segments, /*causal=*/false, batch.mode));
      BlockContext ctx = context(self, nullptr);
      for (auto& block : enc_blocks_) enc = run_block(block, enc, at::Tensor(), ctx);
    }
    if (enc_final_norm_) enc = enc_final_norm_->forward(enc);
    if (!layers_.has_decoder() && !layers_.has_dec_embedding) return {enc, at::Tensor()};

    if (!batch.dec_tokens.defined()) {
      throw Error(ErrorKind::InvalidArgument, cat(describe(), ": micro-batch has no decoder tokens"));
    }
    const std::int64_t dec_len = batch.dec_tokens.size(1);
    at::Tensor dec;
    if (dec_embedding_) {
      dec = drop(dec_embedding_->forward(batch.dec_tokens, batch.dec_positions, "t5 decoder embedding"));
    } else {
      require_input(input, rows, len + dec_len);
      enc = input.narrow(1, 0, len);
      dec = input.narrow(1, len, dec_len);
    }
    if (!dec_blocks_.empty()) {
      auto self = std::make_shared<const AttentionLayout>(
          make_self_layout(batch.dec_segments, /*causal=*/true, batch.mode));
      auto cross = std::make_shared<const AttentionLayout>(
          make_cross_layout(batch.dec_segments, batch.segments, batch.mode));
      BlockContext ctx = context(self, cross);
      for (auto& block : dec_blocks_) dec = run_block(block, dec, enc, ctx);
    }
    if (head_) return {at::Tensor(), head_->forward(dec, batch.labels, batch.loss_scale)};
    return {at::cat({enc, dec}, 1), at::Tensor()};
  }

  ModelSpec spec_;
  StageLayers layers_;
  ModelOptions options_;
  std::shared_ptr<EmbeddingImpl> embedding_, dec_embedding_;
  std::vector<std::shared_ptr<BlockImpl>> enc_blocks_, dec_blocks_;
  std::shared_ptr<LayerNormImpl> enc_final_norm_;
  std::shared_ptr<HeadImpl> head_;
};

void validate_layers(const ModelSpec& spec, const StageLayers& l) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::InvalidArgument,
                cat("stage layers (enc ", l.enc_begin, "..", l.enc_end, ", dec ", l.dec_begin, "..",
                    l.dec_end, ") of ", spec.name.empty() ? "model" : spec.name, ": ", what));
  };
  if (spec.hidden <= 0 || spec.heads <= 0 || spec.head_dim() <= 0 || spec.ffn_hidden <= 0 ||
      spec.vocab <= 0 || spec.max_positions <= 0 || spec.layers < 0 || spec.dec_layers < 0) {
    fail("model spec must have positive hidden, heads, head_dim, ffn_hidden, vocab, max_positions");
  }
  if (l.enc_begin < 0 || l.enc_begin > l.enc_end || l.enc_end > spec.layers) {
    fail(cat("encoder range must lie in [0, ", spec.layers, "]"));
  }
  if (l.dec_begin < 0 || l.dec_begin > l.dec_end || l.dec_end > spec.dec_layers) {
    fail(cat("decoder range must lie in [0, ", spec.dec_layers, "]"));
  }
  if (l.has_embedding && l.enc_begin != 0) fail("the embedding must sit with encoder layer 0");
  if (spec.kind == ModelKind::Gpt) {
    if (l.has_decoder() || l.has_dec_embedding) fail("GPT has no decoder layers");
    if (l.has_head && l.enc_end != spec.layers) fail("the head must sit with the last layer");
    return;
  }
  if (spec.dec_layers < 1) fail("T5 needs at least one decoder layer");
  if (l.has_decoder() && l.dec_begin == 0 && !l.has_dec_embedding) {
    fail("the stage with decoder layer 0 must have the decoder embedding");
  }
  if (l.has_dec_embedding && l.dec_begin != 0) fail("the decoder embedding must sit with decoder layer 0");
  if ((l.has_decoder() || l.has_dec_embedding) && l.has_encoder() && l.enc_end != spec.layers) {
    fail("a stage holding decoder layers can only hold the last encoder layers");
  }
  if (l.has_head && (l.dec_end != spec.dec_layers || !(l.has_decoder() || l.has_dec_embedding))) {
    fail("the head must sit with the last decoder layer");
  }
}

}  // namespace
}  // namespace model

std::shared_ptr<StageModel> make_stage_model(const ModelSpec& spec, const StageLayers& layers,
                                             const ModelOptions& options) {
  options.validate();
  model::validate_layers(spec, layers);
  try {
    return std::make_shared<model::TransformerStage>(spec, layers, options);
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::Internal, cat("make_stage_model: ", e.what_without_backtrace()));
  }
}

std::vector<std::int64_t> stage_output_shape(const ModelSpec& spec, const StageLayers& layers,
                                             const MicroBatchShape& shape) {
  if (layers.has_head) return {};
  const bool dec = spec.kind == ModelKind::T5 && (layers.has_decoder() || layers.has_dec_embedding);
  return {shape.batch, dec ? shape.seqlen + shape.dec_seqlen : shape.seqlen, spec.hidden};
}

}  // namespace dynapipe::runtime
