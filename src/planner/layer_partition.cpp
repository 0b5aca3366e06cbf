// Layer splits over pipeline stages; see include/dynapipe/planner/layer_partition.h.
#include "dynapipe/planner/layer_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/layer_balance.h"
#include "dynapipe/planner/planner.h"

namespace dynapipe {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::vector<int> balanced_counts(const PlanConfig& config) {
  MicroBatchShape row{.batch = 1, .seqlen = config.max_seqlen, .dec_seqlen = 0};
  if (config.model.kind == ModelKind::T5) {
    row.dec_seqlen = config.max_target_len > 0 ? config.max_target_len : config.max_seqlen;
  }
  CostModelOptions options;
  options.seqlen_multiple = config.seqlen_multiple;
  options.tp = config.tp;
  const std::vector<double> units = layer_unit_ms(config.cost_model, config.model, options, {row}, {1.0});
  return balance_layer_counts(units, config.pp);
}

// Estimated time of the first batches planned under `counts`; infinity when infeasible.
double planned_ms(const PlanConfig& config, const std::vector<int>& counts, const std::vector<GlobalBatch>& batches,
                  int num_batches) {
  PlanConfig candidate = config;
  candidate.stage_layers = assign_layers(config.model, counts);
  PlannerOptions options;
  options.fixed_layout = true;  // compare splits, not interleaving
  options.verify = false;
  try {
    const Planner planner(candidate, options);
    double total = 0;
    for (int i = 0; i < num_batches; ++i) total += planner.plan_iteration(batches[i]).est_iteration_ms;
    return total;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Infeasible) throw;
    return kInfinity;
  }
}

std::vector<int> joint_counts(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                              const LayerPartitionOptions& options) {
  if (batches.empty()) throw Error(ErrorKind::InvalidArgument, "--partition joint needs at least one global batch");
  const int num_batches = std::min<int>(std::max(options.joint_batches, 1), static_cast<int>(batches.size()));
  auto score = [&](const std::vector<int>& counts) { return planned_ms(config, counts, batches, num_batches); };

  std::vector<int> best = layers_per_stage(assign_layers_uniform(config.model, config.pp));
  double best_ms = score(best);
  const std::vector<int> balanced = balanced_counts(config);
  if (balanced != best) {
    const double balanced_ms = score(balanced);
    if (balanced_ms < best_ms) {
      best = balanced;
      best_ms = balanced_ms;
    }
  }
  for (int round = 0; round < options.joint_max_rounds; ++round) {
    std::vector<int> round_best = best;
    double round_best_ms = best_ms;
    for (int boundary = 0; boundary + 1 < config.pp; ++boundary) {
      for (int direction : {-1, +1}) {
        // Move one layer across the boundary between stages `boundary` and `boundary + 1`.
        std::vector<int> counts = best;
        counts[boundary] += direction;
        counts[boundary + 1] -= direction;
        if (counts[boundary] < 1 || counts[boundary + 1] < 1) continue;
        const double ms = score(counts);
        if (ms < round_best_ms * (1 - 1e-9)) {
          round_best = counts;
          round_best_ms = ms;
        }
      }
    }
    if (round_best == best) break;
    best = round_best;
    best_ms = round_best_ms;
  }
  if (std::isinf(best_ms)) {
    throw Error(ErrorKind::Infeasible,
                cat("--partition joint: no split of ", config.model.name, " over ", config.pp,
                    " stages that the search tried fits --memory-limit"));
  }
  return best;
}

// The largest static memory (weights, gradients, optimizer states) of a stage under `layers`.
std::int64_t max_static_bytes(const PlanConfig& config, const std::vector<StageLayers>& layers) {
  CostModelOptions options;
  options.num_stages = config.pp;
  options.seqlen_multiple = config.seqlen_multiple;
  options.tp = config.tp;
  options.zero_shards = config.zero == 1 ? config.dp : 1;
  options.layers = layers;
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
  const std::vector<int> counts =
      partition == LayerPartition::Balanced ? balanced_counts(base) : joint_counts(base, batches, options);
  std::vector<StageLayers> layers = assign_layers(base.model, counts);
  const std::vector<StageLayers> uniform = assign_layers_uniform(base.model, base.pp);
  if (layers == uniform) return {};
  // balanced weighs time only: where its heavier stages no longer hold their weights but the
  // uniform split's do, keep the uniform split (joint already skipped what does not fit).
  if (partition == LayerPartition::Balanced) {
    const std::int64_t limit = memory_limit_bytes(base);
    if (max_static_bytes(base, layers) >= limit && max_static_bytes(base, uniform) < limit) return {};
  }
  return layers;
}

}  // namespace dynapipe
