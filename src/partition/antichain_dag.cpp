// Antichain DAG of a layer graph; see include/dynapipe/partition/antichain_dag.h.
#include "dynapipe/partition/antichain_dag.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "node_set.h"

namespace dynapipe {

namespace {

using partition_detail::NodeSet;

class Enumerator {
 public:
  explicit Enumerator(const ProfileGraph& graph) : n_(static_cast<int>(graph.nodes.size())) {
    out_.resize(n_);
    std::vector<int> in_degree(n_, 0);
    for (const ProfileEdge& e : graph.edges) {
      out_[e.from].push_back(e.to);
      ++in_degree[e.to];
    }
    // Strict ancestors and descendants, filled in topological order (the graph is acyclic:
    // the reader checked).
    pred_.assign(n_, NodeSet(n_));
    succ_.assign(n_, NodeSet(n_));
    std::vector<int> order;
    std::vector<int> remaining = in_degree;
    for (int v = 0; v < n_; ++v) {
      if (remaining[v] == 0) order.push_back(v);
    }
    for (std::size_t head = 0; head < order.size(); ++head) {
      const int v = order[head];
      for (int w : out_[v]) {
        pred_[w].unite(pred_[v]);
        pred_[w].insert(v);
        if (--remaining[w] == 0) order.push_back(w);
      }
    }
    DYNAPIPE_CHECK(static_cast<int>(order.size()) == n_, "antichain DAG of a cyclic graph");
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      for (int w : out_[*it]) {
        succ_[*it].unite(succ_[w]);
        succ_[*it].insert(w);
      }
    }
    for (int v = 0; v < n_; ++v) {
      if (in_degree[v] == 0) {
        first_source_ = v;
        break;
      }
    }
  }

  int first_source() const { return first_source_; }

  // The antichain plus the earlier nodes with an out-edge that leaves the antichain's
  // down-set: their outputs still cross the boundary. Extras first, ascending.
  std::vector<int> augment(const std::vector<int>& antichain) const {
    NodeSet extra(n_);
    for (int a : antichain) {
      for (int p : pred_[a].members()) {
        for (int o : out_[p]) {
          if (o != a && !pred_[a].contains(o)) {
            extra.insert(p);
            break;
          }
        }
      }
    }
    std::vector<int> augmented = extra.members();
    augmented.insert(augmented.end(), antichain.begin(), antichain.end());
    return augmented;
  }

  // Antichains one step later: one augmented member replaced by one of its successors
  // none of whose descendants is a member yet; then members that precede another member
  // are dropped.
  std::vector<std::vector<int>> next(const std::vector<int>& antichain) const {
    NodeSet current(n_);
    for (int a : antichain) current.insert(a);
    const std::vector<int> augmented = augment(antichain);
    NodeSet augmented_set(n_);
    for (int a : augmented) augmented_set.insert(a);
    std::vector<std::vector<int>> result;
    for (int u : augmented) {
      for (int v : out_[u]) {
        if (current.contains(v) || succ_[v].intersects(augmented_set)) continue;
        std::vector<int> candidate = augmented;
        std::replace(candidate.begin(), candidate.end(), u, v);
        NodeSet candidate_set(n_);
        for (int x : candidate) candidate_set.insert(x);
        std::vector<int> reduced;
        for (int x : candidate) {
          if (succ_[x].intersects(candidate_set)) continue;
          if (std::find(reduced.begin(), reduced.end(), x) == reduced.end()) reduced.push_back(x);
        }
        result.push_back(std::move(reduced));
      }
    }
    return result;
  }

  NodeSet down_set(const std::vector<int>& antichain) const {
    NodeSet set(n_);
    for (int a : antichain) {
      set.unite(pred_[a]);
      set.insert(a);
    }
    return set;
  }

 private:
  int n_;
  int first_source_ = 0;
  std::vector<std::vector<int>> out_;
  std::vector<NodeSet> pred_, succ_;
};

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

AntichainDag build_antichain_dag(const ProfileGraph& graph, std::int64_t max_states) {
  if (graph.nodes.empty()) throw Error(ErrorKind::InvalidArgument, "graph: expected at least one node");
  const Enumerator enumerator(graph);

  // Breadth-first enumeration; ids in discovery order, edges (with repeats) in the order
  // the steps are found.
  std::vector<std::vector<int>> antichains;
  std::map<std::vector<int>, int> id_of;  // sorted antichain -> discovery id
  std::vector<std::vector<int>> children;
  std::vector<bool> expanded;
  auto intern = [&](const std::vector<int>& antichain) {
    const auto [it, inserted] = id_of.emplace(sorted(antichain), static_cast<int>(antichains.size()));
    if (inserted) {
      if (static_cast<std::int64_t>(antichains.size()) >= max_states) {
        throw Error(ErrorKind::Unsupported,
                    cat("graph: more than ", max_states,
                        " antichain states (too many parallel branches); compress its branches first"));
      }
      antichains.push_back(antichain);
      children.emplace_back();
      expanded.push_back(false);
    }
    return it->second;
  };
  std::deque<int> queue{intern({enumerator.first_source()})};
  while (!queue.empty()) {
    const int id = queue.front();
    queue.pop_front();
    if (expanded[id]) continue;
    expanded[id] = true;
    for (const std::vector<int>& next : enumerator.next(antichains[id])) {
      const int child = intern(next);
      children[id].push_back(child);
      queue.push_back(child);
    }
  }

  // Reverse post-order of a depth-first search from the first state, children in order.
  const int count = static_cast<int>(antichains.size());
  std::vector<int> post_order;
  std::vector<char> visited(count, 0);
  std::vector<std::pair<int, std::size_t>> stack{{0, 0}};
  visited[0] = 1;
  while (!stack.empty()) {
    auto& [state, next] = stack.back();
    if (next == children[state].size()) {
      post_order.push_back(state);
      stack.pop_back();
      continue;
    }
    const int child = children[state][next++];
    if (!visited[child]) {
      visited[child] = 1;
      stack.push_back({child, 0});
    }
  }
  std::vector<int> rank(count);
  for (int i = 0; i < count; ++i) rank[post_order[count - 1 - i]] = i;

  AntichainDag dag;
  dag.states.resize(count);
  std::vector<partition_detail::NodeSet> ancestors(count, partition_detail::NodeSet(count));
  std::vector<std::vector<int>> parents(count);
  for (int id = 0; id < count; ++id) {
    for (int child : children[id]) parents[rank[child]].push_back(rank[id]);
  }
  for (int id = 0; id < count; ++id) {
    AntichainState& state = dag.states[rank[id]];
    state.antichain = enumerator.augment(antichains[id]);
    state.nodes = enumerator.down_set(antichains[id]).members();
    for (int v : state.nodes) {
      const ProfileNode& node = graph.nodes[v];
      state.compute_s += (node.forward_ms + node.backward_ms) / 1000.0;
      state.activation_bytes += node.activation_bytes;
      state.parameter_bytes += node.parameter_bytes;
    }
    for (int v : state.antichain) state.output_activation_bytes += graph.nodes[v].activation_bytes;
  }
  for (int s = 0; s < count; ++s) {
    for (int p : parents[s]) {
      DYNAPIPE_CHECK(p < s, "antichain states out of topological order");
      ancestors[s].unite(ancestors[p]);
      ancestors[s].insert(p);
    }
    dag.states[s].ancestors = ancestors[s].members();
  }
  if (dag.states.back().nodes.size() != graph.nodes.size()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("graph: ", graph.nodes.size() - dag.states.back().nodes.size(),
                    " nodes are not connected to the first source ", graph.nodes[enumerator.first_source()].id,
                    "; expected one connected layer graph"));
  }
  return dag;
}

}  // namespace dynapipe
