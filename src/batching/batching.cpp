#include "dynapipe/batching/batching.h"

#include <algorithm>
#include <array>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "costing.h"
#include "varlen_memo.h"
#include "dynapipe/batching/ordering.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/cost_model.h"

namespace dynapipe {
namespace {

void check_samples(const GlobalBatch& batch, const BatchingOptions& options) {
  const bool t5 = options.kind == ModelKind::T5;
  std::vector<SampleId> ids;
  ids.reserve(batch.samples.size());
  for (const Sample& sample : batch.samples) {
    // Only on error: built for every sample it was ~5% of a short256 plan.
    auto where = [&] { return cat("make_microbatches: sample ", sample.id); };
    if (sample.input_len < 0 || sample.target_len < 0) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(where(), ": lengths must be >= 0, got input_len ", sample.input_len,
                      ", target_len ", sample.target_len));
    }
    const std::int64_t total = std::int64_t{sample.input_len} + sample.target_len;
    if (total == 0) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(where(), ": input_len + target_len must be >= 1, got 0"));
    }
    if (!t5 && total > options.max_seqlen) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(where(), ": input_len + target_len must be <= max_seqlen ",
                      options.max_seqlen, " (truncated), got ", total));
    }
    if (t5 && sample.input_len > options.max_seqlen) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(where(), ": input_len must be <= max_seqlen ", options.max_seqlen,
                      " (truncated), got ", sample.input_len));
    }
    if (t5 && sample.target_len > options.max_target_len) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(where(), ": target_len must be <= max_target_len ", options.max_target_len,
                      " (truncated), got ", sample.target_len));
    }
    ids.push_back(sample.id);
  }
  std::sort(ids.begin(), ids.end());
  const auto duplicate = std::adjacent_find(ids.begin(), ids.end());
  if (duplicate != ids.end()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("make_microbatches: sample ids must be unique, got ", *duplicate, " twice"));
  }
}

// Infeasible when the smallest micro-batch the strategy can form does not fit even with
// full recompute and one micro-batch in flight.
void check_alone_fits(const GlobalBatch& batch, const BatchingOptions& options,
                      detail::ShapeCosts& full) {
  // packing-megatron names its padded row and recompute mode itself when they do not fit.
  if (options.memory_limit_bytes == 0 || options.strategy == Strategy::PackingMegatron) return;
  if (options.strategy == Strategy::Padding) {
    const MicroBatchShape row{
        .batch = 1,
        .seqlen = round_up(options.max_seqlen, options.seqlen_multiple),
        .dec_seqlen = options.kind == ModelKind::T5
                          ? round_up(options.max_target_len + 1, options.seqlen_multiple)
                          : 0};
    const detail::ShapeCost& cost = full.get(row);
    if (!cost.fits_one) {
      throw Error(ErrorKind::Infeasible,
                  cat("make_microbatches: memory of one padded row (", row.seqlen, "+",
                      row.dec_seqlen, " tokens) must be <= memory_limit_bytes ",
                      options.memory_limit_bytes, ", got ", cost.one_bytes, " bytes on stage ",
                      cost.one_stage, " even with full recompute and one micro-batch in flight"));
    }
    return;
  }
  const std::vector<Sample>& samples = batch.samples;
  auto alone_of = [&](std::size_t k) {
    const std::size_t members[1] = {k};
    return detail::make_microbatch(samples, members, options, detail::lone_sample_form(full.cost_model()));
  };
  // Where the cost model is monotone a sample's memory alone grows with its encoder and
  // decoder lengths: where the samples that no other is at least as long as on both sides
  // fit, every sample does (T5-11B pp 8 short256: ~530 costed shapes per strategy were ~1%
  // of a plan).
  if (full.cost_model().monotone()) {
    std::vector<detail::ModelLengths> lengths;
    lengths.reserve(samples.size());
    for (const Sample& sample : samples) lengths.push_back(detail::model_lengths(sample, options.kind));
    std::vector<std::size_t> by_enc(samples.size());
    std::iota(by_enc.begin(), by_enc.end(), std::size_t{0});
    std::sort(by_enc.begin(), by_enc.end(), [&](std::size_t a, std::size_t b) {
      return lengths[a].enc != lengths[b].enc ? lengths[a].enc > lengths[b].enc : lengths[a].dec > lengths[b].dec;
    });
    bool all_fit = true;
    std::int64_t most_dec = -1;  // over the samples with more encoder tokens
    for (std::size_t k : by_enc) {
      if (lengths[k].dec <= most_dec) continue;  // another is at least as long on both sides
      most_dec = lengths[k].dec;
      if (!detail::cost_of(full, alone_of(k)).fits_one) {
        all_fit = false;
        break;
      }
    }
    if (all_fit) return;
  }
  // Every sample, to name the first that does not fit.
  for (std::size_t k = 0; k < samples.size(); ++k) {
    const MicroBatch alone = alone_of(k);
    const detail::ShapeCost cost = detail::cost_of(full, alone);
    if (!cost.fits_one) {
      throw Error(ErrorKind::Infeasible,
                  cat("make_microbatches: memory of sample ", samples[k].id, " alone (input_len ",
                      samples[k].input_len, ", target_len ", samples[k].target_len, ", shape 1x",
                      alone.shape.seqlen, "+", alone.shape.dec_seqlen,
                      ") must be <= memory_limit_bytes ", options.memory_limit_bytes, ", got ",
                      cost.one_bytes, " bytes on stage ", cost.one_stage,
                      " even with full recompute and one micro-batch in flight"));
    }
  }
}

// Whether the DP objective under one recompute mode, for one replica, provably cannot
// beat `incumbent_ms`, by a lower bound without the DP. Where the cost model is
// subadditive (CostModel::subadditive()), every sample in one varlen micro-batch bounds
// Σ t from below (a merged micro-batch pays the fixed overheads once, runs larger
// matmuls and pads no more than its parts, and a padded segment costs no less than the
// same samples in one varlen row); where it is monotone (CostModel::monotone()), no
// micro-batch is faster than its slowest sample alone. Where it has an affine bound
// (cost_model.h), K micro-batches also pay its fixed time K times and the slowest takes
// at least the mean: min over K of Σ + slope·max bounds the objective too, which rules
// out full recompute of many short samples before the samples alone are costed. Memory
// is ignored.
bool cannot_beat(double incumbent_ms, const GlobalBatch& batch, const BatchingOptions& options,
                 detail::ShapeCosts& costs, detail::VarlenMemoStore& memos) {
  const double slope = options.bubble_weight * (options.num_stages - 1);
  const std::vector<Sample>& samples = batch.samples;
  detail::VarlenMemoStore::Bound& known = memos.bounds[static_cast<std::size_t>(costs.recompute())];
  if (!known.valid) {
    std::vector<std::size_t> all(samples.size());
    for (std::size_t k = 0; k < all.size(); ++k) all[k] = k;
    const MicroBatch merged =
        detail::make_varlen_microbatch(samples, all, options.kind, options.seqlen_multiple,
                                       detail::lone_sample_form(costs.cost_model()));
    // Only a subadditive model's merged row bounds Σ t; otherwise no bound (0).
    known.merged_ms = costs.cost_model().subadditive() ? detail::cost_of(costs, merged).time_ms : 0.0;
    known.tokens = {};
    for (const Sample& sample : samples) {
      known.tokens.add(detail::model_lengths(sample, options.kind), options.kind);
    }
    known.valid = true;
  }
  // The affine bound first: it needs no sample costed alone. True if on some stage
  // every count K of micro-batches gives Σ + slope·max >= the incumbent; K past the count
  // where Σ alone reaches it need no look, nor K past one that stays below.
  auto affine_rules_out = [&](double slowest_ms) {
    const std::optional<AffineTimeBound>& affine = costs.affine_bound();
    if (!affine || !known.tokens.every_sample_has_tokens) return false;
    for (std::size_t s = 0; s < affine->fixed_ms.size(); ++s) {
      const double work = known.tokens.work_ms(*affine, s);
      const double fixed = affine->fixed_ms[s];
      bool below = false;
      for (std::size_t k = 1; k <= samples.size() && !below; ++k) {  // K micro-batches
        const double count = static_cast<double>(k);
        const double sum = std::max(known.merged_ms, work + count * fixed);
        if (sum >= incumbent_ms) break;  // and so for every larger K
        below = sum + slope * std::max(slowest_ms, sum / count) < incumbent_ms;
      }
      if (!below) return true;
    }
    return false;
  };
  if (affine_rules_out(0)) return true;
  if (!known.has_slowest) {
    // Samples of equal model lengths cost the same alone: each distinct pair once.
    std::vector<std::pair<std::int64_t, std::int64_t>> lengths;
    lengths.reserve(samples.size());
    for (const Sample& sample : samples) {
      const detail::ModelLengths l = detail::model_lengths(sample, options.kind);
      lengths.emplace_back(l.enc, l.dec);
    }
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    std::vector<std::int64_t> bytes(2 * static_cast<std::size_t>(options.num_stages));
    const detail::LoneSample lone = detail::lone_sample_form(costs.cost_model());
    double slowest = 0;
    for (const auto& [enc, dec] : lengths) {
      const MicroBatchShape shape{.batch = 1,
                                  .seqlen = round_up(enc, options.seqlen_multiple),
                                  .dec_seqlen = round_up(dec, options.seqlen_multiple)};
      const double squares_enc = static_cast<double>(enc) * static_cast<double>(enc);
      const double squares_dec = static_cast<double>(dec) * static_cast<double>(dec);
      const AttentionDensity density =
          detail::varlen_row_density(1, lone, squares_enc, squares_dec, shape, options.kind);
      slowest = std::max(slowest, costs.evaluate_stages(shape, density, bytes));
    }
    known.slowest_ms = slowest;
    known.has_slowest = true;
  }
  // The slowest sample alone bounds a micro-batch only where time never falls as it grows.
  const double slowest_ms = costs.cost_model().monotone() ? known.slowest_ms : 0.0;
  return known.merged_ms + slope * slowest_ms >= incumbent_ms || affine_rules_out(slowest_ms);
}

}  // namespace

void BatchingOptions::validate() const {
  auto fail = [](const std::string& what) {
    throw Error(ErrorKind::InvalidArgument, cat("batching options: ", what));
  };
  if (num_stages < 1) fail(cat("num_stages must be >= 1, got ", num_stages));
  if (dp < 1) fail(cat("dp must be >= 1, got ", dp));
  if (memory_limit_bytes < 0) fail(cat("memory_limit_bytes must be >= 0, got ", memory_limit_bytes));
  if (max_seqlen < 1) fail(cat("max_seqlen must be >= 1, got ", max_seqlen));
  if (kind == ModelKind::T5 && max_target_len < 1) {
    fail(cat("max_target_len must be >= 1 for t5, got ", max_target_len));
  }
  if (seqlen_multiple < 1) fail(cat("seqlen_multiple must be >= 1, got ", seqlen_multiple));
  if (token_budget < 0) fail(cat("token_budget must be >= 0, got ", token_budget));
  if (fixed_batch < 0) fail(cat("fixed_batch must be >= 0, got ", fixed_batch));
  if (!(min_tmax_interval_ms >= 0)) {
    fail(cat("min_tmax_interval_ms must be >= 0, got ", min_tmax_interval_ms));
  }
  if (t5_bucket_tokens < 0) fail(cat("t5_bucket_tokens must be >= 0, got ", t5_bucket_tokens));
  if (!in_flight.empty() && in_flight.size() != static_cast<std::size_t>(num_stages)) {
    fail(cat("in_flight must be empty or hold num_stages ", num_stages, " entries, got ",
             in_flight.size()));
  }
  for (int k : in_flight) {
    if (k < 1) fail(cat("in_flight entries must be >= 1, got ", k));
  }
  if (!(bubble_weight > 0)) fail(cat("bubble_weight must be > 0, got ", bubble_weight));
  if (lone_samples_alone && strategy != Strategy::DynaPipe) {
    fail(cat("lone_samples_alone applies to dynapipe only, got strategy ", strategy_name(strategy)));
  }
}

struct BatchingCache::Store : detail::VarlenMemoStore {};

BatchingCache::BatchingCache() : store_(std::make_unique<Store>()) {}
BatchingCache::~BatchingCache() = default;
void BatchingCache::absorb(BatchingCache&& other) { store_->absorb(std::move(*other.store_)); }

BatchingResult make_microbatches(const GlobalBatch& batch, const CostModel& cost_model,
                                 const BatchingOptions& options, BatchingCache* cache) {
  options.validate();
  if (cost_model.num_stages() != options.num_stages) {
    throw Error(ErrorKind::InvalidArgument,
                cat("make_microbatches: the cost model's stage count must equal num_stages ",
                    options.num_stages, ", got ", cost_model.num_stages()));
  }
  BatchingCache local;
  detail::VarlenMemoStore& memos = cache != nullptr ? cache->store() : local.store();
  if (memos.batch != &batch || memos.cost_model != &cost_model) {
    memos = detail::VarlenMemoStore{};
    memos.batch = &batch;
    memos.cost_model = &cost_model;
  }
  // Once per store and length limits (a plan's DPs and baselines share one).
  const detail::VarlenMemoStore::SampleLimits limits{options.kind, options.max_seqlen, options.max_target_len};
  if (memos.samples_checked != limits) {
    check_samples(batch, options);
    memos.samples_checked = limits;
  }
  BatchingResult result;
  result.replicas.resize(static_cast<std::size_t>(options.dp));
  if (batch.samples.empty()) return result;
  // Every replica takes part in the step's gradient reduction, so each needs a sample.
  if (batch.samples.size() < static_cast<std::size_t>(options.dp)) {
    throw Error(ErrorKind::Infeasible,
                cat(batch.samples.size(), " samples cannot feed --dp ", options.dp,
                    " replicas; raise --global-batch-tokens or lower --dp"));
  }

  std::array<std::unique_ptr<detail::ShapeCosts>, kRecomputeModes.size()> costs;
  for (std::size_t m = 0; m < kRecomputeModes.size(); ++m) {
    costs[m] = std::make_unique<detail::ShapeCosts>(cost_model, kRecomputeModes[m],
                                                    options.num_stages, options.memory_limit_bytes,
                                                    options.in_flight);
  }
  // dynapipe costs each segment in the lightest mode it fits: one DP, whose segments are
  // every mode's (full recompute fits the most) at the lightest time, so no DP of a
  // lighter mode can beat it.
  const bool mixed = options.strategy == Strategy::DynaPipe && options.mixed_recompute &&
                     !options.recompute && !options.varlen_padded_cut;
  if (mixed) {
    for (std::size_t m = 1; m < costs.size(); ++m) costs[m]->mix_with(costs[m - 1].get());
  }
  // Every sample fits alone (full recompute, one in flight: no rule or weight involved).
  if (memos.alone_checked != std::pair{options.memory_limit_bytes, options.strategy}) {
    check_alone_fits(batch, options, *costs.back());
    memos.alone_checked = {options.memory_limit_bytes, options.strategy};
  }

  const std::int64_t bucket_tokens =
      options.t5_bucket_tokens > 0
          ? options.t5_bucket_tokens
          : std::max<std::int64_t>(round_up((options.max_seqlen + 31) / 32, options.seqlen_multiple),
                                   options.seqlen_multiple);
  // dynapipe also cuts packing-varlen's rows in sequence: with padding gone, the sorted
  // order groups runs of similar lengths, the rows order groups samples that fill a row;
  // the lower objective wins (docs/batching.md, "Ordering for varlen").
  const bool varlen = options.strategy == Strategy::DynaPipe;
  std::vector<std::vector<std::size_t>> orders;
  // (Both as order_samples() and order_packed_rows() give them, made once per store.)
  if (!varlen || options.varlen_order != VarlenOrder::PackedRows) {
    orders.push_back(memos.sorted_order(batch.samples, options.kind, bucket_tokens));
  }
  if (varlen && options.varlen_order != VarlenOrder::Sorted) {
    std::vector<std::size_t> all(batch.samples.size());
    std::iota(all.begin(), all.end(), std::size_t{0});
    orders.push_back(detail::rows_in_sequence(
        memos.best_fit_rows(batch.samples, all, options.kind, options.max_seqlen,
                            options.kind == ModelKind::T5 ? options.max_target_len + 1 : 0)));
  }
  auto run_one = [&](const std::vector<std::size_t>& order, detail::ShapeCosts& c,
                     detail::MemoryRule rule, double incumbent_ms) {
    const detail::StrategyInput input{batch.samples, order, options, &memos};
    switch (options.strategy) {
      case Strategy::DynaPipe:
      case Strategy::DynaPipePadded: return detail::run_dynapipe(input, c, rule, incumbent_ms);
      case Strategy::Padding: return detail::run_padding(input, c, rule, incumbent_ms);
      case Strategy::Packing:
      case Strategy::PackingVarlen: return detail::run_packing(input, c, rule, incumbent_ms);
      case Strategy::TokenBased: return detail::run_token_based(input, c, rule, incumbent_ms);
      case Strategy::PackingMegatron: return detail::run_packing_megatron(input, c, rule, incumbent_ms);
    }
    return std::optional<detail::Candidate>{};
  };
  auto run = [&](detail::ShapeCosts& c, detail::MemoryRule rule, double incumbent_ms) {
    std::optional<detail::Candidate> best_order;
    for (const std::vector<std::size_t>& order : orders) {
      const double bound = best_order ? best_order->objective_ms : incumbent_ms;
      if (std::optional<detail::Candidate> c_order = run_one(order, c, rule, bound)) {
        best_order = std::move(c_order);
      }
    }
    return best_order;
  };

  // The pipelined rule first: falling back to one in flight costs throughput the
  // objective does not see. Within a rule, the recompute mode with the best objective
  // (ties: the lighter mode).
  std::optional<detail::Candidate> best;
  const detail::MemoryRule pipelined =
      options.lone_samples_alone ? detail::MemoryRule::PipelinedLoneAlone : detail::MemoryRule::Pipelined;
  for (detail::MemoryRule rule : {pipelined, detail::MemoryRule::OneInFlight}) {
    for (std::size_t m = 0; m < kRecomputeModes.size(); ++m) {
      if (options.recompute && *options.recompute != kRecomputeModes[m]) continue;
      if (mixed && m + 1 < kRecomputeModes.size()) continue;  // the heaviest mode's mix only
      const double incumbent = best ? best->objective_ms : std::numeric_limits<double>::infinity();
      // The DP strategies skip a mode that cannot beat the incumbent (one replica: with
      // more, the DP's objective is only an estimate of the result's).
      const bool dp_strategy = options.strategy == Strategy::DynaPipe ||
                               options.strategy == Strategy::DynaPipePadded;
      if (best && dp_strategy && options.dp == 1 && options.min_tmax_interval_ms == 0 &&
          cannot_beat(incumbent, batch, options, mixed ? *costs.front() : *costs[m], memos)) {
        continue;
      }
      if (std::optional<detail::Candidate> candidate = run(*costs[m], rule, incumbent)) {
        best = std::move(candidate);
        result.recompute = kRecomputeModes[m];
        if (mixed) {  // the heaviest mode a micro-batch of the cut runs in
          result.recompute = Recompute::None;
          for (const std::vector<MicroBatch>& replica : best->replicas) {
            for (const MicroBatch& mb : replica) {
              result.recompute =
                  std::max(result.recompute, detail::mixed_mode_of(*costs[m], mb, rule));
            }
          }
        }
      }
    }
    if (best) {
      result.one_in_flight = rule == detail::MemoryRule::OneInFlight;
      break;
    }
  }
  if (!best) {
    throw Error(ErrorKind::Infeasible,
                cat("make_microbatches: strategy ", strategy_name(options.strategy),
                    " must find micro-batches within memory_limit_bytes ",
                    options.memory_limit_bytes, ", got none under any recompute mode"));
  }
  result.replicas = std::move(best->replicas);
  result.objective_ms = best->objective_ms;
  result.size = best->size;
  for (std::vector<MicroBatch>& replica : result.replicas) {
    for (std::size_t k = 0; k < replica.size(); ++k) replica[k].id = static_cast<int>(k);
  }
  return result;
}

int count_lone_samples(const GlobalBatch& batch, const CostModel& cost_model, const BatchingOptions& options,
                       int limit) {
  options.validate();
  if (batch.samples.empty() || options.memory_limit_bytes == 0) return 0;
  const detail::ShapeCosts costs(cost_model, Recompute::None, options.num_stages, options.memory_limit_bytes,
                                 options.in_flight);
  // The longest lengths together, dense: no sample holds more (memory grows with both).
  std::int64_t max_enc = 0, max_dec = 0;
  for (const Sample& sample : batch.samples) {
    const detail::ModelLengths lengths = detail::model_lengths(sample, options.kind);
    max_enc = std::max(max_enc, lengths.enc);
    max_dec = std::max(max_dec, lengths.dec);
  }
  const MicroBatchShape longest{.batch = 1,
                                .seqlen = round_up(max_enc, options.seqlen_multiple),
                                .dec_seqlen = round_up(max_dec, options.seqlen_multiple)};
  if (costs.evaluate(longest, AttentionDensity{}).fits_pipelined) return 0;
  int count = 0;
  for (std::size_t k = 0; k < batch.samples.size() && count <= limit; ++k) {
    const std::size_t members[] = {k};
    const MicroBatch alone =
        detail::make_microbatch(batch.samples, members, options, detail::lone_sample_form(cost_model));
    const detail::ShapeCost cost = costs.evaluate(alone.shape, alone.density);
    count += !cost.fits_pipelined && cost.fits_one;
  }
  return count;
}

double microbatch_time_ms(const CostModel& cost_model, const MicroBatch& microbatch,
                          Recompute recompute) {
  double time_ms = 0;
  for (int s = 0; s < cost_model.num_stages(); ++s) {
    const StageCost c = cost_model.stage_cost(s, microbatch.shape, microbatch.density, recompute);
    time_ms = std::max(time_ms, c.fwd_ms + c.bwd_ms);
  }
  return time_ms;
}

double pipeline_objective_ms(const std::vector<double>& times_ms, int num_stages,
                             double bubble_weight) {
  double sum = 0, max = 0;
  for (double t : times_ms) {
    sum += t;
    max = std::max(max, t);
  }
  return sum + bubble_weight * (num_stages - 1) * max;
}

double padding_efficiency(const BatchingResult& result) {
  std::int64_t real = 0, computed = 0;
  for (const auto& replica : result.replicas) {
    for (const MicroBatch& mb : replica) {
      real += mb.real_tokens;
      computed += mb.shape.tokens();
    }
  }
  return computed == 0 ? 1.0 : static_cast<double>(real) / static_cast<double>(computed);
}

}  // namespace dynapipe
