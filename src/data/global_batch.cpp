#include "dynapipe/data/global_batch.h"

#include <unordered_set>

#include "dynapipe/core/error.h"
#include "dynapipe/data/dataset.h"

namespace dynapipe {

std::vector<GlobalBatch> form_global_batches(const std::vector<Sample>& samples,
                                             const std::vector<SampleId>& truncated,
                                             std::int64_t global_batch_tokens,
                                             std::int64_t max_batches) {
  if (global_batch_tokens < 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat("global_batch_tokens must be >= 1, got ", global_batch_tokens));
  }
  if (max_batches < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("max_batches must be >= 0 (0: all), got ", max_batches));
  }
  const std::unordered_set<SampleId> truncated_set(truncated.begin(), truncated.end());
  std::vector<GlobalBatch> batches;
  std::int64_t batch_tokens = 0;
  for (const Sample& sample : samples) {
    const std::int64_t tokens = std::int64_t{sample.input_len} + sample.target_len;
    if (batches.empty() || batch_tokens + tokens > global_batch_tokens) {
      if (max_batches > 0 && static_cast<std::int64_t>(batches.size()) == max_batches) break;
      batches.emplace_back();
      batches.back().index = static_cast<std::int64_t>(batches.size()) - 1;
      batch_tokens = 0;
    }
    GlobalBatch& batch = batches.back();
    batch.samples.push_back(sample);
    if (truncated_set.count(sample.id) != 0) batch.truncated_ids.push_back(sample.id);
    batch_tokens += tokens;
  }
  return batches;
}

std::vector<GlobalBatch> form_global_batches(const Dataset& dataset,
                                             std::int64_t global_batch_tokens,
                                             std::int64_t max_batches) {
  return form_global_batches(dataset.samples(), dataset.truncated_ids(), global_batch_tokens,
                             max_batches);
}

}  // namespace dynapipe
