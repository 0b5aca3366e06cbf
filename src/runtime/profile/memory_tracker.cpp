// MemoryTracker (memory_tracker.h): a c10::MemoryReportingInfoBase pushed into this
// thread's debug info as the profiler state, which LibTorch's CPU allocator calls on
// every allocation (+bytes) and free (-bytes) while memoryProfilingEnabled() is true.
#include "runtime/profile/memory_tracker.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>

namespace dynapipe::runtime::profile {

struct MemoryTracker::State : c10::MemoryReportingInfoBase {
  bool on = false;
  std::int64_t current = 0, peak = 0;
  void reportMemoryUsage(void*, std::int64_t alloc_size, std::int64_t, std::int64_t,
                         c10::Device) override {
    current += alloc_size;
    peak = std::max(peak, current);
  }
  bool memoryProfilingEnabled() const override { return on; }
};

struct MemoryTracker::Guard {
  explicit Guard(std::shared_ptr<State> state)
      : guard(c10::DebugInfoKind::PROFILER_STATE, std::move(state)) {}
  c10::DebugInfoGuard guard;
};

MemoryTracker::MemoryTracker()
    : state_(std::make_shared<State>()), guard_(std::make_unique<Guard>(state_)) {}
MemoryTracker::~MemoryTracker() = default;

void MemoryTracker::start() {
  state_->current = state_->peak = 0;
  state_->on = true;
}
void MemoryTracker::stop() { state_->on = false; }
void MemoryTracker::reset_peak() { state_->peak = state_->current; }
std::int64_t MemoryTracker::current() const { return state_->current; }
std::int64_t MemoryTracker::peak() const { return state_->peak; }

}  // namespace dynapipe::runtime::profile
