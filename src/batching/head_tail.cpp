#include "dynapipe/batching/head_tail.h"

#include <algorithm>

#include "costing.h"
#include "dynapipe/core/error.h"

namespace dynapipe {

std::vector<MicroBatch> split_head_and_tail(const GlobalBatch& batch,
                                            std::vector<MicroBatch> microbatches,
                                            const CostModel& cost_model, Recompute recompute,
                                            const BatchingOptions& options) {
  std::vector<double> time(microbatches.size());
  for (std::size_t k = 0; k < microbatches.size(); ++k) {
    time[k] = microbatch_time_ms(cost_model, microbatches[k], recompute);
  }
  std::vector<std::size_t> order(microbatches.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return time[a] > time[b]; });
  std::vector<MicroBatch> sorted;
  sorted.reserve(order.size() + 1);
  for (std::size_t k : order) sorted.push_back(std::move(microbatches[k]));

  // The fastest micro-batch that can be split (scanning from the fast end).
  auto split = std::find_if(sorted.rbegin(), sorted.rend(),
                            [](const MicroBatch& mb) { return mb.sample_ids.size() >= 2; });
  if (split != sorted.rend()) {
    const detail::SamplePositions positions(batch.samples);
    std::vector<std::size_t> members;
    for (SampleId id : split->sample_ids) members.push_back(positions.of(id, "split_head_and_tail"));
    const std::size_t half = members.size() / 2;
    const std::span<const std::size_t> all(members);
    const detail::LoneSample lone = detail::lone_sample_form(cost_model);
    MicroBatch head = detail::make_varlen_microbatch(batch.samples, all.first(half), options.kind,
                                                     options.seqlen_multiple, lone);
    MicroBatch tail = detail::make_varlen_microbatch(batch.samples, all.subspan(half),
                                                     options.kind, options.seqlen_multiple, lone);
    sorted.erase(std::next(split).base());
    sorted.insert(sorted.begin(), std::move(head));
    sorted.push_back(std::move(tail));
  }
  for (std::size_t k = 0; k < sorted.size(); ++k) sorted[k].id = static_cast<int>(k);
  return sorted;
}

}  // namespace dynapipe
