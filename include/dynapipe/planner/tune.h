// tune(): which parallel layout and which batching for my data on N GPUs? Grid-searches
// every (tensor, pipeline, data)-parallel layout of the GPUs for each strategy (and, for
// packing-megatron, every micro-batch size and recompute mode, which it fixes for a whole
// run), plans a few global batches at each point and keeps the configuration with the
// highest estimated tokens/s per strategy (`dynapipe tune`, docs/cli.md).
//
//   TuneOptions options;
//   options.base = config;              // model, cost model, data limits, memory limit
//   options.gpus = 8;
//   options.strategies = {"dynapipe", "packing-megatron"};
//   TuneResult r = tune(samples, truncated, options);
//   r.best.at("dynapipe").est_tokens_per_s;
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/rank_layout.h"
#include "dynapipe/core/sample.h"
#include "dynapipe/plan/execution_plan.h"

namespace dynapipe {

// One parallel layout: gpus() = tp * pp * dp = the GPU count.
using TuneLayout = RankLayout;

struct TuneOptions {
  // Model, cost model, max_seqlen / max_target_len, global_batch_tokens, memory limit,
  // schedule, seed, seqlen_multiple; strategy, tp, pp, dp, micro_batch_size, recompute
  // and iterations are set by the search.
  PlanConfig base;
  int gpus = 8;                          // >= 1
  std::vector<std::string> strategies;   // empty = every strategy
  std::int64_t iterations = 3;           // global batches planned per point, >= 1
  // packing-megatron's micro-batch sizes: powers of two up to this many rows (>= 1).
  std::int64_t max_micro_batch_size = 64;
  // Ablations of packing-megatron, to measure its causes one at a time (docs/RESULTS.md):
  // plan it on the shared token-budget global batches instead of its rows-based ones;
  // also try the recompute mode chosen per iteration (no fixed mode for the run).
  bool megatron_token_batches = false;
  bool megatron_free_recompute = false;
  // Threads planning the points' iterations at once (0: one per hardware thread); the
  // result is the same for any count. >= 0.
  int threads = 1;
  // Called after each point: (points done, points in all), from the thread that finished
  // it, one call at a time. May be empty.
  std::function<void(int, int)> progress;
  void validate() const;  // throws InvalidArgument naming the field
};

struct TunePoint {
  std::string strategy;
  TuneLayout layout;
  std::int64_t micro_batch_size = 0;    // packing-megatron; 0 = the strategy's choice
  std::optional<Recompute> recompute;   // packing-megatron; unset = chosen per iteration
  std::string schedule;                 // the first iteration's (first replica's) schedule
  double est_tokens_per_s = 0;          // real tokens / estimated time over the batches
  double est_iteration_ms = 0;          // mean
  double padding_efficiency = 0;
  double mean_planning_ms = 0;
};

struct TuneResult {
  std::vector<TuneLayout> layouts;               // every layout searched
  std::map<std::string, TunePoint> best;         // per strategy with a feasible point
  std::map<std::string, int> points_tried, points_feasible;  // per strategy
  std::vector<TunePoint> feasible;               // every feasible point, in search order
};

// Layouts of `gpus` devices for `model`: tp dividing the GPU count, the heads and the ffn
// width; pp dividing the rest, at most the layer count; dp the remainder. Ordered by tp,
// then pp. Throws InvalidArgument when gpus < 1.
std::vector<TuneLayout> tune_layouts(const ModelSpec& model, int gpus);

// Runs the search over `samples` (file order; `truncated` as Dataset::truncated_ids()).
// Layouts whose tp the cost model has no data for (a100-measured at tp 16) are left out;
// points whose plan is infeasible (memory) or unsupported are skipped; other errors
// propagate. Deterministic.
TuneResult tune(const std::vector<Sample>& samples, const std::vector<SampleId>& truncated,
                const TuneOptions& options);

}  // namespace dynapipe
