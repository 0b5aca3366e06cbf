// PlanOptions: the user-facing options that shape a plan, declared once for every front
// end. The CLI's common flags of `plan`, `simulate` and `train` and the keyword arguments
// of Python's `dynapipe.Planner` both iterate plan_option_table(), so an option has one
// name, one default and one range, and validate_plan_options() gives both front ends the
// same message. A new option is one PlanOptions field plus one table row.
//
//   PlanOptions options;              // the defaults
//   options.pp = 4;
//   PlanConfig config = to_plan_config(options);  // validates, resolves the model
//
// Thread-safety: the table is immutable; the functions are pure.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "dynapipe/data/samples_cache.h"
#include "dynapipe/plan/execution_plan.h"

namespace dynapipe {

struct PlanOptions {
  std::string samples;  // --samples (plan, simulate) / --data (train); not in the table
  std::string model = "gpt-tiny";
  std::int64_t tp = 1;  // tensor-parallel devices per stage (plan, simulate, tune)
  std::int64_t pp = 1;
  std::int64_t dp = 1;
  std::int64_t zero = 0;  // ZeRO stage: 0, or 1 (optimizer states sharded over dp)
  std::int64_t max_seqlen = 2048;
  std::int64_t max_target_len = 0;  // 0: same as max_seqlen
  std::int64_t global_batch_tokens = 65536;
  // Spellings from strategy_names() / schedule_kind_names(); to_plan_config() parses
  // them into PlanConfig's enums (the CLI and Python both pass text).
  std::string strategy = "dynapipe";
  std::string schedule = "auto";
  double memory_limit_gib = 0;  // 0: the device's memory
  std::string cost_model = "analytic:a100-40g";
  std::int64_t iterations = 0;  // 0: all
  std::uint64_t seed = 0;
  std::int64_t seqlen_multiple = 8;
  std::int64_t micro_batch_size = 0;  // rows per micro-batch where the strategy fixes it; 0: its choice
  std::int64_t token_budget = 0;      // token-based: padded tokens per micro-batch; 0: its choice
  std::string recompute = "auto";     // one mode for every micro-batch; auto: the planner picks
  // Layers over the pp stages: uniform, balanced or joint (planner/layer_partition.h);
  // to_plan_config() resolves it into PlanConfig::stage_layers (joint reads the samples).
  std::string partition = "balanced";
  // Ranks per stage: "R0,R1,..." (one per stage), "1" (none replicated) or a `dynapipe
  // partition --out` JSON file; to_plan_config() resolves it into PlanConfig::stage_replicas.
  std::string replicas = "1";
  // 1: pipedream's vertical sync (the first stage's weight version travels with the
  // activations); a flag on the command line, 0 or 1 in Python.
  std::int64_t vertical_sync = 0;
};

// One option. Integers and doubles are checked against [min, max] (inclusive; NaN is
// rejected); strings against `choices` when it is not empty; `seed` takes any uint64.
struct PlanOptionSpec {
  using Field = std::variant<std::int64_t PlanOptions::*, double PlanOptions::*,
                             std::string PlanOptions::*, std::uint64_t PlanOptions::*>;
  std::string flag;  // CLI spelling, e.g. "--max-seqlen"
  std::string name;  // Python keyword, e.g. "max_seqlen"
  std::string help;
  Field field;
  double min = 0;
  double max = 0;
  std::vector<std::string> choices;
  bool show_default = true;  // CLI help prints the default
  bool is_flag = false;      // an int in [0, 1] given as a bare flag on the command line
};

// Every option but `samples`, in CLI help order.
const std::vector<PlanOptionSpec>& plan_option_table();

// Throws Error(InvalidArgument) naming the first option out of range, with its CLI flag:
//   "--pp must be an integer in [1, 1024], got 0"
//   "--strategy must be one of dynapipe, padding, ..., got \"magic\""
void validate_plan_options(const PlanOptions& options);

// Validates, then builds the PlanConfig (model resolved from its preset or JSON file,
// max_target_len 0 resolved to max_seqlen, the layer split chosen by `partition`). Throws what validate_plan_options() and
// load_model_spec() throw.
// threads: planning the layer split's candidates at once (LayerPartitionOptions::threads).
// samples: where the split reads the samples file (null: read here, once per call), so
// a command that reads the file again for its batches reads it once.
// split_planned: LayerPartitionOptions::split_planned, progress while the split is chosen.
PlanConfig to_plan_config(const PlanOptions& options, int threads = 1,
                          SamplesCache* samples = nullptr, const std::function<void()>& split_planned = {});

// The layer split `options.partition` chooses for `config`'s own strategy and schedule,
// as to_plan_config() chooses it for options.strategy and options.schedule: `plan`'s
// comparison and `simulate` plan every strategy x schedule on its own best split, so each
// baseline is compared in its strongest form (docs/partition.md). Empty means uniform.
// Reads the samples file (through `samples`, when given) when the partition needs it.
std::vector<StageLayers> stage_layers_for(const PlanOptions& options, const PlanConfig& config,
                                          int threads = 1, SamplesCache* samples = nullptr,
                                          const std::function<void()>& split_planned = {});

// The global batches options.partition chooses a split on for `config` (the first
// LayerPartitionOptions::joint_batches of its samples; none where it reads no samples:
// uniform, pp 1, or balanced without a samples file). Reads the samples file (through
// `samples`, when given). They depend on the samples and the truncation limits only, so
// one read serves every strategy and schedule of a command.
std::vector<GlobalBatch> partition_batches(const PlanOptions& options, const PlanConfig& config,
                                           SamplesCache* samples = nullptr);

// stage_layers_for() on batches partition_batches() read for the same samples and limits.
std::vector<StageLayers> stage_layers_for(const PlanOptions& options, const PlanConfig& config,
                                          const std::vector<GlobalBatch>& batches, int threads = 1,
                                          const std::function<void()>& split_planned = {});

}  // namespace dynapipe
