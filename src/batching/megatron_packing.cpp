// packing-megatron: the DynaPipe artifact's packing baseline (header comment of
// include/dynapipe/batching/megatron_packing.h; docs/batching.md).
#include "dynapipe/batching/megatron_packing.h"

#include <algorithm>
#include <unordered_set>

#include "costing.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"

namespace dynapipe {
namespace {

struct RowLengths {
  std::int64_t enc = 0;
  std::int64_t dec = 0;
};

RowLengths packed_lengths(const Sample& s, const MegatronRows& rows) {
  if (rows.kind == ModelKind::Gpt) return {std::int64_t{s.input_len} + s.target_len, 0};
  return {s.input_len, std::min<std::int64_t>(std::int64_t{s.target_len} + 1, rows.max_target_len)};
}

void check_rows(const MegatronRows& rows) {
  if (rows.max_seqlen < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("packing-megatron: --max-seqlen must be >= 1, got ", rows.max_seqlen));
  }
  if (rows.kind == ModelKind::T5 && rows.max_target_len < 1) {
    throw Error(ErrorKind::InvalidArgument,
                cat("packing-megatron: --max-target-len must be >= 1 for t5, got ", rows.max_target_len));
  }
}

}  // namespace

std::vector<std::vector<std::size_t>> pack_next_fit(std::span<const Sample> samples, const MegatronRows& rows) {
  check_rows(rows);
  std::vector<std::vector<std::size_t>> out;
  RowLengths open;
  for (std::size_t k = 0; k < samples.size(); ++k) {
    const RowLengths l = packed_lengths(samples[k], rows);
    if (l.enc > rows.max_seqlen) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("packing-megatron: sample ", samples[k].id, " must fit a row of ", rows.max_seqlen,
                      " tokens (truncate first), got ", l.enc));
    }
    const bool fits = !out.empty() && open.enc + l.enc <= rows.max_seqlen && open.dec + l.dec <= rows.max_target_len;
    if (!fits) {
      out.emplace_back();
      open = {};
    }
    out.back().push_back(k);
    open.enc += l.enc;
    open.dec += l.dec;
  }
  return out;
}

std::vector<GlobalBatch> form_megatron_global_batches(const std::vector<Sample>& samples,
                                                      const std::vector<SampleId>& truncated,
                                                      const MegatronRows& rows,
                                                      std::int64_t global_batch_tokens,
                                                      std::int64_t max_batches) {
  if (global_batch_tokens < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("global_batch_tokens must be >= 1, got ", global_batch_tokens));
  }
  if (max_batches < 0) throw Error(ErrorKind::InvalidArgument, cat("max_batches must be >= 0 (0: all), got ", max_batches));
  check_rows(rows);
  const std::size_t rows_per_batch =
      static_cast<std::size_t>(std::max<std::int64_t>(1, global_batch_tokens / rows.row_tokens()));
  const std::unordered_set<SampleId> truncated_set(truncated.begin(), truncated.end());
  const std::vector<std::vector<std::size_t>> packed = pack_next_fit(samples, rows);
  std::vector<GlobalBatch> batches;
  for (std::size_t begin = 0; begin < packed.size(); begin += rows_per_batch) {
    if (max_batches > 0 && static_cast<std::int64_t>(batches.size()) == max_batches) break;
    GlobalBatch& batch = batches.emplace_back();
    batch.index = static_cast<std::int64_t>(batches.size()) - 1;
    const std::size_t end = std::min(packed.size(), begin + rows_per_batch);
    for (std::size_t r = begin; r < end; ++r) {
      for (std::size_t k : packed[r]) {
        batch.samples.push_back(samples[k]);
        if (truncated_set.count(samples[k].id) != 0) batch.truncated_ids.push_back(samples[k].id);
      }
    }
  }
  return batches;
}

namespace detail {

// The batch's samples, next-fit into full-length rows; micro-batch k of fixed_batch rows
// (else of the best size up to the most that fit, best_fixed_size()) goes to replica
// k mod dp, as Megatron's sampler deals micro-batches to data-parallel ranks. Only the
// 1F1B memory rule applies (the schedule is fixed), and only the configured recompute
// mode when one is set.
std::optional<Candidate> run_packing_megatron(const StrategyInput& input, ShapeCosts& costs, MemoryRule rule,
                                              double incumbent_ms) {
  const BatchingOptions& options = input.options;
  if (rule != MemoryRule::Pipelined) return std::nullopt;
  const bool t5 = options.kind == ModelKind::T5;
  const MegatronRows layout{.kind = options.kind, .max_seqlen = options.max_seqlen,
                            .max_target_len = t5 ? options.max_target_len : 0};
  const std::vector<std::vector<std::size_t>> rows = pack_next_fit(input.samples, layout);
  const MicroBatchShape row_shape{.batch = 1,
                                  .seqlen = round_up(options.max_seqlen, options.seqlen_multiple),
                                  .dec_seqlen = t5 ? round_up(options.max_target_len, options.seqlen_multiple) : 0};
  auto shape_of = [&](std::int64_t n) {
    MicroBatchShape s = row_shape;
    s.batch = n;
    return s;
  };
  std::int64_t per_microbatch = options.fixed_batch;
  if (per_microbatch > 0) {
    if (!costs.get(shape_of(per_microbatch)).fits(rule)) {
      // The last mode tried (or the configured one): nothing else can make it fit.
      if (options.recompute || costs.recompute() == Recompute::Full) {
        const ShapeCost alone = costs.evaluate(shape_of(per_microbatch), {});
        throw Error(ErrorKind::Infeasible,
                    cat("--micro-batch-size ", per_microbatch, " (rows of ", row_shape.seqlen,
                        t5 ? cat("+", row_shape.dec_seqlen) : std::string(), " tokens) must fit --memory-limit ",
                        format_gib(options.memory_limit_bytes), " under 1F1B with recompute ",
                        recompute_name(costs.recompute()), ", got ", format_gib(alone.one_bytes),
                        " on stage ", alone.one_stage, " for one micro-batch alone, before the ",
                        options.num_stages, " in flight of 1F1B"));
      }
      return std::nullopt;
    }
  } else {
    // The most rows that fit; best_fixed_size() then tries every smaller size too.
    per_microbatch =
        most_rows_that_fit(costs, rule, static_cast<std::int64_t>(rows.size()), shape_of);
    if (per_microbatch == 0) return std::nullopt;
  }
  return best_fixed_size(per_microbatch, costs, rule, options, incumbent_ms, [&](std::int64_t size) {
    std::vector<std::vector<MicroBatch>> replicas(static_cast<std::size_t>(options.dp));
    const std::size_t step = static_cast<std::size_t>(size);
    for (std::size_t begin = 0, k = 0; begin < rows.size(); begin += step, ++k) {
      const std::size_t end = std::min(rows.size(), begin + step);
      MicroBatch microbatch;
      std::vector<std::size_t> members;
      for (std::size_t r = begin; r < end; ++r) {
        microbatch.rows.emplace_back();
        for (std::size_t i : rows[r]) {
          members.push_back(i);
          microbatch.rows.back().push_back(input.samples[i].id);
        }
      }
      fill_members(input.samples, members, &microbatch);
      microbatch.shape = shape_of(static_cast<std::int64_t>(end - begin));
      replicas[k % replicas.size()].push_back(std::move(microbatch));
    }
    return replicas;
  });
}

}  // namespace detail
}  // namespace dynapipe
