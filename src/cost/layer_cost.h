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
// stage total is rounded.
struct LayerCost {
  double fwd_ms = 0;
  double bwd_input_ms = 0;   // includes recomputation
  double bwd_weight_ms = 0;
  double stored_bytes = 0;
  double peak_bytes = 0;     // transient on top of stored
  // Adds `count` layers: times and stored add up, the transient is the max. Inline:
  // the batching's segment scans cost every stage of ~10^5 shapes per plan.
  void add(const LayerCost& other, int count) {
    fwd_ms += count * other.fwd_ms;
    bwd_input_ms += count * other.bwd_input_ms;
    bwd_weight_ms += count * other.bwd_weight_ms;
    stored_bytes += count * other.stored_bytes;
    peak_bytes = peak_bytes < other.peak_bytes ? other.peak_bytes : peak_bytes;  // std::max
  }
};

// A transformer layer's cost under every recompute mode: the modes share every term but
// what is kept and what backward recomputes, so one evaluation serves all three (the
// varlen scans cost none and selective of a segment together).
struct LayerTerms {
  LayerCost common;             // times without recomputation; memory left to in()
  double stored_none = 0;       // every activation kept
  double working = 0;           // backward's transient peak
  double score_bytes = 0;       // what the attention scores keep
  double selective_bwd_ms = 0;  // recomputing the attention core in backward
  double full_stored = 0;       // only the layer's input kept
  // The layer's cost under `mode`.
  LayerCost in(Recompute mode) const {
    LayerCost cost = common;
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
// One GPT layer or T5 encoder layer over `batch` rows of `seqlen` tokens.
LayerTerms encoder_layer_terms(const LayerCoefficients& c, double batch, double seqlen, double density);
// One T5 decoder layer: causal self-attention over dec_seqlen, cross-attention, MLP.
LayerTerms decoder_layer_terms(const LayerCoefficients& c, double batch, double enc_seqlen,
                               double dec_seqlen, double self_density, double cross_density);
LayerCost embedding_cost(const LayerCoefficients& c, double tokens);
LayerCost head_cost(const LayerCoefficients& c, double tokens);

}  // namespace dynapipe::detail
