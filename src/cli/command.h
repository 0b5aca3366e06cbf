// Subcommand registry of the `dynapipe` CLI. Each cmd_<name>.cpp registers itself:
//
//   namespace { const bool registered = register_command({"plan", &setup_plan}); }
//
// setup functions add a CLI11 subcommand and its callback. main.cpp owns the one catch
// ladder that maps dynapipe::Error kinds to exit codes.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dynapipe::cli {

struct Command {
  std::string name;
  std::function<void(CLI::App& app)> setup;  // adds the subcommand to app
};

bool register_command(Command command);
const std::vector<Command>& registered_commands();

}  // namespace dynapipe::cli
