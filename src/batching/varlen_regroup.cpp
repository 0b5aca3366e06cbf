#include "dynapipe/batching/varlen_regroup.h"

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
  const detail::SamplePositions positions(batch.samples);
  std::vector<MicroBatch> varlen;
  varlen.reserve(microbatches.size());
  std::vector<std::size_t> members;
  for (const MicroBatch& mb : microbatches) {
    members.clear();
    for (SampleId id : mb.sample_ids) members.push_back(positions.of(id, "as_varlen_microbatches"));
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
