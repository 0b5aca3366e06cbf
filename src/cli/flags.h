// Flags shared by `plan`, `simulate` and `train`, declared once (CONTRACTS.md).
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
  std::string strategy = "dynapipe";
  std::string schedule = "auto";
  double memory_limit_gib = 0;  // 0: the device's memory
  std::string cost_model = "analytic:a100-40g";
  std::int64_t iterations = 0;  // 0: all
  std::uint64_t seed = 0;
  int seqlen_multiple = 8;
  std::string partition = "balanced";  // --partition: layers over stages (docs/partition.md)
};

enum class SamplesFlag { Samples, Data };

// Adds the common flags to `command`; `samples_flag` picks --samples or --data.
void add_common_flags(CLI::App& command, CommonFlags& flags, SamplesFlag samples_flag);

// The PlanConfig these flags describe (model resolved from its preset or file; the layer
// split chosen by --partition, which for joint plans the first global batches).
PlanConfig to_plan_config(const CommonFlags& flags);

}  // namespace dynapipe::cli
