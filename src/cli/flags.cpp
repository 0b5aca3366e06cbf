#include "cli/flags.h"

#include <variant>

#include "dynapipe/core/strings.h"

namespace dynapipe::cli {

void add_common_flags(CLI::App& command, CommonFlags& flags, SamplesFlag samples_flag) {
  if (samples_flag == SamplesFlag::Samples) {
    command.add_option("--samples", flags.samples, "Samples file (JSONL, optionally gzip)")
        ->required();
  } else {
    command.add_option("--data", flags.samples, "Samples file (JSONL, optionally gzip)");
  }
  for (const PlanOptionSpec& spec : plan_option_table()) {
    CLI::Option* option = std::visit(
        [&](auto member) { return command.add_option(spec.flag, flags.*member, spec.help); },
        spec.field);
    if (!spec.choices.empty()) option->type_name(cat("{", join(spec.choices, ","), "}"));
    if (spec.show_default) option->capture_default_str();
  }
}

}  // namespace dynapipe::cli
