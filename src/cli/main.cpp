// dynapipe: the command-line front door. Exit codes: 0 success, 2 bad input or usage,
// 1 internal failure (docs/errors.md).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "dynapipe/core/error.h"

namespace dynapipe::cli {

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace

bool register_command(Command command) {
  registry().push_back(std::move(command));
  return true;
}

const std::vector<Command>& registered_commands() { return registry(); }

}  // namespace dynapipe::cli

int main(int argc, char** argv) {
  using namespace dynapipe;
  CLI::App app{"dynapipe: dynamic micro-batching and pipeline planning for multi-task training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dynapipe 0.1.0");
  auto commands = cli::registered_commands();
  std::sort(commands.begin(), commands.end(),
            [](const cli::Command& a, const cli::Command& b) { return a.name < b.name; });
  for (const auto& command : commands) command.setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
