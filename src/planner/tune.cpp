// The layout x strategy grid search behind `dynapipe tune` (include/dynapipe/planner/tune.h).
#include "dynapipe/planner/tune.h"

#include <algorithm>
#include <exception>
#include <memory>

#include "dynapipe/batching/megatron_packing.h"
#include "dynapipe/core/parallel.h"
#include "dynapipe/core/strategy.h"
#include "dynapipe/core/error.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/planner/plan_many.h"
#include "dynapipe/planner/planner.h"
#include "dynapipe/schedule/schedule.h"

namespace dynapipe {
namespace {

struct Candidate {
  std::string strategy;
  TuneLayout layout;
  std::int64_t micro_batch_size = 0;
  std::optional<Recompute> recompute;
};

std::vector<std::string> strategies_of(const TuneOptions& options) {
  if (!options.strategies.empty()) return options.strategies;
  std::vector<std::string> all;
  for (std::string_view name : strategy_names()) all.emplace_back(name);
  return all;
}

}  // namespace

void TuneOptions::validate() const {
  if (gpus < 1) throw Error(ErrorKind::InvalidArgument, cat("--gpus must be >= 1, got ", gpus));
  checked_thread_count(threads, "--planner-threads");
  if (iterations < 1) throw Error(ErrorKind::InvalidArgument, cat("--iterations must be >= 1, got ", iterations));
  if (max_micro_batch_size < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("max micro-batch size must be >= 1, got ", max_micro_batch_size));
  }
  for (const std::string& s : strategies) {
    if (!parse_strategy(s)) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--strategies must name strategies among ", join(strategy_names(), ", "), ", got \"", s, "\""));
    }
  }
}

std::vector<TuneLayout> tune_layouts(const ModelSpec& model, int gpus) {
  if (gpus < 1) throw Error(ErrorKind::InvalidArgument, cat("--gpus must be >= 1, got ", gpus));
  std::vector<TuneLayout> layouts;
  for (int tp = 1; tp <= gpus; ++tp) {
    if (gpus % tp != 0 || model.heads % tp != 0 || model.ffn_hidden % tp != 0) continue;
    const int rest = gpus / tp;
    for (int pp = 1; pp <= rest; ++pp) {
      if (rest % pp != 0 || pp > model.total_layers()) continue;
      layouts.push_back({tp, pp, rest / pp});
    }
  }
  return layouts;
}

TuneResult tune(const std::vector<Sample>& samples, const std::vector<SampleId>& truncated,
                const TuneOptions& options) {
  options.validate();
  const PlanConfig& base = options.base;
  TuneResult result;
  result.layouts = tune_layouts(base.model, options.gpus);
  // Degrees the cost model has no data for (a100-measured: 1, 2, 4, 8; a profile: its
  // own) are not searched.
  std::erase_if(result.layouts, [&](const TuneLayout& layout) {
    try {
      make_cost_model(base.cost_model, base.model, {.tp = layout.tp});
      return false;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::InvalidArgument || layout.tp == 1) throw;
      return true;
    }
  });
  const std::vector<std::string> strategies = strategies_of(options);

  // The global batches: shared by every strategy but packing-megatron, whose batches are
  // a number of padded rows.
  const std::vector<GlobalBatch> token_batches =
      form_global_batches(samples, truncated, base.global_batch_tokens, options.iterations);
  const MegatronRows rows{.kind = base.model.kind,
                          .max_seqlen = base.max_seqlen,
                          .max_target_len = base.max_target_len > 0 ? base.max_target_len : base.max_seqlen};
  std::vector<GlobalBatch> megatron_batches;
  const std::int64_t megatron_rows = std::max<std::int64_t>(1, base.global_batch_tokens / rows.row_tokens());

  std::vector<Candidate> candidates;
  for (const std::string& strategy : strategies) {
    const bool megatron = parse_strategy(strategy) == Strategy::PackingMegatron;
    if (megatron && megatron_batches.empty() && !options.megatron_token_batches) {
      megatron_batches = form_megatron_global_batches(samples, truncated, rows, base.global_batch_tokens,
                                                      options.iterations);
    }
    for (const TuneLayout& layout : result.layouts) {
      if (!megatron) {
        candidates.push_back({strategy, layout, 0, std::nullopt});
        continue;
      }
      // Megatron fixes both for the run: every power-of-two micro-batch size that gives
      // each replica at least one micro-batch, under each recompute mode.
      const std::int64_t per_replica = std::max<std::int64_t>(1, megatron_rows / layout.dp);
      for (std::int64_t mbs = 1; mbs <= std::min(per_replica, options.max_micro_batch_size); mbs *= 2) {
        for (Recompute mode : kRecomputeModes) candidates.push_back({strategy, layout, mbs, mode});
        if (options.megatron_free_recompute) candidates.push_back({strategy, layout, mbs, std::nullopt});
      }
    }
  }

  PlannerOptions planner_options;
  planner_options.verify = false;  // estimates only; `plan` verifies what it writes
  // Every candidate's Planner first (in order), then all their iterations at once
  // (plan_many()), then the points in candidate order: the same result for any thread count.
  struct Point {
    std::unique_ptr<const Planner> planner;
    std::exception_ptr error;  // the Planner's, or the first failing iteration's
    std::vector<IterationPlan> iterations;
    bool has_iterations = false;  // plan_many() reports its end
  };
  std::vector<Point> points(candidates.size());
  std::vector<PlanRequest> requests;
  std::vector<std::size_t> point_of;  // per request
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    const Candidate& c = candidates[k];
    ++result.points_tried[c.strategy];
    PlanConfig config = base;
    config.strategy = *parse_strategy(c.strategy);
    config.tp = c.layout.tp;
    config.pp = c.layout.pp;
    config.dp = c.layout.dp;
    config.micro_batch_size = c.micro_batch_size;
    config.recompute = c.recompute;
    config.iterations = options.iterations;
    const bool own_batches = config.strategy == Strategy::PackingMegatron && !options.megatron_token_batches;
    try {
      points[k].planner = std::make_unique<const Planner>(config, planner_options);
    } catch (...) {
      points[k].error = std::current_exception();
      continue;
    }
    requests.push_back({points[k].planner.get(), own_batches ? megatron_batches : token_batches});
    point_of.push_back(k);
    points[k].has_iterations = !requests.back().batches.empty();
  }
  int done = 0;
  auto report = [&] {
    if (options.progress) options.progress(++done, static_cast<int>(candidates.size()));
  };
  for (const Point& point : points) {
    if (!point.has_iterations) report();  // nothing to plan
  }
  std::vector<PlannedIterations> planned =
      plan_many(requests, options.threads, [&](std::size_t, std::size_t left) {
        if (left == 0) report();  // plan_many() calls one at a time
      });
  for (std::size_t r = 0; r < requests.size(); ++r) {
    points[point_of[r]].error = planned[r].error;
    points[point_of[r]].iterations = std::move(planned[r].iterations);
  }

  for (std::size_t k = 0; k < candidates.size(); ++k) {
    const Candidate& c = candidates[k];
    Point& point = points[k];
    if (point.error) {
      try {
        std::rethrow_exception(point.error);
      } catch (const Error& e) {
        if (!rules_out_option(e)) throw;
      }
      continue;
    }
    const std::vector<IterationPlan>& iterations = point.iterations;
    const PlanSummary summary = summarize(iterations);
    TunePoint tuned{.strategy = c.strategy,
                    .layout = c.layout,
                    .micro_batch_size = c.micro_batch_size,
                    .recompute = c.recompute,
                    .schedule = iterations.empty() || iterations[0].replicas.empty()
                                    ? std::string()
                                    : std::string(schedule_kind_name(iterations[0].replicas[0].schedule)),
                    .est_tokens_per_s = summary.est_tokens_per_s,
                    .est_iteration_ms = summary.mean_est_iteration_ms,
                    .padding_efficiency = summary.padding_efficiency,
                    .mean_planning_ms = summary.mean_planning_ms};
    ++result.points_feasible[c.strategy];
    auto it = result.best.find(c.strategy);
    if (it == result.best.end() || tuned.est_tokens_per_s > it->second.est_tokens_per_s) {
      result.best[c.strategy] = tuned;
    }
    result.feasible.push_back(std::move(tuned));
  }
  return result;
}

}  // namespace dynapipe
