// Another strategy's micro-batches run as varlen ones: as_varlen_microbatches() keeps each
// micro-batch's samples together but computes them as one block-diagonal row
// (Strategy::DynaPipe's form), so no token is padding. The planner simulates
// packing-varlen's and token-based's cuts this way as candidates of dynapipe
// (docs/batching.md, "Baseline cuts"): each such micro-batch computes no more tokens and
// no more attention than the baseline's own, so it is no slower and no heavier.
//
//   BatchingResult theirs = make_microbatches(batch, model, token_based_options);
//   std::vector<MicroBatch> ours = as_varlen_microbatches(batch, theirs.replicas[0], options, model);
#pragma once

#include <vector>

#include "dynapipe/batching/batching.h"
#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/sample.h"

namespace dynapipe {

// REQUIRES: every sample id of `microbatches` is in `batch`. Returns one varlen
// micro-batch per input micro-batch, same samples in the same order, ids 0..m−1;
// options.kind and options.seqlen_multiple shape them. A micro-batch of one sample is one
// dense row where `cost_model` says so (CostModel::lone_samples_dense()).
std::vector<MicroBatch> as_varlen_microbatches(const GlobalBatch& batch,
                                               const std::vector<MicroBatch>& microbatches,
                                               const BatchingOptions& options,
                                               const CostModel& cost_model);

// `microbatches` with each varlen micro-batch of one sample as one dense row (rows and
// density dropped, the shape kept) where `cost_model` says so
// (CostModel::lone_samples_dense()); as given otherwise. For a baseline's cut run in its
// own rows by dynapipe, which runs lone samples as its own micro-batches.
std::vector<MicroBatch> with_lone_samples_dense(std::vector<MicroBatch> microbatches,
                                                const CostModel& cost_model);

}  // namespace dynapipe
