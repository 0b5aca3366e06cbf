// Independent tasks on a few threads, with results as if they had run in order.
//
//   std::vector<Result> out(n);
//   const std::vector<std::exception_ptr> errors =
//       run_indexed(n, threads, [&](std::size_t i) { out[i] = compute(i); });
//   for (std::size_t i = 0; i < n; ++i) if (errors[i]) std::rethrow_exception(errors[i]);
//
// Indices are handed out in increasing order and each task writes only its own slot, so
// what the caller assembles does not depend on the thread count. plan_many()
// (planner/plan_many.h) plans iterations this way for `plan`, `simulate` and `tune`
// (docs/cli.md, --planner-threads).
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <string_view>
#include <vector>

namespace dynapipe {

// `threads` as a thread count: 0 means one per hardware thread (at least 1).
// REQUIRES: threads >= 0.
int resolve_thread_count(int threads);

// A thread count given as `name` (e.g. a flag), checked: throws InvalidArgument
// "<name> must be >= 0 (0: one per hardware thread), got <threads>" unless threads >= 0.
int checked_thread_count(int threads, std::string_view name);

// Runs task(i) for every i in [0, count) on min(resolve_thread_count(threads), count)
// threads (one: the caller's thread, no thread is started). The caller's thread is one of
// them; the others come from a process-wide pool that keeps its threads, idle, between
// calls (as many as the most that calls have used at once; a forked child starts with
// none), so tasks find their allocator's caches warm. An exception a task throws is
// kept for its index; the result holds one entry per index (null: the task returned, or was
// skipped). skip(i), when given, is asked just before task i would start (on the thread that
// would run it): true drops it, e.g. work a failure at a smaller index made useless.
// Returns once every task has ended.
std::vector<std::exception_ptr> run_indexed(std::size_t count, int threads,
                                            const std::function<void(std::size_t)>& task,
                                            const std::function<bool(std::size_t)>& skip = {});

}  // namespace dynapipe
