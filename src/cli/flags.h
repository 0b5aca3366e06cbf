// Flags shared by `plan`, `simulate` and `train`, declared once (docs/cli.md).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "dynapipe/plan/execution_plan.h"

namespace dynapipe::cli {

struct CommonFlags {
  std::string samples;  // --samples (plan, simulate) / --data (train)
  std::string model = "gpt-tiny";
  int pp = 1;
  int dp = 1;
  std::int64_t max_seqlen = 2048;
  std::int64_t max_target_len = 0;  // 0: same as --max-seqlen
  std::int64_t global_batch_tokens = 65536;
  Strategy strategy = Strategy::DynaPipe;
  ScheduleKind schedule = ScheduleKind::Auto;
  double memory_limit_gib = 0;  // 0: the device's memory
  std::string cost_model = "analytic:a100-40g";
  std::int64_t iterations = 0;  // 0: all
  std::uint64_t seed = 0;
  int seqlen_multiple = 8;
};

enum class SamplesFlag { Samples, Data };

// Adds the common flags to `command`; `samples_flag` picks --samples or --data.
void add_common_flags(CLI::App& command, CommonFlags& flags, SamplesFlag samples_flag);

// CLI11 transformers from each spelling of the one name table to its enum; the
// choices in --help come from the same tables.
CLI::CheckedTransformer strategy_transformer();
CLI::CheckedTransformer schedule_transformer();

// The PlanConfig these flags describe (model resolved from its preset or file).
PlanConfig to_plan_config(const CommonFlags& flags);

}  // namespace dynapipe::cli
