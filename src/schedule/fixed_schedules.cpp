// The schedules whose order does not look at costs: GPipe, 1F1B, interleaved 1F1B.
#include <algorithm>
#include <utility>
#include <vector>

#include "schedule/builders.h"

namespace dynapipe::detail {
namespace {

ScheduleOrder empty_order(const PipelineProblem& problem) {
  ScheduleOrder order;
  order.device_ops.resize(problem.layout.num_devices);
  return order;
}

}  // namespace

ScheduleOrder build_gpipe(const PipelineProblem& problem) {
  ScheduleOrder order = empty_order(problem);
  const int m = problem.num_microbatches();
  const int stages = problem.num_stages();
  // (mb, stage) lexicographic is a topological order of the forwards, and (mb desc,
  // stage desc) of the backwards, so each device's subsequence cannot deadlock.
  for (int mb = 0; mb < m; ++mb) {
    for (int s = 0; s < stages; ++s) {
      order.device_ops[problem.layout.device_of(s)].push_back({mb, s, OpKind::F});
    }
  }
  for (int mb = m - 1; mb >= 0; --mb) {
    for (int s = stages - 1; s >= 0; --s) {
      order.device_ops[problem.layout.device_of(s)].push_back({mb, s, OpKind::B});
    }
  }
  return order;
}

ScheduleOrder build_1f1b(const PipelineProblem& problem) {
  ScheduleOrder order = empty_order(problem);
  const int m = problem.num_microbatches();
  const int num_devices = problem.layout.num_devices;
  for (int d = 0; d < num_devices; ++d) {
    auto& ops = order.device_ops[d];
    ops.reserve(2 * static_cast<std::size_t>(m));
    const int warmup = std::min(num_devices - d - 1, m);
    for (int mb = 0; mb < warmup; ++mb) ops.push_back({mb, d, OpKind::F});
    for (int i = 0; i < m - warmup; ++i) {
      ops.push_back({warmup + i, d, OpKind::F});
      ops.push_back({i, d, OpKind::B});
    }
    for (int mb = m - warmup; mb < m; ++mb) ops.push_back({mb, d, OpKind::B});
  }
  return order;
}

// Megatron's interleaved schedule (schedules.py, get_schedule_table): the forward
// sequence of every device walks a table of (micro-batch, chunk) in groups of D
// micro-batches — chunk 0 of the group, then chunk 1, ... — and the backward sequence
// walks the same table with chunks reversed. Device d warms up with
// 2 (D - d - 1) + (C - 1) D forwards, then alternates one forward and one backward,
// then cools down.
//
// m not a multiple of D: the table is padded with phantom micro-batches up to the next
// multiple of D (as the reference does) and their ops are dropped afterwards. A smaller
// last group with the same warm-up deadlocks (a device's first steady forward can need
// a later chunk from a device that is stuck in a backward); dropping phantoms cannot,
// because no real op depends on a phantom one, so the padded schedule's execution minus
// the phantoms is still an execution. The phantoms' slots cost nothing: the simulator
// runs each op as early as its inputs allow.
ScheduleOrder build_interleaved(const PipelineProblem& problem) {
  ScheduleOrder order = empty_order(problem);
  const int m = problem.num_microbatches();
  const int num_devices = problem.layout.num_devices;
  const int chunks = problem.layout.chunks;
  const int padded = (m + num_devices - 1) / num_devices * num_devices;
  std::vector<std::pair<int, int>> table;  // (mb, chunk) per virtual micro-batch step
  table.reserve(static_cast<std::size_t>(padded) * chunks);
  for (int first = 0; first < padded; first += num_devices) {
    for (int c = 0; c < chunks; ++c) {
      for (int mb = first; mb < first + num_devices; ++mb) table.emplace_back(mb, c);
    }
  }
  const int total = static_cast<int>(table.size());
  for (int d = 0; d < num_devices; ++d) {
    auto& ops = order.device_ops[d];
    ops.reserve(2 * static_cast<std::size_t>(m) * chunks);
    auto forward = [&](int k) {
      if (table[k].first >= m) return;  // phantom
      ops.push_back({table[k].first, table[k].second * num_devices + d, OpKind::F});
    };
    auto backward = [&](int k) {
      if (table[k].first >= m) return;
      ops.push_back({table[k].first, (chunks - 1 - table[k].second) * num_devices + d, OpKind::B});
    };
    const int warmup = std::min(2 * (num_devices - d - 1) + (chunks - 1) * num_devices, total);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k < total - warmup; ++k) {
      forward(warmup + k);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return order;
}

}  // namespace dynapipe::detail
