// Private to batching/: costing shapes against the memory rule, with a per-call cache,
// and building MicroBatch values from samples. Shared by the DP and the baselines.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dynapipe/batching/batching.h"
#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/sample.h"
#include "dynapipe/cost/cost_model.h"

namespace dynapipe::detail {

// How many micro-batches may be in flight at stage s when checking memory.
enum class MemoryRule : std::uint8_t {
  Pipelined,    // k_s from BatchingOptions::in_flight (default p − s, as under 1F1B)
  OneInFlight,  // k_s = 1: the schedule must limit micro-batches in flight
  // Pipelined for micro-batches of several samples, OneInFlight for one sample alone
  // (BatchingOptions::lone_samples_alone; dynapipe only).
  PipelinedLoneAlone,
};

// The rule a micro-batch of `samples` samples is held to under `rule`.
inline MemoryRule rule_for(MemoryRule rule, std::size_t samples) {
  if (rule != MemoryRule::PipelinedLoneAlone) return rule;
  return samples == 1 ? MemoryRule::OneInFlight : MemoryRule::Pipelined;
}

struct ShapeCost {
  double time_ms = std::numeric_limits<double>::quiet_NaN();  // NaN = not evaluated yet
  bool fits_pipelined = false;
  bool fits_one = false;
  std::int64_t one_bytes = 0;  // max over stages of static + stored + peak (k = 1)
  int one_stage = 0;           // the stage attaining one_bytes
  bool fits(MemoryRule rule) const {  // REQUIRES: not PipelinedLoneAlone (rule_for())
    return rule == MemoryRule::Pipelined ? fits_pipelined : fits_one;
  }
};

// Time and memory feasibility of shapes under one recompute mode. Shapes with dense
// attention are cached per (seqlen, dec_seqlen) row, indexed by batch.
// Complexity: one evaluation = one CostModel::bottleneck_ms_and_bytes() call.
class ShapeCosts {
 public:
  using Row = std::vector<ShapeCost>;

  // in_flight: k_s per stage for MemoryRule::Pipelined; empty = p − s.
  ShapeCosts(const CostModel& cost_model, Recompute recompute, int num_stages,
             std::int64_t memory_limit_bytes, std::span<const int> in_flight = {});

  Recompute recompute() const { return recompute_; }
  // Uncached, any density.
  ShapeCost evaluate(const MicroBatchShape& shape, const AttentionDensity& density) const;
  // Cached, dense attention. The reference stays valid for the life of this object.
  Row* row(std::int64_t seqlen, std::int64_t dec_seqlen);
  const ShapeCost& get(Row* row, std::int64_t seqlen, std::int64_t dec_seqlen,
                       std::int64_t batch);
  const ShapeCost& get(const MicroBatchShape& shape) {
    return get(row(shape.seqlen, shape.dec_seqlen), shape.seqlen, shape.dec_seqlen, shape.batch);
  }
  std::int64_t evaluations() const { return evaluations_; }
  // Uncached: the time (max over stages of fwd + bwd) and, into bytes[0..2p), every
  // stage's held bytes (StageCost::held_bytes()) then peak bytes, independent of the
  // memory rule.
  double evaluate_stages(const MicroBatchShape& shape, const AttentionDensity& density,
                         std::span<std::int64_t> bytes) const;
  // evaluate_stages() for several shapes, each under each of `modes` (this object's own
  // mode need not be among them), in one cost-model call
  // (CostModel::bottleneck_ms_and_bytes_many()), by mode: shape j's results for modes[k]
  // are times[J·k + j] and bytes[2p·(J·k + j), 2p·(J·k + j + 1)) (J shapes).
  void evaluate_stages_many(std::span<const MicroBatchShape> shapes,
                            std::span<const AttentionDensity> densities,
                            std::span<const Recompute> modes, std::span<double> times,
                            std::span<std::int64_t> bytes) const;
  // How many shapes evaluate_stages_many() costs for about the price of one.
  int costing_lanes() const { return cost_model_.costing_lanes(); }
  // Per stage, the most micro-batches in flight that fit with the held and peak bytes
  // `bytes` gives (evaluate_stages()'s; several shapes' one after another, p counts each
  // into `most`): the largest k with static + k·held + peak within the memory limit, 0 for
  // not even one, kManyInFlight for every k (or no limit): more than any k a rule asks.
  // Every memory rule's check of a segment is then one comparison per stage
  // (fits_in_flight()), so the varlen rows keep these p numbers per segment instead of 2p
  // byte counts (VarlenRows::Row). Complexity: one integer division per stage.
  void most_in_flight(std::span<const std::int64_t> bytes, std::span<std::uint32_t> most) const;
  // Whether a shape whose most_in_flight() is `most` fits under `rule`.
  // Inline: the varlen scans call it once per new segment and rule.
  // REQUIRES: not PipelinedLoneAlone (rule_for()).
  bool fits_in_flight(std::span<const std::uint32_t> most, MemoryRule rule) const {
    const std::size_t p = static_cast<std::size_t>(num_stages_);
    for (std::size_t s = 0; s < p; ++s) {
      const std::int64_t k = rule == MemoryRule::Pipelined ? in_flight_[s] : 1;
      if (k > most[s]) return false;
    }
    return true;
  }
  // What fits() checks against under `rule`: the memory limit, then k_s per stage (and a
  // marker for PipelinedLoneAlone).
  std::vector<std::int64_t> rule_key(MemoryRule rule) const;
  int num_stages() const { return num_stages_; }
  std::int64_t memory_limit_bytes() const { return memory_limit_bytes_; }  // 0 = unlimited
  const CostModel& cost_model() const { return cost_model_; }
  // The cost model's affine lower bound of stage times under this mode, if it has one.
  const std::optional<AffineTimeBound>& affine_bound() const { return affine_bound_; }
  // Mixed recompute (BatchingOptions::mixed_recompute): the costs of the next lighter
  // mode, with the same memory rules, whose micro-batches that fit run in it; nullptr
  // (default): every micro-batch in this mode.
  void mix_with(ShapeCosts* lighter) { lighter_ = lighter; }
  ShapeCosts* lighter() const { return lighter_; }

 private:
  const CostModel& cost_model_;
  ShapeCosts* lighter_ = nullptr;
  Recompute recompute_;
  int num_stages_;
  std::int64_t memory_limit_bytes_;  // 0 = unlimited
  std::vector<std::int64_t> static_bytes_;
  std::vector<std::int64_t> in_flight_;
  std::vector<std::int64_t> room_base_;  // per stage: the limit less the static bytes
  std::optional<AffineTimeBound> affine_bound_;
  std::unordered_map<std::uint64_t, Row> rows_;
  mutable std::int64_t evaluations_ = 0;
  mutable std::vector<StageCost> stage_scratch_;  // one evaluation's per-stage costs
  mutable std::vector<std::int64_t> bytes_scratch_;  // evaluate()'s held and peak bytes per stage
};

// ShapeCosts::most_in_flight()'s counts, for most.size() / p shapes of p = room_base.size()
// stages: bytes holds each shape's held[p] then peak[p], room_base[s] the memory limit less
// stage s's static bytes; each count is the largest k with k·held <= room_base[s] − peak (0:
// not even one; kManyInFlight: every k). Integer divisions.
inline constexpr std::uint32_t kManyInFlight = std::numeric_limits<std::uint32_t>::max();
void most_in_flight_counts(std::span<const std::int64_t> bytes,
                           std::span<const std::int64_t> room_base, std::span<std::uint32_t> most);

// Token lengths of one sample as the model sees them, before rounding:
// GPT enc = input + target, dec = 0; T5 enc = input, dec = target + 1 (bos ++ target).
struct ModelLengths {
  std::int64_t enc = 0;
  std::int64_t dec = 0;
};
ModelLengths model_lengths(const Sample& sample, ModelKind kind);

// Model tokens and their samples' squared lengths summed over a set of samples, and
// whether the cost model's affine bound applies to each of them (cost_model.h: an
// encoder token, and for T5 a decoder token).
struct TokenTotals {
  double enc = 0, dec = 0;
  double enc_squares = 0, dec_squares = 0;
  bool every_sample_has_tokens = true;
  void add(const ModelLengths& l, ModelKind kind) {
    const double e = static_cast<double>(l.enc), d = static_cast<double>(l.dec);
    enc += e;
    dec += d;
    enc_squares += e * e;
    dec_squares += d * d;
    every_sample_has_tokens = every_sample_has_tokens && l.enc > 0 && (kind != ModelKind::T5 || l.dec > 0);
  }
  // AffineTimeBound::work_ms() of these totals on stage s.
  double work_ms(const AffineTimeBound& bound, std::size_t s) const {
    return bound.work_ms(s, enc, dec, enc_squares, dec_squares);
  }
};

// The shape of `members` one per row, padded to the longest: {count, round(max enc),
// round(max dec)}.
MicroBatchShape padded_shape(std::span<const Sample> samples, std::span<const std::size_t> members,
                             ModelKind kind, std::int64_t seqlen_multiple);

// One micro-batch of whole samples, one per row, padded to the longest (padded_shape()).
MicroBatch make_padded_microbatch(std::span<const Sample> samples,
                                  std::span<const std::size_t> members, ModelKind kind,
                                  std::int64_t seqlen_multiple);

// Block-diagonal attention over `rows` rows of seqlen (dec_seqlen) tokens holding
// samples whose lengths square-sum to enc_squares (dec_squares): Σ L² / (rows·seqlen²).
// GPT: dec stays 1 (unused).
AttentionDensity varlen_density(double enc_squares, double dec_squares, std::int64_t rows,
                                const MicroBatchShape& shape, ModelKind kind);

// How the varlen form makes a micro-batch of one sample: one varlen row, or one dense row
// padded to the seqlen multiple, as the cost model prices it (CostModel::lone_samples_dense()).
enum class LoneSample { Varlen, Dense };
LoneSample lone_sample_form(const CostModel& cost_model);

// The density of `count` samples in one varlen row, in the form make_varlen_microbatch()
// gives them: dense for one sample where `lone` is Dense, else varlen_density() of one row.
AttentionDensity varlen_row_density(std::size_t count, LoneSample lone, double enc_squares,
                                    double dec_squares, const MicroBatchShape& shape, ModelKind kind);

// Where each sample id sits in a batch's samples, for turning a micro-batch's ids back into
// positions: one sorted array of (id, position), one allocation (a hash map made one per
// sample: ~4,000 of a GPT-6.7B pp 4 short256 plan's allocations).
class SamplePositions {
 public:
  explicit SamplePositions(std::span<const Sample> samples);
  // The position of `id` (the first, if the batch repeats it). Throws naming `caller` and
  // the id if the batch does not hold it.
  std::size_t of(SampleId id, std::string_view caller) const;

 private:
  std::vector<std::pair<SampleId, std::size_t>> by_id_;
};

// One varlen micro-batch: every sample in one row, attention block-diagonal per sample.
// Shape {1, round(Σ enc), round(Σ dec)}, density Σ L² / seqlen² (T5: per encoder and
// decoder), the same representation packing-varlen uses for its rows. One sample with
// `lone` Dense: make_padded_microbatch()'s dense row.
MicroBatch make_varlen_microbatch(std::span<const Sample> samples,
                                  std::span<const std::size_t> members, ModelKind kind,
                                  std::int64_t seqlen_multiple, LoneSample lone);

// The micro-batch form of `options.strategy` for the DP strategies: varlen for dynapipe
// (a lone sample as `lone` says), padded otherwise.
MicroBatch make_microbatch(std::span<const Sample> samples, std::span<const std::size_t> members,
                           const BatchingOptions& options, LoneSample lone);

// Cost of a micro-batch: dense ones through the cache, others evaluated.
ShapeCost cost_of(ShapeCosts& costs, const MicroBatch& microbatch);
// cost_of() in the lightest mode of costs' mixing chain (ShapeCosts::lighter()) whose
// memory rule the micro-batch fits; costs' own where none does.
ShapeCost mixed_cost_of(ShapeCosts& costs, const MicroBatch& microbatch, MemoryRule rule);
// The mode mixed_cost_of() costs the micro-batch in.
Recompute mixed_mode_of(ShapeCosts& costs, const MicroBatch& microbatch, MemoryRule rule);

// A packed row: samples whose model lengths add up within the capacities.
struct PackedRow {
  std::int64_t enc = 0;  // Σ enc lengths of its samples
  std::int64_t dec = 0;  // Σ dec lengths (T5: target + 1 each)
  std::vector<std::size_t> members;
};

// Best-fit decreasing: samples by (enc, dec) descending, each into the fitting row with
// the least room left (enc first, then dec; ties: the older row). O(n log n + n · rows).
std::vector<PackedRow> pack_best_fit_decreasing(std::span<const Sample> samples,
                                                std::span<const std::size_t> members,
                                                ModelKind kind, std::int64_t enc_capacity,
                                                std::int64_t dec_capacity);

// The rows' members one row after another (order_packed_rows()).
std::vector<std::size_t> rows_in_sequence(std::span<const PackedRow> rows);

// Fills sample_ids, real_tokens and target_tokens from `members`.
void fill_members(std::span<const Sample> samples, std::span<const std::size_t> members,
                  MicroBatch* microbatch);

// Costs every micro-batch (dense ones through the cache) and returns the objective
// (max over replicas of Σt + bubble_weight·(p−1)·max t), or nullopt if one does not fit under `rule`
// or a replica got no micro-batch.
std::optional<double> replicas_objective(const std::vector<std::vector<MicroBatch>>& replicas,
                                         ShapeCosts& costs, MemoryRule rule,
                                         const BatchingOptions& options);

// A strategy's answer for one (memory rule, recompute mode).
struct Candidate {
  std::vector<std::vector<MicroBatch>> replicas;
  double objective_ms = std::numeric_limits<double>::infinity();
  std::int64_t size = 0;  // BatchingResult::size
};

// The micro-batches as a candidate with their objective (replicas_objective()) if they fit
// and it is strictly below `bound_ms`; nullopt otherwise.
inline std::optional<Candidate> candidate_below(std::vector<std::vector<MicroBatch>> replicas,
                                                ShapeCosts& costs, MemoryRule rule,
                                                const BatchingOptions& options, double bound_ms) {
  const std::optional<double> objective = replicas_objective(replicas, costs, rule, options);
  if (!objective || !(*objective < bound_ms)) return std::nullopt;
  return Candidate{std::move(replicas), *objective};
}

// The most rows in [1, max(cap, 1)] whose shape shape_of(rows) fits `rule`, by binary
// search (memory is non-decreasing in rows); 0 if not even one row fits.
template <typename ShapeOf>
std::int64_t most_rows_that_fit(ShapeCosts& costs, MemoryRule rule, std::int64_t cap,
                                ShapeOf&& shape_of) {
  std::int64_t lo = 0, hi = std::max<std::int64_t>(cap, 1);  // fits(lo) (or lo = 0), hi unknown
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (costs.get(shape_of(mid)).fits(rule)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// For the strategies of a fixed micro-batch size (padding, the packings): the
// micro-batching of `most` rows each when options.fixed_batch sets it or
// !options.size_by_objective; otherwise the best of every size from `most` (the most that
// fit) down to 1 by the DP's objective (replicas_objective()), as token-based picks its
// token budget. The most that fit has the smallest Σt but the longest fill and drain:
// where memory is plentiful (a small model, a CPU) it is one micro-batch of every row and
// no pipelining at all. Ties keep the larger size; nullopt when nothing fits or beats
// `incumbent_ms`. build(rows) returns the replicas' micro-batches.
template <typename Build>
std::optional<Candidate> best_fixed_size(std::int64_t most, ShapeCosts& costs, MemoryRule rule,
                                         const BatchingOptions& options, double incumbent_ms,
                                         Build&& build) {
  std::optional<Candidate> best;
  const std::int64_t smallest = options.fixed_batch > 0 || !options.size_by_objective ? most : 1;
  for (std::int64_t rows = most; rows >= smallest; --rows) {
    const double bound = best ? best->objective_ms : incumbent_ms;
    if (std::optional<Candidate> c = candidate_below(build(rows), costs, rule, options, bound)) {
      best = std::move(c);
      best->size = rows;
    }
  }
  return best;
}

// Strategy entry points (baselines.cpp, dynapipe_strategy.cpp). `order` is the
// strategy-independent sorted order (order_samples()). nullopt: nothing feasible under
// this rule and mode, or nothing strictly better than `incumbent_ms`.
struct VarlenMemoStore;
struct StrategyInput {
  std::span<const Sample> samples;
  std::span<const std::size_t> order;
  const BatchingOptions& options;
  // Segment costs, packings and orders kept across DPs; make_microbatches() always gives one.
  VarlenMemoStore* memos = nullptr;
};
std::optional<Candidate> run_dynapipe(const StrategyInput& input, ShapeCosts& costs,
                                      MemoryRule rule, double incumbent_ms);
std::optional<Candidate> run_padding(const StrategyInput& input, ShapeCosts& costs,
                                     MemoryRule rule, double incumbent_ms);
std::optional<Candidate> run_packing(const StrategyInput& input, ShapeCosts& costs,
                                     MemoryRule rule, double incumbent_ms);
std::optional<Candidate> run_packing_megatron(const StrategyInput& input, ShapeCosts& costs,
                                              MemoryRule rule, double incumbent_ms);
std::optional<Candidate> run_token_based(const StrategyInput& input, ShapeCosts& costs,
                                         MemoryRule rule, double incumbent_ms);

}  // namespace dynapipe::detail
