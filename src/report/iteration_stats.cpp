#include "dynapipe/report/iteration_stats.h"

#include <algorithm>

namespace dynapipe {

ReplicaStats replica_stats(const ReplicaPlan& replica, int num_devices) {
  ReplicaStats stats;
  stats.makespan_ms = replica.est_iteration_ms;
  std::vector<double> busy(num_devices, 0.0);
  for (const TimedOp& op : replica.timeline) {
    if (op.device >= 0 && op.device < num_devices) busy[op.device] += op.end_ms - op.start_ms;
  }
  double total_busy = 0;
  for (double b : busy) total_busy += b;
  stats.ideal_ms = total_busy / num_devices;
  stats.busiest_ms = busy.empty() ? 0.0 : *std::max_element(busy.begin(), busy.end());
  stats.bubble_fraction =
      stats.makespan_ms > 0 ? 1.0 - total_busy / (num_devices * stats.makespan_ms) : 0.0;
  stats.peak_memory_bytes = replica.est_peak_memory_bytes;
  return stats;
}

IterationStats iteration_stats(const IterationPlan& iteration, int num_devices) {
  IterationStats stats;
  stats.est_iteration_ms = iteration.est_iteration_ms;
  stats.peak_memory_bytes.assign(num_devices, 0);
  double slowest = -1;
  for (const ReplicaPlan& replica : iteration.replicas) {
    const ReplicaStats r = replica_stats(replica, num_devices);
    if (r.makespan_ms > slowest) {
      slowest = r.makespan_ms;
      stats.ideal_ms = r.ideal_ms;
      stats.busiest_ms = r.busiest_ms;
    }
    stats.bubble_fraction += r.bubble_fraction / iteration.replicas.size();
    for (int d = 0; d < num_devices && d < static_cast<int>(r.peak_memory_bytes.size()); ++d) {
      stats.peak_memory_bytes[d] = std::max(stats.peak_memory_bytes[d], r.peak_memory_bytes[d]);
    }
    for (const MicroBatch& mb : replica.microbatches) {
      stats.real_tokens += mb.real_tokens;
      stats.computed_tokens += mb.shape.tokens();
      ++stats.num_microbatches;
    }
  }
  return stats;
}

}  // namespace dynapipe
