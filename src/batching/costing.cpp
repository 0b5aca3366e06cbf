#include "costing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/cost_model.h"

namespace dynapipe::detail {

ShapeCosts::ShapeCosts(const CostModel& cost_model, Recompute recompute, int num_stages,
                       std::int64_t memory_limit_bytes, std::span<const int> in_flight)
    : cost_model_(cost_model), recompute_(recompute), num_stages_(num_stages),
      memory_limit_bytes_(memory_limit_bytes),
      affine_bound_(cost_model.affine_time_bound(recompute)),
      stage_scratch_(static_cast<std::size_t>(num_stages)),
      bytes_scratch_(2 * static_cast<std::size_t>(num_stages)) {
  static_bytes_.reserve(static_cast<std::size_t>(num_stages));
  for (int s = 0; s < num_stages; ++s) {
    static_bytes_.push_back(cost_model.static_bytes(s));
    in_flight_.push_back(in_flight.empty() ? num_stages - s : in_flight[static_cast<std::size_t>(s)]);
    room_base_.push_back(memory_limit_bytes - static_bytes_.back());
  }
}

ShapeCost ShapeCosts::evaluate(const MicroBatchShape& shape,
                               const AttentionDensity& density) const {
  // Through the bottleneck call, which the analytic model answers for each distinct stage
  // once without building every stage's StageCost (the same numbers:
  // CostModel::bottleneck_ms_and_bytes()): token-based's budget scan alone costs ~3,700
  // shapes per ~540-sample plan (−0.7% / −1.4% of a GPT-6.7B / T5-11B short256 plan).
  std::span<std::int64_t> bytes(bytes_scratch_);
  ShapeCost out;
  out.time_ms = evaluate_stages(shape, density, bytes);
  out.fits_pipelined = true;
  out.fits_one = true;
  const std::size_t p = static_cast<std::size_t>(num_stages_);
  for (std::size_t s = 0; s < p; ++s) {
    const std::int64_t held = bytes[s], peak = bytes[p + s];
    const std::int64_t one = static_bytes_[s] + held + peak;
    const std::int64_t pipelined = static_bytes_[s] + in_flight_[s] * held + peak;
    if (one > out.one_bytes || s == 0) {
      out.one_bytes = one;
      out.one_stage = static_cast<int>(s);
    }
    if (memory_limit_bytes_ > 0) {
      out.fits_one = out.fits_one && one <= memory_limit_bytes_;
      out.fits_pipelined = out.fits_pipelined && pipelined <= memory_limit_bytes_;
    }
  }
  return out;
}

double ShapeCosts::evaluate_stages(const MicroBatchShape& shape, const AttentionDensity& density,
                                   std::span<std::int64_t> bytes) const {
  ++evaluations_;
  const double time_ms =
      cost_model_.bottleneck_ms_and_bytes(shape, density, recompute_, stage_scratch_, bytes);
  DYNAPIPE_CHECK(!std::isnan(time_ms), cat("cost model returned NaN time for shape ", shape.batch,
                                           "x", shape.seqlen, "+", shape.dec_seqlen));
  return time_ms;
}

void ShapeCosts::evaluate_stages_many(std::span<const MicroBatchShape> shapes,
                                      std::span<const AttentionDensity> densities,
                                      std::span<const Recompute> modes, std::span<double> times,
                                      std::span<std::int64_t> bytes) const {
  evaluations_ += static_cast<std::int64_t>(shapes.size());
  cost_model_.bottleneck_ms_and_bytes_many(shapes, densities, modes, stage_scratch_, times, bytes);
  // One pass over the times (by mode, then shape); the shape is named only on failure.
  for (std::size_t at = 0; at < times.size(); ++at) {
    if (!std::isnan(times[at])) continue;
    const MicroBatchShape& shape = shapes[at % shapes.size()];
    DYNAPIPE_CHECK(!std::isnan(times[at]), cat("cost model returned NaN time for shape ", shape.batch,
                                               "x", shape.seqlen, "+", shape.dec_seqlen));
  }
}

void most_in_flight_counts(std::span<const std::int64_t> bytes,
                           std::span<const std::int64_t> room_base, std::span<std::uint32_t> most) {
  const std::size_t p = room_base.size(), shapes = most.size() / p;
  const std::int64_t* b = bytes.data();
  std::uint32_t* m = most.data();
  for (std::size_t shape = 0; shape < shapes; ++shape, b += 2 * p, m += p) {
    for (std::size_t s = 0; s < p; ++s) {
      const std::int64_t held = b[s];
      const std::int64_t room = room_base[s] - b[p + s];  // for k·held
      if (room < held) {
        m[s] = 0;  // not even one (held < 0 included: k = 1 is then the heaviest)
      } else if (held <= 0) {
        m[s] = kManyInFlight;  // held <= 0 and one fits: so does every k
      } else {
        m[s] = static_cast<std::uint32_t>(std::min<std::int64_t>(room / held, kManyInFlight));
      }
    }
  }
}

void ShapeCosts::most_in_flight(std::span<const std::int64_t> bytes,
                                std::span<std::uint32_t> most) const {
  const std::size_t p = static_cast<std::size_t>(num_stages_);
  DYNAPIPE_CHECK(bytes.size() == 2 * most.size() && most.size() % p == 0,
                 "most_in_flight: 2p bytes for every p counts");
  if (memory_limit_bytes_ == 0) {
    std::ranges::fill(most, kManyInFlight);
    return;
  }
  most_in_flight_counts(bytes, room_base_, most);
}

std::vector<std::int64_t> ShapeCosts::rule_key(MemoryRule rule) const {
  std::vector<std::int64_t> key{memory_limit_bytes_};
  for (int s = 0; s < num_stages_; ++s) {
    key.push_back(rule == MemoryRule::OneInFlight ? 1 : in_flight_[static_cast<std::size_t>(s)]);
  }
  if (rule == MemoryRule::PipelinedLoneAlone) key.push_back(-1);
  return key;
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

std::vector<PackedRow> pack_best_fit_decreasing(std::span<const Sample> samples,
                                                std::span<const std::size_t> members,
                                                ModelKind kind, std::int64_t enc_capacity,
                                                std::int64_t dec_capacity) {
  // Each sample's lengths read once, beside its index: the sort compares them ~n log n
  // times, which reading them from the samples made ~4% of a ~540-sample plan.
  struct Keyed {
    ModelLengths lengths;
    std::size_t k;
  };
  std::vector<Keyed> sorted;
  sorted.reserve(members.size());
  for (std::size_t k : members) sorted.push_back({model_lengths(samples[k], kind), k});
  std::stable_sort(sorted.begin(), sorted.end(), [](const Keyed& a, const Keyed& b) {
    if (a.lengths.enc != b.lengths.enc) return a.lengths.enc > b.lengths.enc;
    return a.lengths.dec > b.lengths.dec;
  });
  std::vector<PackedRow> rows;
  for (const auto& [lengths, k] : sorted) {
    PackedRow* best = nullptr;
    for (PackedRow& row : rows) {
      if (row.enc + lengths.enc > enc_capacity || row.dec + lengths.dec > dec_capacity) continue;
      if (best == nullptr || row.enc > best->enc || (row.enc == best->enc && row.dec > best->dec)) {
        best = &row;
      }
    }
    if (best == nullptr) best = &rows.emplace_back();
    best->enc += lengths.enc;
    best->dec += lengths.dec;
    best->members.push_back(k);
  }
  return rows;
}

std::vector<std::size_t> rows_in_sequence(std::span<const PackedRow> rows) {
  std::vector<std::size_t> order;
  for (const PackedRow& row : rows) order.insert(order.end(), row.members.begin(), row.members.end());
  return order;
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

MicroBatchShape padded_shape(std::span<const Sample> samples, std::span<const std::size_t> members,
                             ModelKind kind, std::int64_t seqlen_multiple) {
  std::int64_t enc = 0, dec = 0;
  for (std::size_t k : members) {
    const ModelLengths lengths = model_lengths(samples[k], kind);
    enc = std::max(enc, lengths.enc);
    dec = std::max(dec, lengths.dec);
  }
  return {.batch = static_cast<std::int64_t>(members.size()),
          .seqlen = round_up(enc, seqlen_multiple),
          .dec_seqlen = round_up(dec, seqlen_multiple)};
}

MicroBatch make_padded_microbatch(std::span<const Sample> samples,
                                  std::span<const std::size_t> members, ModelKind kind,
                                  std::int64_t seqlen_multiple) {
  MicroBatch microbatch;
  fill_members(samples, members, &microbatch);
  microbatch.shape = padded_shape(samples, members, kind, seqlen_multiple);
  return microbatch;
}

ShapeCost cost_of(ShapeCosts& costs, const MicroBatch& microbatch) {
  if (microbatch.density == AttentionDensity{}) return costs.get(microbatch.shape);
  return costs.evaluate(microbatch.shape, microbatch.density);
}

namespace {

// The chain's costs (ShapeCosts::lighter()) in which `microbatch` runs mixed: the lightest
// whose memory rule it fits, else `costs`.
ShapeCosts& mixed_costs(ShapeCosts& costs, const MicroBatch& microbatch, MemoryRule rule,
                        ShapeCost* cost) {
  std::array<ShapeCosts*, kRecomputeModes.size()> chain{};
  std::size_t n = 0;
  for (ShapeCosts* c = &costs; c != nullptr && n < chain.size(); c = c->lighter()) chain[n++] = c;
  const MemoryRule own = rule_for(rule, microbatch.sample_ids.size());
  for (std::size_t k = n; k-- > 1;) {  // lightest first; costs' own below
    *cost = cost_of(*chain[k], microbatch);
    if (cost->fits(own)) return *chain[k];
  }
  *cost = cost_of(costs, microbatch);
  return costs;
}

}  // namespace

ShapeCost mixed_cost_of(ShapeCosts& costs, const MicroBatch& microbatch, MemoryRule rule) {
  ShapeCost cost;
  mixed_costs(costs, microbatch, rule, &cost);
  return cost;
}

Recompute mixed_mode_of(ShapeCosts& costs, const MicroBatch& microbatch, MemoryRule rule) {
  ShapeCost cost;
  return mixed_costs(costs, microbatch, rule, &cost).recompute();
}

AttentionDensity varlen_density(double enc_squares, double dec_squares, std::int64_t rows,
                                const MicroBatchShape& shape, ModelKind kind) {
  auto density = [&](double squares, std::int64_t seqlen) {
    const double area = static_cast<double>(rows) * static_cast<double>(seqlen) *
                        static_cast<double>(seqlen);
    return seqlen == 0 ? 1.0 : squares / area;
  };
  AttentionDensity out;
  out.enc = density(enc_squares, shape.seqlen);
  if (kind == ModelKind::T5) out.dec = density(dec_squares, shape.dec_seqlen);
  return out;
}

SamplePositions::SamplePositions(std::span<const Sample> samples) {
  by_id_.reserve(samples.size());
  for (std::size_t k = 0; k < samples.size(); ++k) by_id_.emplace_back(samples[k].id, k);
  std::sort(by_id_.begin(), by_id_.end());
}

std::size_t SamplePositions::of(SampleId id, std::string_view caller) const {
  const auto it = std::lower_bound(by_id_.begin(), by_id_.end(), std::pair<SampleId, std::size_t>{id, 0});
  DYNAPIPE_CHECK(it != by_id_.end() && it->first == id, cat(caller, ": sample ", id, " not in the batch"));
  return it->second;
}

LoneSample lone_sample_form(const CostModel& cost_model) {
  return cost_model.lone_samples_dense() ? LoneSample::Dense : LoneSample::Varlen;
}

AttentionDensity varlen_row_density(std::size_t count, LoneSample lone, double enc_squares,
                                    double dec_squares, const MicroBatchShape& shape, ModelKind kind) {
  if (count == 1 && lone == LoneSample::Dense) return AttentionDensity{};
  return varlen_density(enc_squares, dec_squares, 1, shape, kind);
}

MicroBatch make_varlen_microbatch(std::span<const Sample> samples,
                                  std::span<const std::size_t> members, ModelKind kind,
                                  std::int64_t seqlen_multiple, LoneSample lone) {
  if (members.size() == 1 && lone == LoneSample::Dense) {
    return make_padded_microbatch(samples, members, kind, seqlen_multiple);
  }
  MicroBatch microbatch;
  fill_members(samples, members, &microbatch);
  microbatch.rows.push_back(microbatch.sample_ids);
  std::int64_t enc = 0, dec = 0;
  double enc_squares = 0, dec_squares = 0;
  for (std::size_t k : members) {
    const ModelLengths lengths = model_lengths(samples[k], kind);
    enc += lengths.enc;
    dec += lengths.dec;
    enc_squares += static_cast<double>(lengths.enc) * static_cast<double>(lengths.enc);
    dec_squares += static_cast<double>(lengths.dec) * static_cast<double>(lengths.dec);
  }
  microbatch.shape = {.batch = 1,
                      .seqlen = round_up(enc, seqlen_multiple),
                      .dec_seqlen = round_up(dec, seqlen_multiple)};
  microbatch.density = varlen_density(enc_squares, dec_squares, 1, microbatch.shape, kind);
  return microbatch;
}

MicroBatch make_microbatch(std::span<const Sample> samples, std::span<const std::size_t> members,
                           const BatchingOptions& options, LoneSample lone) {
  if (options.strategy == Strategy::DynaPipe) {
    return make_varlen_microbatch(samples, members, options.kind, options.seqlen_multiple, lone);
  }
  return make_padded_microbatch(samples, members, options.kind, options.seqlen_multiple);
}

std::optional<double> replicas_objective(const std::vector<std::vector<MicroBatch>>& replicas,
                                         ShapeCosts& costs, MemoryRule rule,
                                         const BatchingOptions& options) {
  double objective = 0;
  std::vector<double> times;
  for (const std::vector<MicroBatch>& replica : replicas) {
    // A replica without work cannot take part in the gradient reduction of the step.
    if (replica.empty()) return std::nullopt;
    times.clear();
    for (const MicroBatch& mb : replica) {
      const ShapeCost cost = mixed_cost_of(costs, mb, rule);
      if (!cost.fits(rule_for(rule, mb.sample_ids.size()))) return std::nullopt;
      times.push_back(cost.time_ms);
    }
    objective = std::max(objective,
                         pipeline_objective_ms(times, options.num_stages, options.bubble_weight));
  }
  return objective;
}

}  // namespace dynapipe::detail
