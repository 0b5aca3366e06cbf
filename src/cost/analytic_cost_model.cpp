// The analytic cost model: FLOPs and bytes of each layer kind from the model's shapes,
// turned into time with a shape-dependent matmul efficiency and the memory bandwidth,
// and activation memory after Korthikanti et al., "Reducing Activation Recomputation in
// Large Transformer Models" (2022). docs/cost-model.md derives every term.
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include "cost/layer_cost.h"

#include "dynapipe/core/cpu_dispatch.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/cost_model.h"

// Lanes (vectors of four doubles) pass between this file's functions, which are internal
// and inlined into their callers: GCC's note that such arguments change the ABI where AVX
// is off (the baseline build) concerns calls across translation units only.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dynapipe {
namespace detail {
namespace {

// Elementary ops a layer runs (kernels / dispatches), for DeviceSpec::op_overhead_ms.
// Forward of a GPT layer: LN, QKV, scores, softmax, dropout, AV, proj, dropout+residual,
// LN, fc1, GELU, fc2, dropout+residual, plus two reshapes. Backward runs about twice as
// many, four of which are the weight-gradient matmuls.
constexpr double kLayerFwdOps = 15;
constexpr double kLayerBwdWeightOps = 4;
constexpr double kLayerBwdInputOps = 26;
constexpr double kAttentionCoreOps = 4;     // scores, softmax, dropout, AV
constexpr double kCrossAttentionExtraOps = 9;  // LN, Q, KV, scores, softmax, dropout, AV, proj, residual
constexpr double kEmbeddingOps = 3;
constexpr double kHeadOps = 6;
// Elementwise backward kernels read the saved input and the incoming gradient and write
// the outgoing one: about 1.5x the bytes of their forward.
constexpr double kMemoryBoundBackwardFactor = 1.5;

// Time of a matmul with `flops` over `rows` rows at efficiency eff_max * m / (m + m_half):
// flops / (peak * eff) = flops * (m + m_half) / m / (peak * eff_max), linear in m.
// (A select, not a branch, so that vector lanes take it one by one.)
template <typename V>
[[gnu::always_inline]] inline V matmul_ms(const LayerCoefficients& c, V flops, V rows) {
  const V ms = flops * (rows + c.half_rows) / rows * c.matmul_ms_per_flop;
  return rows > 0 && flops > 0 ? ms : V{};
}

// std::max(a, b) lane by lane: b where a < b, else a.
template <typename V>
[[gnu::always_inline]] inline V max_of(V a, V b) {
  return a < b ? b : a;
}

// The layer formulas below take V = double, or Lanes: several micro-batches' shapes in
// vector lanes, costed by the same arithmetic in the same order, so each lane holds
// exactly the double's result. Lanes skip the formulas' guard against no tokens: their
// caller costs only micro-batches with tokens in every lane.
template <typename V>
[[gnu::always_inline]] inline bool no_tokens(V n) {
  if constexpr (std::is_same_v<V, double>) {
    return n <= 0;
  } else {
    return false;
  }
}

// Attention backward over forward, in matmul work: dV and dP, dQ and dK (2x); fused
// attention also recomputes QK^T, which it never stored (2.5x).
double attention_backward_factor(const LayerCoefficients& c) { return c.flash_attention ? 2.5 : 2.0; }

// One GPT layer or T5 encoder layer over b rows of s tokens.
template <typename V>
[[gnu::always_inline]] inline BasicLayerTerms<V> encoder_layer_terms_of(const LayerCoefficients& c, V b, V s, V density) {
  BasicLayerTerms<V> terms;
  BasicLayerCost<V>& cost = terms.common;
  const V n = b * s;  // tokens
  if (no_tokens(n)) return terms;
  const double e = c.e, h = c.h, k = c.k, f = c.f;
  const V scores = b * c.a * s * s * density;  // attention score elements
  const V kept_scores = c.flash_attention ? V{} : scores;  // those written to memory

  const V dense_flops = 2.0 * n * (4 * h * k + 2 * h * f);  // QKV, proj, fc1, fc2
  const V attention_flops = 4.0 * b * s * s * k * density;  // QK^T and AV
  const V dense_ms = matmul_ms(c, dense_flops, n);
  const V attention_ms = matmul_ms(c, attention_flops, n) * c.attention_slowdown;
  // LN x2, dropout+residual x2 (with 1-byte masks), GELU; softmax + dropout over scores.
  const V elementwise_bytes = n * h * (10 * e + 2) + 2 * e * n * f + (4 * e + 1) * kept_scores;
  const V attention_core_bytes = (4 * e + 1) * kept_scores;
  const V elementwise_ms = elementwise_bytes * c.ms_per_byte;

  cost.fwd_ms = dense_ms + attention_ms + elementwise_ms + kLayerFwdOps * c.op_ms;
  cost.bwd_weight_ms = dense_ms / c.backward_speedup + kLayerBwdWeightOps * c.op_ms;
  cost.bwd_input_ms = (dense_ms + attention_backward_factor(c) * attention_ms) / c.backward_speedup +
                      kMemoryBoundBackwardFactor * elementwise_ms + kLayerBwdInputOps * c.op_ms;

  // Korthikanti et al. with element size e (their formula is e = 2, k = h, f = 4h):
  // LN inputs 2e nh, QKV input e nh, Q K V 3e nk, proj input e nk, fc1 input e nh,
  // GELU input and output 2e nf, dropout masks 2 nh, softmax output + mask + dropout
  // output (2e + 1) per score. The LibTorch runtime keeps no dropout mask and only the
  // softmax output per score (e), plus LayerNorm's mean and rstd (2 x 2 x 4 n). Its
  // backward holds two score-sized gradients at once, by which time the layer's MLP has
  // released what it kept (GELU input and output, LN and fc1 inputs).
  const bool lt = c.libtorch_memory;
  const double per_score = lt ? e : 2 * e + 1;
  const V stored_none = n * h * (4 * e + (lt ? 0 : 2)) + 4 * e * n * k + 2 * e * n * f + per_score * kept_scores +
                        (lt ? 16.0 * n : V{});
  const V working = lt ? max_of<V>(2 * e * kept_scores - 2 * e * n * (f + h), 2 * e * n * f)
                       : max_of<V>(2 * e * kept_scores, 2 * e * n * f) + 4 * e * n * h;
  terms.stored_none = stored_none;
  terms.working = working;
  terms.score_bytes = per_score * kept_scores;
  terms.selective_bwd_ms = attention_ms + attention_core_bytes * c.ms_per_byte + kAttentionCoreOps * c.op_ms;
  terms.full_stored = e * n * h;
  return terms;
}

// One T5 decoder layer: causal self-attention over sd, cross-attention sd x se, MLP.
template <typename V>
[[gnu::always_inline]] inline BasicLayerTerms<V> decoder_layer_terms_of(const LayerCoefficients& c, V b, V se, V sd, V self_density,
                                          V cross_density) {
  BasicLayerTerms<V> terms;
  BasicLayerCost<V>& cost = terms.common;
  const V nd = b * sd, ne = b * se;
  if (no_tokens(nd)) return terms;
  const double e = c.e, h = c.h, k = c.k, f = c.f;
  const V self_scores = b * c.a * sd * sd * self_density;
  const V cross_scores = b * c.a * sd * se * cross_density;  // attention score elements
  // Those written to memory, as for the encoder layer (none with flash attention).
  const V kept_self_scores = c.flash_attention ? V{} : self_scores;
  const V kept_cross_scores = c.flash_attention ? V{} : cross_scores;
  const V kept_scores = kept_self_scores + kept_cross_scores;

  // Self QKV + proj (4hk), cross Q + proj (2hk), MLP (2hf) over decoder tokens; cross K, V
  // (2hk) over encoder tokens.
  const V dense_ms = matmul_ms(c, 2.0 * nd * (6 * h * k + 2 * h * f), nd) + matmul_ms(c, 2.0 * ne * 2 * h * k, ne);
  const V attention_ms =
      matmul_ms(c, 4.0 * b * k * (sd * sd * self_density + sd * se * cross_density), nd) * c.attention_slowdown;
  const V elementwise_bytes = nd * h * (15 * e + 3) + 2 * e * nd * f + (4 * e + 1) * kept_scores;
  const V elementwise_ms = elementwise_bytes * c.ms_per_byte;
  const double ops = kLayerFwdOps + kCrossAttentionExtraOps;

  cost.fwd_ms = dense_ms + attention_ms + elementwise_ms + ops * c.op_ms;
  cost.bwd_weight_ms = dense_ms / c.backward_speedup + (kLayerBwdWeightOps + 3) * c.op_ms;
  cost.bwd_input_ms = (dense_ms + attention_backward_factor(c) * attention_ms) / c.backward_speedup +
                      kMemoryBoundBackwardFactor * elementwise_ms +
                      (kLayerBwdInputOps + 2 * kCrossAttentionExtraOps - 3) * c.op_ms;

  // As the encoder layer, plus the cross-attention block: its LN input and output, Q,
  // K and V (K, V over encoder tokens), proj input, dropout mask, scores.
  // LibTorch runtime: as for the encoder layer (no dropout masks, e per score, three
  // LayerNorms' statistics); the cross-attention backward also holds dK, dV over the
  // encoder tokens.
  const bool lt = c.libtorch_memory;
  const double per_score = lt ? e : 2 * e + 1;
  const V stored_none = nd * h * (6 * e + (lt ? 0 : 3)) + 6 * e * nd * k + 2 * e * ne * k + 2 * e * nd * f +
                        per_score * kept_scores + (lt ? 24.0 * nd : V{});
  const V mlp_released = 2 * e * nd * (f + h);
  // std::max({x, y, z}) keeps the first largest, as max_of(max_of(x, y), z) does.
  const V working =
      lt ? max_of<V>(max_of<V>(2 * e * kept_self_scores - mlp_released,
                               2 * e * kept_cross_scores + 2 * e * ne * k - mlp_released),
                     2 * e * nd * f)
         : max_of<V>(max_of<V>(2 * e * kept_self_scores, 2 * e * kept_cross_scores), 2 * e * nd * f) +
               4 * e * nd * h + 2 * e * ne * h;
  terms.stored_none = stored_none;
  terms.working = working;
  terms.score_bytes = per_score * kept_scores;
  terms.selective_bwd_ms =
      attention_ms + (4 * e + 1) * kept_scores * c.ms_per_byte + 2 * kAttentionCoreOps * c.op_ms;
  terms.full_stored = e * nd * h;
  return terms;
}

// Token + position lookup and dropout over n tokens. Its backward is the scatter-add
// into the tables: weight gradient only, apart from the dropout.
template <typename V>
[[gnu::always_inline]] inline BasicLayerCost<V> embedding_cost_of(const LayerCoefficients& c, V n) {
  BasicLayerCost<V> cost;
  if (no_tokens(n)) return cost;
  const double e = c.e, h = c.h;
  cost.fwd_ms = n * h * (5 * e + 1) * c.ms_per_byte + kEmbeddingOps * c.op_ms;
  cost.bwd_input_ms = n * h * (2 * e + 1) * c.ms_per_byte + c.op_ms;
  cost.bwd_weight_ms = 3 * e * n * h * c.ms_per_byte + 2 * c.op_ms;
  cost.stored_bytes = n * h;  // dropout mask
  cost.peak_bytes = e * n * h;
  return cost;
}

// Final LN, LM head (h x vocab matmul) and cross-entropy over n tokens. The loss keeps
// the logits' softmax in fp32 (4 n V bytes) until backward.
template <typename V>
[[gnu::always_inline]] inline BasicLayerCost<V> head_cost_of(const LayerCoefficients& c, V n) {
  BasicLayerCost<V> cost;
  if (no_tokens(n)) return cost;
  const double e = c.e, h = c.h, v = c.v;
  const V head_ms = matmul_ms(c, 2.0 * n * h * v, n);
  cost.fwd_ms = head_ms + (2 * e * n * h + (e + 8) * n * v) * c.ms_per_byte + kHeadOps * c.op_ms;
  cost.bwd_weight_ms = head_ms / c.backward_speedup + c.op_ms;
  cost.bwd_input_ms = head_ms / c.backward_speedup + (3 * e * n * h + (e + 8) * n * v) * c.ms_per_byte +
                      (kHeadOps - 1) * c.op_ms;
  cost.stored_bytes = 4 * n * v + 2 * e * n * h;
  cost.peak_bytes = (4 + e) * n * v;  // the logits in e and their fp32 gradient
  return cost;
}

}  // namespace

DYNAPIPE_ALSO_AVX2 LayerTerms encoder_layer_terms(const LayerCoefficients& c, double b, double s, double density) {
  return encoder_layer_terms_of(c, b, s, density);
}
DYNAPIPE_ALSO_AVX2 LayerTerms decoder_layer_terms(const LayerCoefficients& c, double b, double se, double sd,
                                                  double self_density, double cross_density) {
  return decoder_layer_terms_of(c, b, se, sd, self_density, cross_density);
}
DYNAPIPE_ALSO_AVX2 LayerCost embedding_cost(const LayerCoefficients& c, double n) { return embedding_cost_of(c, n); }
DYNAPIPE_ALSO_AVX2 LayerCost head_cost(const LayerCoefficients& c, double n) { return head_cost_of(c, n); }

}  // namespace detail

namespace {

// Four micro-batches' costs side by side (GCC's vector extension: one AVX2 register, or two
// SSE2 halves in the baseline build).
using Lanes = double __attribute__((vector_size(4 * sizeof(double))));
constexpr std::size_t kLanes = 4;

using detail::BasicLayerCost;
using detail::decoder_layer_terms;
using detail::embedding_cost;
using detail::encoder_layer_terms;
using detail::head_cost;
using detail::LayerCoefficients;
using detail::LayerCost;

class AnalyticCostModel final : public CostModel {
 public:
  AnalyticCostModel(const ModelSpec& model, const DeviceSpec& device, const CostModelOptions& options)
      : model_(model), device_(device), options_(options),
        stages_(resolve_stage_layers(model, options)) {
    // Tensor parallelism (Megatron, no sequence parallelism) splits heads, the ffn width
    // and the vocabulary over tp devices; hidden-wide tensors (LN, dropout, residual) are
    // replicated. Each device then runs the layer with the narrower widths.
    const double tp = options.tp;
    c_.e = device.bytes_per_element;
    c_.h = model.hidden;
    c_.k = model.attention_width() / tp;
    c_.f = model.ffn_hidden / tp;
    c_.a = model.heads / tp;
    c_.v = std::ceil(model.vocab / tp);
    c_.matmul_ms_per_flop = 1.0 / (device.peak_tflops * 1e9 * device.matmul_efficiency);
    c_.half_rows = device.matmul_half_rows;
    c_.attention_slowdown = 1.0 / device.attention_efficiency;
    c_.ms_per_byte = 1.0 / (device.memory_bandwidth_gbs * 1e6);
    c_.backward_speedup = device.backward_speedup;
    c_.op_ms = device.op_overhead_ms;
    // The cpu preset is the device this project's LibTorch runtime trains on: its memory
    // terms are what that runtime keeps (docs/cost-model.md), not Megatron's.
    c_.libtorch_memory = device.name == "cpu";
    c_.flash_attention = device.flash_attention;
    // Stages with the same layers cost the same: bottleneck_ms_and_bytes() costs the
    // first of each kind only (GPT-6.7B pp 4: the two middle stages).
    for (std::size_t s = 0; s < stages_.size(); ++s) {
      std::size_t first = s;
      for (std::size_t t = 0; t < s; ++t) {
        if (same_layers(stages_[t], stages_[s])) {
          first = t;
          break;
        }
      }
      if (first == s) {
        distinct_.push_back(s);
      } else {
        repeats_.emplace_back(s, first);
      }
      has_kind_.embedding = has_kind_.embedding || stages_[s].has_embedding;
      has_kind_.encoder = has_kind_.encoder || stages_[s].has_encoder();
      has_kind_.dec_embedding = has_kind_.dec_embedding || stages_[s].has_dec_embedding;
      has_kind_.decoder = has_kind_.decoder || stages_[s].has_decoder();
      has_kind_.head = has_kind_.head || stages_[s].has_head;
    }
    const ModelSpec shard = tensor_parallel_shard(model, options.tp);
    for (const StageLayers& s : stages_) {
      const std::int64_t parameters = stage_parameter_count(shard, s);
      static_bytes_.push_back(model_state_bytes(parameters, device.bytes_per_element, options.zero_shards));
      weight_bytes_.push_back(parameters * device.bytes_per_element);
    }
    // Every DP's costing asks for it: probed once per mode here.
    for (Recompute mode : kRecomputeModes) {
      affine_bounds_[static_cast<std::size_t>(mode)] = probe_affine_time_bound(mode);
    }
  }

  const ModelSpec& model() const override { return model_; }
  const DeviceSpec& device() const override { return device_; }
  const std::vector<StageLayers>& stages() const override { return stages_; }

  StageCost stage_cost(int stage, const MicroBatchShape& shape, const AttentionDensity& density,
                       Recompute recompute) const override {
    DYNAPIPE_CHECK(stage >= 0 && stage < num_stages(), cat("stage ", stage, " of ", num_stages()));
    LayerCosts layers(*this, shape, density, recompute);
    return stage_cost_of(stages_[stage], layers);
  }

  // Stages share their layer kinds: each is costed once for all of them.
  void stage_costs(const MicroBatchShape& shape, const AttentionDensity& density,
                   Recompute recompute, std::span<StageCost> out) const override {
    DYNAPIPE_CHECK(out.size() == stages_.size(),
                   cat("stage_costs: ", out.size(), " slots for ", stages_.size(), " stages"));
    LayerCosts layers(*this, shape, density, recompute);
    for (std::size_t s = 0; s < stages_.size(); ++s) out[s] = stage_cost_of(stages_[s], layers);
  }

  // stage_costs() reduced to what the segment scans read, with the same arithmetic in
  // the same order (stage_total()), so the results are identical.
  double bottleneck_ms_and_bytes(const MicroBatchShape& shape, const AttentionDensity& density,
                                 Recompute recompute, std::span<StageCost> scratch,
                                 std::span<std::int64_t> bytes) const override {
    const std::size_t p = stages_.size();
    // Tensor parallelism adds its all-reduces in stage_cost_of(): the general path.
    if (options_.tp > 1 || bytes.size() != 2 * p) {
      return CostModel::bottleneck_ms_and_bytes(shape, density, recompute, scratch, bytes);
    }
    // resolved_modes() with the one mode: the same values, without the lazy layers'
    // checks in every stage's sum (padded shapes: token-based's scan, the padded DP).
    double time_ms = 0;
    resolved_modes(shape, density, std::span<const Recompute>(&recompute, 1), std::span<double>(&time_ms, 1),
                   bytes);
    return time_ms;
  }

  // bottleneck_ms_and_bytes() per mode, the layers' shared terms computed once.
  void bottleneck_ms_and_bytes_modes(const MicroBatchShape& shape, const AttentionDensity& density,
                                     std::span<const Recompute> modes, std::span<StageCost> scratch,
                                     std::span<double> times,
                                     std::span<std::int64_t> bytes) const override {
    const std::size_t p = stages_.size();
    if (options_.tp > 1 || modes.empty() || bytes.size() != 2 * p * modes.size() ||
        times.size() != modes.size()) {
      CostModel::bottleneck_ms_and_bytes_modes(shape, density, modes, scratch, times, bytes);
      return;
    }
    resolved_modes(shape, density, modes, times, bytes);
  }

  // bottleneck_ms_and_bytes_modes() four micro-batches at a time (resolved_lanes()), the
  // rest one by one; lanes need tokens in every micro-batch (the formulas' guard).
  void bottleneck_ms_and_bytes_many(std::span<const MicroBatchShape> shapes,
                                    std::span<const AttentionDensity> densities,
                                    std::span<const Recompute> modes, std::span<StageCost> scratch,
                                    std::span<double> times, std::span<std::int64_t> bytes) const override {
    const std::size_t p = stages_.size(), k = modes.size();
    if (options_.tp > 1 || modes.empty() || densities.size() != shapes.size() ||
        times.size() != k * shapes.size() || bytes.size() != 2 * p * k * shapes.size()) {
      CostModel::bottleneck_ms_and_bytes_many(shapes, densities, modes, scratch, times, bytes);
      return;
    }
    // By mode: micro-batch j's results for mode m at n·m + j (its bytes 2p times that).
    const std::size_t n = shapes.size();
    std::size_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      const bool tokens = std::all_of(shapes.begin() + j, shapes.begin() + j + kLanes, [&](const MicroBatchShape& s) {
        return s.batch > 0 && s.seqlen > 0 && (model_.kind != ModelKind::T5 || s.dec_seqlen > 0);
      });
      if (!tokens) break;
      resolved_lanes(shapes.subspan(j, kLanes), densities.subspan(j, kLanes), modes, times.subspan(j),
                     bytes.subspan(2 * p * j), n);
    }
    for (; j < n; ++j) {
      resolved_modes(shapes[j], densities[j], modes, times.subspan(j), bytes.subspan(2 * p * j), n);
    }
  }
  int costing_lanes() const override { return options_.tp > 1 ? 1 : static_cast<int>(kLanes); }

  // Probed once per mode by the constructor (probe_affine_time_bound()).
  std::optional<AffineTimeBound> affine_time_bound(Recompute recompute) const override {
    return affine_bounds_[static_cast<std::size_t>(recompute)];
  }

  // Merging two micro-batches pays the op overheads once, runs the same flops in larger
  // (no less efficient) matmuls and adds no attention pair: never slower.
  bool subadditive() const override { return true; }
  // Every term grows with rows, tokens and Σ L².
  bool monotone() const override { return true; }

  std::int64_t static_bytes(int stage) const override {
    DYNAPIPE_CHECK(stage >= 0 && stage < num_stages(), cat("stage ", stage, " of ", num_stages()));
    return static_bytes_[stage];
  }

  std::int64_t weight_bytes(int stage) const override {
    DYNAPIPE_CHECK(stage >= 0 && stage < num_stages(), cat("stage ", stage, " of ", num_stages()));
    return weight_bytes_[stage];
  }

  std::string describe() const override { return cat("analytic:", device_.name); }

 private:
  // The cost of each layer kind for one micro-batch, computed on first use.
  class LayerCosts {
   public:
    LayerCosts(const AnalyticCostModel& m, const MicroBatchShape& shape,
               const AttentionDensity& density, Recompute recompute)
        : b(static_cast<double>(shape.batch)),
          se(static_cast<double>(round_up(shape.seqlen, m.options_.seqlen_multiple))),
          sd(m.model_.kind == ModelKind::T5
                 ? static_cast<double>(round_up(shape.dec_seqlen, m.options_.seqlen_multiple))
                 : 0.0),
          m_(m), density_(density), recompute_(recompute) {}

    const double b, se, sd;  // rows, rounded encoder and decoder lengths

    const LayerCost& embedding() {
      return get(embedding_, [&] { return embedding_cost(m_.c_, b * se); });
    }
    const LayerCost& encoder() {
      return get(encoder_, [&] { return encoder_terms().in(recompute_); });
    }
    // A transformer layer under every mode (not cached).
    detail::LayerTerms encoder_terms() const { return encoder_layer_terms(m_.c_, b, se, density_.enc); }
    detail::LayerTerms decoder_terms() const {
      const double cross_density = std::sqrt(density_.enc * density_.dec);
      return decoder_layer_terms(m_.c_, b, se, sd, density_.dec, cross_density);
    }
    const LayerCost& dec_embedding() {
      return get(dec_embedding_, [&] { return embedding_cost(m_.c_, b * sd); });
    }
    const LayerCost& decoder() {
      return get(decoder_, [&] { return decoder_terms().in(recompute_); });
    }
    const LayerCost& head() {
      return get(head_,
                 [&] { return head_cost(m_.c_, b * (m_.model_.kind == ModelKind::T5 ? sd : se)); });
    }
    Recompute recompute() const { return recompute_; }

   private:
    template <typename Make>
    static const LayerCost& get(std::optional<LayerCost>& slot, Make&& make) {
      if (!slot) slot = make();
      return *slot;
    }
    const AnalyticCostModel& m_;
    AttentionDensity density_;
    Recompute recompute_;
    std::optional<LayerCost> embedding_, encoder_, dec_embedding_, decoder_, head_;
  };

  // Without attention (density 0) every layer's time is affine in its tokens: the
  // matmuls cost flops · (rows + m_half) / rows with flops linear in rows, the memory-
  // bound work is linear, the op overheads fixed. Attention only adds (scores, their
  // recomputation), and so does rounding the tokens up and tensor-parallel
  // communication. So three probes per stage at density 0 give the exact line, which
  // bounds every micro-batch's time from below; it is shaved by a relative 1e-6 against
  // rounding in the probes. The attention within the samples adds, per score, a memory-
  // bound part and a matmul part at the efficiency of the micro-batch's n tokens,
  // (n + m_half)/n times its best: probed at 2^20 tokens and scaled by n/(n + m_half),
  // that is at most the cost of a score in any micro-batch. The cross-attention of T5's
  // decoder pairs the samples' encoder and decoder lengths; it is left out (>= 0).
  std::optional<AffineTimeBound> probe_affine_time_bound(Recompute recompute) const {
    const double m = static_cast<double>(options_.seqlen_multiple);
    const bool t5 = model_.kind == ModelKind::T5;
    auto probe = [&](std::size_t s, std::int64_t enc, std::int64_t dec,
                     AttentionDensity density = {.enc = 0, .dec = 0}) {
      const MicroBatchShape shape{.batch = 1, .seqlen = enc, .dec_seqlen = t5 ? dec : 0};
      LayerCosts layers(*this, shape, density, recompute);
      const LayerCost total = stage_total(stages_[s], layers);
      return total.fwd_ms + (total.bwd_input_ms + total.bwd_weight_ms);
    };
    constexpr std::int64_t kLarge = std::int64_t{1} << 20;  // tokens of the squares' probes
    constexpr double kLargeDensity = 1.0 / 4096;             // 256 scores per token
    const double large = static_cast<double>(kLarge);
    const double squares = kLargeDensity * large * large;  // Σ L² of the probes
    const double best_efficiency = large / (large + c_.half_rows);
    constexpr double kShave = 1 - 1e-6;
    const std::int64_t one = options_.seqlen_multiple, two = 2 * options_.seqlen_multiple;
    AffineTimeBound bound;
    for (std::size_t s = 0; s < stages_.size(); ++s) {
      const double base = probe(s, one, one);
      const double enc_ms = (probe(s, two, one) - base) / m;
      const double dec_ms = t5 ? (probe(s, one, two) - base) / m : 0.0;
      const double fixed_ms = base - enc_ms * m - dec_ms * m;
      if (!(enc_ms >= 0 && dec_ms >= 0 && fixed_ms >= 0)) return std::nullopt;
      bound.enc_ms.push_back(enc_ms * kShave);
      bound.dec_ms.push_back(dec_ms * kShave);
      bound.fixed_ms.push_back(fixed_ms * kShave);
      // Each less 1e-12 of the flat time, far above the rounding in the difference (a
      // stage without such attention differs by a few ulp, of either sign).
      const double flat = probe(s, kLarge, kLarge);
      auto per_square = [&](AttentionDensity density) {
        const double extra = probe(s, kLarge, kLarge, density) - flat - 1e-12 * flat;
        return std::max(0.0, extra / squares * best_efficiency * kShave);
      };
      bound.enc_sq_ms.push_back(per_square({.enc = kLargeDensity, .dec = 0}));
      bound.dec_sq_ms.push_back(t5 ? per_square({.enc = 0, .dec = kLargeDensity}) : 0.0);
    }
    return bound;
  }

  // LayerCosts' values for one mode, computed beforehand (bottleneck_ms_and_bytes_modes()):
  // stage_total() reads them as it reads LayerCosts.
  // V: double, or Lanes (resolved_lanes()).
  template <typename V>
  struct ResolvedLayers {
    ResolvedLayers(const V& b_, const V& se_, const V& sd_) : b(b_), se(se_), sd(sd_) {}
    explicit ResolvedLayers(const LayerCosts& layers) : b(layers.b), se(layers.se), sd(layers.sd) {}
    const V b, se, sd;
    BasicLayerCost<V> embedding_cost, encoder_cost, dec_embedding_cost, decoder_cost, head_cost;
    const BasicLayerCost<V>& embedding() const { return embedding_cost; }
    const BasicLayerCost<V>& encoder() const { return encoder_cost; }
    const BasicLayerCost<V>& dec_embedding() const { return dec_embedding_cost; }
    const BasicLayerCost<V>& decoder() const { return decoder_cost; }
    const BasicLayerCost<V>& head() const { return head_cost; }
  };

  // bottleneck_ms_and_bytes_modes() for tp = 1: the segment scans' costing, built for AVX2
  // too (core/cpu_dispatch.h; the same values bit for bit), as are the layer terms.
  // Mode k's results at times[stride·k] and bytes[2p·stride·k, +2p).
  DYNAPIPE_ALSO_AVX2 void resolved_modes(
      const MicroBatchShape& shape, const AttentionDensity& density, std::span<const Recompute> modes,
      std::span<double> times, std::span<std::int64_t> bytes, std::size_t stride = 1) const {
    const std::size_t p = stages_.size();
    // Every layer kind a stage has, resolved up front: the mode-free ones once, the
    // transformer layers per mode. The same values the lazy LayerCosts gives, summed the
    // same way, without its checks in every stage's sum (the segment scans' costing was
    // mostly that: ~1,000 of ~1,300 instructions per segment, GPT-6.7B pp 4 short256).
    LayerCosts layers(*this, shape, density, modes.front());
    ResolvedLayers<double> resolved(layers);
    if (has_kind_.embedding) resolved.embedding_cost = layers.embedding();
    if (has_kind_.dec_embedding) resolved.dec_embedding_cost = layers.dec_embedding();
    if (has_kind_.head) resolved.head_cost = layers.head();
    const detail::LayerTerms encoder = has_kind_.encoder ? layers.encoder_terms() : detail::LayerTerms{};
    const detail::LayerTerms decoder = has_kind_.decoder ? layers.decoder_terms() : detail::LayerTerms{};
    for (std::size_t k = 0; k < modes.size(); ++k) {
      resolved.encoder_cost = encoder.in(modes[k]);
      resolved.decoder_cost = decoder.in(modes[k]);
      times[stride * k] = bottleneck_of(resolved, bytes.subspan(2 * p * stride * k, 2 * p));
    }
  }

  // resolved_modes() for kLanes micro-batches at once, one per vector lane: the same
  // values as kLanes calls (the same formulas in the same order; no FMA in either build,
  // core/cpu_dispatch.h), lane j's results for mode m at times[stride·m + j] and
  // bytes[2p·(stride·m + j), +2p). REQUIRES: tokens in every micro-batch (and decoder
  // tokens, T5).
  DYNAPIPE_ALSO_AVX2 void resolved_lanes(std::span<const MicroBatchShape> shapes,
                                         std::span<const AttentionDensity> densities,
                                         std::span<const Recompute> modes, std::span<double> times,
                                         std::span<std::int64_t> bytes, std::size_t stride) const {
    const std::size_t p = stages_.size(), k = modes.size();
    const bool t5 = model_.kind == ModelKind::T5;
    Lanes b, se, sd, enc_density, dec_density, cross_density;
    for (std::size_t j = 0; j < kLanes; ++j) {  // as LayerCosts reads one shape
      const MicroBatchShape& shape = shapes[j];
      b[j] = static_cast<double>(shape.batch);
      se[j] = static_cast<double>(round_up(shape.seqlen, options_.seqlen_multiple));
      sd[j] = t5 ? static_cast<double>(round_up(shape.dec_seqlen, options_.seqlen_multiple)) : 0.0;
      enc_density[j] = densities[j].enc;
      dec_density[j] = densities[j].dec;
      cross_density[j] = has_kind_.decoder ? std::sqrt(densities[j].enc * densities[j].dec) : 0.0;
    }
    ResolvedLayers<Lanes> resolved(b, se, sd);
    if (has_kind_.embedding) resolved.embedding_cost = detail::embedding_cost_of<Lanes>(c_, b * se);
    if (has_kind_.dec_embedding) resolved.dec_embedding_cost = detail::embedding_cost_of<Lanes>(c_, b * sd);
    if (has_kind_.head) resolved.head_cost = detail::head_cost_of<Lanes>(c_, b * (t5 ? sd : se));
    const detail::BasicLayerTerms<Lanes> encoder =
        has_kind_.encoder ? detail::encoder_layer_terms_of<Lanes>(c_, b, se, enc_density)
                          : detail::BasicLayerTerms<Lanes>{};
    const detail::BasicLayerTerms<Lanes> decoder =
        has_kind_.decoder ? detail::decoder_layer_terms_of<Lanes>(c_, b, se, sd, dec_density, cross_density)
                          : detail::BasicLayerTerms<Lanes>{};
    for (std::size_t m = 0; m < k; ++m) {
      resolved.encoder_cost = encoder.in(modes[m]);
      resolved.decoder_cost = decoder.in(modes[m]);
      Lanes time_ms{};
      for (const std::size_t s : distinct_) {  // bottleneck_of(), lane by lane
        const BasicLayerCost<Lanes> total = stage_total(stages_[s], resolved);
        const Lanes stage_ms = total.fwd_ms + (total.bwd_input_ms + total.bwd_weight_ms);
        time_ms = time_ms < stage_ms ? stage_ms : time_ms;
        const Lanes sent = output_bytes_of<Lanes>(stages_[s], b, se, sd);
        for (std::size_t j = 0; j < kLanes; ++j) {
          std::int64_t* out = bytes.data() + 2 * p * (stride * m + j);
          out[s] = static_cast<std::int64_t>(std::ceil(total.stored_bytes[j])) +
                   static_cast<std::int64_t>(sent[j]);
          out[p + s] = static_cast<std::int64_t>(std::ceil(total.peak_bytes[j]));
        }
      }
      for (std::size_t j = 0; j < kLanes; ++j) {
        std::int64_t* out = bytes.data() + 2 * p * (stride * m + j);
        for (const auto& [s, first] : repeats_) {
          out[s] = out[first];
          out[p + s] = out[p + first];
        }
        times[stride * m + j] = time_ms[j];
      }
    }
  }

  // The bottleneck time and per-stage bytes of bottleneck_ms_and_bytes() (tp = 1),
  // from layers resolved in one mode (ResolvedLayers, resolved_modes()).
  template <typename Layers>
  double bottleneck_of(Layers& layers, std::span<std::int64_t> bytes) const {
    const std::size_t p = stages_.size();
    double time_ms = 0;
    for (const std::size_t s : distinct_) {
      const LayerCost total = stage_total(stages_[s], layers);
      time_ms = std::max(time_ms, total.fwd_ms + (total.bwd_input_ms + total.bwd_weight_ms));
      bytes[s] = static_cast<std::int64_t>(std::ceil(total.stored_bytes)) +
                 output_bytes(stages_[s], layers);  // held_bytes()
      bytes[p + s] = static_cast<std::int64_t>(std::ceil(total.peak_bytes));
    }
    for (const auto& [s, first] : repeats_) {  // their times are already in the max
      bytes[s] = bytes[first];
      bytes[p + s] = bytes[p + first];
    }
    return time_ms;
  }

  // The stage's layers summed (before tensor-parallel communication): times and stored
  // bytes added up, peak the largest piece's.
  template <typename Layers>
  static std::decay_t<decltype(std::declval<Layers&>().embedding())> stage_total(
      const StageLayers& s, Layers& layers) {
    std::decay_t<decltype(layers.embedding())> total;
    if (s.has_embedding) total.add(layers.embedding(), 1);
    // The encoder output (the K/V input of every decoder layer) is one tensor the decoder
    // layers share; it is not counted (its K and V projections are, per layer).
    if (s.has_encoder()) total.add(layers.encoder(), s.enc_end - s.enc_begin);
    if (s.has_dec_embedding) total.add(layers.dec_embedding(), 1);
    if (s.has_decoder()) total.add(layers.decoder(), s.dec_end - s.dec_begin);
    if (s.has_head) total.add(layers.head(), 1);
    return total;
  }

  // Whether two stages cost the same: the same layer counts and pieces (stage_total()).
  static bool same_layers(const StageLayers& a, const StageLayers& b) {
    return a.has_embedding == b.has_embedding && a.enc_end - a.enc_begin == b.enc_end - b.enc_begin &&
           a.has_dec_embedding == b.has_dec_embedding && a.dec_end - a.dec_begin == b.dec_end - b.dec_begin &&
           a.has_head == b.has_head;
  }

  StageCost stage_cost_of(const StageLayers& s, LayerCosts& layers) const {
    LayerCost total = stage_total(s, layers);
    const double b = layers.b, se = layers.se, sd = layers.sd;
    if (options_.tp > 1) add_tensor_parallel_comm(s, b, se, sd, layers.recompute(), total);

    StageCost cost;
    cost.fwd_ms = total.fwd_ms;
    cost.bwd_input_ms = total.bwd_input_ms;
    cost.bwd_weight_ms = total.bwd_weight_ms;
    cost.bwd_ms = total.bwd_input_ms + total.bwd_weight_ms;
    cost.stored_bytes = static_cast<std::int64_t>(std::ceil(total.stored_bytes));
    cost.peak_bytes = static_cast<std::int64_t>(std::ceil(total.peak_bytes));
    cost.output_bytes = output_bytes(s, layers);
    return cost;
  }

  // The activation stage `s` sends on (0 on the last stage). T5: the encoder output
  // travels with the decoder hidden state once the decoder began.
  template <typename Layers>
  std::int64_t output_bytes(const StageLayers& s, const Layers& layers) const {
    return static_cast<std::int64_t>(output_bytes_of<double>(s, layers.b, layers.se, layers.sd));
  }
  // The same for b rows of se encoder and sd decoder tokens (rounded), before the cast.
  // V: double, or Lanes (resolved_lanes(): the same product per lane).
  template <typename V>
  V output_bytes_of(const StageLayers& s, const V& b, const V& se, const V& sd) const {
    if (s.has_head) return V{};
    const V rows = s.has_decoder() || s.has_dec_embedding ? se + sd : se;
    return c_.e * b * rows * c_.h;
  }

  // The per-device shape of one tensor-parallel shard: heads, ffn and vocab split tp ways.
  static ModelSpec tensor_parallel_shard(const ModelSpec& model, int tp) {
    ModelSpec shard = model;
    if (tp <= 1) return shard;
    shard.kv_channels = model.head_dim();
    shard.heads = model.heads / tp;
    shard.ffn_hidden = model.ffn_hidden / tp;
    shard.vocab = (model.vocab + tp - 1) / tp;
    return shard;
  }

  // Megatron's tensor-parallel all-reduces of the hidden state (e * tokens * h bytes) over
  // the tp devices: per GPT/encoder layer 2 in forward (after attention and after the
  // MLP) and 2 in backward, per decoder layer 3 and 3 (cross-attention); the embedding 1
  // in forward, the head 1 in backward; full recomputation repeats the forward's.
  void add_tensor_parallel_comm(const StageLayers& s, double b, double se, double sd,
                                Recompute recompute, LayerCost& total) const {
    auto allreduce = [&](double tokens) {
      return allreduce_ms(static_cast<std::int64_t>(c_.e * tokens * c_.h), options_.tp);
    };
    const double enc = allreduce(b * se), dec = allreduce(b * sd);
    const double layers_fwd = 2 * enc * (s.enc_end - s.enc_begin) + 3 * dec * (s.dec_end - s.dec_begin);
    double fwd = layers_fwd, bwd = layers_fwd;
    if (s.has_embedding) fwd += enc;
    if (s.has_dec_embedding) fwd += dec;
    if (s.has_head) bwd += model_.kind == ModelKind::T5 ? dec : enc;
    if (recompute == Recompute::Full) bwd += layers_fwd;
    total.fwd_ms += fwd;
    total.bwd_input_ms += bwd;
  }

  ModelSpec model_;
  DeviceSpec device_;
  CostModelOptions options_;
  std::vector<StageLayers> stages_;
  std::vector<std::int64_t> static_bytes_;
  std::vector<std::int64_t> weight_bytes_;
  // Stages with the same layers (same_layers()): the first of each kind, in order, and
  // every other as (stage, the first of its kind).
  std::vector<std::size_t> distinct_;
  std::vector<std::pair<std::size_t, std::size_t>> repeats_;
  struct {
    bool embedding = false, encoder = false, dec_embedding = false, decoder = false, head = false;
  } has_kind_;  // the layer kinds some stage has
  LayerCoefficients c_;
  std::array<std::optional<AffineTimeBound>, 3> affine_bounds_;  // per Recompute
};

}  // namespace

std::unique_ptr<CostModel> make_analytic_cost_model(const ModelSpec& model, const DeviceSpec& device,
                                                    const CostModelOptions& options) {
  model.validate();
  options.validate();
  auto require = [&](bool ok, const char* field, double got) {
    if (!ok) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("device '", device.name, "': ", field, " must be > 0, got ", got));
    }
  };
  require(device.peak_tflops > 0, "peak_tflops", device.peak_tflops);
  require(device.memory_bandwidth_gbs > 0, "memory_bandwidth_gbs", device.memory_bandwidth_gbs);
  require(device.matmul_efficiency > 0, "matmul_efficiency", device.matmul_efficiency);
  require(device.attention_efficiency > 0, "attention_efficiency", device.attention_efficiency);
  require(device.backward_speedup > 0, "backward_speedup", device.backward_speedup);
  require(device.bytes_per_element > 0, "bytes_per_element", device.bytes_per_element);
  check_tensor_parallel(model, options.tp);
  return std::make_unique<AnalyticCostModel>(model, device, options);
}

}  // namespace dynapipe
