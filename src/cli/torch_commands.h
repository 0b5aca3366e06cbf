// The subcommands that need LibTorch. They are built into `dynapipe-torch`; the `dynapipe`
// executable lists them too and hands them to `dynapipe-torch` (cmd_torch_handoff.cpp),
// so that the planner's commands (plan, simulate, tune, data, partition) never load
// LibTorch, whose start-up alone takes ~0.5 s (docs/building.md).
#pragma once

#include <string_view>

namespace dynapipe::cli {

struct TorchCommand {
  std::string_view name;
  std::string_view description;  // as `dynapipe --help` lists it
};

inline constexpr TorchCommand kTrainCommand{"train",
                                            "Train on this machine's CPUs with the planned executors"};
inline constexpr TorchCommand kProfileCommand{
    "profile", "Measure this machine's per-layer costs into a profile JSON"};
inline constexpr TorchCommand kTorchCommands[] = {kTrainCommand, kProfileCommand};

// The executable those commands run in, beside `dynapipe`.
inline constexpr std::string_view kTorchExecutable = "dynapipe-torch";

}  // namespace dynapipe::cli
