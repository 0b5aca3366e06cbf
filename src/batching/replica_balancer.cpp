#include "dynapipe/batching/replica_balancer.h"

#include <algorithm>
#include <queue>

#include "dynapipe/core/error.h"

namespace dynapipe {
namespace {

struct Part {
  double load = 0;
  std::vector<int> items;
};

// A partial solution: `replicas` parts, heaviest first.
struct Tuple {
  std::vector<Part> parts;
  int key = 0;  // creation order, for deterministic ties
  double spread() const { return parts.front().load - parts.back().load; }
};

void sort_parts(std::vector<Part>* parts) {
  std::stable_sort(parts->begin(), parts->end(),
                   [](const Part& a, const Part& b) { return a.load > b.load; });
}

}  // namespace

std::vector<int> balance_replicas(std::span<const double> loads, int replicas) {
  DYNAPIPE_CHECK(replicas >= 1, cat("replicas ", replicas, " < 1"));
  std::vector<int> owner(loads.size(), 0);
  if (loads.empty() || replicas == 1) return owner;

  // Largest spread first; among equal spreads the older tuple.
  auto lower_priority = [](const Tuple& a, const Tuple& b) {
    if (a.spread() != b.spread()) return a.spread() < b.spread();
    return a.key > b.key;
  };
  std::priority_queue<Tuple, std::vector<Tuple>, decltype(lower_priority)> heap(lower_priority);
  int next_key = 0;
  for (std::size_t k = 0; k < loads.size(); ++k) {
    DYNAPIPE_CHECK(loads[k] >= 0, cat("load ", loads[k], " of item ", k, " < 0"));
    Tuple tuple;
    tuple.parts.resize(static_cast<std::size_t>(replicas));
    tuple.parts[0] = {loads[k], {static_cast<int>(k)}};
    tuple.key = next_key++;
    heap.push(std::move(tuple));
  }
  while (heap.size() > 1) {
    Tuple a = heap.top();
    heap.pop();
    Tuple b = heap.top();
    heap.pop();
    // Heaviest of a with lightest of b, and so on: the differencing step.
    Tuple merged;
    merged.parts.resize(a.parts.size());
    for (std::size_t r = 0; r < a.parts.size(); ++r) {
      Part& from_b = b.parts[b.parts.size() - 1 - r];
      merged.parts[r].load = a.parts[r].load + from_b.load;
      merged.parts[r].items = std::move(a.parts[r].items);
      merged.parts[r].items.insert(merged.parts[r].items.end(), from_b.items.begin(),
                                   from_b.items.end());
    }
    sort_parts(&merged.parts);
    merged.key = next_key++;
    heap.push(std::move(merged));
  }
  const Tuple& last = heap.top();
  for (std::size_t r = 0; r < last.parts.size(); ++r) {
    for (int item : last.parts[r].items) owner[static_cast<std::size_t>(item)] = static_cast<int>(r);
  }
  return owner;
}

namespace {

// One replica's items summed, and its two largest (the largest's item, to take it out).
struct ReplicaLoad {
  double sum = 0, first = 0, second = 0;
  int first_item = -1;
  void add(double load, int item) {
    sum += load;
    if (load > first) {
      second = first;
      first = load;
      first_item = item;
    } else {
      second = std::max(second, load);
    }
  }
  // Σ + slope · max after taking item `out` (load out_load; none: -1) out and adding `in_load`
  // (none: 0).
  double objective(double slope, int out, double out_load, double in_load) const {
    const double max = out >= 0 && out == first_item ? second : first;
    const double sum_after = sum - (out >= 0 ? out_load : 0) + in_load;
    return sum_after + slope * std::max(max, in_load);
  }
};

}  // namespace

std::vector<int> balance_pipeline_replicas(std::span<const double> loads, int replicas, double slope) {
  DYNAPIPE_CHECK(slope >= 0, cat("slope ", slope, " < 0"));
  std::vector<int> owner = balance_replicas(loads, replicas);
  if (replicas == 1 || loads.size() < static_cast<std::size_t>(replicas)) return owner;
  const int n = static_cast<int>(loads.size());
  const auto load = [&](int k) { return loads[static_cast<std::size_t>(k)]; };
  // Each accepted step lowers the largest objective: bounded, and few in practice.
  for (int step = 0; step < 4 * n; ++step) {
    std::vector<ReplicaLoad> at(static_cast<std::size_t>(replicas));
    std::vector<int> count(static_cast<std::size_t>(replicas), 0);
    for (int k = 0; k < n; ++k) {
      at[static_cast<std::size_t>(owner[static_cast<std::size_t>(k)])].add(load(k), k);
      ++count[static_cast<std::size_t>(owner[static_cast<std::size_t>(k)])];
    }
    std::vector<double> objective(static_cast<std::size_t>(replicas));
    int worst = 0;
    for (int r = 0; r < replicas; ++r) {
      objective[static_cast<std::size_t>(r)] = at[static_cast<std::size_t>(r)].objective(slope, -1, 0, 0);
      if (objective[static_cast<std::size_t>(r)] > objective[static_cast<std::size_t>(worst)]) worst = r;
    }
    const ReplicaLoad& from = at[static_cast<std::size_t>(worst)];
    double best_ms = objective[static_cast<std::size_t>(worst)] * (1 - 1e-12);
    int best_a = -1, best_b = -1, best_q = -1;  // item a from worst to q (and item b back)
    for (int q = 0; q < replicas; ++q) {
      if (q == worst) continue;
      double rest = 0;  // the largest objective a step between worst and q leaves as it is
      for (int r = 0; r < replicas; ++r) {
        if (r != worst && r != q) rest = std::max(rest, objective[static_cast<std::size_t>(r)]);
      }
      const ReplicaLoad& to = at[static_cast<std::size_t>(q)];
      for (int a = 0; a < n; ++a) {
        if (owner[static_cast<std::size_t>(a)] != worst) continue;
        if (count[static_cast<std::size_t>(worst)] > 1) {  // a move
          const double ms = std::max({rest, from.objective(slope, a, load(a), 0),
                                      to.objective(slope, -1, 0, load(a))});
          if (ms < best_ms) best_ms = ms, best_a = a, best_b = -1, best_q = q;
        }
        for (int b = 0; b < n; ++b) {  // a swap
          if (owner[static_cast<std::size_t>(b)] != q) continue;
          const double ms = std::max({rest, from.objective(slope, a, load(a), load(b)),
                                      to.objective(slope, b, load(b), load(a))});
          if (ms < best_ms) best_ms = ms, best_a = a, best_b = b, best_q = q;
        }
      }
    }
    if (best_a < 0) break;
    owner[static_cast<std::size_t>(best_a)] = best_q;
    if (best_b >= 0) owner[static_cast<std::size_t>(best_b)] = worst;
  }
  return owner;
}

}  // namespace dynapipe
