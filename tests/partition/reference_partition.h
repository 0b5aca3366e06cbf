// Test reference for the partitioner: PipeDream's objective restated for one explicit
// partition (one level), and a brute force over every partition of a small graph.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "dynapipe/partition/antichain_dag.h"

namespace dynapipe::testing {

struct StageChoice {
  int first = 0, end = 0;  // antichain states [first, end)
  int replicas = 1;
  bool operator==(const StageChoice&) const = default;
};

// Seconds per input of `stages` on `workers` at `bandwidth`, or NaN when the stages do not
// tile the states along the antichain DAG, the replicas do not add up, or memory overflows.
inline double evaluate_partition(const AntichainDag& dag, int workers, double bandwidth,
                                 std::optional<double> memory_limit,
                                 const std::vector<StageChoice>& stages) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int count = static_cast<int>(dag.states.size());
  auto cumulative = [&](int state, double AntichainState::*field) {
    return state < 0 ? 0.0 : dag.states[state].*field;
  };
  int used = 0;
  double worst = 0;
  for (std::size_t t = 0; t < stages.size(); ++t) {
    const StageChoice& s = stages[t];
    const int before = s.first - 1, last = s.end - 1;
    if (s.replicas < 1 || s.end <= s.first) return nan;
    if (t == 0 ? s.first != 0 : s.first != stages[t - 1].end) return nan;
    if (before >= 0 && !std::binary_search(dag.states[last].ancestors.begin(),
                                           dag.states[last].ancestors.end(), before)) {
      return nan;
    }
    used += s.replicas;
    const double compute = cumulative(last, &AntichainState::compute_s) - cumulative(before, &AntichainState::compute_s);
    const double params =
        cumulative(last, &AntichainState::parameter_bytes) - cumulative(before, &AntichainState::parameter_bytes);
    const double activations =
        cumulative(last, &AntichainState::activation_bytes) - cumulative(before, &AntichainState::activation_bytes);
    const int r = s.replicas;
    if (memory_limit) {
      const std::int64_t stashed = (workers - used + r - 1) / r;
      if (static_cast<double>(std::max<std::int64_t>(stashed, 1)) * (params + activations) > *memory_limit) return nan;
    }
    worst = std::max(worst, (compute + 4.0 * (r - 1) * params / (bandwidth * r)) / r);
    if (t > 0) {
      worst = std::max(worst, 2.0 * dag.states[before].output_activation_bytes / (bandwidth * r));
      if (last < count - 1) worst = std::max(worst, 2.0 * dag.states[last].output_activation_bytes / (bandwidth * r));
    }
  }
  if (stages.empty() || stages.back().end != count || used != workers) return nan;
  return worst;
}

// The best evaluate_partition over every chain of states and every split of the workers.
inline double brute_force_partition(const AntichainDag& dag, int workers, double bandwidth,
                                    std::optional<double> memory_limit, bool straight) {
  const int count = static_cast<int>(dag.states.size());
  double best = std::numeric_limits<double>::quiet_NaN();
  std::vector<StageChoice> stages;
  std::function<void(int, int)> extend = [&](int first, int workers_left) {
    if (first == count) {
      if (workers_left != 0) return;
      const double time = evaluate_partition(dag, workers, bandwidth, memory_limit, stages);
      if (!std::isnan(time) && (std::isnan(best) || time < best)) best = time;
      return;
    }
    for (int end = first + 1; end <= count; ++end) {
      for (int r = 1; r <= std::min(straight ? 1 : workers_left, workers_left); ++r) {
        stages.push_back({first, end, r});
        extend(end, workers_left - r);
        stages.pop_back();
      }
    }
  };
  extend(0, workers);
  return best;
}

}  // namespace dynapipe::testing
