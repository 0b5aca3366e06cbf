// The "dynapipe" strategy: ordered samples, the exact DP of dp_partitioner.h, and the
// split over data-parallel replicas.
#include <algorithm>

#include "costing.h"
#include "dynapipe/batching/dp_partitioner.h"
#include "dynapipe/batching/replica_balancer.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"

namespace dynapipe::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// t([i, j)) for every segment of `seq` that fits under `rule`. A row stops at the first
// segment that does not fit: memory is assumed non-decreasing in batch and lengths, and
// [i, j+1) is never smaller than [i, j) in any dimension.
// Complexity: O(Σ_i window(i)) cache lookups; cost-model calls only for new shapes.
SegmentTable build_segment_table(std::span<const Sample> samples,
                                 std::span<const std::size_t> seq, ModelKind kind,
                                 std::int64_t seqlen_multiple, ShapeCosts& costs,
                                 MemoryRule rule) {
  const int n = static_cast<int>(seq.size());
  std::vector<std::int64_t> enc(seq.size()), dec(seq.size());
  for (int k = 0; k < n; ++k) {
    const ModelLengths lengths = model_lengths(samples[seq[k]], kind);
    enc[k] = round_up(lengths.enc, seqlen_multiple);
    dec[k] = round_up(lengths.dec, seqlen_multiple);
  }
  SegmentTable table(n);
  for (int i = 0; i < n; ++i) {
    std::int64_t max_enc = enc[i], max_dec = dec[i];
    ShapeCosts::Row* row = costs.row(max_enc, max_dec);
    for (int j = i; j < n; ++j) {
      if (enc[j] > max_enc || dec[j] > max_dec) {
        max_enc = std::max(max_enc, enc[j]);
        max_dec = std::max(max_dec, dec[j]);
        row = costs.row(max_enc, max_dec);
      }
      const ShapeCost& cost = costs.get(row, max_enc, max_dec, j - i + 1);
      if (!cost.fits(rule)) break;
      table.push(i, cost.time_ms);
    }
  }
  return table;
}

std::vector<MicroBatch> cut(std::span<const Sample> samples, std::span<const std::size_t> seq,
                            const std::vector<int>& starts, const BatchingOptions& options) {
  std::vector<MicroBatch> microbatches;
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const std::size_t begin = static_cast<std::size_t>(starts[k]);
    const std::size_t end = k + 1 < starts.size() ? static_cast<std::size_t>(starts[k + 1])
                                                  : seq.size();
    microbatches.push_back(make_padded_microbatch(samples, seq.subspan(begin, end - begin),
                                                  options.kind, options.seqlen_multiple));
  }
  return microbatches;
}

PartitionOptions partition_options(const BatchingOptions& options, double sum_weight,
                                   double incumbent_ms) {
  return {.num_stages = options.num_stages,
          .sum_weight = sum_weight,
          .min_tmax_interval_ms = options.min_tmax_interval_ms,
          // The thinned search reports threshold objectives: not comparable, no pruning.
          .incumbent_ms = options.min_tmax_interval_ms > 0 ? kInf : incumbent_ms};
}

// One DP over all samples with objective Σt/dp + (p−1)·max t, then Karmarkar–Karp.
std::optional<Candidate> split_microbatches(const StrategyInput& input, ShapeCosts& costs,
                                            MemoryRule rule, double incumbent_ms) {
  const BatchingOptions& options = input.options;
  const SegmentTable table = build_segment_table(input.samples, input.order, options.kind,
                                                 options.seqlen_multiple, costs, rule);
  // With dp > 1 the DP objective only estimates the replicas' objective (it can be above
  // or below it), so another mode's result cannot prune this search.
  const double weight = 1.0 / options.dp;
  const Partition partition = solve_partition(
      table, partition_options(options, weight, options.dp == 1 ? incumbent_ms : kInf));
  if (!partition.found) return std::nullopt;
  std::vector<MicroBatch> microbatches = cut(input.samples, input.order, partition.starts, options);

  Candidate candidate;
  candidate.replicas.resize(static_cast<std::size_t>(options.dp));
  std::vector<double> times;
  for (const MicroBatch& mb : microbatches) times.push_back(costs.get(mb.shape).time_ms);
  const std::vector<int> owner = balance_replicas(times, options.dp);
  for (std::size_t k = 0; k < microbatches.size(); ++k) {  // DP order inside each replica
    candidate.replicas[static_cast<std::size_t>(owner[k])].push_back(std::move(microbatches[k]));
  }
  const std::optional<double> objective =
      replicas_objective(candidate.replicas, costs, rule, options.num_stages);
  DYNAPIPE_CHECK(objective.has_value(), "a DP micro-batch does not fit its own memory rule");
  if (!(*objective < incumbent_ms)) return std::nullopt;
  candidate.objective_ms = *objective;
  return candidate;
}

// Deal the ordered samples to replicas in a snake (0, 1, .., dp−1, dp−1, .., 0, ...) so
// every replica gets the same length profile, then one exact DP per replica.
std::optional<Candidate> split_samples(const StrategyInput& input, ShapeCosts& costs,
                                       MemoryRule rule, double incumbent_ms) {
  const BatchingOptions& options = input.options;
  const std::size_t dp = static_cast<std::size_t>(options.dp);
  std::vector<std::vector<std::size_t>> shards(dp);
  for (std::size_t k = 0; k < input.order.size(); ++k) {
    const std::size_t round = k / dp, slot = k % dp;
    shards[round % 2 == 0 ? slot : dp - 1 - slot].push_back(input.order[k]);
  }
  Candidate candidate;
  candidate.replicas.resize(dp);
  for (std::size_t r = 0; r < dp; ++r) {
    const SegmentTable table = build_segment_table(input.samples, shards[r], options.kind,
                                                   options.seqlen_multiple, costs, rule);
    // Each replica's objective is a lower bound of the maximum: the incumbent prunes.
    const Partition partition = solve_partition(table, partition_options(options, 1.0, incumbent_ms));
    if (!partition.found) return std::nullopt;
    candidate.replicas[r] = cut(input.samples, shards[r], partition.starts, options);
  }
  const std::optional<double> objective =
      replicas_objective(candidate.replicas, costs, rule, options.num_stages);
  DYNAPIPE_CHECK(objective.has_value(), "a DP micro-batch does not fit its own memory rule");
  if (!(*objective < incumbent_ms)) return std::nullopt;
  candidate.objective_ms = *objective;
  return candidate;
}

}  // namespace

std::optional<Candidate> run_dynapipe(const StrategyInput& input, ShapeCosts& costs,
                                      MemoryRule rule, double incumbent_ms) {
  const ReplicaSplit split = input.options.dp == 1 ? ReplicaSplit::Microbatches
                                                   : input.options.replica_split;
  std::optional<Candidate> by_microbatches, by_samples;
  if (split != ReplicaSplit::Samples) {
    by_microbatches = split_microbatches(input, costs, rule, incumbent_ms);
  }
  if (split != ReplicaSplit::Microbatches) {
    const double bound = by_microbatches ? by_microbatches->objective_ms : incumbent_ms;
    by_samples = split_samples(input, costs, rule, bound);
  }
  return by_samples ? by_samples : by_microbatches;
}

}  // namespace dynapipe::detail
