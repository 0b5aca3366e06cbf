// form_global_batches(): cuts the samples, in file order, into global batches by token
// budget (docs/data.md). The result is the same for every strategy, so the training
// math depends only on it.
//
// Rule: samples are added to the current batch while the sum of their truncated token
// counts (input_len + target_len) stays <= global_batch_tokens; the sample that would
// exceed it starts the next batch. A sample larger than the budget alone forms a batch.
// The last partial batch is kept.
//
// Complexity: O(n) plus a hash set of the truncated ids.
// Thread-safety: pure functions.
//
//   Dataset data = Dataset::load(path, limits);
//   for (const GlobalBatch& batch : form_global_batches(data, 65536)) plan(batch);
#pragma once

#include <cstdint>
#include <vector>

#include "dynapipe/core/sample.h"

namespace dynapipe {

class Dataset;

// `truncated` lists the ids of truncated samples (Dataset::truncated_ids()); each batch
// gets those of its own samples, in file order. `max_batches` > 0 stops after that many
// batches; 0 means all. Throws Error(InvalidArgument) if global_batch_tokens < 1 or
// max_batches < 0.
std::vector<GlobalBatch> form_global_batches(const std::vector<Sample>& samples,
                                             const std::vector<SampleId>& truncated,
                                             std::int64_t global_batch_tokens,
                                             std::int64_t max_batches = 0);

// The same over a dataset's samples and truncated ids.
std::vector<GlobalBatch> form_global_batches(const Dataset& dataset,
                                             std::int64_t global_batch_tokens,
                                             std::int64_t max_batches = 0);

}  // namespace dynapipe
