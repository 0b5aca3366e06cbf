#include "runtime/exec/plan_ahead.h"

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {

PlanAhead::PlanAhead(PlanStore& store, std::function<std::string(std::int64_t)> produce,
                     std::int64_t first, std::int64_t end, int ahead, int threads)
    : store_(store), produce_(std::move(produce)), next_(first), end_(end), consumer_(first),
      ahead_(ahead) {
  DYNAPIPE_CHECK(ahead >= 1 && threads >= 1, cat("plan ahead ", ahead, " with ", threads, " threads"));
  for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { work(); });
}

PlanAhead::~PlanAhead() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& t : threads_) t.join();
}

void PlanAhead::advance(std::int64_t consumer_step) {
  {
    std::lock_guard lock(mutex_);
    consumer_ = std::max(consumer_, consumer_step);
  }
  changed_.notify_all();
}

void PlanAhead::check(std::int64_t step) {
  std::lock_guard lock(mutex_);
  if (error_ && error_iteration_ <= step) std::rethrow_exception(error_);
}

void PlanAhead::work() {
  while (true) {
    std::int64_t iteration;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] {
        return stopping_ || error_ || (next_ < end_ && next_ <= consumer_ + ahead_);
      });
      if (stopping_ || error_ || next_ >= end_) return;
      iteration = next_++;
      planning_.insert(iteration);
    }
    try {
      store_.put(iteration, produce_(iteration));
    } catch (const std::exception& e) {
      bool earliest;
      {
        std::unique_lock lock(mutex_);
        if (!error_ || iteration < error_iteration_) {
          error_ = std::current_exception();
          error_iteration_ = iteration;
        }
        changed_.notify_all();
        // Earlier iterations still being planned are put first: a rank that found the
        // failure instead of such a plan would leave its peers waiting in that step.
        changed_.wait(lock, [&] { return *planning_.begin() == iteration; });
        planning_.erase(iteration);
        earliest = error_iteration_ == iteration;
      }
      changed_.notify_all();
      if (!earliest) return;  // an earlier iteration failed too and reports itself
      try {
        store_.report_failure(cat("rank 0: planning iteration ", iteration, " failed: ", e.what()));
      } catch (...) {
        // The store is gone too; the consumer still rethrows the planning error.
      }
      return;
    }
    {
      std::lock_guard lock(mutex_);
      planning_.erase(iteration);
    }
    changed_.notify_all();
  }
}

}  // namespace dynapipe::runtime
