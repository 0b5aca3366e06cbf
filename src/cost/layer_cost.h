// Analytic per-layer costs: what one layer of each kind costs for a shape. Private to
// cost/; the analytic cost model sums them per stage (docs/cost-model.md).
#pragma once


#include "dynapipe/core/model_kind.h"

namespace dynapipe::detail {

// Everything the formulas need, precomputed once per cost model (doubles: the formulas
// multiply token counts by widths and would overflow int32).
struct LayerCoefficients {
  double e = 2;                   // bytes per element
  double h = 0, k = 0, f = 0;     // hidden, attention width (heads x head_dim), ffn
  double a = 0, v = 0;            // heads, vocab
  double matmul_ms_per_flop = 0;  // 1 / (peak x eff_max)
  double half_rows = 0;           // m_half of the efficiency curve
  double attention_slowdown = 1;  // 1 / DeviceSpec::attention_efficiency
  double ms_per_byte = 0;         // 1 / memory bandwidth
  double backward_speedup = 1;
  double op_ms = 0;               // per-op overhead
  bool libtorch_memory = false;   // memory terms of the LibTorch runtime (the cpu preset)
  bool flash_attention = false;   // DeviceSpec::flash_attention
};

// One layer's (or embedding's, or head's) cost. Memory in bytes, as double until the
// stage total is rounded. V is double, or a vector of doubles (GCC's vector extension)
// that holds several micro-batches' costs in its lanes, computed by the same source.
template <typename V>
struct BasicLayerCost {
  V fwd_ms{};
  V bwd_input_ms{};   // includes recomputation
  V bwd_weight_ms{};
  V stored_bytes{};
  V peak_bytes{};     // transient on top of stored
  // Adds `count` layers: times and stored add up, the transient is the max. Inline:
  // the batching's segment scans cost every stage of ~10^5 shapes per plan.
  void add(const BasicLayerCost& other, int count) {
    const double n = count;
    fwd_ms += n * other.fwd_ms;
    bwd_input_ms += n * other.bwd_input_ms;
    bwd_weight_ms += n * other.bwd_weight_ms;
    stored_bytes += n * other.stored_bytes;
    peak_bytes = peak_bytes < other.peak_bytes ? other.peak_bytes : peak_bytes;  // std::max
  }
};
using LayerCost = BasicLayerCost<double>;

// A transformer layer's cost under every recompute mode: the modes share every term but
// what is kept and what backward recomputes, so one evaluation serves all three (the
// varlen scans cost none and selective of a segment together).
template <typename V>
struct BasicLayerTerms {
  BasicLayerCost<V> common;   // times without recomputation; memory left to in()
  V stored_none{};            // every activation kept
  V working{};                // backward's transient peak
  V score_bytes{};            // what the attention scores keep
  V selective_bwd_ms{};       // recomputing the attention core in backward
  V full_stored{};            // only the layer's input kept
  // The layer's cost under `mode`.
  BasicLayerCost<V> in(Recompute mode) const {
    BasicLayerCost<V> cost = common;
    switch (mode) {
      case Recompute::None:
        cost.stored_bytes = stored_none;
        cost.peak_bytes = working;
        break;
      case Recompute::Selective:
        cost.stored_bytes = stored_none - score_bytes;
        cost.peak_bytes = working + score_bytes;
        cost.bwd_input_ms += selective_bwd_ms;
        break;
      case Recompute::Full:
        cost.stored_bytes = full_stored;
        cost.peak_bytes = working + stored_none;
        cost.bwd_input_ms += common.fwd_ms;
        break;
    }
    return cost;
  }
};
using LayerTerms = BasicLayerTerms<double>;
// One GPT layer or T5 encoder layer over `batch` rows of `seqlen` tokens.
LayerTerms encoder_layer_terms(const LayerCoefficients& c, double batch, double seqlen, double density);
// One T5 decoder layer: causal self-attention over dec_seqlen, cross-attention, MLP.
LayerTerms decoder_layer_terms(const LayerCoefficients& c, double batch, double enc_seqlen,
                               double dec_seqlen, double self_density, double cross_density);
LayerCost embedding_cost(const LayerCoefficients& c, double tokens);
LayerCost head_cost(const LayerCoefficients& c, double tokens);

}  // namespace dynapipe::detail
