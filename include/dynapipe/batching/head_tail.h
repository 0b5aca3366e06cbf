// Head and tail micro-batches: a pipeline's fill and drain last about (p − 1) forward
// passes of its first micro-batch and (p − 1) backward passes of its last, so a schedule
// starts and ends faster on small ones. split_head_and_tail() reorders varlen
// micro-batches slowest first and splits the fastest one that holds two or more samples
// into two halves, run first and last. The planner simulates the result next to the DP's
// own cut and keeps the faster (docs/batching.md, "Head and tail").
//
//   std::vector<MicroBatch> mbs = split_head_and_tail(batch, result.replicas[0], model,
//                                                     result.recompute, options);
#pragma once

#include <vector>

#include "dynapipe/batching/batching.h"
#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/sample.h"

namespace dynapipe {

class CostModel;

// REQUIRES: `microbatches` are varlen micro-batches of `batch` (one row each, as
// Strategy::DynaPipe makes them). Returns them with ids renumbered 0..m−1 in the new
// order; unchanged apart from the order when no micro-batch holds two samples. The
// halves hold fewer tokens and less Σ L² than the micro-batch they came from, so they
// fit wherever it fitted (monotone memory).
std::vector<MicroBatch> split_head_and_tail(const GlobalBatch& batch,
                                            std::vector<MicroBatch> microbatches,
                                            const CostModel& cost_model, Recompute recompute,
                                            const BatchingOptions& options);

}  // namespace dynapipe
