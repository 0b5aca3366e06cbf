// PlanAhead: planning workers on rank 0 that plan, encode and publish iterations ahead
// of training (docs/runtime.md, "Planning ahead"). Torch-free.
//
// Iterations [first, end) are handed out in order to `threads` workers; a worker may start
// iteration i only while i <= consumer + ahead, where `consumer` is the step rank 0 is
// training (advance()). A worker's exception is stored (the first one wins), published
// to the plan store as the job's failure (so every rank waiting for a plan fails fast),
// and rethrown by check() on the consumer's thread. The destructor stops and joins.
//
//   PlanAhead ahead(store, produce, /*first=*/0, /*end=*/steps, /*ahead=*/2, /*threads=*/2);
//   for (step ...) { ahead.advance(step); ahead.check(); bytes = store.get(step, ...); }
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dynapipe/runtime/plan_store.h"

namespace dynapipe::runtime {

class PlanAhead {
 public:
  // `produce(i)` returns the encoded plan of iteration i; must be thread-safe.
  PlanAhead(PlanStore& store, std::function<std::string(std::int64_t)> produce, std::int64_t first,
            std::int64_t end, int ahead, int threads);
  ~PlanAhead();
  PlanAhead(const PlanAhead&) = delete;
  PlanAhead& operator=(const PlanAhead&) = delete;

  void advance(std::int64_t consumer_step);
  // Rethrows the first worker exception, if any.
  void check();
  bool failed();

 private:
  void work();
  PlanStore& store_;
  std::function<std::string(std::int64_t)> produce_;
  std::int64_t next_, end_, consumer_;
  int ahead_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

}  // namespace dynapipe::runtime
