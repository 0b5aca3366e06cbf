// FakeCostModel: a CostModel test double with closed-form, monotone costs, for tests and
// benches of the modules that consume a cost model (batching, schedule, planner).
//
// Per stage s, for a shape (batch b, seqlen L, dec_seqlen D) and density (de, dd):
//   base_ms   = stage_scale[s] · (fixed_ms + ms_per_token·b·(L + D)
//                                 + ms_per_attention·b·(de·L² + dd·D²)
//                                 + superlinear_ms·max(0, b·(L + D) − superlinear_from)²
//                                 − dip_ms where b·(L + D) is a multiple of dip_period
//                                 + varlen_fixed_ms where the density is not dense)
//   fwd_ms    = base_ms,  bwd_ms = 2·base_ms        (so fwd + bwd = 3·base_ms)
//   recompute: selective adds selective_extra·base_ms to bwd, full adds base_ms.
//   stored    = bytes_per_token·b·(L+D)  (+ bytes_per_attention·b·(de·L² + dd·D²) unless
//               selective/full); full keeps only full_bytes_per_token·b·(L+D)
//   peak      = peak_bytes_per_token·b·(L+D)
//   static    = static_bytes, weights = weight_bytes (every stage)
// With the defaults, fwd + bwd = 3·(0.5 + 0.001·b·L) ms: the toy cost of the reference's
// DP fixtures. Everything is non-decreasing in b, L, D, as real models are; with
// superlinear_ms > 0 a micro-batch past superlinear_from tokens costs more than its
// parts (not subadditive, as a measured table extrapolated far past its shapes); with
// dip_ms > 0 it is cheaper at token counts divisible by dip_period (not monotone).
//
//   FakeCostModel model({.num_stages = 4});
//   FakeCostModel model(FakeCostParams{.num_stages = 2, .bytes_per_token = 1000});
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dynapipe/cost/cost_model.h"

namespace dynapipe {

struct FakeCostParams {
  int num_stages = 1;
  double fixed_ms = 0.5;
  double ms_per_token = 0.001;
  double ms_per_attention = 0;
  double selective_extra = 0.1;
  std::vector<double> stage_scale = {};  // per stage time factor; empty = all 1
  std::int64_t bytes_per_token = 0;
  std::int64_t bytes_per_attention = 0;
  std::int64_t full_bytes_per_token = 0;
  std::int64_t peak_bytes_per_token = 0;
  std::int64_t static_bytes = 0;
  std::int64_t weight_bytes = 0;
  // affine_time_bound(): the exact line, attention's Σ L² term included (true), or none
  // (false); affine_squares false leaves that term out (tokens and fixed part only).
  bool affine_bound = true;
  bool affine_squares = true;
  double superlinear_ms = 0;           // 0: subadditive()
  double superlinear_from = 0;         // tokens
  // > 0: time falls by dip_ms where b·(L + D) is a multiple of dip_period tokens (not
  // monotone(), as a noisy measured table).
  double dip_ms = 0;
  std::int64_t dip_period = 64;
  // A fixed time of varlen rows (varlen_costs_extra() where > 0), and whether a micro-batch
  // of one sample is made dense (lone_samples_dense()).
  double varlen_fixed_ms = 0;
  bool lone_samples_dense = false;
};

class FakeCostModel final : public CostModel {
 public:
  explicit FakeCostModel(FakeCostParams params = {})
      : params_(std::move(params)), stages_(static_cast<std::size_t>(params_.num_stages)) {
    spec_.name = "fake";
    device_.name = "fake";
  }

  const ModelSpec& model() const override { return spec_; }
  const DeviceSpec& device() const override { return device_; }
  const std::vector<StageLayers>& stages() const override { return stages_; }

  StageCost stage_cost(int stage, const MicroBatchShape& shape, const AttentionDensity& density,
                       Recompute recompute) const override {
    calls_.fetch_add(1, std::memory_order_relaxed);
    const double b = static_cast<double>(shape.batch);
    const double tokens = b * static_cast<double>(shape.seqlen + shape.dec_seqlen);
    const double attention =
        b * (density.enc * static_cast<double>(shape.seqlen) * static_cast<double>(shape.seqlen) +
             density.dec * static_cast<double>(shape.dec_seqlen) *
                 static_cast<double>(shape.dec_seqlen));
    const double scale = params_.stage_scale.empty()
                             ? 1.0
                             : params_.stage_scale[static_cast<std::size_t>(stage)];
    const double past = std::max(0.0, tokens - params_.superlinear_from);
    const bool dips = params_.dip_ms > 0 &&
                      static_cast<std::int64_t>(tokens) % params_.dip_period == 0;
    const double varlen = density == AttentionDensity{} ? 0.0 : params_.varlen_fixed_ms;
    const double base = scale * (params_.fixed_ms - (dips ? params_.dip_ms : 0.0) + varlen +
                                 params_.ms_per_token * tokens +
                                 params_.ms_per_attention * attention +
                                 params_.superlinear_ms * past * past);
    StageCost cost;
    cost.fwd_ms = base;
    cost.bwd_ms = 2 * base;
    const auto token_bytes = [&](std::int64_t per_token) {
      return static_cast<std::int64_t>(static_cast<double>(per_token) * tokens);
    };
    switch (recompute) {
      case Recompute::None:
        cost.stored_bytes = token_bytes(params_.bytes_per_token) +
                            static_cast<std::int64_t>(
                                static_cast<double>(params_.bytes_per_attention) * attention);
        break;
      case Recompute::Selective:
        cost.bwd_ms += params_.selective_extra * base;
        cost.stored_bytes = token_bytes(params_.bytes_per_token);
        break;
      case Recompute::Full:
        cost.bwd_ms += base;
        cost.stored_bytes = token_bytes(params_.full_bytes_per_token);
        break;
    }
    cost.bwd_input_ms = cost.bwd_ms / 2;
    cost.bwd_weight_ms = cost.bwd_ms - cost.bwd_input_ms;
    cost.peak_bytes = token_bytes(params_.peak_bytes_per_token);
    // The activation sent on, as the real models: none from the last stage.
    cost.output_bytes = stage + 1 < params_.num_stages ? token_bytes(2) : 0;
    return cost;
  }

  bool subadditive() const override { return params_.superlinear_ms == 0; }
  bool monotone() const override { return params_.dip_ms == 0; }
  bool varlen_costs_extra() const override { return params_.varlen_fixed_ms > 0; }
  bool lone_samples_dense() const override { return params_.lone_samples_dense; }
  std::int64_t static_bytes(int) const override { return params_.static_bytes; }
  std::int64_t weight_bytes(int) const override { return params_.weight_bytes; }
  double p2p_ms(std::int64_t) const override { return 0; }
  double allreduce_ms(std::int64_t, int) const override { return 0; }
  std::string describe() const override { return "fake"; }
  // fwd + bwd = k·scale·(fixed + per_token·tokens + attention), k = 3, 3 + selective_extra
  // or 4 by mode, attention at least Σ L² per part (a varlen row's, less than a padded
  // one's): a lower bound, shaved against rounding.
  std::optional<AffineTimeBound> affine_time_bound(Recompute recompute) const override {
    if (!params_.affine_bound) return std::nullopt;
    const double k = recompute == Recompute::None        ? 3
                     : recompute == Recompute::Selective ? 3 + params_.selective_extra
                                                         : 4;
    AffineTimeBound bound;
    for (int s = 0; s < params_.num_stages; ++s) {
      const double scale = params_.stage_scale.empty()
                               ? 1.0
                               : params_.stage_scale[static_cast<std::size_t>(s)];
      const double per_token = k * scale * params_.ms_per_token * (1 - 1e-9);
      bound.enc_ms.push_back(per_token);
      bound.dec_ms.push_back(per_token);
      // Below the dips too: the fixed part less dip_ms.
      bound.fixed_ms.push_back(k * scale * (params_.fixed_ms - params_.dip_ms) * (1 - 1e-9));
      if (params_.affine_squares) {
        bound.enc_sq_ms.push_back(k * scale * params_.ms_per_attention * (1 - 1e-9));
        bound.dec_sq_ms.push_back(k * scale * params_.ms_per_attention * (1 - 1e-9));
      }
    }
    return bound;
  }

  // stage_cost() calls so far (tests of caching).
  std::int64_t calls() const { return calls_.load(std::memory_order_relaxed); }

 private:
  FakeCostParams params_;
  ModelSpec spec_;
  DeviceSpec device_;
  std::vector<StageLayers> stages_;
  mutable std::atomic<std::int64_t> calls_{0};
};

}  // namespace dynapipe
