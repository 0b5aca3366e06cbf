// Spreading micro-batches over data-parallel replicas so that their loads are balanced.
//
//   std::vector<int> owner = balance_replicas({4.5, 4.4, 3.0, 2.4}, 2);
//   // owner[k] = replica of item k; loads {4.5+2.4, 4.4+3.0}
#pragma once

#include <span>
#include <vector>

namespace dynapipe {

// Multi-way Karmarkar–Karp (largest differencing method) over item loads, as the
// reference does with prtpy.partitioning.kk: every item starts as a `replicas`-tuple
// (load, 0, ..., 0); the two tuples with the largest max − min spread are merged by
// pairing the heaviest part of one with the lightest of the other, until one tuple is
// left. Deterministic (ties by item index). Returns the replica of every item; replicas
// are numbered by decreasing load. Complexity: O(m log m · replicas) for m items.
// REQUIRES: replicas >= 1, loads >= 0.
std::vector<int> balance_replicas(std::span<const double> loads, int replicas);

// balance_replicas(), then improved for what a pipeline replica takes: its items' sum plus
// `slope` times its largest item (the DP objective's Σt + β(p − 1)·max t). Moves of one item
// and swaps of two between the worst replica and another, the best first, while the largest
// replica objective falls; no replica is left empty. Items' order within a replica is kept.
// REQUIRES: replicas >= 1, loads >= 0, slope >= 0, at least `replicas` items.
std::vector<int> balance_pipeline_replicas(std::span<const double> loads, int replicas, double slope);

}  // namespace dynapipe
