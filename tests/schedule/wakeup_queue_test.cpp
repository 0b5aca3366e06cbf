// The list schedules' wake-up queue pops (time, device) pairs exactly as one min-heap of
// the pairs does: earliest first, ties by the lower device, repeats kept.
#include <gtest/gtest.h>

#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "dynapipe/core/rng.h"
#include "schedule/builders.h"

namespace dynapipe {
namespace {

using detail::WakeupQueue;

TEST(WakeupQueueTest, PopsAsAHeapOfPairsDoes) {
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng(seed);
    const int devices = static_cast<int>(rng.uniform_int(1, 13));
    WakeupQueue queue(devices);
    using Pair = std::pair<double, int>;
    std::priority_queue<Pair, std::vector<Pair>, std::greater<>> heap;
    for (int d = 0; d < devices; ++d) heap.emplace(0.0, d);
    double now = 0;
    for (int step = 0; step < 400; ++step) {
      // Pushes at or after the last pop, as the builders make them, on a coarse grid so
      // that equal times (and exact repeats) are common.
      if (heap.empty() || rng.uniform(0, 1) < 0.55) {
        const double time_ms = now + static_cast<double>(rng.uniform_int(0, 6));
        const int device = static_cast<int>(rng.uniform_int(0, devices - 1));
        queue.push(time_ms, device);
        heap.emplace(time_ms, device);
        continue;
      }
      ASSERT_FALSE(queue.empty()) << "seed " << seed << " step " << step;
      const Pair expected = heap.top();
      heap.pop();
      ASSERT_EQ(queue.pop(), expected) << "seed " << seed << " step " << step;
      now = expected.first;
    }
    while (!heap.empty()) {
      ASSERT_EQ(queue.pop(), heap.top()) << "seed " << seed;
      heap.pop();
    }
    EXPECT_TRUE(queue.empty()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace dynapipe
