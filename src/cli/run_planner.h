// Shared driver of `plan` and `simulate`: load samples, form global batches, plan them
// on --planner-threads threads with progress on stderr.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "dynapipe/batching/megatron_packing.h"
#include "dynapipe/core/sample.h"
#include "dynapipe/plan/execution_plan.h"
#include "dynapipe/planner/plan_options.h"

namespace dynapipe::cli {

// packing-megatron's row layout for `config` (T5 decoder rows: --max-target-len).
MegatronRows megatron_rows(const PlanConfig& config);

// Global batches of the samples file named in config (truncated per config), at most
// config.iterations of them (0 = all); packing-megatron's are rows-based. Reads the file
// through `samples` (once per command). Prints a one-line dataset summary on stderr.
std::vector<GlobalBatch> load_global_batches(const PlanConfig& config, SamplesCache& samples);

struct PlannedRun {
  std::vector<IterationPlan> iterations;
  PlanSummary summary;
};

// One configuration to plan on its batches (which must outlive the call).
struct PlanJob {
  PlanConfig config;
  const std::vector<GlobalBatch>* batches = nullptr;
};

// A job's plans, or the error that stopped it: its Planner's, or its first failing
// iteration's (the one a run in order would have thrown).
struct PlanJobResult {
  PlannedRun run;
  std::exception_ptr error;
};

// Plans every job's batches, each with one Planner, all their iterations on one pool of
// `threads` threads (0: one per hardware thread). The results are the same for any thread
// count. `label` prefixes the progress line.
std::vector<PlanJobResult> plan_jobs(const std::vector<PlanJob>& jobs, int threads,
                                     const char* label);

// plan_jobs() of one configuration; rethrows its error.
PlannedRun plan_batches(const PlanConfig& config, const std::vector<GlobalBatch>& batches,
                        const char* label, int threads);

// The layers per stage `config` plans on, as the tables show them ("6,6,6,6"; uniform where
// config.stage_layers is empty).
std::string layers_per_stage_text(const PlanConfig& config);

// to_plan_config() with a progress line on an interactive stderr while `--partition
// balanced` or `joint` plans candidate splits (joint's search can take tens of seconds).
PlanConfig to_plan_config_with_progress(const PlanOptions& options, int threads, SamplesCache& samples);

// Sets each configs[i].stage_layers to its own split (stage_layers_for() under `options`'
// --partition), all on `threads` threads, on the first batches of base's samples
// (partition_batches(), through `samples`), with progress on an interactive stderr. Returns,
// per configuration, the error choosing its split threw (null: chosen); the splits are the
// same for any thread count.
std::vector<std::exception_ptr> choose_layer_splits(const PlanOptions& options, const PlanConfig& base,
                                                    std::vector<PlanConfig>& configs, int threads,
                                                    SamplesCache& samples);

}  // namespace dynapipe::cli
