// `dynapipe tune`: the best parallel layout (tp x pp x dp of --gpus) per strategy for a
// dataset, model, cost model and memory limit, with the throughput ratios between
// strategies (docs/cli.md; the search is planner/tune.h).
#include <map>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <iostream>

#include "cli/command.h"
#include "cli/flags.h"
#include "cli/run_planner.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/planner/plan_options.h"
#include "dynapipe/planner/planner.h"
#include "dynapipe/planner/tune.h"
#include "dynapipe/report/table.h"

namespace dynapipe::cli {
namespace {

// The options every point shares go through to_plan_config(), the one validation that
// plan, simulate, train and Python use; the grid search then sets tp, pp, dp, strategy,
// micro-batch size and recompute per point.
PlanOptions tune_defaults() {
  PlanOptions options;
  options.model = "gpt-6.7b";
  options.partition = "uniform";  // each point has its own pp; its layers split uniformly
  return options;
}

struct TuneFlags {
  PlanOptions plan = tune_defaults();
  int gpus = 8;
  std::int64_t iterations = 3;
  std::string strategies;  // empty: all
  bool summary_json = false;
  bool megatron_token_batches = false;
  bool megatron_free_recompute = false;
  int planner_threads = 0;
};

// The ratios are against this strategy when it has a result (the paper's baseline), else
// against "packing".
std::string reference_strategy(const TuneResult& r) {
  if (r.best.count(std::string(strategy_name(Strategy::PackingMegatron)))) {
    return std::string(strategy_name(Strategy::PackingMegatron));
  }
  return "packing";
}

std::string point_recompute(const TunePoint& p) {
  return p.recompute ? std::string(recompute_name(*p.recompute)) : "auto";
}

void run_tune(const TuneFlags& flags) {
  TuneOptions options;
  SamplesCache samples;  // the file is read once for the split and the grid
  options.base = to_plan_config_with_progress(flags.plan, 1, samples);
  const PlanConfig& base = options.base;
  options.gpus = flags.gpus;
  options.iterations = flags.iterations;
  options.megatron_token_batches = flags.megatron_token_batches;
  options.megatron_free_recompute = flags.megatron_free_recompute;
  options.threads = flags.planner_threads;  // checked by validate()
  if (!flags.strategies.empty()) options.strategies = split(flags.strategies, ',');
  options.validate();
  // Fail fast on the cost model and model (e.g. a100-measured with another model) before
  // loading data.
  make_cost_model(base.cost_model, base.model, {});
  const std::shared_ptr<const Dataset> loaded = samples.load(base.samples_path, truncation_limits(base));
  const Dataset& dataset = *loaded;

  const bool interactive = isatty(fileno(stderr)) != 0;
  if (interactive) {
    options.progress = [](int done, int total) {
      std::fprintf(stderr, "\rdynapipe tune: %d/%d configurations", done, total);
      if (done == total) std::fprintf(stderr, "\r\033[K");
    };
  }
  const TuneResult result = tune(dataset.samples(), dataset.truncated_ids(), options);
  const std::string reference = reference_strategy(result);
  const double reference_tps = result.best.count(reference) ? result.best.at(reference).est_tokens_per_s : 0;

  if (flags.summary_json) {
    nlohmann::ordered_json j;
    j["model"] = base.model.name;
    j["cost_model"] = base.cost_model;
    j["gpus"] = flags.gpus;
    j["max_seqlen"] = base.max_seqlen;
    j["global_batch_tokens"] = base.global_batch_tokens;
    j["memory_limit_gib"] = base.memory_limit_gib;
    j["reference"] = reference;
    nlohmann::ordered_json strategies = nlohmann::ordered_json::object();
    for (const auto& [name, p] : result.best) {
      nlohmann::ordered_json s;
      s["tp"] = p.layout.tp;
      s["pp"] = p.layout.pp;
      s["dp"] = p.layout.dp;
      s["micro_batch_size"] = p.micro_batch_size;
      s["recompute"] = point_recompute(p);
      s["schedule"] = p.schedule;
      s["est_tokens_per_s"] = p.est_tokens_per_s;
      s["est_iteration_ms"] = p.est_iteration_ms;
      s["padding_efficiency"] = p.padding_efficiency;
      s["vs_reference"] = reference_tps > 0 ? p.est_tokens_per_s / reference_tps : 0.0;
      s["points_tried"] = result.points_tried.at(name);
      s["points_feasible"] = result.points_feasible.at(name);
      strategies[name] = s;
    }
    j["strategies"] = strategies;
    std::cout << j.dump() << "\n";
    return;
  }

  std::printf("dynapipe tune: %s on %d GPUs (%zu layouts), %s, max seqlen %lld, %lld tokens/batch, "
              "memory limit %s GiB, %lld iterations per point\n\n",
              base.model.name.c_str(), flags.gpus, result.layouts.size(), base.cost_model.c_str(),
              static_cast<long long>(base.max_seqlen), static_cast<long long>(base.global_batch_tokens),
              base.memory_limit_gib > 0 ? format_fixed(base.memory_limit_gib, 2).c_str() : "device",
              static_cast<long long>(flags.iterations));
  TextTable table({"strategy", "tp", "pp", "dp", "mbs", "recompute", "schedule", "est. tokens/s",
                   "padding eff.", "est. iter ms", cat("vs ", reference), "feasible/tried"});
  for (const auto& [name, tried] : result.points_tried) {
    const auto it = result.best.find(name);
    if (it == result.best.end()) {
      table.add_row({name, "-", "-", "-", "-", "-", "-", "infeasible", "-", "-", "-", cat(0, "/", tried)});
      continue;
    }
    const TunePoint& p = it->second;
    table.add_row({name, cat(p.layout.tp), cat(p.layout.pp), cat(p.layout.dp),
                   p.micro_batch_size > 0 ? cat(p.micro_batch_size) : "auto", point_recompute(p), p.schedule,
                   format_fixed(p.est_tokens_per_s, 0), format_fixed(p.padding_efficiency, 3),
                   format_fixed(p.est_iteration_ms, 1),
                   reference_tps > 0 ? format_fixed(p.est_tokens_per_s / reference_tps, 2) + "x" : "-",
                   cat(result.points_feasible.count(name) ? result.points_feasible.at(name) : 0, "/", tried)});
  }
  std::cout << table.to_markdown();
}

void setup(CLI::App& app) {
  auto flags = std::make_shared<TuneFlags>();
  std::vector<std::string> schedule_choices;
  for (std::string_view name : schedule_kind_names()) schedule_choices.emplace_back(name);
  CLI::App* command = app.add_subcommand(
      "tune", "Best tp x pp x dp layout of --gpus per strategy (grid search by simulation)");
  command->add_option("--samples", flags->plan.samples, "Samples file (JSONL, optionally gzip)")->required();
  // The options every point shares: plan's flags, spelled, checked and explained by the table.
  add_plan_option_flags(*command, flags->plan,
                        {"model", "cost_model", "memory_limit_gib", "max_seqlen", "max_target_len",
                         "global_batch_tokens", "seed", "seqlen_multiple"});
  command->add_option("--gpus", flags->gpus, "GPUs to lay out as tp x pp x dp")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  command->add_option("--iterations", flags->iterations, "Global batches planned per configuration")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))->capture_default_str();
  command->add_option("--strategies", flags->strategies, "Comma list of strategies (default: all)");
  command->add_option("--schedule", flags->plan.schedule,
                      "Schedule for every strategy but packing-megatron (always 1f1b)")
      ->type_name(cat("{", join(schedule_choices, ","), "}"))
      ->capture_default_str();
  command->add_flag("--summary-json", flags->summary_json,
                    "Print one JSON object {\"strategies\": {name: {tp, pp, dp, est_tokens_per_s, ...}}}");
  command->add_flag("--megatron-token-batches", flags->megatron_token_batches,
                    "Ablation: plan packing-megatron on the token-budget global batches");
  command->add_flag("--megatron-free-recompute", flags->megatron_free_recompute,
                    "Ablation: also let packing-megatron pick recompute per iteration");
  add_planner_threads_flag(*command, flags->planner_threads);
  command->callback([flags] { run_tune(*flags); });
}

const bool registered = register_command({"tune", &setup});

}  // namespace
}  // namespace dynapipe::cli
