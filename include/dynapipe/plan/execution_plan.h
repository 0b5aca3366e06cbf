// ExecutionPlan: everything the planner decided for a run, as written to --out
// (docs/plan-format.md) and as executors read it, one IterationPlan at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/rank_layout.h"
#include "dynapipe/core/sample.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/plan/instruction.h"
#include "dynapipe/schedule/pipeline.h"
#include "dynapipe/schedule/schedule.h"

namespace dynapipe {

// Every input that shaped the plan. Names are parsed into enums once, at the edge (CLI,
// plan JSON, bindings); everything downstream reads the enums.
struct PlanConfig {
  ModelSpec model;
  std::string samples_path;
  Strategy strategy = Strategy::DynaPipe;
  ScheduleKind schedule = ScheduleKind::Auto;
  std::string cost_model = "analytic:a100-40g";
  int tp = 1;  // tensor-parallel devices per stage; world size = tp * pp * dp
  int pp = 1;
  int dp = 1;
  int zero = 0;    // ZeRO stage: 0 (off) or 1 (AdamW states sharded over the dp replicas)
  int chunks = 1;  // virtual stages per device chosen for interleaved schedules
  std::int64_t max_seqlen = 0;
  std::int64_t max_target_len = 0;
  std::int64_t global_batch_tokens = 0;
  double memory_limit_gib = 0;
  int seqlen_multiple = 8;
  std::uint64_t seed = 0;
  std::int64_t iterations = 0;  // 0 = all
  std::int64_t micro_batch_size = 0;  // rows per micro-batch where the strategy fixes it; 0 = its choice
  std::int64_t token_budget = 0;      // token-based: padded tokens per micro-batch; 0 = its choice
  std::optional<Recompute> recompute = std::nullopt;  // one mode for every micro-batch; unset = the planner picks
  // `--recompute per-microbatch`: the planner picks each micro-batch's mode (recompute unset).
  bool mixed_recompute = false;
  // pipedream: the version the first stage chose travels with the activations, so every
  // stage uses it for that micro-batch (docs/schedules.md, "Vertical sync").
  bool vertical_sync = false;
  // The layers of each of the pp stages (cost model and stage models both read it); empty:
  // assign_layers_uniform(model, pp). `--partition balanced|joint` fills it (docs/partition.md).
  std::vector<StageLayers> stage_layers;
  // [stage] ranks that run each of the pp stages (PipeDream's replicated stages, each
  // >= 1; `--replicas` or `--replicas-from`); empty: 1 each. World size = tp · dp · Σ.
  std::vector<int> stage_replicas;
  friend bool operator==(const PlanConfig&, const PlanConfig&) = default;
};

// The job's ranks as the configuration lays them out (tp, pp, dp, stage replicas).
inline RankLayout rank_layout_of(const PlanConfig& config) {
  return RankLayout{
      .tp = config.tp, .pp = config.pp, .dp = config.dp, .stage_replicas = config.stage_replicas};
}

struct MicroBatchEstimate {
  std::vector<double> fwd_ms;                  // [stage]
  std::vector<double> bwd_ms;                  // [stage]
  std::vector<std::int64_t> activation_bytes;  // [stage] stored activations
  friend bool operator==(const MicroBatchEstimate&, const MicroBatchEstimate&) = default;
};

struct ReplicaPlan {
  std::vector<MicroBatch> microbatches;
  std::vector<MicroBatchEstimate> estimates;   // parallel to microbatches
  ScheduleKind schedule = ScheduleKind::OneFOneB;  // the schedule chosen (never Auto)
  Recompute recompute = Recompute::None;
  double est_iteration_ms = 0;
  std::vector<std::int64_t> est_peak_memory_bytes;  // [device]
  std::vector<TimedOp> timeline;
  std::vector<ExecutorProgram> executors;      // one per device of this replica
};

struct IterationPlan {
  std::int64_t index = 0;
  std::vector<SampleId> sample_ids;
  std::vector<SampleId> truncated_ids;
  std::vector<ReplicaPlan> replicas;
  double est_iteration_ms = 0;    // the slowest replica
  double padding_efficiency = 0;  // real tokens / tokens computed
  double planning_ms = 0;
};

struct PlanSummary {
  std::int64_t iterations = 0;
  double mean_est_iteration_ms = 0;
  double est_tokens_per_s = 0;
  double padding_efficiency = 0;
  double mean_planning_ms = 0;
  double p99_planning_ms = 0;
};

struct ExecutionPlan {
  PlanConfig config;
  std::vector<IterationPlan> iterations;
  PlanSummary summary;
};

}  // namespace dynapipe
