// Many planners' iterations at once: the pool behind `--planner-threads` of `plan`,
// `simulate` and `tune` (docs/cli.md).
//
//   std::vector<PlanRequest> requests = {{&planner_a, batches}, {&planner_b, batches}};
//   std::vector<PlannedIterations> out = plan_many(requests, /*threads=*/0);
//   if (out[1].error) std::rethrow_exception(out[1].error);
//
// Planner::plan_iteration() is const and thread-safe: every request's iterations go to one
// pool of run_indexed() (core/parallel.h) and come back in order, so the result is the
// same for any thread count. A request's error is its first failing iteration's, the one a
// run in order would have thrown; its later iterations are not planned once one failed.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <span>
#include <vector>

#include "dynapipe/core/sample.h"
#include "dynapipe/plan/execution_plan.h"
#include "dynapipe/planner/planner.h"

namespace dynapipe {

struct PlanRequest {
  const Planner* planner = nullptr;    // not null; outlives the call
  std::span<const GlobalBatch> batches;  // planned in order; outlive the call
};

struct PlannedIterations {
  std::vector<IterationPlan> iterations;  // one per batch, in order (empty on error)
  std::exception_ptr error;               // the first failing iteration's, or null
};

// Called once per iteration of every request when it has ended (planned, failed or
// skipped after an earlier failure), one call at a time: the request's index and how many
// of its iterations are still to end (0: the request is done).
using PlanProgress = std::function<void(std::size_t request, std::size_t left)>;

// Plans every request's batches on `threads` threads (0: one per hardware thread), one
// iteration per thread; with fewer iterations than threads, each plan runs on its share
// of them (Planner::plan_iteration(batch, threads), the planners' own
// PlannerOptions::threads set aside). The plans do not depend on the count.
std::vector<PlannedIterations> plan_many(std::span<const PlanRequest> requests, int threads,
                                         const PlanProgress& progress = {});

}  // namespace dynapipe
