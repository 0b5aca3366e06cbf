// The antichain DAG: a hand-enumerated diamond, chains, and properties on random DAGs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dynapipe/partition/antichain_dag.h"
#include "dynapipe/partition/profile_graph.h"
#include "random_graph.h"

namespace dynapipe {
namespace {

ProfileGraph make_graph(int nodes, const std::vector<std::pair<int, int>>& edges) {
  ProfileGraph graph;
  for (int v = 0; v < nodes; ++v) {
    ProfileNode node;
    node.id = "n";
    node.id += std::to_string(v);
    node.forward_ms = v + 1;
    node.backward_ms = 2 * (v + 1);
    node.activation_bytes = 10.0 * (v + 1);
    node.parameter_bytes = 100.0 * (v + 1);
    graph.nodes.push_back(node);
  }
  for (auto [from, to] : edges) graph.edges.push_back({from, to});
  return graph;
}

TEST(AntichainDag, DiamondByHand) {
  // s -> a, s -> b, a -> t, b -> t. Breadth first: {s}, {a}, {b}, {a,b}, {t}; the depth-first
  // reverse post-order numbers them {s}=0, {b}=1, {a}=2, {a,b}=3, {t}=4.
  const AntichainDag dag = build_antichain_dag(make_graph(4, {{0, 1}, {0, 2}, {1, 3}, {2, 3}}));
  ASSERT_EQ(dag.states.size(), 5u);
  const std::vector<std::vector<int>> nodes = {{0}, {0, 2}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}};
  const std::vector<std::vector<int>> ancestors = {{}, {0}, {0}, {0, 1, 2}, {0, 1, 2, 3}};
  for (std::size_t s = 0; s < 5; ++s) {
    EXPECT_EQ(dag.states[s].nodes, nodes[s]) << s;
    EXPECT_EQ(dag.states[s].ancestors, ancestors[s]) << s;
  }
  // {s, a}: s still feeds b, so its output leaves too: 10 + 20 bytes; {t}: 40 bytes.
  EXPECT_DOUBLE_EQ(dag.states[2].output_activation_bytes, 30.0);
  EXPECT_DOUBLE_EQ(dag.states[4].output_activation_bytes, 40.0);
  EXPECT_DOUBLE_EQ(dag.states[3].compute_s, (3 + 6 + 9) / 1000.0);
  EXPECT_DOUBLE_EQ(dag.states[3].parameter_bytes, 600.0);
}

TEST(AntichainDag, ChainGivesPrefixes) {
  std::vector<std::pair<int, int>> edges;
  for (int v = 0; v + 1 < 6; ++v) edges.push_back({v, v + 1});
  const AntichainDag dag = build_antichain_dag(make_graph(6, edges));
  ASSERT_EQ(dag.states.size(), 6u);
  for (int s = 0; s < 6; ++s) {
    EXPECT_EQ(static_cast<int>(dag.states[s].nodes.size()), s + 1);
    EXPECT_EQ(static_cast<int>(dag.states[s].ancestors.size()), s);
    EXPECT_DOUBLE_EQ(dag.states[s].output_activation_bytes, 10.0 * (s + 1));
  }
}

TEST(AntichainDag, StatesAreDistinctDownSetsInTopologicalOrder) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const ProfileGraph graph = testing::random_dag(rng, 2 + trial % 7);
    const AntichainDag dag = build_antichain_dag(graph);
    std::set<std::vector<int>> seen;
    for (std::size_t s = 0; s < dag.states.size(); ++s) {
      const std::vector<int>& nodes = dag.states[s].nodes;
      EXPECT_TRUE(seen.insert(nodes).second) << "duplicate state";
      // Closed under predecessors: every edge into the set starts inside it.
      for (const ProfileEdge& e : graph.edges) {
        if (std::binary_search(nodes.begin(), nodes.end(), e.to)) {
          EXPECT_TRUE(std::binary_search(nodes.begin(), nodes.end(), e.from));
        }
      }
      for (int a : dag.states[s].ancestors) {
        EXPECT_LT(a, static_cast<int>(s));
        EXPECT_TRUE(std::includes(nodes.begin(), nodes.end(), dag.states[a].nodes.begin(), dag.states[a].nodes.end()));
      }
    }
    EXPECT_EQ(dag.states.back().nodes.size(), graph.nodes.size());
    EXPECT_EQ(dag.states.front().nodes, std::vector<int>{0});
  }
}

}  // namespace
}  // namespace dynapipe
