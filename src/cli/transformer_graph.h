// A transformer's per-layer costs as a PipeDream profile (graph.txt): an Input0 source,
// then one node per layer of the stack, in order, with the embedding riding on the first
// layer, the head on the last and T5's decoder embedding on the first decoder layer (the
// units of --partition balanced). Times are the cost model's forward and backward ms for
// one micro-batch of `shape`; activation_size the bytes a stage boundary after the layer
// carries; parameter_size the layer's parameter bytes (the token table with the embedding
// and the tied head).
#pragma once

#include <string>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/partition/profile_graph.h"

namespace dynapipe::cli {

// `cost_spec` as --cost-model takes it; `model` built for any stage count.
ProfileGraph transformer_graph(const std::string& cost_spec, const ModelSpec& model, const MicroBatchShape& shape,
                               int seqlen_multiple);

// The same from a cost model already laid out with one layer per stage.
ProfileGraph transformer_graph(const CostModel& per_layer, const MicroBatchShape& shape);

}  // namespace dynapipe::cli
