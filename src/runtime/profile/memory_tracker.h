// MemoryTracker: bytes allocated by LibTorch's CPU allocator on this thread, and their
// peak, while a measurement runs. Private to runtime/.
//
// LibTorch 1.13 has no CPU allocator statistics in C++, but its default CPU allocator
// reports every allocation and free (with the size) to the memory-profiling hook
// c10::MemoryReportingInfoBase found in the thread's debug info. We install ourselves as
// that hook, the way the autograd profiler does with profile_memory=True. Allocations
// made while tracking is off are invisible; freeing one while it is on only makes
// LibTorch log a warning, so callers create and free a measurement's tensors inside
// one tracked window.
//
//   MemoryTracker tracker;             // installed on this thread until destroyed
//   tracker.start();                   // current = peak = 0
//   ...forward / backward...
//   tracker.current(); tracker.peak(); tracker.stop();
#pragma once

#include <cstdint>
#include <memory>

namespace dynapipe::runtime::profile {

class MemoryTracker {
 public:
  MemoryTracker();
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  void start();                      // zeroes both counters and starts counting
  void stop();                       // stops counting (counters keep their values)
  void reset_peak();                 // peak = current
  std::int64_t current() const;      // allocated minus freed since start()
  std::int64_t peak() const;         // most current() has been since start()/reset_peak()

 private:
  struct State;
  std::shared_ptr<State> state_;
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

}  // namespace dynapipe::runtime::profile
