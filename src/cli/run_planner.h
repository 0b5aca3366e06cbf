// Shared driver of `plan` and `simulate`: load samples, form global batches, plan them
// with progress on stderr.
#pragma once

#include <vector>

#include "dynapipe/batching/megatron_packing.h"
#include "dynapipe/core/sample.h"
#include "dynapipe/plan/execution_plan.h"

namespace dynapipe::cli {

// packing-megatron's row layout for `config` (T5 decoder rows: --max-target-len).
MegatronRows megatron_rows(const PlanConfig& config);

// Global batches of the samples file named in config (truncated per config), at most
// config.iterations of them (0 = all); packing-megatron's are rows-based. Prints a one-line dataset summary on stderr.
std::vector<GlobalBatch> load_global_batches(const PlanConfig& config);

struct PlannedRun {
  std::vector<IterationPlan> iterations;
  PlanSummary summary;
};

// Plans every batch with one Planner for `config`; `label` prefixes the progress line.
PlannedRun plan_batches(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                        const char* label);

}  // namespace dynapipe::cli
