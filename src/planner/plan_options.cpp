#include "dynapipe/planner/plan_options.h"

#include <cmath>
#include <memory>
#include <string_view>
#include <utility>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/data/samples_cache.h"
#include "dynapipe/planner/layer_partition.h"
#include "dynapipe/planner/planner.h"
#include "dynapipe/planner/stage_replicas.h"
#include "dynapipe/schedule/schedule.h"

namespace dynapipe {
namespace {

constexpr double kMaxLen = 16777216.0;         // 2^24 tokens
constexpr double kMaxTokens = 1099511627776.0;  // 2^40 tokens

std::vector<std::string> strategy_choices() {
  std::vector<std::string> names;
  for (std::string_view name : strategy_names()) names.emplace_back(name);
  return names;
}

std::vector<std::string> schedule_choices() {
  std::vector<std::string> names;
  for (std::string_view name : schedule_kind_names()) names.emplace_back(name);  // "auto" first
  return names;
}

// One table row; a function rather than brace-init so that every field is set explicitly.
PlanOptionSpec row(std::string flag, std::string name, std::string help,
                   PlanOptionSpec::Field field, double min = 0, double max = 0,
                   std::vector<std::string> choices = {}, bool show_default = true) {
  PlanOptionSpec spec;
  spec.flag = std::move(flag);
  spec.name = std::move(name);
  spec.help = std::move(help);
  spec.field = field;
  spec.min = min;
  spec.max = max;
  spec.choices = std::move(choices);
  spec.show_default = show_default;
  return spec;
}

std::vector<PlanOptionSpec> make_table() {
  using O = PlanOptions;
  std::vector<PlanOptionSpec> t;
  t.push_back(row("--model", "model", "Model preset or JSON file", &O::model));
  t.push_back(row("--tp", "tp", "Tensor-parallel devices per stage (plan, simulate, tune)", &O::tp,
               1, 1024));
  t.push_back(row("--pp", "pp", "Pipeline stages", &O::pp, 1, 1024));
  t.push_back(row("--dp", "dp", "Data-parallel replicas", &O::dp, 1, 1024));
  t.push_back(row("--zero", "zero", "ZeRO stage: 1 shards the optimizer states over the --dp replicas",
               &O::zero, 0, 1));
  t.push_back(row("--max-seqlen", "max_seqlen", "Truncation limit (GPT: input+target; T5: encoder)",
               &O::max_seqlen, 1, kMaxLen));
  t.push_back(row("--max-target-len", "max_target_len",
               "T5 decoder truncation limit (default: --max-seqlen)", &O::max_target_len, 0,
               kMaxLen, {}, false));
  t.push_back(row("--global-batch-tokens", "global_batch_tokens",
               "Token budget of one global batch (all replicas)", &O::global_batch_tokens, 1,
               kMaxTokens));
  t.push_back(row("--strategy", "strategy", "Micro-batching strategy", &O::strategy, 0, 0,
               strategy_choices()));
  t.push_back(row("--schedule", "schedule", "Pipeline schedule", &O::schedule, 0, 0,
               schedule_choices()));
  t.push_back(row("--memory-limit", "memory_limit_gib",
               "Device memory per executor, GiB (default: the device's)", &O::memory_limit_gib, 0,
               1e6, {}, false));
  t.push_back(row("--cost-model", "cost_model",
               "analytic:<device> (a100-40g, a100-80g, h100-80g, cpu), a100-measured (gpt-6.7b, t5-11b) or "
               "a profile JSON",
               &O::cost_model));
  t.push_back(row("--iterations", "iterations", "Only the first N global batches (0: all)",
               &O::iterations, 0, kMaxTokens, {}, false));
  t.push_back(row("--seed", "seed", "Seed of all randomness", &O::seed));
  t.push_back(row("--seqlen-multiple", "seqlen_multiple",
               "Round micro-batch sequence lengths up to this multiple", &O::seqlen_multiple, 1,
               4096));
  t.push_back(row("--micro-batch-size", "micro_batch_size",
               "Rows per micro-batch for padding/packing strategies (0: the fastest of the objective's size, the most that fit and the sizes next to the objective's)",
               &O::micro_batch_size, 0, kMaxLen));
  t.push_back(row("--token-budget", "token_budget",
               "Padded tokens per micro-batch for token-based (0: the fastest of the objective's budget among 512, 1024, ..., 65536 and the budgets next to it)",
               &O::token_budget, 0, kMaxTokens));
  t.push_back(row("--recompute", "recompute",
               "One recompute mode for every micro-batch (auto: the planner picks one per "
               "iteration; per-microbatch: one per micro-batch)",
               &O::recompute, 0, 0, {"auto", "per-microbatch", "none", "selective", "full"}));
  t.push_back(row("--partition", "partition",
               "Layers over pipeline stages: uniform, balanced (by the cost model) or joint (with the "
               "data's dynamic micro-batches)",
               &O::partition, 0, 0, layer_partition_names()));
  PlanOptionSpec vertical_sync =
      row("--vertical-sync", "vertical_sync",
          "pipedream: every stage uses the weight version the first stage chose for a micro-batch",
          &O::vertical_sync, 0, 1, {}, false);
  vertical_sync.is_flag = true;
  t.push_back(std::move(vertical_sync));
  t.push_back(
      row("--replicas", "replicas",
          "Ranks per pipeline stage, R0,R1,... (each stage's replicas take its micro-batches round "
          "robin), or the JSON of `dynapipe partition --out`",
          &O::replicas));
  return t;
}

std::string format_bound(double v) {
  // Bounds are whole numbers except memory; print 1099511627776, not 1.09951e+12.
  if (v == std::floor(v) && std::fabs(v) < 9e15) return cat(static_cast<std::int64_t>(v));
  return cat(v);
}

void check(const PlanOptionSpec& spec, std::int64_t value) {
  if (static_cast<double>(value) < spec.min || static_cast<double>(value) > spec.max) {
    throw Error(ErrorKind::InvalidArgument,
                cat(spec.flag, " must be an integer in [", format_bound(spec.min), ", ",
                    format_bound(spec.max), "], got ", value));
  }
}

void check(const PlanOptionSpec& spec, double value) {
  if (!(value >= spec.min && value <= spec.max)) {  // NaN fails both
    throw Error(ErrorKind::InvalidArgument,
                cat(spec.flag, " must be a number in [", format_bound(spec.min), ", ",
                    format_bound(spec.max), "], got ", value));
  }
}

void check(const PlanOptionSpec& spec, const std::string& value) {
  if (spec.choices.empty()) {
    if (value.empty()) {
      throw Error(ErrorKind::InvalidArgument, cat(spec.flag, " must not be empty"));
    }
    return;
  }
  for (const std::string& choice : spec.choices) {
    if (choice == value) return;
  }
  throw Error(ErrorKind::InvalidArgument, cat(spec.flag, " must be one of ",
                                              join(spec.choices, ", "), ", got \"", value, "\""));
}

void check(const PlanOptionSpec&, std::uint64_t) {}  // every seed is valid

}  // namespace

const std::vector<PlanOptionSpec>& plan_option_table() {
  static const std::vector<PlanOptionSpec> kTable = make_table();
  return kTable;
}

void validate_plan_options(const PlanOptions& options) {
  for (const PlanOptionSpec& spec : plan_option_table()) {
    std::visit([&](auto member) { check(spec, options.*member); }, spec.field);
  }
}

PlanConfig to_plan_config(const PlanOptions& options, int threads, SamplesCache* samples,
                          const std::function<void()>& split_planned) {
  validate_plan_options(options);
  PlanConfig config;
  config.model = load_model_spec(options.model);
  config.samples_path = options.samples;
  // Validated above against the same name tables, so the parses succeed.
  config.strategy = *parse_strategy(options.strategy);
  config.schedule = *parse_schedule_kind(options.schedule);
  config.cost_model = options.cost_model;
  config.tp = static_cast<int>(options.tp);
  config.pp = static_cast<int>(options.pp);
  config.dp = static_cast<int>(options.dp);
  config.zero = static_cast<int>(options.zero);
  config.max_seqlen = options.max_seqlen;
  config.max_target_len = options.max_target_len > 0 ? options.max_target_len : options.max_seqlen;
  config.global_batch_tokens = options.global_batch_tokens;
  config.memory_limit_gib = options.memory_limit_gib;
  config.seqlen_multiple = static_cast<int>(options.seqlen_multiple);
  config.seed = options.seed;
  config.iterations = options.iterations;
  config.micro_batch_size = options.micro_batch_size;
  config.token_budget = options.token_budget;
  if (options.recompute == "per-microbatch") {
    config.mixed_recompute = true;
  } else if (options.recompute != "auto") {
    config.recompute = parse_recompute(options.recompute);
  }
  config.vertical_sync = options.vertical_sync == 1;
  config.stage_layers = stage_layers_for(options, config, threads, samples, split_planned);
  config.stage_replicas = parse_stage_replicas(options.replicas, config.pp);
  return config;
}

namespace {

// options.partition parsed. to_plan_config() validated it, but these functions are public
// too: the table's check of --partition again (its choices are layer_partition_names()).
LayerPartition partition_of(const PlanOptions& options) {
  for (const PlanOptionSpec& spec : plan_option_table()) {
    if (spec.flag == "--partition") check(spec, options.partition);
  }
  return *parse_layer_partition(options.partition);
}

}  // namespace

std::vector<GlobalBatch> partition_batches(const PlanOptions& options, const PlanConfig& config,
                                           SamplesCache* samples) {
  const LayerPartition partition = partition_of(options);
  // balanced weighs the layers by the first batches' work when the samples are known.
  const bool wants_batches = partition == LayerPartition::Joint ||
                             (partition == LayerPartition::Balanced && !config.samples_path.empty());
  if (!wants_batches || config.pp <= 1) return {};
  if (config.samples_path.empty()) {
    throw Error(ErrorKind::InvalidArgument, "--partition joint needs the samples file (--samples / --data)");
  }
  const LayerPartitionOptions defaults;
  const std::shared_ptr<const Dataset> data =
      load_samples(samples, config.samples_path, truncation_limits(config));
  return form_global_batches(*data, config.global_batch_tokens, defaults.joint_batches);
}

std::vector<StageLayers> stage_layers_for(const PlanOptions& options, const PlanConfig& config,
                                          const std::vector<GlobalBatch>& batches, int threads,
                                          const std::function<void()>& split_planned) {
  LayerPartitionOptions partition_options;
  partition_options.threads = threads;
  partition_options.split_planned = split_planned;
  return choose_stage_layers(config, partition_of(options), batches, partition_options);
}

std::vector<StageLayers> stage_layers_for(const PlanOptions& options, const PlanConfig& config, int threads,
                                          SamplesCache* samples, const std::function<void()>& split_planned) {
  return stage_layers_for(options, config, partition_batches(options, config, samples), threads, split_planned);
}

}  // namespace dynapipe
