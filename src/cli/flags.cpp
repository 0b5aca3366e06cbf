#include "cli/flags.h"

#include "dynapipe/cost/model_spec.h"

namespace dynapipe::cli {

void add_common_flags(CLI::App& command, CommonFlags& flags, SamplesFlag samples_flag) {
  if (samples_flag == SamplesFlag::Samples) {
    command.add_option("--samples", flags.samples, "Samples file (JSONL, optionally gzip)")
        ->required();
  } else {
    command.add_option("--data", flags.samples, "Samples file (JSONL, optionally gzip)");
  }
  command.add_option("--model", flags.model, "Model preset or JSON file")->capture_default_str();
  command.add_option("--pp", flags.pp, "Pipeline stages")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  command.add_option("--dp", flags.dp, "Data-parallel replicas")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  command.add_option("--max-seqlen", flags.max_seqlen,
                     "Truncation limit (GPT: input+target; T5: encoder)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))->capture_default_str();
  command.add_option("--max-target-len", flags.max_target_len,
                     "T5 decoder truncation limit (default: --max-seqlen)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 24));
  command.add_option("--global-batch-tokens", flags.global_batch_tokens,
                     "Token budget of one global batch (all replicas)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))->capture_default_str();
  command.add_option("--strategy", flags.strategy, "Micro-batching strategy")
      ->transform(strategy_transformer())
      ->default_str(std::string(strategy_name(flags.strategy)));
  command.add_option("--schedule", flags.schedule, "Pipeline schedule")
      ->transform(schedule_transformer())
      ->default_str(std::string(schedule_kind_name(flags.schedule)));
  command.add_option("--memory-limit", flags.memory_limit_gib,
                     "Device memory per executor, GiB (default: the device's)")
      ->check(CLI::Range(0.0, 1e6));
  command.add_option("--cost-model", flags.cost_model,
                     "analytic:<device> (a100-40g, a100-80g, h100-80g, cpu) or a profile JSON")
      ->capture_default_str();
  command.add_option("--iterations", flags.iterations, "Only the first N global batches (0: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  command.add_option("--seed", flags.seed, "Seed of all randomness")->capture_default_str();
  command.add_option("--seqlen-multiple", flags.seqlen_multiple,
                     "Round micro-batch sequence lengths up to this multiple")
      ->check(CLI::Range(1, 4096))->capture_default_str();
}

CLI::CheckedTransformer strategy_transformer() {
  std::vector<std::pair<std::string, Strategy>> choices;
  for (std::string_view name : strategy_names()) choices.emplace_back(name, *parse_strategy(name));
  return CLI::CheckedTransformer(choices);
}

CLI::CheckedTransformer schedule_transformer() {
  std::vector<std::pair<std::string, ScheduleKind>> choices;
  for (std::string_view name : schedule_kind_names()) {
    choices.emplace_back(name, *parse_schedule_kind(name));
  }
  return CLI::CheckedTransformer(choices);
}

PlanConfig to_plan_config(const CommonFlags& flags) {
  PlanConfig config;
  config.model = load_model_spec(flags.model);
  config.samples_path = flags.samples;
  config.strategy = flags.strategy;
  config.schedule = flags.schedule;
  config.cost_model = flags.cost_model;
  config.pp = flags.pp;
  config.dp = flags.dp;
  config.max_seqlen = flags.max_seqlen;
  config.max_target_len = flags.max_target_len > 0 ? flags.max_target_len : flags.max_seqlen;
  config.global_batch_tokens = flags.global_batch_tokens;
  config.memory_limit_gib = flags.memory_limit_gib;
  config.seqlen_multiple = flags.seqlen_multiple;
  config.seed = flags.seed;
  config.iterations = flags.iterations;
  return config;
}

}  // namespace dynapipe::cli
