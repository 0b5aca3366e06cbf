#include "costing.h"

#include <algorithm>
#include <cmath>

#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/cost_model.h"

namespace dynapipe::detail {

ShapeCosts::ShapeCosts(const CostModel& cost_model, Recompute recompute, int num_stages,
                       std::int64_t memory_limit_bytes)
    : cost_model_(cost_model), recompute_(recompute), num_stages_(num_stages),
      memory_limit_bytes_(memory_limit_bytes) {
  static_bytes_.reserve(static_cast<std::size_t>(num_stages));
  for (int s = 0; s < num_stages; ++s) static_bytes_.push_back(cost_model.static_bytes(s));
}

ShapeCost ShapeCosts::evaluate(const MicroBatchShape& shape,
                               const AttentionDensity& density) const {
  ++evaluations_;
  ShapeCost out;
  out.time_ms = 0;
  out.fits_pipelined = true;
  out.fits_one = true;
  for (int s = 0; s < num_stages_; ++s) {
    const StageCost c = cost_model_.stage_cost(s, shape, density, recompute_);
    out.time_ms = std::max(out.time_ms, c.fwd_ms + c.bwd_ms);
    const std::int64_t one = static_bytes_[s] + c.stored_bytes + c.peak_bytes;
    const std::int64_t pipelined =
        static_bytes_[s] + std::int64_t{num_stages_ - s} * c.stored_bytes + c.peak_bytes;
    if (one > out.one_bytes || s == 0) {
      out.one_bytes = one;
      out.one_stage = s;
    }
    if (memory_limit_bytes_ > 0) {
      out.fits_one = out.fits_one && one <= memory_limit_bytes_;
      out.fits_pipelined = out.fits_pipelined && pipelined <= memory_limit_bytes_;
    }
  }
  DYNAPIPE_CHECK(!std::isnan(out.time_ms),
                 cat("cost model returned NaN time for shape ", shape.batch, "x", shape.seqlen,
                     "+", shape.dec_seqlen));
  return out;
}

ShapeCosts::Row* ShapeCosts::row(std::int64_t seqlen, std::int64_t dec_seqlen) {
  const std::uint64_t key =
      (static_cast<std::uint64_t>(seqlen) << 32) ^ static_cast<std::uint64_t>(dec_seqlen);
  return &rows_[key];  // unordered_map references survive rehashing
}

const ShapeCost& ShapeCosts::get(Row* row, std::int64_t seqlen, std::int64_t dec_seqlen,
                                 std::int64_t batch) {
  const std::size_t index = static_cast<std::size_t>(batch - 1);
  if (row->size() <= index) row->resize(index + 1);
  ShapeCost& entry = (*row)[index];
  if (std::isnan(entry.time_ms)) {
    entry = evaluate({.batch = batch, .seqlen = seqlen, .dec_seqlen = dec_seqlen}, {});
  }
  return entry;
}

ModelLengths model_lengths(const Sample& sample, ModelKind kind) {
  if (kind == ModelKind::Gpt) return {std::int64_t{sample.input_len} + sample.target_len, 0};
  return {sample.input_len, std::int64_t{sample.target_len} + 1};
}

void fill_members(std::span<const Sample> samples, std::span<const std::size_t> members,
                  MicroBatch* microbatch) {
  microbatch->sample_ids.clear();
  microbatch->sample_ids.reserve(members.size());
  microbatch->real_tokens = 0;
  microbatch->target_tokens = 0;
  for (std::size_t k : members) {
    const Sample& sample = samples[k];
    microbatch->sample_ids.push_back(sample.id);
    microbatch->real_tokens += std::int64_t{sample.input_len} + sample.target_len;
    microbatch->target_tokens += sample.target_len;
  }
}

MicroBatch make_padded_microbatch(std::span<const Sample> samples,
                                  std::span<const std::size_t> members, ModelKind kind,
                                  std::int64_t seqlen_multiple) {
  MicroBatch microbatch;
  fill_members(samples, members, &microbatch);
  std::int64_t enc = 0, dec = 0;
  for (std::size_t k : members) {
    const ModelLengths lengths = model_lengths(samples[k], kind);
    enc = std::max(enc, lengths.enc);
    dec = std::max(dec, lengths.dec);
  }
  microbatch.shape = {.batch = static_cast<std::int64_t>(members.size()),
                      .seqlen = round_up(enc, seqlen_multiple),
                      .dec_seqlen = round_up(dec, seqlen_multiple)};
  return microbatch;
}

std::optional<double> replicas_objective(const std::vector<std::vector<MicroBatch>>& replicas,
                                         ShapeCosts& costs, MemoryRule rule, int num_stages) {
  double objective = 0;
  std::vector<double> times;
  for (const std::vector<MicroBatch>& replica : replicas) {
    // A replica without work cannot take part in the gradient reduction of the step.
    if (replica.empty()) return std::nullopt;
    times.clear();
    for (const MicroBatch& mb : replica) {
      const bool dense = mb.density == AttentionDensity{};
      const ShapeCost cost = dense ? costs.get(mb.shape) : costs.evaluate(mb.shape, mb.density);
      if (!cost.fits(rule)) return std::nullopt;
      times.push_back(cost.time_ms);
    }
    objective = std::max(objective, pipeline_objective_ms(times, num_stages));
  }
  return objective;
}

}  // namespace dynapipe::detail
