// PlanAhead: planning workers on rank 0 that plan, encode and publish iterations ahead
// of training (docs/runtime.md, "Planning ahead"). Torch-free.
//
// Iterations [first, end) are handed out in order to `threads` workers; a worker may start
// iteration i only while i <= consumer + ahead, where `consumer` is the step rank 0 is
// training (advance()). A worker's exception is stored (the earliest iteration's wins)
// and published to the plan store as the job's failure (so every rank waiting for a plan
// fails fast) once every earlier iteration's plan is in the store: all ranks train up to
// the failed iteration and stop there together. check(step) rethrows it on the consumer's
// thread from that step on. The destructor stops and joins.
//
//   PlanAhead ahead(store, produce, /*first=*/0, /*end=*/steps, /*ahead=*/2, /*threads=*/2);
//   for (step ...) { ahead.advance(step); ahead.check(step); bytes = store.get(step, ...); }
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
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
  // Rethrows the worker exception of an iteration <= step, if any.
  void check(std::int64_t step);

 private:
  void work();
  PlanStore& store_;
  std::function<std::string(std::int64_t)> produce_;
  std::int64_t next_, end_, consumer_;
  int ahead_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::set<std::int64_t> planning_;  // iterations a worker holds
  std::exception_ptr error_;
  std::int64_t error_iteration_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace dynapipe::runtime
