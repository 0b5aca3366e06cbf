#include "dynapipe/core/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
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

namespace {

// Threads kept across run_indexed() calls. Started per call, a plan's helper thread came
// to a cold allocator every time: on jemalloc a fresh thread's allocations faulted new
// pages in (GPT-6.7B short256 plans on two threads: ~170 page faults a plan, ~1 ms on
// this VM; planning ahead ~340), which a thread that stays keeps warm.
class HelperPool {
 public:
  static HelperPool& instance() {
    static HelperPool pool;
    return pool;
  }

  HelperPool() {
    // A forked child (a Python process forking workers, say) has none of the pool's
    // threads, and its copies of the locks may show waiters that are not there: it leaves
    // the parent's state alone, never joined, and starts an empty one.
    pthread_atfork([] { instance().state_->mutex.lock(); }, [] { instance().state_->mutex.unlock(); },
                   [] { instance().state_ = new State; });
  }

  ~HelperPool() {
    {
      const std::lock_guard lock(state_->mutex);
      state_->stopping = true;
    }
    state_->wake.notify_all();
    for (std::thread& thread : state_->threads) thread.join();
    delete state_;
  }

  // Runs work() on the calling thread and on up to `helpers` pool threads, starting more
  // where fewer are idle (nested calls get their own), and returns once every thread
  // that began work() has returned from it. work() must not throw.
  void run(std::size_t helpers, const std::function<void()>& work) {
    State& state = *state_;
    Job job{&work, helpers, 0};
    {
      const std::lock_guard lock(state.mutex);
      state.jobs.push_back(&job);
      while (state.idle + state.starting < helpers) {
        state.threads.emplace_back([&state] { serve(state); });
        ++state.starting;
      }
    }
    state.wake.notify_all();
    work();
    std::unique_lock lock(state.mutex);
    job.unclaimed = 0;  // no helper starts it from here on
    std::erase(state.jobs, &job);
    state.done.wait(lock, [&] { return job.running == 0; });
  }

 private:
  struct Job {
    const std::function<void()>* work;
    std::size_t unclaimed;  // helpers it may still take
    std::size_t running;    // helpers inside work()
  };
  struct State {
    std::mutex mutex;
    std::condition_variable wake, done;
    std::vector<Job*> jobs;
    std::vector<std::thread> threads;
    std::size_t idle = 0;      // threads waiting for a job
    std::size_t starting = 0;  // threads started that have not begun waiting
    bool stopping = false;

    Job* claimable() const {
      for (Job* job : jobs) {
        if (job->unclaimed > 0) return job;
      }
      return nullptr;
    }
  };

  static void serve(State& state) {
    std::unique_lock lock(state.mutex);
    --state.starting;
    ++state.idle;
    for (;;) {
      state.wake.wait(lock, [&] { return state.stopping || state.claimable() != nullptr; });
      if (state.stopping) return;
      Job* job = state.claimable();
      --job->unclaimed;
      ++job->running;
      --state.idle;
      lock.unlock();
      (*job->work)();
      lock.lock();
      ++state.idle;
      if (--job->running == 0) state.done.notify_all();
    }
  }

  State* state_ = new State;  // replaced, not freed, in a forked child
};

}  // namespace

std::vector<std::exception_ptr> run_indexed(std::size_t count, int threads,
                                            const std::function<void(std::size_t)>& task,
                                            const std::function<bool(std::size_t)>& skip) {
  std::vector<std::exception_ptr> errors(count);
  std::atomic<std::size_t> next{0};
  // Each index is taken once; its slot in `errors` is written by the one thread that took it.
  const std::function<void()> work = [&] {
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
  // The caller's thread is one of the workers.
  HelperPool::instance().run(workers - 1, work);
  return errors;
}

}  // namespace dynapipe
