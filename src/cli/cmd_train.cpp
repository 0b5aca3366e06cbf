// `dynapipe train`: plans and trains on this machine (one process per stage x replica,
// launched here) or joins a torchrun-style job (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT). The runtime does the work (dynapipe/runtime/train.h); this file only
// maps flags to TrainOptions and prints the summary.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>

#include "cli/command.h"
#include "cli/flags.h"
#include "cli/run_planner.h"
#include "cli/torch_commands.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/runtime/train.h"

namespace dynapipe::cli {

namespace {

struct TrainArgs {
  CommonFlags common;
  runtime::TrainOptions options;
  bool no_progress = false;
  std::string password_file;
};

std::string plan_store_password(const std::string& password_file) {
  if (!password_file.empty()) {
    std::ifstream in(password_file);
    std::string line;
    if (!in || !std::getline(in, line) || line.empty()) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--plan-store-password-file must hold the password on its first line, got ",
                      in ? "an empty file" : "an unreadable file", " (", password_file, ")"));
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
  }
  const char* env = std::getenv("DYNAPIPE_PLAN_STORE_PASSWORD");
  return env != nullptr ? env : "";
}

// This process's own command line, to start the other ranks with (they see RANK set
// and join instead of launching).
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  std::string current;
  for (char c : all) {
    if (c == '\0') {
      argv.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!argv.empty()) argv[0] = "/proc/self/exe";
  return argv;
}

void setup_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto& o = args->options;
  auto* cmd =
      app.add_subcommand(std::string(kTrainCommand.name), std::string(kTrainCommand.description));
  // Training runs on this machine's CPUs: estimate with the CPU model unless told otherwise.
  args->common.cost_model = "analytic:cpu";
  add_common_flags(*cmd, args->common, SamplesFlag::Data);
  cmd->add_option("--device", o.device, "cpu, or cuda[:N] (needs a LibTorch with CUDA and NCCL)")
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Optimizer steps (global batches; the data cycles)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))->capture_default_str();
  cmd->add_option("--metrics", o.metrics_path, "Write one JSON object per step to this JSONL file");
  cmd->add_option("--threads-per-rank", o.threads_per_rank, "LibTorch intra-op threads per rank")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--plan-store", o.plan_store,
                  "Where plans go: empty (the job's TCPStore), tcp://host:port, redis://host:port")
      ->envname("DYNAPIPE_PLAN_STORE");
  // The Redis password never travels on a command line (ps, logs, the ranks' argv):
  // env DYNAPIPE_PLAN_STORE_PASSWORD or a file.
  cmd->add_option("--plan-store-password-file", args->password_file,
                  "File whose first line is the Redis AUTH password (or env DYNAPIPE_PLAN_STORE_PASSWORD)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--checkpoint-dir", o.checkpoint_dir, "Save checkpoints here (shared by all ranks)");
  cmd->add_option("--checkpoint-every", o.checkpoint_every, "Save every N steps (0: only at the end)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))->capture_default_str();
  cmd->add_flag("--resume", o.resume, "Continue from --checkpoint-dir's latest checkpoint");
  cmd->add_flag("--refine-cost-model", o.refine_cost_model,
                "Scale the cost model's forward/backward times by what each stage measures, step by step");
  cmd->add_flag("--release-freed-memory", o.release_freed_memory,
                "Hand freed host memory back to the OS (resident memory tracks live tensors; page faults make steps up to ~2x slower)");
  cmd->add_option("--dropout", o.dropout, "Dropout probability (0: deterministic)")
      ->check(CLI::Range(0.0, 0.999))->capture_default_str();
  cmd->add_option("--lr", o.lr, "AdamW learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW weight decay")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--plan-ahead", o.plan_ahead, "Iterations planned ahead of training")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--planner-threads", o.planner_threads, "Planning worker threads on rank 0")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--comm-timeout", o.comm_timeout_s, "Seconds any communication may wait")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--store-timeout", o.store_timeout_s, "Seconds to wait for a plan or the rendezvous")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--run-id", o.run_id, "Namespace of this run's keys in the plan store");
  cmd->add_flag("--no-progress", args->no_progress, "No progress output on stderr");
  cmd->callback([args] {
    auto& options = args->options;
    options.samples = std::make_shared<SamplesCache>();  // one read for the split and the data
    options.plan = args->no_progress ? to_plan_config(args->common, 1, options.samples.get())
                                     : to_plan_config_with_progress(args->common, 1, *options.samples);
    if (options.plan.tp > 1) {
      // The runtime's stage models hold whole layers; nothing splits a layer over devices.
      throw Error(ErrorKind::Unsupported,
                  cat("dynapipe train: --tp must be 1 (this runtime has no tensor-parallel layers; "
                      "plan or simulate tp > 1 instead), got ", options.plan.tp));
    }
    options.plan_store_password = plan_store_password(args->password_file);
    options.progress = !args->no_progress;
    options.worker_command = own_command_line();
    auto summary = runtime::run_training(options);
    if (summary.is_reporter) std::fputs(runtime::format_summary(summary).c_str(), stdout);
  });
}

const bool registered = register_command({"train", &setup_train});

}  // namespace

}  // namespace dynapipe::cli
