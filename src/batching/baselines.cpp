// Baseline strategies, costed with the same cost model and memory rule as DynaPipe:
//   padding        data order, fixed micro-batch size, every row padded to the maximum;
//   packing        first-fit rows of whole samples (data order), dense attention per row;
//   packing-varlen best-fit-decreasing rows, block-diagonal attention (density Σ L²);
//   token-based    sorted order, fairseq batch_by_size on padded tokens.
// Padding and packing shard the data-order samples over replicas by stride (sample k to
// replica k mod dp, like torch's DistributedSampler); token-based deals its micro-batches
// round-robin (fairseq shards its list of batches the same way).
#include <algorithm>
#include <numeric>

#include "costing.h"
#include "varlen_memo.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"

namespace dynapipe::detail {
namespace {

std::vector<std::vector<std::size_t>> strided_shards(std::size_t n, int dp) {
  std::vector<std::vector<std::size_t>> shards(static_cast<std::size_t>(dp));
  for (std::size_t k = 0; k < n; ++k) shards[k % shards.size()].push_back(k);
  return shards;
}

// Padded row lengths of the padding baseline: the truncation limits, rounded.
MicroBatchShape max_row_shape(const BatchingOptions& options, std::int64_t rows) {
  const bool t5 = options.kind == ModelKind::T5;
  return {.batch = rows,
          .seqlen = round_up(options.max_seqlen, options.seqlen_multiple),
          .dec_seqlen = t5 ? round_up(options.max_target_len + 1, options.seqlen_multiple) : 0};
}

// Rows per micro-batch: options.fixed_batch, or the largest in [1, cap] whose full-length
// shape fits (memory is non-decreasing in batch: binary search). 0 if none fits.
std::int64_t rows_per_microbatch(const BatchingOptions& options, ShapeCosts& costs,
                                 MemoryRule rule, std::int64_t cap) {
  if (options.fixed_batch > 0) {
    return costs.get(max_row_shape(options, options.fixed_batch)).fits(rule)
               ? options.fixed_batch
               : 0;
  }
  return most_rows_that_fit(costs, rule, cap,
                            [&](std::int64_t rows) { return max_row_shape(options, rows); });
}

// First-fit in the given order: each sample goes to the first row with room in both
// dimensions. Complexity: O(n · rows).
std::vector<PackedRow> pack_first_fit(std::span<const Sample> samples,
                                      std::span<const std::size_t> members, ModelKind kind,
                                      std::int64_t enc_capacity, std::int64_t dec_capacity) {
  std::vector<PackedRow> rows;
  for (std::size_t k : members) {
    const ModelLengths lengths = model_lengths(samples[k], kind);
    auto fits = [&](const PackedRow& row) {
      return row.enc + lengths.enc <= enc_capacity && row.dec + lengths.dec <= dec_capacity;
    };
    auto it = std::find_if(rows.begin(), rows.end(), fits);
    if (it == rows.end()) it = rows.insert(rows.end(), PackedRow{});
    it->enc += lengths.enc;
    it->dec += lengths.dec;
    it->members.push_back(k);
  }
  return rows;
}

MicroBatch make_packed_microbatch(std::span<const Sample> samples,
                                  std::span<const PackedRow> rows, const BatchingOptions& options,
                                  bool varlen) {
  MicroBatch microbatch;
  std::vector<std::size_t> members;
  std::int64_t enc = 0, dec = 0;
  double enc_square_sum = 0, dec_square_sum = 0;
  for (const PackedRow& row : rows) {
    members.insert(members.end(), row.members.begin(), row.members.end());
    std::vector<SampleId>& ids = microbatch.rows.emplace_back();
    for (std::size_t k : row.members) {
      ids.push_back(samples[k].id);
      const ModelLengths lengths = model_lengths(samples[k], options.kind);
      enc_square_sum += static_cast<double>(lengths.enc) * static_cast<double>(lengths.enc);
      dec_square_sum += static_cast<double>(lengths.dec) * static_cast<double>(lengths.dec);
    }
    enc = std::max(enc, row.enc);
    dec = std::max(dec, row.dec);
  }
  fill_members(samples, members, &microbatch);
  microbatch.shape = {.batch = static_cast<std::int64_t>(rows.size()),
                      .seqlen = round_up(enc, options.seqlen_multiple),
                      .dec_seqlen = round_up(dec, options.seqlen_multiple)};
  if (varlen) {
    microbatch.density = varlen_density(enc_square_sum, dec_square_sum,
                                        static_cast<std::int64_t>(rows.size()), microbatch.shape,
                                        options.kind);
  }
  return microbatch;
}

}  // namespace

std::optional<Candidate> run_padding(const StrategyInput& input, ShapeCosts& costs,
                                     MemoryRule rule, double incumbent_ms) {
  const BatchingOptions& options = input.options;
  const auto shards = strided_shards(input.samples.size(), options.dp);
  const std::int64_t rows =
      rows_per_microbatch(options, costs, rule, static_cast<std::int64_t>(shards[0].size()));
  if (rows == 0) return std::nullopt;
  return best_fixed_size(rows, costs, rule, options, incumbent_ms, [&](std::int64_t size) {
    const std::size_t step = static_cast<std::size_t>(size);
    std::vector<std::vector<MicroBatch>> replicas(shards.size());
    for (std::size_t r = 0; r < shards.size(); ++r) {
      const std::span<const std::size_t> shard(shards[r]);
      for (std::size_t begin = 0; begin < shard.size(); begin += step) {
        const std::size_t count = std::min(shard.size() - begin, step);
        MicroBatch microbatch;
        fill_members(input.samples, shard.subspan(begin, count), &microbatch);
        microbatch.shape = max_row_shape(options, static_cast<std::int64_t>(count));
        replicas[r].push_back(std::move(microbatch));
      }
    }
    return replicas;
  });
}

std::optional<Candidate> run_packing(const StrategyInput& input, ShapeCosts& costs,
                                     MemoryRule rule, double incumbent_ms) {
  const BatchingOptions& options = input.options;
  const bool varlen = options.strategy == Strategy::PackingVarlen;
  const bool t5 = options.kind == ModelKind::T5;
  const std::int64_t enc_capacity = options.max_seqlen;
  const std::int64_t dec_capacity = t5 ? options.max_target_len + 1 : 0;
  const auto shards = strided_shards(input.samples.size(), options.dp);
  // Per shard its rows: packing-varlen's from the store (every rule and mode packs the
  // same), packing's packed here.
  std::vector<std::vector<PackedRow>> first_fit;
  first_fit.reserve(shards.size());  // `packed` views them: no reallocation
  std::vector<std::span<const PackedRow>> packed;
  std::size_t most_rows = 0;
  for (const auto& shard : shards) {
    if (varlen) {
      packed.emplace_back(
          input.memos->best_fit_rows(input.samples, shard, options.kind, enc_capacity, dec_capacity));
    } else {
      packed.emplace_back(first_fit.emplace_back(
          pack_first_fit(input.samples, shard, options.kind, enc_capacity, dec_capacity)));
    }
    most_rows = std::max(most_rows, packed.back().size());
  }
  // Sized for full-length dense rows, so every micro-batch fits whatever its rows hold.
  const std::int64_t rows =
      rows_per_microbatch(options, costs, rule, static_cast<std::int64_t>(most_rows));
  if (rows == 0) return std::nullopt;
  return best_fixed_size(rows, costs, rule, options, incumbent_ms, [&](std::int64_t size) {
    const std::size_t step = static_cast<std::size_t>(size);
    std::vector<std::vector<MicroBatch>> replicas(shards.size());
    for (std::size_t r = 0; r < shards.size(); ++r) {
      const std::span<const PackedRow> all = packed[r];
      for (std::size_t begin = 0; begin < all.size(); begin += step) {
        const std::size_t count = std::min(all.size() - begin, step);
        replicas[r].push_back(
            make_packed_microbatch(input.samples, all.subspan(begin, count), options, varlen));
      }
    }
    return replicas;
  });
}

std::optional<Candidate> run_token_based(const StrategyInput& input, ShapeCosts& costs,
                                         MemoryRule rule, double incumbent_ms) {
  const BatchingOptions& options = input.options;
  std::vector<std::int64_t> budgets;
  if (options.token_budget > 0) {
    budgets.push_back(options.token_budget);
  } else {
    for (std::int64_t b = kSmallestTokenBudget; b <= kLargestTokenBudget; b *= 2) budgets.push_back(b);
  }
  std::optional<Candidate> best;
  // Where the cost model is monotone its memory is taken to grow with the padded shape,
  // which only grows along a micro-batch: the samples that fit are a prefix of those the
  // budget allows. It is found by galloping (1, 2, 4, .. samples) then bisection, a few
  // costed shapes per micro-batch where the walk costed one per sample, and the walk goes
  // at most twice as far as the micro-batch. Otherwise every shape, in order.
  const bool gallop = costs.cost_model().monotone();
  std::vector<MicroBatchShape> grown;  // the shape of the first 1, 2, .. samples
  auto fits = [&](std::size_t count) { return costs.get(grown[count - 1]).fits(rule); };
  for (std::int64_t budget : budgets) {
    // Grow while the padded shape stays within the budget and fits; a sample alone
    // always starts a micro-batch (fairseq would reject it; here it is costed alone).
    std::vector<std::pair<std::size_t, std::size_t>> ranges;  // [begin, end) of the order
    std::size_t begin = 0;
    bool feasible = true;
    while (begin < input.order.size() && feasible) {
      grown.clear();
      std::size_t count = 0;         // the most samples known to fit
      std::size_t too_many = 0;      // 0, or a count known not to fit
      std::size_t next_probe = 1;    // galloping: the next count to cost
      std::int64_t enc = 0, dec = 0;
      for (std::size_t end = begin; end < input.order.size(); ++end) {
        const ModelLengths lengths = model_lengths(input.samples[input.order[end]], options.kind);
        enc = std::max(enc, lengths.enc);
        dec = std::max(dec, lengths.dec);
        const MicroBatchShape shape{.batch = static_cast<std::int64_t>(end + 1 - begin),
                                    .seqlen = round_up(enc, options.seqlen_multiple),
                                    .dec_seqlen = round_up(dec, options.seqlen_multiple)};
        if (end > begin && shape.tokens() > budget) break;
        grown.push_back(shape);
        if (gallop && grown.size() < next_probe) continue;
        if (!fits(grown.size())) {
          too_many = grown.size();
          break;
        }
        count = grown.size();
        next_probe *= 2;
      }
      if (too_many == 0 && count < grown.size()) {  // the budget ended between two probes
        if (fits(grown.size())) {
          count = grown.size();
        } else {
          too_many = grown.size();
        }
      }
      while (too_many > count + 1) {  // galloping: bisect between the last two probes
        const std::size_t mid = count + (too_many - count) / 2;
        (fits(mid) ? count : too_many) = mid;
      }
      feasible = count > 0;
      if (!feasible) break;
      ranges.emplace_back(begin, begin + count);
      begin += count;
    }
    if (!feasible) return std::nullopt;  // a sample alone does not fit under this rule
    // Fewer micro-batches than replicas (a small batch, a large budget): halve the
    // largest until every replica gets one; a smaller shape fits wherever a larger did.
    while (ranges.size() < static_cast<std::size_t>(options.dp)) {
      auto largest = std::max_element(ranges.begin(), ranges.end(), [](auto a, auto b) {
        return a.second - a.first < b.second - b.first;
      });
      const auto [lo, hi] = *largest;
      DYNAPIPE_CHECK(hi - lo > 1, "fewer samples than replicas reached token-based");
      *largest = {lo, lo + (hi - lo) / 2};
      ranges.insert(largest + 1, {lo + (hi - lo) / 2, hi});
    }
    // The objective from the ranges' padded shapes (as replicas_objective() costs their
    // micro-batches: dense, this mode), the micro-batches made only for a new best (made
    // for every budget they were ~0.6% of a T5-11B pp 8 plan).
    const std::size_t dp = static_cast<std::size_t>(options.dp);
    std::vector<std::vector<double>> times(dp);
    bool fits = true;
    for (std::size_t k = 0; k < ranges.size() && fits; ++k) {
      const auto [lo, hi] = ranges[k];
      const ShapeCost& cost = costs.get(
          padded_shape(input.samples, input.order.subspan(lo, hi - lo), options.kind, options.seqlen_multiple));
      fits = cost.fits(rule_for(rule, hi - lo));
      times[k % dp].push_back(cost.time_ms);
    }
    if (!fits) continue;
    double objective = 0;
    for (const std::vector<double>& replica : times) {
      objective = std::max(objective, pipeline_objective_ms(replica, options.num_stages, options.bubble_weight));
    }
    const double bound = best ? best->objective_ms : incumbent_ms;
    if (!(objective < bound)) continue;
    std::vector<std::vector<MicroBatch>> replicas(dp);
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      const auto [lo, hi] = ranges[k];
      replicas[k % dp].push_back(make_padded_microbatch(
          input.samples, input.order.subspan(lo, hi - lo), options.kind, options.seqlen_multiple));
    }
    best = Candidate{std::move(replicas), objective};
    best->size = budget;
  }
  return best;
}

}  // namespace dynapipe::detail
