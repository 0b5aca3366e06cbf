// `dynapipe train` and `dynapipe profile` in the `dynapipe` executable: listed with their
// descriptions, and run by replacing this process with `dynapipe-torch` (beside this
// executable) on the same arguments, so that only those commands load LibTorch
// (cli/torch_commands.h). Its --help, errors and exit codes are the command's own.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "cli/command.h"
#include "cli/torch_commands.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe::cli {
namespace {

std::filesystem::path torch_executable() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    throw Error(ErrorKind::Internal,
                cat("cannot find this executable's directory (/proc/self/exe): ", error.message()));
  }
  return self.parent_path() / kTorchExecutable;
}

// Replaces this process with dynapipe-torch running `command` on `args`. argv[0] stays
// what the user typed (CLI11 shows it in usage lines); the path is this executable's
// directory, not a PATH search.
[[noreturn]] void hand_over(const std::string& program, std::string_view command,
                            const std::vector<std::string>& args) {
  const std::filesystem::path target = torch_executable();
  std::vector<std::string> words = {program, std::string(command)};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  ::execv(target.c_str(), argv.data());
  // Only reached when the exec failed.
  const int failure = errno;
  throw Error(failure == ENOENT ? ErrorKind::InvalidArgument : ErrorKind::Internal,
              cat("dynapipe ", command, " runs in ", target.string(),
                  " (built with LibTorch, beside dynapipe), which must be an executable, got: ",
                  std::strerror(failure)));
}

void add_handoff(CLI::App& app, const TorchCommand& command) {
  CLI::App* sub = app.add_subcommand(std::string(command.name), std::string(command.description));
  // Every argument after the command name goes over untouched, --help included.
  sub->set_help_flag();
  sub->prefix_command();
  sub->allow_extras();
  sub->callback([&app, sub, name = command.name] { hand_over(app.get_name(), name, sub->remaining()); });
}

// One registration per command, so that `dynapipe --help` lists them in name order.
const bool registered = [] {
  for (const TorchCommand& command : kTorchCommands) {
    register_command({std::string(command.name),
                      [&command](CLI::App& app) { add_handoff(app, command); }});
  }
  return true;
}();

}  // namespace
}  // namespace dynapipe::cli
