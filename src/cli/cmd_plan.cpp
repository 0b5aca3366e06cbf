// `dynapipe plan`: plan every iteration of a samples file, write the plan JSON, and
// compare the chosen strategy with the baselines on the same cost model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <fstream>
#include <iostream>

#include "cli/command.h"
#include "cli/flags.h"
#include "cli/output_file.h"
#include "cli/run_planner.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/error.h"
#include "dynapipe/plan/exports.h"
#include "dynapipe/plan/plan_json.h"
#include "dynapipe/report/iteration_stats.h"
#include "dynapipe/report/table.h"

namespace dynapipe::cli {
namespace {

struct PlanFlags {
  CommonFlags common;
  std::string out;
  std::string trace;
  std::string svg;
  std::string actions_csv;
  bool summary_json = false;
  bool compare = true;
  int planner_threads = 0;
};

// The chosen strategy first, then every other one in table order.
std::vector<Strategy> comparison_strategies(Strategy chosen) {
  std::vector<Strategy> order = {chosen};
  for (std::string_view name : strategy_names()) {
    const Strategy s = *parse_strategy(name);
    if (s != chosen) order.push_back(s);
  }
  return order;
}

// The per-device op order a timeline records (ops sorted by start on each device).
ScheduleOrder order_from_timeline(const std::vector<TimedOp>& timeline, int num_devices) {
  std::vector<TimedOp> sorted = timeline;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const TimedOp& a, const TimedOp& b) { return a.start_ms < b.start_ms; });
  ScheduleOrder order;
  order.device_ops.resize(num_devices);
  for (const TimedOp& op : sorted) order.device_ops[op.device].push_back(op.op);
  return order;
}

void add_summary_row(TextTable& table, const std::string& strategy, const PlannedRun& run,
                     double baseline_ms, const std::string& layers) {
  double microbatches = 0;
  for (const IterationPlan& it : run.iterations) {
    for (const ReplicaPlan& r : it.replicas) microbatches += r.microbatches.size();
  }
  const double n = std::max<double>(1, run.iterations.size());
  table.add_row({strategy, format_fixed(microbatches / n, 1),
                 format_fixed(run.summary.padding_efficiency, 3),
                 format_fixed(run.summary.mean_est_iteration_ms, 1),
                 format_fixed(run.summary.est_tokens_per_s, 0),
                 baseline_ms > 0 ? format_fixed(baseline_ms / run.summary.mean_est_iteration_ms, 2) + "x"
                                 : "-",
                 format_fixed(run.summary.mean_planning_ms, 2),
                 format_fixed(run.summary.p99_planning_ms, 2), layers});
}

void run_plan(const PlanFlags& flags) {
  const int threads = checked_planner_threads(flags.planner_threads);
  SamplesCache samples;  // the file is read once for the split, the batches and the baselines
  PlanConfig config = to_plan_config_with_progress(flags.common, threads, samples);
  const std::vector<GlobalBatch> batches = load_global_batches(config, samples);
  PlannedRun chosen =
      plan_batches(config, batches, std::string(strategy_name(config.strategy)).c_str(), threads);

  ExecutionPlan plan;
  plan.config = config;
  plan.iterations = std::move(chosen.iterations);
  plan.summary = chosen.summary;
  // Write outputs only once everything succeeded (nothing half-way on error).
  write_file_atomically(flags.out, plan_to_json(plan, 1));
  if (!plan.iterations.empty()) {
    const ReplicaPlan& first = plan.iterations.front().replicas.front();
    if (!flags.trace.empty()) {
      ChromeTraceOptions options;
      options.process_name = cat("iteration 0, replica 0 (", schedule_kind_name(first.schedule), ")");
      write_file_atomically(flags.trace, timeline_chrome_trace(first.timeline, options));
    }
    if (!flags.svg.empty()) {
      SvgOptions options;
      options.title = cat(config.model.name, " iteration 0: ", schedule_kind_name(first.schedule), ", recompute ",
                          recompute_name(first.recompute), ", ",
                          format_fixed(first.est_iteration_ms, 1), " ms");
      write_file_atomically(flags.svg, timeline_svg(first.timeline, options));
    }
    if (!flags.actions_csv.empty()) {
      write_file_atomically(flags.actions_csv,
                            order_to_pytorch_csv(order_from_timeline(first.timeline, config.pp)));
    }
  }
  if (flags.summary_json) {
    std::cout << summary_to_json(plan.summary) << "\n";
    return;
  }

  std::printf("dynapipe plan: %s, tp %d, pp %d, dp %d, max seqlen %lld, %lld tokens/batch, %s\n",
              config.model.name.c_str(), config.tp, config.pp, config.dp,
              static_cast<long long>(config.max_seqlen),
              static_cast<long long>(config.global_batch_tokens), config.cost_model.c_str());
  std::printf("%zu iterations planned; plan written to %s\n\n", plan.iterations.size(),
              flags.out.c_str());
  TextTable table({"strategy", "micro-batches/iter", "padding eff.", "est. iter ms",
                   "est. tokens/s", "speed-up vs packing", "plan ms (mean)", "plan ms (p99)", "layers/stage"});
  struct Run {
    std::string name;
    PlannedRun run;
    std::string layers;  // its split (each strategy's own under balanced and joint)
  };
  std::vector<Run> runs;
  runs.push_back({std::string(strategy_name(config.strategy)), PlannedRun{{}, plan.summary}, layers_per_stage_text(config)});
  runs.back().run.iterations = plan.iterations;
  if (flags.compare) {
    // Every baseline's iterations planned at once, reported in table order.
    struct Baseline {
      std::string name;
      std::exception_ptr error;  // choosing its split failed
      std::size_t job = 0;       // its index in `jobs`, when it has one
    };
    std::vector<Baseline> baselines;
    std::vector<PlanConfig> others;  // per baseline
    for (Strategy strategy : comparison_strategies(config.strategy)) {
      if (strategy == config.strategy) continue;
      others.push_back(config);
      others.back().strategy = strategy;
      baselines.emplace_back().name = strategy_name(strategy);
    }
    // Each baseline on its own best split (docs/partition.md), not dynapipe's.
    const std::vector<std::exception_ptr> split_errors =
        choose_layer_splits(flags.common, config, others, threads, samples);
    std::vector<PlanJob> jobs;
    std::deque<std::vector<GlobalBatch>> own_batches;  // packing-megatron's (stable addresses)
    for (std::size_t b = 0; b < baselines.size(); ++b) {
      Baseline& baseline = baselines[b];
      const PlanConfig& other = others[b];
      const Strategy strategy = other.strategy;
      if (split_errors[b]) {
        baseline.error = split_errors[b];
        continue;
      }
      // packing-megatron's global batches are rows-based; the others share token batches.
      const bool rows_based =
          (strategy == Strategy::PackingMegatron) != (config.strategy == Strategy::PackingMegatron);
      if (rows_based) own_batches.push_back(load_global_batches(other, samples));
      baseline.job = jobs.size();
      jobs.push_back({other, rows_based ? &own_batches.back() : &batches});
    }
    std::vector<PlanJobResult> results = plan_jobs(jobs, threads, "baselines");
    for (const Baseline& baseline : baselines) {
      try {
        if (baseline.error) std::rethrow_exception(baseline.error);
        if (results[baseline.job].error) std::rethrow_exception(results[baseline.job].error);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::Infeasible) throw;
        std::fprintf(stderr, "%s: infeasible: %s\n", baseline.name.c_str(), e.what());
        continue;
      }
      runs.push_back({baseline.name, std::move(results[baseline.job].run), layers_per_stage_text(jobs[baseline.job].config)});
    }
  }
  double packing_ms = 0;
  for (const Run& r : runs) {
    if (r.name == "packing") packing_ms = r.run.summary.mean_est_iteration_ms;
  }
  for (const Run& r : runs) add_summary_row(table, r.name, r.run, packing_ms, r.layers);
  std::cout << table.to_markdown();
}

void setup(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* command = app.add_subcommand("plan", "Plan micro-batches, schedules and executor programs");
  add_common_flags(*command, flags->common, SamplesFlag::Samples);
  command->add_option("--out", flags->out, "Plan JSON to write")->required();
  command->add_option("--trace", flags->trace, "Chrome/Perfetto trace of the first iteration's simulated timeline");
  command->add_option("--svg", flags->svg, "SVG timeline of the first iteration");
  command->add_option("--actions-csv", flags->actions_csv,
                      "PyTorch pipelining action CSV of the first iteration");
  command->add_flag("--summary-json", flags->summary_json,
                    "Print only the plan's summary as one JSON object");
  command->add_flag("!--no-compare", flags->compare, "Skip planning the baselines for comparison");
  add_planner_threads_flag(*command, flags->planner_threads);
  command->callback([flags] { run_plan(*flags); });
}

const bool registered = register_command({"plan", &setup});

}  // namespace
}  // namespace dynapipe::cli
