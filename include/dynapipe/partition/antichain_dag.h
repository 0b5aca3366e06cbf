// The DAG of antichains of a layer graph (PipeDream's linearisation of branching models).
//
// A state is a down-set of the layer DAG (every layer it holds has all its inputs in it),
// named by its antichain of last layers, augmented with the earlier layers whose outputs
// still leave the set. Two states where one is an ancestor of the other in the antichain
// DAG bound a valid pipeline stage (the layers of the later minus those of the earlier),
// so the stage DP runs over a chain of states even when the model branches (ResNet, GNMT).
//
// States are enumerated as PipeDream's optimizer does (breadth first from the first source,
// advancing one augmented-antichain member along one out-edge at a time) and numbered in
// the reverse post-order of a depth-first search from the first state, so a chain of n
// layers gives states 0..n-1 with state i = the first i+1 layers.
#pragma once

#include <cstdint>
#include <vector>

#include "dynapipe/partition/profile_graph.h"

namespace dynapipe {

struct AntichainState {
  std::vector<int> antichain;  // augmented antichain (graph node indices)
  std::vector<int> nodes;      // the down-set, ascending node indices
  std::vector<int> ancestors;  // earlier states it can follow as a stage boundary, ascending
  // Sums over `nodes`: forward+backward seconds, activation and parameter bytes.
  double compute_s = 0;
  double activation_bytes = 0;
  double parameter_bytes = 0;
  // Bytes leaving the state: the activations of its augmented antichain.
  double output_activation_bytes = 0;
};

struct AntichainDag {
  std::vector<AntichainState> states;  // topological order; the last holds every node
};

// Throws Unsupported when the graph has more than `max_states` states (a heavily branched
// graph: compress its branches first), InvalidArgument when it has no node.
AntichainDag build_antichain_dag(const ProfileGraph& graph, std::int64_t max_states = 20000);

}  // namespace dynapipe
