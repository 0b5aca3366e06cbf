#include "dynapipe/core/parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "dynapipe/core/error.h"

namespace dynapipe {

int resolve_thread_count(int threads) {
  DYNAPIPE_CHECK(threads >= 0, cat("thread count ", threads, " < 0"));
  if (threads > 0) return threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int checked_thread_count(int threads, std::string_view name) {
  if (threads < 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat(name, " must be >= 0 (0: one per hardware thread), got ", threads));
  }
  return threads;
}

std::vector<std::exception_ptr> run_indexed(std::size_t count, int threads,
                                            const std::function<void(std::size_t)>& task,
                                            const std::function<bool(std::size_t)>& skip) {
  std::vector<std::exception_ptr> errors(count);
  std::atomic<std::size_t> next{0};
  // Each index is taken once; its slot in `errors` is written by the one thread that took it.
  auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
      if (skip && skip(i)) continue;
      try {
        task(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const std::size_t workers =
      std::min<std::size_t>(static_cast<std::size_t>(resolve_thread_count(threads)), count);
  if (workers <= 1) {
    work();
    return errors;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (std::size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();  // the caller's thread is one of the workers
  for (std::thread& thread : pool) thread.join();
  return errors;
}

}  // namespace dynapipe
