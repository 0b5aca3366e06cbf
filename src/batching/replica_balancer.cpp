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

}  // namespace dynapipe
