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

#include <string>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/model_spec.h"

namespace dynapipe {

// Forward + backward ms of each unit, summed over `shapes` weighted by `weights` (same
// length). `options` supplies seqlen_multiple and zero_shards; its split is ignored.
std::vector<double> layer_unit_ms(const std::string& cost_spec, const ModelSpec& model,
                                  const CostModelOptions& options, const std::vector<MicroBatchShape>& shapes,
                                  const std::vector<double>& weights);

// Layers per stage minimising the most expensive stage (sum of its units); among equally
// good splits (within 1e-9 relative), the one with the smallest sum of squared stage costs
// found first. Throws InvalidArgument if num_stages is not in [1, units].
std::vector<int> balance_layer_counts(const std::vector<double>& unit_ms, int num_stages);

}  // namespace dynapipe
