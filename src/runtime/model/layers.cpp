// Layers of the stage models; see layers.h. Also implements the split-backward
// entry points declared in stage_model.h (backward_input, DeferredWeightGrads).
#include "runtime/model/layers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {

namespace {
// The handle of the backward_input() running on this thread, if any. Autograd runs a
// CPU graph on the thread that calls backward (re-entrant calls included), so the
// linear layers' backward sees the caller's handle.
thread_local DeferredWeightGrads* t_active_stash = nullptr;
}  // namespace

void DeferredWeightGrads::flush() {
  at::NoGradGuard no_grad;
  for (Entry& e : entries_) {
    const std::int64_t out = e.weight.size(0), in = e.weight.size(1);
    at::Tensor dy = e.output_grad.reshape({-1, out});
    at::Tensor dw = dy.t().mm(e.input.reshape({-1, in}));
    at::Tensor& wg = e.weight.mutable_grad();
    if (wg.defined()) wg.add_(dw); else wg = dw;
    if (e.bias.defined()) {
      at::Tensor db = dy.sum(0);
      at::Tensor& bg = e.bias.mutable_grad();
      if (bg.defined()) bg.add_(db); else bg = db;
    }
  }
  entries_.clear();
}

DeferredWeightGrads backward_input(const torch::Tensor& output, const torch::Tensor& grad) {
  DeferredWeightGrads stash;
  DYNAPIPE_CHECK(t_active_stash == nullptr, "backward_input: nested on one thread");
  t_active_stash = &stash;
  try {
    if (grad.defined()) {
      torch::autograd::backward({output}, {grad});
    } else {
      torch::autograd::backward({output});
    }
  } catch (const c10::Error& e) {
    t_active_stash = nullptr;
    throw Error(ErrorKind::Internal, cat("backward_input: ", e.what_without_backtrace()));
  } catch (...) {
    t_active_stash = nullptr;
    throw;
  }
  t_active_stash = nullptr;
  return stash;
}

}  // namespace dynapipe::runtime

namespace dynapipe::runtime::model {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---------------------------------------------------------------- init

at::Generator init_generator(std::uint64_t seed, InitTag tag, std::int64_t index) {
  // splitmix64 over (seed, tag, index): well-mixed, and stable across platforms.
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::uint64_t s = mix(seed);
  s = mix(s ^ static_cast<std::uint64_t>(tag));
  s = mix(s ^ static_cast<std::uint64_t>(index));
  return at::make_generator<at::CPUGeneratorImpl>(s);
}

// ---------------------------------------------------------------- linear

namespace {

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& b) {
    ctx->save_for_backward({x, w, b.has_value() ? *b : at::Tensor()});
    return at::linear(x, w, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& b = saved[2];
    at::Tensor dy = grads[0];
    at::Tensor dx = dy.matmul(w);
    if (t_active_stash != nullptr) {
      // BackwardInput: dW and db wait for DeferredWeightGrads::flush().
      t_active_stash->add({x, dy, w, b});
      return {dx, at::Tensor(), at::Tensor()};
    }
    const std::int64_t out = w.size(0), in = w.size(1);
    at::Tensor dy2 = dy.reshape({-1, out});
    at::Tensor dw = dy2.t().mm(x.reshape({-1, in}));
    at::Tensor db = b.defined() ? dy2.sum(0) : at::Tensor();
    return {dx, dw, db};
  }
};

}  // namespace

LinearImpl::LinearImpl(std::int64_t in, std::int64_t out, bool with_bias) {
  weight = register_parameter("weight", at::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", at::zeros({out}));
}

void LinearImpl::init(at::Generator& gen, double stddev) {
  at::NoGradGuard no_grad;
  weight.normal_(0.0, stddev, gen);
  if (bias.defined()) bias.zero_();
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  c10::optional<at::Tensor> b;
  if (bias.defined()) b = bias;
  return LinearFunction::apply(x, weight, b);
}

LayerNormImpl::LayerNormImpl(std::int64_t dim) {
  weight = register_parameter("weight", at::ones({dim}));
  bias = register_parameter("bias", at::zeros({dim}));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  return at::layer_norm(x, {weight.size(0)}, weight, bias, 1e-5);
}

// ---------------------------------------------------------------- checkpoint

namespace {

struct CheckpointState : torch::CustomClassHolder {
  CheckpointBody body;
  std::vector<at::Tensor> params;
  bool restore_rng = false;
  at::Tensor rng_state;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList params,
                               c10::intrusive_ptr<CheckpointState> state) {
    (void)params;  // passed only to connect the graph; state->params holds them
    if (state->restore_rng) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      state->rng_state = gen.get_state();
    }
    std::vector<at::Tensor> outputs;
    {
      at::NoGradGuard no_grad;
      outputs = state->body(inputs.vec());
    }
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["state"] = at::IValue::make_capsule(state);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = ctx->saved_data["state"].toCapsule();
    auto* state = static_cast<CheckpointState*>(holder.get());
    variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (const at::Tensor& s : saved) {
      at::Tensor d = s.detach();
      if (d.is_floating_point()) d.requires_grad_(true);
      inputs.push_back(d);
    }
    std::vector<at::Tensor> outputs;
    {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      at::Tensor resume_state;
      if (state->restore_rng) {
        std::lock_guard<std::mutex> lock(gen.mutex());
        resume_state = gen.get_state();
        gen.set_state(state->rng_state);
      }
      at::AutoGradMode enable_grad(true);
      outputs = state->body(inputs);
      if (state->restore_rng) {
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(resume_state);
      }
    }
    variable_list roots, root_grads;
    for (std::size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    // Gradients wrt every input that can take one, then every parameter.
    variable_list targets;
    std::vector<int> input_slot(inputs.size(), -1);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) {
        input_slot[i] = static_cast<int>(targets.size());
        targets.push_back(inputs[i]);
      }
    }
    const std::size_t first_param = targets.size();
    for (const at::Tensor& p : state->params) targets.push_back(p);

    variable_list grads(targets.size());
    if (!roots.empty() && !targets.empty()) {
      grads = torch::autograd::grad(roots, targets, root_grads, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    variable_list result;
    result.reserve(inputs.size() + state->params.size() + 1);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      result.push_back(input_slot[i] >= 0 ? grads[input_slot[i]] : at::Tensor());
    }
    for (std::size_t j = 0; j < state->params.size(); ++j) result.push_back(grads[first_param + j]);
    result.emplace_back();  // the state argument
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(CheckpointBody body, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& params, bool restore_rng) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->body = std::move(body);
  state->params = params;
  state->restore_rng = restore_rng;
  return CheckpointFunction::apply(at::TensorList(inputs), at::TensorList(params), state);
}

// ---------------------------------------------------------------- attention layouts

namespace {

struct Run {
  std::int64_t segment, start, len;
};

// Maximal runs of one non-zero segment id in each row. Collation keeps a sample's
// tokens contiguous, so each run is one sample.
std::vector<std::vector<Run>> segment_runs(const at::Tensor& segments) {
  at::Tensor seg = segments.to(at::kLong).contiguous();
  const std::int64_t rows = seg.size(0), len = seg.size(1);
  const std::int64_t* data = seg.data_ptr<std::int64_t>();
  std::vector<std::vector<Run>> runs(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t* row = data + r * len;
    std::int64_t i = 0;
    while (i < len) {
      std::int64_t j = i;
      while (j < len && row[j] == row[i]) ++j;
      if (row[i] != 0) runs[r].push_back({row[i], i, j - i});
      i = j;
    }
  }
  return runs;
}

}  // namespace

AttentionLayout make_self_layout(const at::Tensor& segments, bool causal, AttentionMode mode) {
  AttentionLayout layout;
  layout.mode = mode;
  layout.causal = causal;
  layout.rows = segments.size(0);
  layout.q_len = layout.k_len = segments.size(1);
  if (mode == AttentionMode::Varlen) {
    auto runs = segment_runs(segments);
    for (std::int64_t r = 0; r < layout.rows; ++r) {
      for (const Run& run : runs[r]) layout.spans.push_back({r, run.start, run.len, run.start, run.len});
    }
    layout.varlen = plan_varlen(layout.spans, causal, layout.rows, layout.q_len, layout.k_len);
    return layout;
  }
  at::Tensor q = segments.unsqueeze(2), k = segments.unsqueeze(1);
  at::Tensor mask = q.eq(k).logical_and(q.ne(0));
  if (causal) {
    const std::int64_t s = segments.size(1);
    mask = mask.logical_and(at::ones({s, s}, at::kBool).tril());
  }
  layout.keep = mask.any(-1, /*keepdim=*/true).unsqueeze(1).to(at::kFloat);
  layout.mask = mask.logical_not().unsqueeze(1);  // stored inverted: what masked_fill needs
  return layout;
}

AttentionLayout make_cross_layout(const at::Tensor& dec_segments, const at::Tensor& enc_segments,
                                  AttentionMode mode) {
  AttentionLayout layout;
  layout.mode = mode;
  layout.rows = dec_segments.size(0);
  layout.q_len = dec_segments.size(1);
  layout.k_len = enc_segments.size(1);
  if (mode == AttentionMode::Varlen) {
    auto dec_runs = segment_runs(dec_segments);
    auto enc_runs = segment_runs(enc_segments);
    for (std::int64_t r = 0; r < layout.rows; ++r) {
      std::unordered_map<std::int64_t, const Run*> enc_of;
      for (const Run& e : enc_runs[r]) enc_of[e.segment] = &e;
      for (const Run& d : dec_runs[r]) {
        auto it = enc_of.find(d.segment);
        if (it == enc_of.end()) continue;  // sample without input: its queries see nothing
        layout.spans.push_back({r, d.start, d.len, it->second->start, it->second->len});
      }
    }
    layout.varlen = plan_varlen(layout.spans, /*causal=*/false, layout.rows, layout.q_len, layout.k_len);
    return layout;
  }
  at::Tensor q = dec_segments.unsqueeze(2), k = enc_segments.unsqueeze(1);
  at::Tensor mask = q.eq(k).logical_and(q.ne(0));
  layout.keep = mask.any(-1, /*keepdim=*/true).unsqueeze(1).to(at::kFloat);
  layout.mask = mask.logical_not().unsqueeze(1);
  return layout;
}

at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionLayout& layout) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  if (layout.mode != AttentionMode::Varlen) {
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
    scores.masked_fill_(layout.mask, kMaskedScore);
    at::Tensor probs = at::softmax(scores, -1);
    return at::matmul(probs, v).mul_(layout.keep);
  }
  return varlen_attention(q, k, v, layout.varlen);
}

// ---------------------------------------------------------------- attention, block

AttentionImpl::AttentionImpl(const ModelSpec& spec, bool cross)
    : cross_(cross), heads_(spec.heads), head_dim_(spec.head_dim()) {
  const std::int64_t h = spec.hidden, inner = heads_ * head_dim_;
  if (cross_) {
    q_ = register_module("q", std::make_shared<LinearImpl>(h, inner, true));
    kv_ = register_module("kv", std::make_shared<LinearImpl>(h, 2 * inner, true));
  } else {
    qkv_ = register_module("qkv", std::make_shared<LinearImpl>(h, 3 * inner, true));
  }
  out_ = register_module("out", std::make_shared<LinearImpl>(inner, h, true));
}

void AttentionImpl::init(at::Generator& gen, double stddev, double out_stddev) {
  if (cross_) {
    q_->init(gen, stddev);
    kv_->init(gen, stddev);
  } else {
    qkv_->init(gen, stddev);
  }
  out_->init(gen, out_stddev);
}

at::Tensor AttentionImpl::forward(const at::Tensor& x_q, const at::Tensor& x_kv,
                                  const std::shared_ptr<const AttentionLayout>& layout,
                                  const BlockContext& ctx) {
  const std::int64_t b = x_q.size(0), sq = x_q.size(1);
  at::Tensor q, k, v;
  if (cross_) {
    const std::int64_t sk = x_kv.size(1);
    q = q_->forward(x_q).view({b, sq, heads_, head_dim_}).transpose(1, 2);
    at::Tensor kv = kv_->forward(x_kv).view({b, sk, 2, heads_, head_dim_}).permute({2, 0, 3, 1, 4});
    k = kv[0];
    v = kv[1];
  } else {
    at::Tensor qkv = qkv_->forward(x_q).view({b, sq, 3, heads_, head_dim_}).permute({2, 0, 3, 1, 4});
    q = qkv[0];
    k = qkv[1];
    v = qkv[2];
  }
  at::Tensor core;
  if (ctx.recompute == Recompute::Selective) {
    // Store q, k, v only; scores and probabilities are rebuilt in backward.
    core = checkpoint(
        [layout](const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{attention_core(in[0], in[1], in[2], *layout)};
        },
        {q, k, v}, {}, /*restore_rng=*/false)[0];
  } else {
    core = attention_core(q, k, v, *layout);
  }
  return out_->forward(core.transpose(1, 2).reshape({b, sq, heads_ * head_dim_}));
}

BlockImpl::BlockImpl(const ModelSpec& spec, BlockKind kind) : kind_(kind) {
  const std::int64_t h = spec.hidden;
  ln_self_ = register_module("ln_self", std::make_shared<LayerNormImpl>(h));
  self_ = register_module("self_attn", std::make_shared<AttentionImpl>(spec, false));
  if (kind_ == BlockKind::Decoder) {
    ln_cross_ = register_module("ln_cross", std::make_shared<LayerNormImpl>(h));
    cross_ = register_module("cross_attn", std::make_shared<AttentionImpl>(spec, true));
  }
  ln_mlp_ = register_module("ln_mlp", std::make_shared<LayerNormImpl>(h));
  fc1_ = register_module("fc1", std::make_shared<LinearImpl>(h, spec.ffn_hidden, true));
  fc2_ = register_module("fc2", std::make_shared<LinearImpl>(spec.ffn_hidden, h, true));
}

void BlockImpl::init(at::Generator& gen, int total_layers) {
  // GPT-2 style: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers).
  const double stddev = 0.02, out_stddev = 0.02 / std::sqrt(2.0 * std::max(1, total_layers));
  self_->init(gen, stddev, out_stddev);
  if (cross_) cross_->init(gen, stddev, out_stddev);
  fc1_->init(gen, stddev);
  fc2_->init(gen, out_stddev);
}

at::Tensor BlockImpl::forward(const at::Tensor& x, const at::Tensor& enc_out,
                              const BlockContext& ctx) {
  auto drop = [&](const at::Tensor& t) {
    return ctx.dropout > 0.0 ? at::dropout(t, ctx.dropout, ctx.training) : t;
  };
  at::Tensor h = x + drop(self_->forward(ln_self_->forward(x), at::Tensor(), ctx.self, ctx));
  if (kind_ == BlockKind::Decoder) {
    h = h + drop(cross_->forward(ln_cross_->forward(h), enc_out, ctx.cross, ctx));
  }
  return h + drop(fc2_->forward(at::gelu(fc1_->forward(ln_mlp_->forward(h)))));
}

}  // namespace dynapipe::runtime::model
