#include "cli/flags.h"

#include <algorithm>
#include <variant>

#include "dynapipe/core/parallel.h"
#include "dynapipe/core/strings.h"

namespace dynapipe::cli {
namespace {

// CLI11 parses the type only; to_plan_config() checks ranges and choices.
void add_plan_option(CLI::App& command, PlanOptions& flags, const PlanOptionSpec& spec) {
  if (spec.is_flag) {
    auto* member = std::get_if<std::int64_t PlanOptions::*>(&spec.field);
    if (member != nullptr) {
      command.add_flag(spec.flag, flags.**member, spec.help);
      return;
    }
  }
  CLI::Option* option = std::visit(
      [&](auto member) { return command.add_option(spec.flag, flags.*member, spec.help); }, spec.field);
  if (!spec.choices.empty()) option->type_name(cat("{", join(spec.choices, ","), "}"));
  if (spec.show_default) option->capture_default_str();
}

}  // namespace

void add_common_flags(CLI::App& command, CommonFlags& flags, SamplesFlag samples_flag) {
  if (samples_flag == SamplesFlag::Samples) {
    command.add_option("--samples", flags.samples, "Samples file (JSONL, optionally gzip)")
        ->required();
  } else {
    command.add_option("--data", flags.samples, "Samples file (JSONL, optionally gzip)");
  }
  for (const PlanOptionSpec& spec : plan_option_table()) add_plan_option(command, flags, spec);
}

void add_plan_option_flags(CLI::App& command, PlanOptions& flags, const std::vector<std::string>& names) {
  for (const PlanOptionSpec& spec : plan_option_table()) {
    if (std::find(names.begin(), names.end(), spec.name) != names.end()) add_plan_option(command, flags, spec);
  }
}

void add_planner_threads_flag(CLI::App& command, int& threads) {
  command
      .add_option("--planner-threads", threads,
                  "Threads planning iterations at once (0: one per hardware thread); the plans "
                  "are the same for any count")
      ->capture_default_str();
}

int checked_planner_threads(int threads) { return checked_thread_count(threads, "--planner-threads"); }

}  // namespace dynapipe::cli
