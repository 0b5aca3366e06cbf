// Small random layer DAGs for the partitioner's property tests: node 0 is the one source.
#pragma once

#include <random>
#include <string>

#include "dynapipe/partition/profile_graph.h"

namespace dynapipe::testing {

inline ProfileGraph random_dag(std::mt19937& rng, int nodes) {
  std::uniform_real_distribution<double> time(0.1, 5.0), bytes(1e5, 5e7), chance(0, 1);
  ProfileGraph graph;
  for (int v = 0; v < nodes; ++v) {
    ProfileNode node;
    node.id = "node";
    node.id += std::to_string(v);
    node.desc = "Layer";
    node.forward_ms = time(rng);
    node.backward_ms = time(rng);
    node.activation_bytes = bytes(rng);
    node.parameter_bytes = chance(rng) < 0.3 ? 0.0 : bytes(rng);
    graph.nodes.push_back(node);
  }
  for (int to = 1; to < nodes; ++to) {
    bool has_input = false;
    for (int from = 0; from < to; ++from) {
      if (chance(rng) < 0.35) {
        graph.edges.push_back({from, to});
        has_input = true;
      }
    }
    if (!has_input) graph.edges.push_back({static_cast<int>(rng() % to), to});
  }
  return graph;
}

}  // namespace dynapipe::testing
