// Balanced layer splits: layers over pipeline stages by the cost model instead of by count.
//
// A "unit" is one layer of the stack with what rides on it when it is a stage of its own:
// the embedding on the first, the head (final norm, LM head, loss) on the last, and for T5
// the decoder embedding on the first decoder layer. Unit costs come from the cost model
// with one stage per layer, so embedding and head weigh what the cost model says they do.
//
//   auto units = layer_unit_ms("analytic:a100-40g", spec, {}, {{.batch = 1, .seqlen = 2048}}, {1.0});
//   auto stages = assign_layers(spec, balance_layer_counts(units, 4));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/model_spec.h"

namespace dynapipe {

// Forward + backward ms of each unit, summed over `shapes` weighted by `weights` (same
// length), each shape at its attention density (`densities`: empty = dense, or one per
// shape). `options` supplies seqlen_multiple and zero_shards; its split is ignored.
std::vector<double> layer_unit_ms(const std::string& cost_spec, const ModelSpec& model,
                                  const CostModelOptions& options, const std::vector<MicroBatchShape>& shapes,
                                  const std::vector<double>& weights,
                                  const std::vector<AttentionDensity>& densities = {});

// Layers per stage minimising the most expensive stage (sum of its units); among equally
// good splits (within 1e-9 relative), the one with the smallest sum of squared stage costs
// found first. Throws InvalidArgument if num_stages is not in [1, units].
std::vector<int> balance_layer_counts(const std::vector<double>& unit_ms, int num_stages);

// What each unit keeps in memory for one micro-batch shape (same cost model and options as
// layer_unit_ms): weights, gradients and optimizer states; activations kept from forward
// to backward; transient working memory; the activation a unit sends on when it ends a
// stage (held until that micro-batch's backward, as StageCost::held_bytes() counts it). A
// stage's bytes are the sums of its units' static and stored bytes, its last unit's output
// (none on the last stage) and the largest peak (a token table shared by embedding and
// head on one stage is counted twice: the bound errs on the safe side).
struct UnitMemory {
  std::vector<std::int64_t> static_bytes, stored_bytes, peak_bytes;
  std::vector<std::int64_t> output_bytes;  // empty: no unit sends anything
};
UnitMemory layer_unit_memory(const std::string& cost_spec, const ModelSpec& model, const CostModelOptions& options,
                             const MicroBatchShape& shape, Recompute recompute);

// A per-stage memory rule: stage s must keep static + in_flight[s] × (stored + output) +
// peak under limit_bytes (1F1B keeps num_stages − s micro-batches in flight on stage s).
struct StageMemoryRule {
  UnitMemory units;
  std::vector<int> in_flight;  // one per stage
  std::int64_t limit_bytes = 0;
};

// balance_layer_counts with every stage held to `rule` (an exact DP over contiguous ranges:
// the slowest stage smallest among the splits that fit, ties as above); nullopt when no
// split fits. Throws InvalidArgument when the rule's sizes do not match.
std::optional<std::vector<int>> balance_layer_counts(const std::vector<double>& unit_ms, int num_stages,
                                                     const StageMemoryRule& rule);

}  // namespace dynapipe
