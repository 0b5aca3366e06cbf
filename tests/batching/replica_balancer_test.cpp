#include "dynapipe/batching/replica_balancer.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "dynapipe/core/rng.h"

namespace dynapipe {
namespace {

std::vector<double> replica_loads(const std::vector<double>& loads, const std::vector<int>& owner,
                                  int replicas) {
  std::vector<double> out(static_cast<std::size_t>(replicas), 0.0);
  for (std::size_t k = 0; k < loads.size(); ++k) out[static_cast<std::size_t>(owner[k])] += loads[k];
  return out;
}

TEST(ReplicaBalancerTest, ClassicKarmarkarKarpTwoWay) {
  // KK on {8,7,6,5,4}: 8−7 → 1, 6−5 → 1, then {4,1,1} → 4−1 → 3, 3−1 → 2: loads 16/14.
  const std::vector<double> loads{8, 7, 6, 5, 4};
  const std::vector<int> owner = balance_replicas(loads, 2);
  const std::vector<double> got = replica_loads(loads, owner, 2);
  EXPECT_DOUBLE_EQ(got[0], 16);
  EXPECT_DOUBLE_EQ(got[1], 14);
}

TEST(ReplicaBalancerTest, EveryItemOnceAndNearPerfectOnRandomLoads) {
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng(seed);
    const int replicas = static_cast<int>(rng.uniform_int(1, 8));
    std::vector<double> loads(static_cast<std::size_t>(rng.uniform_int(0, 60)));
    double sum = 0, max = 0;
    for (double& l : loads) {
      l = rng.uniform(0.5, 10.0);
      sum += l;
      max = std::max(max, l);
    }
    const std::vector<int> owner = balance_replicas(loads, replicas);
    ASSERT_EQ(owner.size(), loads.size());
    for (int r : owner) ASSERT_TRUE(r >= 0 && r < replicas);
    const std::vector<double> got = replica_loads(loads, owner, replicas);
    const double heaviest = *std::max_element(got.begin(), got.end());
    // Never worse than the LPT-style bound average + largest item.
    EXPECT_LE(heaviest, sum / replicas + max + 1e-9) << "seed " << seed;
    EXPECT_EQ(owner, balance_replicas(loads, replicas));  // deterministic
  }
}

}  // namespace
}  // namespace dynapipe
