// `dynapipe simulate`: strategy × schedule table on one dataset — estimated iteration
// time, tokens/s, bubbles, peak memory per stage and the distance to the ideal bound,
// split into what the layer split leaves unbalanced and what the schedule loses.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>

#include "cli/command.h"
#include "cli/flags.h"
#include "cli/output_file.h"
#include "cli/run_planner.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/plan/exports.h"
#include "dynapipe/report/iteration_stats.h"
#include "dynapipe/report/table.h"

namespace dynapipe::cli {
namespace {

struct SimulateFlags {
  CommonFlags common;
  std::string strategies = join(strategy_names(), ",");
  std::string schedules = "1f1b,interleaved,wait-free-cyclic,zb1p,auto";
  std::string trace;
  int planner_threads = 0;
};

std::string memory_cell(const std::vector<std::int64_t>& bytes) {
  std::vector<std::string> gib;
  for (std::int64_t b : bytes) gib.push_back(format_fixed(bytes_to_gib(b), 1));
  return join(gib, "/");
}

void run_simulate(const SimulateFlags& flags) {
  const int threads = checked_planner_threads(flags.planner_threads);
  // The lists are checked before the samples are read.
  const std::vector<std::string> strategies = split(flags.strategies, ',');
  const std::vector<std::string> schedules = split(flags.schedules, ',');
  for (const std::string& strategy : strategies) {
    if (!parse_strategy(strategy)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--strategies: each must be one of ", join(strategy_names(), ", "),
                      ", got \"", strategy, "\""));
    }
  }
  for (const std::string& schedule : schedules) {
    if (!parse_schedule_kind(schedule)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--schedules: each must be one of ", join(schedule_kind_names(), ", "),
                      ", got \"", schedule, "\""));
    }
  }
  // The flags as given (--partition too) before any samples are read.
  validate_plan_options(flags.common);
  SamplesCache samples;  // the file is read once for the splits and every row's batches
  // Every row's split is chosen below, each on its own row (one that fits nowhere is that
  // row's "infeasible"), so the base configuration takes none.
  PlanOptions unsplit = flags.common;
  unsplit.partition = "uniform";
  const PlanConfig base = to_plan_config(unsplit, threads, &samples);
  const std::vector<GlobalBatch> batches = load_global_batches(base, samples);
  std::printf("dynapipe simulate: %s, tp %d, pp %d, dp %d, max seqlen %lld, %lld tokens/batch, %s, %zu iterations\n\n",
              base.model.name.c_str(), base.tp, base.pp, base.dp, static_cast<long long>(base.max_seqlen),
              static_cast<long long>(base.global_batch_tokens), base.cost_model.c_str(),
              batches.size());
  TextTable table({"strategy", "schedule", "est. iter ms", "tokens/s", "bubble", "peak GiB/stage",
                   "ideal ms", "vs ideal", "layers/stage", "busiest/ideal", "iter/busiest"});
  ExecutionPlan best_plan;
  double best_ms = 0;
  std::vector<std::string> unsupported;  // why the n/a rows are n/a, each reason once
  std::vector<GlobalBatch> megatron_batches;  // packing-megatron's rows-based batches, when asked
  // Every row's configuration first, then every row's iterations planned at once.
  struct Row {
    std::string strategy, schedule;
    std::string layers = "-";
    std::exception_ptr error;  // choosing its split failed
    std::size_t job = 0;       // its index in `jobs`, when it has one
  };
  std::vector<Row> rows;
  std::vector<PlanConfig> configs;  // per row
  for (const std::string& strategy : strategies) {
    const bool megatron = *parse_strategy(strategy) == Strategy::PackingMegatron;
    if (megatron && megatron_batches.empty()) {
      PlanConfig config = base;
      config.strategy = Strategy::PackingMegatron;
      megatron_batches = load_global_batches(config, samples);
    }
    for (const std::string& schedule : schedules) {
      Row& row = rows.emplace_back();
      row.strategy = strategy;
      row.schedule = schedule;
      PlanConfig& config = configs.emplace_back(base);
      config.strategy = *parse_strategy(strategy);
      config.schedule = *parse_schedule_kind(schedule);
    }
  }
  // Every row on its own best split (docs/partition.md): a baseline compared in its
  // strongest form, not on the split chosen for --strategy.
  const std::vector<std::exception_ptr> split_errors =
      choose_layer_splits(flags.common, base, configs, threads, samples);
  std::vector<PlanJob> jobs;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    Row& row = rows[r];
    if (split_errors[r]) {
      row.error = split_errors[r];
      continue;
    }
    const PlanConfig& config = configs[r];
    row.layers = layers_per_stage_text(config);
    row.job = jobs.size();
    jobs.push_back({config, config.strategy == Strategy::PackingMegatron ? &megatron_batches : &batches});
  }
  std::vector<PlanJobResult> results = plan_jobs(jobs, threads, "simulate");

  for (const Row& row : rows) {
    const std::string& strategy = row.strategy;
    const std::string& schedule = row.schedule;
    const std::string& layers = row.layers;
    PlanJobResult* result = row.error ? nullptr : &results[row.job];
    const PlanConfig* job_config = row.error ? nullptr : &jobs[row.job].config;
    try {
      if (row.error) std::rethrow_exception(row.error);
      if (result->error) std::rethrow_exception(result->error);
    } catch (const Error& e) {
      if (!rules_out_option(e)) throw;
      table.add_row({strategy, schedule, "-", "-", "-", "-", "-",
                     e.kind() == ErrorKind::Infeasible ? "infeasible" : "n/a", layers, "-", "-"});
      const std::string why = cat(schedule, ": ", e.what());
      if (e.kind() == ErrorKind::Unsupported &&
          std::find(unsupported.begin(), unsupported.end(), why) == unsupported.end()) {
        unsupported.push_back(why);
      }
      continue;
    }
    const PlanConfig& config = *job_config;
    PlannedRun& run = result->run;
    // vs ideal = busiest/ideal (the busiest device's work over the mean: the layer split
    // and the stages' costs) × iter/busiest (what fill, drain and stalls add to it).
    double ideal = 0, busiest = 0, bubble = 0;
    std::vector<std::int64_t> peak(config.pp, 0);
    for (const IterationPlan& it : run.iterations) {
      const IterationStats s = iteration_stats(it, config.pp);
      ideal += s.ideal_ms / run.iterations.size();
      busiest += s.busiest_ms / run.iterations.size();
      bubble += s.bubble_fraction / run.iterations.size();
      for (int d = 0; d < config.pp; ++d) peak[d] = std::max(peak[d], s.peak_memory_bytes[d]);
    }
    const double ms = run.summary.mean_est_iteration_ms;
    table.add_row({strategy, schedule, format_fixed(ms, 1),
                   format_fixed(run.summary.est_tokens_per_s, 0), format_fixed(bubble, 3),
                   memory_cell(peak), format_fixed(ideal, 1),
                   format_fixed(ms / std::max(ideal, 1e-9), 2) + "x", layers,
                   format_fixed(busiest / std::max(ideal, 1e-9), 3) + "x",
                   format_fixed(ms / std::max(busiest, 1e-9), 3) + "x"});
    if (!flags.trace.empty() && (best_ms == 0 || ms < best_ms)) {
      best_ms = ms;
      best_plan.config = config;
      best_plan.iterations = run.iterations;
    }
  }
  std::cout << table.to_markdown();
  for (const std::string& why : unsupported) std::printf("n/a %s\n", why.c_str());
  if (!flags.trace.empty() && !best_plan.iterations.empty()) {
    ChromeTraceOptions options;
    const std::string best_name = cat(strategy_name(best_plan.config.strategy), "/",
                                      schedule_kind_name(best_plan.config.schedule));
    options.process_name = cat(best_name, ", iteration 0");
    write_file_atomically(flags.trace,
                          timeline_chrome_trace(best_plan.iterations.front().replicas.front().timeline,
                                                options));
    std::printf("\ntrace of the fastest row (%s) written to %s\n", best_name.c_str(),
                flags.trace.c_str());
  }
}

void setup(CLI::App& app) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* command =
      app.add_subcommand("simulate", "Compare strategies x schedules on a dataset by simulation");
  add_common_flags(*command, flags->common, SamplesFlag::Samples);
  command->add_option("--strategies", flags->strategies, "Comma list of strategies")
      ->capture_default_str();
  command->add_option("--schedules", flags->schedules, "Comma list of schedules (auto = best)")
      ->capture_default_str();
  command->add_option("--trace", flags->trace,
                      "Chrome/Perfetto trace of the fastest strategy x schedule");
  add_planner_threads_flag(*command, flags->planner_threads);
  command->callback([flags] { run_simulate(*flags); });
}

const bool registered = register_command({"simulate", &setup});

}  // namespace
}  // namespace dynapipe::cli
