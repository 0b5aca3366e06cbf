// Flags shared by `plan`, `simulate` and `train`, declared once (docs/cli.md): the rows of
// plan_option_table() (planner/plan_options.h), which Python's dynapipe.Planner reads too.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "dynapipe/planner/plan_options.h"

namespace dynapipe::cli {

using CommonFlags = PlanOptions;

enum class SamplesFlag { Samples, Data };

// Adds the common flags to `command`; `samples_flag` picks --samples or --data. CLI11
// only parses the types; ranges and choices are checked by to_plan_config() (one message
// for the CLI and Python).
void add_common_flags(CLI::App& command, CommonFlags& flags, SamplesFlag samples_flag);

// Adds only the rows of plan_option_table() whose `name` is in `names`, for a command
// that sets the others itself (tune lays out tp, pp, dp and strategy per point).
void add_plan_option_flags(CLI::App& command, PlanOptions& flags, const std::vector<std::string>& names);

// --planner-threads of `plan`, `simulate` and `tune`: how many iterations and
// configurations are planned at once (default 0: one per hardware thread).
void add_planner_threads_flag(CLI::App& command, int& threads);
// The flag's value; throws InvalidArgument unless it is >= 0.
int checked_planner_threads(int threads);

}  // namespace dynapipe::cli
