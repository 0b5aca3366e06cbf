#include "dynapipe/core/parallel.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "dynapipe/core/error.h"

namespace dynapipe {
namespace {

TEST(ParallelTest, EveryIndexRunsOnceAndWritesItsOwnSlot) {
  for (int threads : {1, 2, 3, 8}) {
    std::vector<int> out(100, -1);
    std::atomic<int> calls{0};
    const auto errors = run_indexed(out.size(), threads, [&](std::size_t i) {
      ++calls;
      out[i] = static_cast<int>(i * i);
    });
    EXPECT_EQ(calls.load(), 100) << threads << " threads";
    ASSERT_EQ(errors.size(), 100u);
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i], static_cast<int>(i * i)) << i;
      EXPECT_FALSE(errors[i]) << i;
    }
  }
}

// Runs `threads` tasks on `threads` threads, each waiting (up to 10 s) until all run at
// once: with the threads asked for, every task runs on its own; fewer time out and show
// fewer. Each task calls also() first. Returns the threads' ids.
template <typename Also>
std::set<std::thread::id> ids_of_tasks_that_meet(int threads, Also&& also) {
  std::mutex mutex;
  std::set<std::thread::id> ids;
  std::atomic<int> running{0};
  run_indexed(static_cast<std::size_t>(threads), threads, [&](std::size_t) {
    also();
    {
      std::lock_guard lock(mutex);
      ids.insert(std::this_thread::get_id());
    }
    ++running;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (running.load() < threads && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  });
  return ids;
}

TEST(ParallelTest, UsesAsManyThreadsAsAskedAndOneMeansTheCallersThread) {
  for (int threads : {1, 3}) {
    const std::set<std::thread::id> ids = ids_of_tasks_that_meet(threads, [] {});
    EXPECT_EQ(ids.size(), static_cast<std::size_t>(threads));
    if (threads == 1) {
      EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
    }
  }
}

// Counts the threads that ended after touching it (its destructor runs as a thread ends).
std::atomic<int> g_threads_ended{0};
struct EndCounter {
  bool touched = false;
  ~EndCounter() {
    if (touched) ++g_threads_ended;
  }
};
thread_local EndCounter t_end_counter;

// The threads a call helps itself with stay for the next call (their allocator caches
// stay warm), and a task may call run_indexed() itself.
TEST(ParallelTest, HelperThreadsLastAcrossCallsAndNestedCallsFinish) {
  const int ended_before = g_threads_ended.load();
  for (int call = 0; call < 10; ++call) {
    EXPECT_EQ(ids_of_tasks_that_meet(2, [] { t_end_counter.touched = true; }).size(), 2u) << call;
  }
  EXPECT_EQ(g_threads_ended.load(), ended_before);  // no helper thread ended

  for (int round = 0; round < 50; ++round) {
    std::vector<std::vector<int>> out(4, std::vector<int>(8, 0));
    const auto errors = run_indexed(out.size(), 2, [&](std::size_t i) {
      const auto inner = run_indexed(out[i].size(), 2, [&](std::size_t j) { out[i][j] = 1; });
      for (const std::exception_ptr& e : inner) {
        if (e) std::rethrow_exception(e);
      }
    });
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_FALSE(errors[i]) << round << " " << i;
      EXPECT_EQ(out[i], std::vector<int>(8, 1)) << round << " " << i;
    }
  }
}

// A forked child has none of the pool's threads: its calls still run every task (on
// threads of its own), and it exits through the static destructors without joining the
// parent's threads (a hang there ends in SIGALRM).
TEST(ParallelTest, AForkedChildRunsTasksAndExits) {
  // The pool has a helper now, one that has run a task: the two tasks wait for each other.
  // A helper still starting when fork() runs may hold the allocator's lock, and the child's
  // first allocation then never returns: under AddressSanitizer, whose allocator has no
  // fork handler, 7 of 40 runs hung on a loaded machine while this call ran no task.
  std::atomic<int> arrived{0};
  run_indexed(2, 2, [&](std::size_t) {
    ++arrived;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  });
  ASSERT_EQ(arrived.load(), 2);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(10);
    std::vector<int> out(16, 0);
    run_indexed(out.size(), 2, [&](std::size_t i) { out[i] = 1; });
    std::exit(out == std::vector<int>(16, 1) ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ParallelTest, ExceptionsAreKeptPerIndexAndTheOthersStillRun) {
  std::vector<int> out(10, 0);
  const auto errors = run_indexed(out.size(), 3, [&](std::size_t i) {
    if (i == 3 || i == 7) throw std::runtime_error("task " + std::to_string(i));
    out[i] = 1;
  });
  for (std::size_t i = 0; i < out.size(); ++i) {
    const bool failed = i == 3 || i == 7;
    EXPECT_EQ(static_cast<bool>(errors[i]), failed) << i;
    EXPECT_EQ(out[i], failed ? 0 : 1) << i;
  }
  try {
    std::rethrow_exception(errors[3]);
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "task 3");
  }
}

TEST(ParallelTest, SkippedIndicesDoNotRun) {
  std::vector<int> out(20, 0);
  const auto errors = run_indexed(
      out.size(), 2, [&](std::size_t i) { out[i] = 1; }, [](std::size_t i) { return i % 2 == 1; });
  for (std::size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i], i % 2 == 0 ? 1 : 0) << i;
    EXPECT_FALSE(errors[i]);
  }
}

TEST(ParallelTest, NoTasksAndZeroThreads) {
  EXPECT_TRUE(run_indexed(0, 4, [](std::size_t) { FAIL(); }).empty());
  EXPECT_GE(resolve_thread_count(0), 1);
  EXPECT_EQ(resolve_thread_count(5), 5);
  EXPECT_EQ(checked_thread_count(0, "--threads"), 0);
  try {
    checked_thread_count(-2, "--threads");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_STREQ(e.what(), "--threads must be >= 0 (0: one per hardware thread), got -2");
  }
  std::atomic<int> calls{0};
  run_indexed(7, 0, [&](std::size_t) { ++calls; });  // 0: one per hardware thread
  EXPECT_EQ(calls.load(), 7);
}

}  // namespace
}  // namespace dynapipe
