// Training: `dynapipe train` as a library call. Torch-free (pimpl'd runtime behind it).
//
// run_training() either launches the job on this machine (world = pp x dp rank
// processes, each re-running `worker_command` with RANK / WORLD_SIZE / MASTER_ADDR /
// MASTER_PORT set, supervised by launcher.h), or, when RANK is already set (torchrun
// style, or a rank started by our own launcher), runs this process as that rank.
// Rank 0 hosts the job's rendezvous store, runs the planning workers `plan_ahead` iterations ahead
// of training, writes metrics and prints progress. See docs/runtime.md.
//
//   TrainOptions options;
//   options.plan = to_plan_config(flags);   // model, data, strategy, pp, dp, ...
//   options.steps = 20;
//   options.metrics_path = "metrics.jsonl";
//   options.worker_command = {"/proc/self/exe", "train", ...argv...};
//   TrainSummary s = run_training(options);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dynapipe/data/samples_cache.h"
#include "dynapipe/plan/execution_plan.h"

namespace dynapipe::runtime {

struct TrainOptions {
  PlanConfig plan;              // model, samples_path (--data), strategy, schedule, pp, dp, ...
  // Where this process reads plan.samples_path: to_plan_config()'s layer split and the
  // training data share one read. Null: read on each use.
  std::shared_ptr<SamplesCache> samples;
  std::int64_t steps = 10;      // optimizer steps (global batches; the data cycles). >= 1
  std::string metrics_path;     // --metrics FILE.jsonl; empty: none
  int threads_per_rank = 1;     // torch::set_num_threads in every rank. >= 1
  std::string plan_store;       // --plan-store: "" (the job's own store), tcp://h:p, redis://h:p
  std::string device = "cpu";   // --device: "cpu", or "cuda[:N]" where LibTorch has CUDA and
                                // NCCL (this build has neither: Unsupported, exit 2)
  std::string plan_store_password;  // Redis AUTH; empty: none. Never from a command line:
                                    // DYNAPIPE_PLAN_STORE_PASSWORD or a password file.
  std::string checkpoint_dir;   // --checkpoint-dir; empty: no checkpoints
  std::int64_t checkpoint_every = 0;  // save every N steps (and at the end); 0: only at the end
                                      // when checkpoint_dir is set
  bool resume = false;          // continue from checkpoint_dir's latest checkpoint
  bool refine_cost_model = false;  // fold measured forward/backward times into the planner's
                                   // cost model after every step (docs/runtime.md)
  bool release_freed_memory = false;  // --release-freed-memory: let the host allocator hand
                                      // freed pages back to the OS (docs/runtime.md "Host memory")
  double dropout = 0.0;         // 0 makes training deterministic. [0, 1)
  double lr = 3e-4;             // AdamW learning rate. > 0
  double weight_decay = 0.0;    // AdamW weight decay. >= 0
  int plan_ahead = 2;           // iterations planned ahead of the one training. >= 1
  int planner_threads = 2;      // planning worker threads on rank 0. >= 1
  double comm_timeout_s = 300;  // bound on every communication wait (a peer's whole F+B of
                                // a large micro-batch on a CPU can take a minute). > 0
  double store_timeout_s = 300; // bound on waiting for a plan / the rendezvous. > 0
  double kill_grace_s = 5;      // launcher: SIGTERM -> SIGKILL after a rank failed
  std::string run_id;           // namespaces store keys; empty: "run-<port>"
  std::vector<std::string> worker_command;  // argv that starts one rank (the CLI passes
                                            // its own argv); required when launching
  bool progress = true;         // progress on stderr (a bar on a terminal, lines otherwise)
  // Debug only (tests): run pipedream's Forward / Backward on the current weights instead
  // of the plan's stashed versions. Not a CLI flag.
  bool debug_no_weight_stash = false;

  // Throws InvalidArgument naming the flag (e.g. "--steps must be >= 1, got 0").
  void validate() const;
};

struct TrainSummary {
  std::int64_t steps = 0;            // steps run by this invocation + restored ones
  double final_loss = 0;
  double median_loss = 0;
  double median_tokens_per_s = 0;
  double median_step_time_s = 0;
  double median_est_step_time_s = 0;
  double median_planning_ms = 0;
  double padding_efficiency = 0;     // Σ real tokens / Σ padded tokens over all steps
  std::int64_t peak_memory_bytes = 0;      // largest over ranks and steps (RSS)
  std::int64_t peak_memory_above_start_bytes = 0;  // the same minus each rank's RSS before
                                                   // it built its models
  std::int64_t est_peak_memory_bytes = 0;  // the plans' largest estimate
  std::vector<double> losses;        // per step, from step 0 (restored ones included)
  std::string cost_calibration;      // --refine-cost-model: the learnt factors at the end
  bool freed_memory_kept = false;    // the host allocator kept freed pages (in the RSS figures)
  // True in the process that reports the run to the user: the launcher, a one-rank job,
  // or rank 0 of a torchrun-style job. Ranks started by our launcher and other ranks
  // return false (their summary is empty or already reported).
  bool is_reporter = false;
};

// Launches or joins the job (see above). Throws Error: InvalidArgument for options,
// PeerFailure naming the failed rank, Timeout, or whatever the planner threw.
TrainSummary run_training(const TrainOptions& options);

// Human summary: loss, tokens/s, padding efficiency, planning time, measured vs
// estimated step time.
std::string format_summary(const TrainSummary& summary);

}  // namespace dynapipe::runtime
