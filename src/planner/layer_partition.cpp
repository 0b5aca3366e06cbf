// Layer splits over pipeline stages; see include/dynapipe/planner/layer_partition.h.
#include "dynapipe/planner/layer_partition.h"

#include <algorithm>
#include <initializer_list>
#include <cmath>
#include <limits>
#include <optional>

#include "dynapipe/core/error.h"
#include "dynapipe/core/parallel.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/layer_balance.h"
#include "dynapipe/planner/planner.h"

namespace dynapipe {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::int64_t memory_limit_bytes(const PlanConfig& config);

// One row of --max-seqlen tokens (T5: --max-target-len decoder tokens).
MicroBatchShape longest_row(const PlanConfig& config) {
  MicroBatchShape row{.batch = 1, .seqlen = config.max_seqlen, .dec_seqlen = 0};
  if (config.model.kind == ModelKind::T5) {
    row.dec_seqlen = config.max_target_len > 0 ? config.max_target_len : config.max_seqlen;
  }
  return row;
}

// What the layers work on: each global batch as one block-diagonal row (its tokens at
// its attention density), which is the per-layer work of the batch however it is cut;
// without batches, one --max-seqlen row.
struct WorkShapes {
  std::vector<MicroBatchShape> shapes;
  std::vector<AttentionDensity> densities;
};

WorkShapes work_shapes(const PlanConfig& config, const std::vector<GlobalBatch>& batches) {
  const bool t5 = config.model.kind == ModelKind::T5;
  WorkShapes work;
  for (const GlobalBatch& batch : batches) {
    double enc = 0, dec = 0, enc_squares = 0, dec_squares = 0;
    for (const Sample& sample : batch.samples) {
      // The lengths each side of the model sees (GPT: one sequence; T5: the decoder input
      // is the target shifted right, one token longer).
      const double e = t5 ? sample.input_len : static_cast<double>(sample.input_len) + sample.target_len;
      const double d = t5 ? static_cast<double>(sample.target_len) + 1 : 0.0;
      enc += e;
      dec += d;
      enc_squares += e * e;
      dec_squares += d * d;
    }
    if (enc <= 0) continue;
    work.shapes.push_back(
        {.batch = 1, .seqlen = static_cast<std::int64_t>(enc), .dec_seqlen = static_cast<std::int64_t>(dec)});
    work.densities.push_back({.enc = enc_squares / (enc * enc), .dec = dec > 0 ? dec_squares / (dec * dec) : 1.0});
  }
  if (work.shapes.empty()) {
    work.shapes.push_back(longest_row(config));
    work.densities.push_back({});
  }
  return work;
}

CostModelOptions unit_options(const PlanConfig& config) {
  CostModelOptions options;
  options.seqlen_multiple = config.seqlen_multiple;
  options.tp = config.tp;
  options.zero_shards = config.zero == 1 ? config.dp : 1;
  return options;
}

// The min-max splits of the layers' work (work_shapes), each stage held to its own 1F1B
// memory rule for one --max-seqlen row: stage s keeps pp − s such rows in flight besides its
// weights, so early stages, tight on activations, take fewer layers and late ones can hold
// more. One split per recompute mode (none, selective, full) whose activations some split
// fits with, lightest first; then the same under each further share of the memory limit
// (`limit_shares`, the whole limit first); duplicates left out, empty where none fits. The
// layers' times and memory are costed once for every share.
std::vector<std::vector<int>> memory_ruled_splits(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                                                  std::initializer_list<double> limit_shares = {1.0}) {
  const CostModelOptions options = unit_options(config);
  const WorkShapes work = work_shapes(config, batches);
  const std::vector<double> units = layer_unit_ms(config.cost_model, config.model, options, work.shapes,
                                                  std::vector<double>(work.shapes.size(), 1.0), work.densities);
  std::vector<UnitMemory> unit_memory;
  for (Recompute recompute : kRecomputeModes) {
    unit_memory.push_back(layer_unit_memory(config.cost_model, config.model, options, longest_row(config), recompute));
  }
  StageMemoryRule rule;
  for (int s = 0; s < config.pp; ++s) rule.in_flight.push_back(config.pp - s);
  const std::int64_t limit_bytes = memory_limit_bytes(config);
  std::vector<std::vector<int>> splits;
  for (double share : limit_shares) {
    rule.limit_bytes = static_cast<std::int64_t>(share * static_cast<double>(limit_bytes));
    for (const UnitMemory& memory : unit_memory) {
      rule.units = memory;
      std::optional<std::vector<int>> counts = balance_layer_counts(units, config.pp, rule);
      if (counts && std::find(splits.begin(), splits.end(), *counts) == splits.end()) splits.push_back(*counts);
    }
  }
  return splits;
}

std::int64_t max_static_bytes(const PlanConfig& config, const std::vector<int>& counts);

// The min-max split of one --max-seqlen row's layer times alone, or the uniform split where
// only that one keeps every stage's weights, gradients and optimizer states under the limit.
std::vector<int> time_only_counts(const PlanConfig& config) {
  const std::vector<double> units =
      layer_unit_ms(config.cost_model, config.model, unit_options(config), {longest_row(config)}, {1.0});
  const std::vector<int> counts = balance_layer_counts(units, config.pp);
  const std::vector<int> uniform = layers_per_stage(assign_layers_uniform(config.model, config.pp));
  const std::int64_t limit = memory_limit_bytes(config);
  if (max_static_bytes(config, counts) >= limit && max_static_bytes(config, uniform) < limit) return uniform;
  return counts;
}

// Estimated time of the first batches planned under `counts` as plan and simulate plan
// them (the full search, interleaving included); infinity when infeasible, and when the
// configured schedule cannot run the split (a one-layer stage under --schedule
// interleaved): the other candidates may suit it, and where none does, planning on the
// split chosen then says why.
double planned_ms(const PlanConfig& config, const std::vector<int>& counts, const std::vector<GlobalBatch>& batches,
                  int num_batches) {
  PlanConfig candidate = config;
  candidate.stage_layers = assign_layers(config.model, counts);
  PlannerOptions options;
  options.fixed_layout = false;
  options.verify = false;
  try {
    const Planner planner(candidate, options);
    double total = 0;
    for (int i = 0; i < num_batches; ++i) total += planner.plan_iteration(batches[i]).est_iteration_ms;
    return total;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Infeasible && e.kind() != ErrorKind::Unsupported) throw;
    return kInfinity;
  }
}

// A split and its planned time (planned_ms()).
struct ScoredSplit {
  std::vector<int> counts;
  double ms = kInfinity;
};

// `splits` planned on options.threads at once, options.split_planned called after each;
// the first error in their order is thrown, as planning them in turn would.
std::vector<double> planned_ms_of(const PlanConfig& config, const std::vector<std::vector<int>>& splits,
                                  const std::vector<GlobalBatch>& batches, int num_batches,
                                  const LayerPartitionOptions& options) {
  std::vector<double> ms(splits.size());
  const std::vector<std::exception_ptr> errors = run_indexed(splits.size(), options.threads, [&](std::size_t c) {
    ms[c] = planned_ms(config, splits[c], batches, num_batches);
    if (options.split_planned) options.split_planned();
  });
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return ms;
}

// The fastest of `moves` if it plans faster than `from` by more than rounding; ties keep
// the earlier. The moves are planned on options.threads at once.
std::optional<ScoredSplit> fastest_move(const PlanConfig& config, const ScoredSplit& from,
                                        const std::vector<std::vector<int>>& moves,
                                        const std::vector<GlobalBatch>& batches, int num_batches,
                                        const LayerPartitionOptions& options) {
  const std::vector<double> ms = planned_ms_of(config, moves, batches, num_batches, options);
  std::optional<ScoredSplit> best;
  double best_ms = from.ms;
  for (std::size_t k = 0; k < moves.size(); ++k) {
    if (ms[k] < best_ms * (1 - 1e-9)) {
      best = ScoredSplit{moves[k], ms[k]};
      best_ms = ms[k];
    }
  }
  return best;
}

// The splits one stage boundary away from `counts`, moved by one layer: the boundaries in
// order, each first to the left.
std::vector<std::vector<int>> boundary_moves(const std::vector<int>& counts) {
  std::vector<std::vector<int>> moves;
  for (std::size_t boundary = 0; boundary + 1 < counts.size(); ++boundary) {
    for (int direction : {-1, +1}) {
      std::vector<int> moved = counts;
      moved[boundary] += direction;
      moved[boundary + 1] -= direction;
      if (moved[boundary] >= 1 && moved[boundary + 1] >= 1) moves.push_back(std::move(moved));
    }
  }
  return moves;
}

// The splits where one stage gives a layer to another at least two stages away (every
// boundary between them moved by one layer, in the same direction): from the first stage
// to the last, in order.
std::vector<std::vector<int>> layer_transfers(const std::vector<int>& counts) {
  std::vector<std::vector<int>> moves;
  const std::size_t stages = counts.size();
  for (std::size_t from = 0; from < stages; ++from) {
    if (counts[from] < 2) continue;
    for (std::size_t to = 0; to < stages; ++to) {
      if ((from > to ? from - to : to - from) < 2) continue;
      std::vector<int> moved = counts;
      --moved[from];
      ++moved[to];
      moves.push_back(std::move(moved));
    }
  }
  return moves;
}

// balanced with batches: the fastest as planned on the first of them (the planner's full
// search, interleaving included; ties keep the earlier) of: the uniform split, the time-only
// split of one --max-seqlen row, and the memory-ruled splits of the batches' work under the
// memory limit and under half of it. The work balance alone misleads both ways: it ignores
// zb1p's memory rule (pp in flight on every stage), interleaving, which suits even splits,
// and how small the micro-batches must get on a stage its weights nearly fill.
ScoredSplit best_candidate_split(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                                 int num_batches, const LayerPartitionOptions& options) {
  const std::vector<GlobalBatch> first(batches.begin(), batches.begin() + num_batches);
  std::vector<std::vector<int>> candidates = {layers_per_stage(assign_layers_uniform(config.model, config.pp)),
                                              time_only_counts(config)};
  // Also as ruled by half the memory: the splits of the full limit can fill every stage
  // with weights and 1F1B activations, leaving the plans small micro-batches or
  // recomputation (T5-11B pp 8 at 80 GiB on the measured H100 profile, max seqlen 1024:
  // 4,4,4,4,4,4,12,12 at ~78 GiB per stage, 1151.0 ms; half the limit's 4,5,4,5,5,8,8,9,
  // 1056.4).
  for (std::vector<int>& ruled : memory_ruled_splits(config, first, {1.0, 0.5})) candidates.push_back(std::move(ruled));
  std::vector<std::vector<int>> distinct;  // each candidate once, in order
  for (std::vector<int>& c : candidates) {
    if (std::find(distinct.begin(), distinct.end(), c) == distinct.end()) distinct.push_back(std::move(c));
  }
  const std::vector<double> ms = planned_ms_of(config, distinct, batches, num_batches, options);
  const std::size_t best = static_cast<std::size_t>(std::min_element(ms.begin(), ms.end()) - ms.begin());
  return {distinct[best], ms[best]};
}

int searched_batches(const std::vector<GlobalBatch>& batches, const LayerPartitionOptions& options) {
  return std::min<int>(std::max(options.joint_batches, 1), static_cast<int>(batches.size()));
}

// balanced: without batches, the memory-ruled split of one --max-seqlen row (the time-only
// split where none fits); with batches, the best candidate (best_candidate_split()). Its
// candidates are the same for every strategy, which joint's moves are not: each strategy's
// own plans steer them (docs/partition.md, "Moves and the comparison").
std::vector<int> balanced_counts(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                                 const LayerPartitionOptions& options) {
  if (batches.empty()) {
    const std::vector<std::vector<int>> ruled = memory_ruled_splits(config, {});
    return ruled.empty() ? time_only_counts(config) : ruled.front();
  }
  return best_candidate_split(config, batches, searched_batches(batches, options), options).counts;
}

// joint: balanced's search, then one-layer moves for as long as one plans faster (a local
// optimum over boundary moves and layer transfers), options.joint_max_rounds rounds at
// most. The uniform split is among balanced's candidates, so the search starts from the
// better of uniform and balanced.
std::vector<int> joint_counts(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                              const LayerPartitionOptions& options) {
  if (batches.empty()) throw Error(ErrorKind::InvalidArgument, "--partition joint needs at least one global batch");
  const int num_batches = searched_batches(batches, options);
  // Scored as plan and simulate plan them (interleaving included): scored without it, the
  // search can leave a split interleaving suits for one it does not (T5-11B pp 4 80 GiB
  // analytic A100, 4096: 12,12,12,12 planned 10,667.3 ms, joint's 12,11,13,12 10,979.9).
  ScoredSplit best = best_candidate_split(config, batches, num_batches, options);
  for (int round = 0; round < options.joint_max_rounds; ++round) {
    // Each round the fastest of every boundary move and every layer transfer (a layer given
    // to a stage two or more away: several boundary moves at once, each of which alone can
    // plan slower). Transfers tried only where no boundary move helps stopped at the
    // uniform split at GPT-6.7B pp 8, 40 GiB, 8192 (analytic A100); tried after the boundary
    // moves, they came too late at GPT-6.7B pp 8, 80 GiB, 4096, 131,072 tokens (analytic
    // H100): one small boundary move after another led to 4,4,5,3,4,5,3,4 (1708.3 ms over
    // its first 4 batches) while the last stage giving a layer to the second,
    // 4,5,4,4,4,4,4,3, plans 1633.9. Ties keep the earlier: boundary moves first.
    std::vector<std::vector<int>> moves = boundary_moves(best.counts);
    for (std::vector<int>& transfer : layer_transfers(best.counts)) moves.push_back(std::move(transfer));
    std::optional<ScoredSplit> moved = fastest_move(config, best, moves, batches, num_batches, options);
    if (!moved) break;
    best = std::move(*moved);
  }
  if (std::isinf(best.ms)) {
    throw Error(ErrorKind::Infeasible,
                cat("--partition joint: no split of ", config.model.name, " over ", config.pp,
                    " stages that the search tried fits --memory-limit"));
  }
  return best.counts;
}

// The largest static memory (weights, gradients, optimizer states) of a stage under `counts`.
std::int64_t max_static_bytes(const PlanConfig& config, const std::vector<int>& counts) {
  CostModelOptions options = unit_options(config);
  options.num_stages = config.pp;
  options.layers = assign_layers(config.model, counts);
  const auto cost = make_cost_model(config.cost_model, config.model, options);
  std::int64_t worst = 0;
  for (int s = 0; s < cost->num_stages(); ++s) worst = std::max(worst, cost->static_bytes(s));
  return worst;
}

std::int64_t memory_limit_bytes(const PlanConfig& config) {
  if (config.memory_limit_gib > 0) return gib_to_bytes(config.memory_limit_gib);
  CostModelOptions options;
  options.num_stages = config.pp;
  options.tp = config.tp;
  return make_cost_model(config.cost_model, config.model, options)->device().memory_bytes;
}

}  // namespace

std::optional<LayerPartition> parse_layer_partition(std::string_view name) {
  if (name == "uniform") return LayerPartition::Uniform;
  if (name == "balanced") return LayerPartition::Balanced;
  if (name == "joint") return LayerPartition::Joint;
  return std::nullopt;
}

std::string_view layer_partition_name(LayerPartition partition) {
  switch (partition) {
    case LayerPartition::Uniform: return "uniform";
    case LayerPartition::Balanced: return "balanced";
    case LayerPartition::Joint: return "joint";
  }
  return "?";
}

std::vector<std::string> layer_partition_names() { return {"uniform", "balanced", "joint"}; }

std::vector<StageLayers> choose_stage_layers(const PlanConfig& config, LayerPartition partition,
                                             const std::vector<GlobalBatch>& batches,
                                             const LayerPartitionOptions& options) {
  PlanConfig base = config;
  base.stage_layers.clear();
  if (partition == LayerPartition::Uniform || base.pp == 1) return {};
  if (base.max_seqlen < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("--max-seqlen must be >= 1, got ", base.max_seqlen));
  }
  if (base.pp > base.model.total_layers()) {
    throw Error(ErrorKind::InvalidArgument, cat("--pp must be at most the model's ", base.model.total_layers(),
                                                " layers (", base.model.name, "), got ", base.pp));
  }
  const std::vector<int> counts = partition == LayerPartition::Balanced ? balanced_counts(base, batches, options)
                                                                       : joint_counts(base, batches, options);
  std::vector<StageLayers> layers = assign_layers(base.model, counts);
  if (layers == assign_layers_uniform(base.model, base.pp)) return {};
  return layers;
}

}  // namespace dynapipe
