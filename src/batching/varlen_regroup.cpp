#include "dynapipe/batching/varlen_regroup.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "costing.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/cost/cost_model.h"

namespace dynapipe {

std::vector<MicroBatch> as_varlen_microbatches(const GlobalBatch& batch,
                                               const std::vector<MicroBatch>& microbatches,
                                               const BatchingOptions& options,
                                               const CostModel& cost_model) {
  const detail::LoneSample lone = detail::lone_sample_form(cost_model);
  // (id, position) by id: one allocation, where a hash map made one per sample.
  std::vector<std::pair<SampleId, std::size_t>> index;
  index.reserve(batch.samples.size());
  for (std::size_t k = 0; k < batch.samples.size(); ++k) index.emplace_back(batch.samples[k].id, k);
  std::sort(index.begin(), index.end());
  std::vector<MicroBatch> varlen;
  varlen.reserve(microbatches.size());
  std::vector<std::size_t> members;
  for (const MicroBatch& mb : microbatches) {
    members.clear();
    for (SampleId id : mb.sample_ids) {
      const auto it = std::lower_bound(index.begin(), index.end(), std::pair<SampleId, std::size_t>{id, 0});
      DYNAPIPE_CHECK(it != index.end() && it->first == id,
                     cat("as_varlen_microbatches: sample ", id, " not in the batch"));
      members.push_back(it->second);
    }
    varlen.push_back(detail::make_varlen_microbatch(batch.samples, members, options.kind,
                                                    options.seqlen_multiple, lone));
    varlen.back().id = static_cast<int>(varlen.size() - 1);
  }
  return varlen;
}

std::vector<MicroBatch> with_lone_samples_dense(std::vector<MicroBatch> microbatches,
                                                const CostModel& cost_model) {
  if (detail::lone_sample_form(cost_model) != detail::LoneSample::Dense) return microbatches;
  for (MicroBatch& mb : microbatches) {
    if (mb.sample_ids.size() != 1 || mb.shape.batch != 1) continue;
    mb.rows.clear();
    mb.density = AttentionDensity{};
  }
  return microbatches;
}

}  // namespace dynapipe
