// Planner: GlobalBatch -> IterationPlan. The one entry point the CLI, the runtime and
// the Python bindings call.
//
// For each global batch: split across replicas and into micro-batches (batching/),
// choose schedule x recompute by simulation (schedule/), lower to per-executor
// instruction lists and verify them (plan/). Deterministic: the same config and batch
// give the same plan bytes. plan_iteration() is const and thread-safe, so planning
// workers can run ahead of training on several threads.
//
//   Planner planner(config);                       // throws on a bad config
//   IterationPlan it = planner.plan_iteration(batch);
#pragma once

#include <memory>
#include <vector>

#include "dynapipe/core/sample.h"
#include "dynapipe/cost/calibration.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/data/truncation.h"
#include "dynapipe/plan/execution_plan.h"

namespace dynapipe {

struct PlannerOptions {
  // Keep one stage layout for every iteration: `--schedule auto` then never picks the
  // interleaved schedule (its layer placement differs), so a training run's executors
  // keep their layers. `plan` and `simulate` leave it off. Default: false.
  bool fixed_layout = false;
  // Verify every lowered plan (deadlock freedom, dependencies, buffers). Default: true.
  bool verify = true;
  // Scale the cost model's times by these measured factors (`train --refine-cost-model`);
  // read at every plan_iteration(), so plans follow the calibration as it learns. Needs
  // config.pp stages; the interleaved model, if any, stays uncalibrated. Default: none.
  std::shared_ptr<const CostCalibration> calibration;
  // dynapipe only: besides the full memory budget, also run the DP with these shares of
  // the activation budget (memory limit minus static memory) and keep the plan that
  // simulates fastest. The DP sizes micro-batches to the 1F1B memory rule; schedules that
  // keep more micro-batches in flight (zb1p, cyclic) may fit only smaller ones.
  std::vector<double> activation_budget_shares = {};
  // dynapipe and dynapipe-padded: plan the cuts for the schedule (docs/batching.md,
  // "Schedule-aware DP"). `--schedule auto` runs one DP per schedule family — 1F1B's
  // memory rule and bubble, zb1p's (p in flight everywhere, a shorter bubble) and
  // interleaved's — and keeps the pair that simulates fastest; a named schedule plans
  // for its own rule. false: the 1F1B rule only, whatever the schedule. Default: true.
  bool schedule_aware_dp = true;
  // dynapipe: also simulate the chosen cuts reordered slowest first with the fastest
  // micro-batch split into a head and a tail (batching/head_tail.h), and keep the faster
  // plan. Default: true.
  bool head_and_tail = true;
  // dynapipe: also cut the sorted order by dynapipe-padded's DP under the best-ranked
  // plan's memory rule and bubble weight, run those micro-batches varlen
  // (BatchingOptions::varlen_padded_cut), and search them in full when they rank among
  // the best, besides the usual three. Default: true.
  bool padded_cut = true;
  // dynapipe: also simulate packing-varlen's and token-based's micro-batches (cut by
  // those strategies under their own 1F1B rule) run varlen, one block-diagonal row each
  // (batching/varlen_regroup.h), ranked by a quick search, each searched again with
  // permuted orders when it comes within 10% of the best full result (2% where that plan
  // idles at most 15%; docs/batching.md "Baseline cuts"). Default: true.
  bool baseline_cuts = true;
  // Every strategy (dynapipe also on the baseline cut it searched in full): where the best
  // plan's devices idle more than a fifth of its makespan (fill, drain, stalls between
  // unequal micro-batches), search its cut once more — every schedule of its row, in its
  // recompute mode — with this many seeded random micro-batch orders too
  // (SearchOptions::random_orders, for the schedules whose orders the search permutes)
  // and keep the faster plan. 0: off. Default: 8 (T5-11B pp 8 at
  // max seqlen 1024: 3558 → 3485 ms).
  int random_orders = 8;
  // Threads one plan_iteration() may use (0: one per hardware thread): dynapipe's first
  // DPs of each varlen order run side by side. The plan is the same for any count.
  // Default: 1.
  int threads = 1;
};

class Planner {
 public:
  // Validates the config (throws InvalidArgument/NotFound/Infeasible naming the value),
  // builds the cost model(s).
  explicit Planner(const PlanConfig& config, const PlannerOptions& options = {});
  ~Planner();
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // The config as planned: memory limit resolved, chunks set when interleaving applies.
  const PlanConfig& config() const;
  const CostModel& cost_model() const;       // calibrated, when a calibration is given
  const CostModel& base_cost_model() const;  // as configured, never calibrated
  // The layers of every (virtual) stage plans use: pp entries, or pp x chunks when the
  // config asks for the interleaved schedule. Stage models must be built from these.
  const std::vector<StageLayers>& stage_layers() const;
  // One line when --max-seqlen (T5: or --max-target-len) lies past a profile's measured
  // lengths (CostModel::extrapolation_warning); empty otherwise. plan and train print it.
  std::string extrapolation_warning() const;

  // Plans one iteration. Throws Infeasible (naming micro-batch, stage and bytes) when no
  // schedule x recompute fits the memory limit.
  IterationPlan plan_iteration(const GlobalBatch& batch) const;
  // The same on `threads` threads (0: one per hardware thread) instead of
  // PlannerOptions::threads: the same plan, or the same error, for any count. A negative
  // count throws InvalidArgument (as PlannerOptions::threads does in the constructor).
  IterationPlan plan_iteration(const GlobalBatch& batch, int threads) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The truncation limits `config` describes (model kind, --max-seqlen, --max-target-len),
// for Dataset::load: every loader of a plan's data truncates the same way.
TruncationLimits truncation_limits(const PlanConfig& config);

// Summary over planned iterations (means, p99 planning time, tokens/s).
PlanSummary summarize(const std::vector<IterationPlan>& iterations);

}  // namespace dynapipe
