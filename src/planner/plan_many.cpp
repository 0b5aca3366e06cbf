#include "dynapipe/planner/plan_many.h"

#include <atomic>
#include <limits>
#include <mutex>
#include <optional>

#include "dynapipe/core/parallel.h"

namespace dynapipe {

std::vector<PlannedIterations> plan_many(std::span<const PlanRequest> requests, int threads,
                                         const PlanProgress& progress) {
  struct Task {
    std::size_t request, iteration;
  };
  std::vector<Task> tasks;
  std::vector<std::vector<std::optional<IterationPlan>>> plans(requests.size());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    plans[r].resize(requests[r].batches.size());
    for (std::size_t i = 0; i < requests[r].batches.size(); ++i) tasks.push_back({r, i});
  }
  // Per request: the smallest iteration that failed so far (later ones need not run), and
  // how many of its iterations are still to end.
  std::vector<std::atomic<std::size_t>> failed_at(requests.size());
  std::vector<std::size_t> left(requests.size());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    failed_at[r] = std::numeric_limits<std::size_t>::max();
    left[r] = requests[r].batches.size();
  }
  std::mutex progress_mutex;
  auto ended = [&](std::size_t r) {
    const std::lock_guard lock(progress_mutex);
    --left[r];
    if (progress) progress(r, left[r]);
  };
  // Fewer iterations than threads: each plan takes a share of the rest (the same plans).
  const std::size_t pool = static_cast<std::size_t>(resolve_thread_count(threads));
  const int per_plan = tasks.empty() || tasks.size() >= pool ? 1 : static_cast<int>(pool / tasks.size());
  const std::vector<std::exception_ptr> errors = run_indexed(
      tasks.size(), threads,
      [&](std::size_t t) {
        const auto [r, i] = tasks[t];
        try {
          plans[r][i] = requests[r].planner->plan_iteration(requests[r].batches[i], per_plan);
        } catch (...) {
          std::size_t seen = failed_at[r].load();
          while (i < seen && !failed_at[r].compare_exchange_weak(seen, i)) {
          }
          ended(r);
          throw;
        }
        ended(r);
      },
      [&](std::size_t t) {
        const auto [r, i] = tasks[t];
        if (i <= failed_at[r].load()) return false;
        ended(r);
        return true;
      });

  std::vector<PlannedIterations> out(requests.size());
  for (std::size_t t = 0; t < tasks.size(); ++t) {  // in order: each request's first failure
    PlannedIterations& result = out[tasks[t].request];
    if (errors[t] && !result.error) result.error = errors[t];
  }
  for (std::size_t r = 0; r < requests.size(); ++r) {
    if (out[r].error) continue;
    out[r].iterations.reserve(plans[r].size());
    for (std::optional<IterationPlan>& plan : plans[r]) out[r].iterations.push_back(std::move(*plan));
  }
  return out;
}

}  // namespace dynapipe
