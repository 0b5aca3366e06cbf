// Statistics of planned iterations for reports: bubbles, the ideal lower bound, memory.
#pragma once

#include <cstdint>
#include <vector>

#include "dynapipe/plan/execution_plan.h"

namespace dynapipe {

struct ReplicaStats {
  double makespan_ms = 0;
  double ideal_ms = 0;          // Σ op durations / devices: no bubble, perfect balance
  double busiest_ms = 0;        // the busiest device's Σ op durations: no bubble, this split
  double bubble_fraction = 0;   // 1 − Σ busy / (devices · makespan)
  std::vector<std::int64_t> peak_memory_bytes;  // [device]
};

// From a replica's simulated timeline.
ReplicaStats replica_stats(const ReplicaPlan& replica, int num_devices);

struct IterationStats {
  double est_iteration_ms = 0;  // slowest replica
  double ideal_ms = 0;          // of the slowest replica
  double busiest_ms = 0;        // of the slowest replica
  double bubble_fraction = 0;   // mean over replicas
  std::vector<std::int64_t> peak_memory_bytes;  // [device], max over replicas
  std::int64_t real_tokens = 0;
  std::int64_t computed_tokens = 0;
  std::int64_t num_microbatches = 0;  // over all replicas
};

IterationStats iteration_stats(const IterationPlan& iteration, int num_devices);

}  // namespace dynapipe
