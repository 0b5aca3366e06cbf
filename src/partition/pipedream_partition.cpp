// PipeDream's hierarchical partitioning DP; see include/dynapipe/partition/pipedream_partition.h.
//
// A[i][j][m] is the best time per input for the layers of state j minus those of state
// i−1 (i = 0: from the start) on m+1 workers of the current level: either one stage
// replicated m+1 ways, or the best A[i][k][m−m'] followed by a last stage (k, j] on m'
// workers, for every ancestor state k of j. Only row i = 0 is needed at the top level;
// lower levels fill every row because the level above asks for any range.
#include "dynapipe/partition/pipedream_partition.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/partition/antichain_dag.h"
#include "node_set.h"

namespace dynapipe {

namespace {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

struct Cell {
  double time = kNone;  // NaN: no partition
  int split = -1;       // last state of the prefix before the last stage, or -1
  int split_workers = -1;  // m index of that prefix
  int replicas = 0;     // workers of the last stage
  bool ok() const { return !std::isnan(time); }
};

// The graph without what PipeDream leaves out of the DP: "Input*" sources (always on the
// first stage) and "__getitem__" sinks (free views of a tuple output).
struct ReducedGraph {
  ProfileGraph graph;
  std::vector<int> original;  // reduced index -> original index
  std::vector<int> inputs;    // removed Input* sources
  std::vector<int> getitems;  // removed __getitem__ sinks
};

bool starts_with(const std::string& text, std::string_view prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

ReducedGraph reduce(const ProfileGraph& graph) {
  const int n = static_cast<int>(graph.nodes.size());
  std::vector<int> in_degree(n, 0);
  for (const ProfileEdge& e : graph.edges) ++in_degree[e.to];
  std::vector<char> removed(n, 0);
  ReducedGraph reduced;
  for (int v = 0; v < n; ++v) {
    if (in_degree[v] == 0 && starts_with(graph.nodes[v].desc, "Input")) {
      removed[v] = 1;
      reduced.inputs.push_back(v);
    }
  }
  std::vector<int> out_degree(n, 0);
  for (const ProfileEdge& e : graph.edges) {
    if (!removed[e.from]) ++out_degree[e.from];
  }
  for (int v = 0; v < n; ++v) {
    if (!removed[v] && out_degree[v] == 0 && starts_with(graph.nodes[v].desc, "__getitem__")) {
      removed[v] = 1;
      reduced.getitems.push_back(v);
    }
  }
  std::vector<int> index(n, -1);
  for (int v = 0; v < n; ++v) {
    if (removed[v]) continue;
    index[v] = static_cast<int>(reduced.original.size());
    reduced.original.push_back(v);
    reduced.graph.nodes.push_back(graph.nodes[v]);
  }
  for (const ProfileEdge& e : graph.edges) {
    if (index[e.from] >= 0 && index[e.to] >= 0) reduced.graph.edges.push_back({index[e.from], index[e.to]});
  }
  if (reduced.graph.nodes.empty()) {
    throw Error(ErrorKind::InvalidArgument, "graph: expected at least one layer besides Input* sources");
  }
  return reduced;
}

// Range tables over states: row i = 0 is the prefix up to state j, row i > 0 the layers of
// state j minus those of state i−1 (NaN when j < i).
class RangeTable {
 public:
  explicit RangeTable(const std::vector<double>& cumulative) : cumulative_(cumulative) {}
  double operator()(int i, int j) const {
    if (i == 0) return cumulative_[j];
    return j >= i ? cumulative_[j] - cumulative_[i - 1] : kNone;
  }

 private:
  std::vector<double> cumulative_;
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct Level {
  int workers = 1;
  double bandwidth = 1;
  int workers_below = 1;  // workers per unit of this level (1 at the bottom)
  int rows = 1;           // 1 at the top level, states+1 below it
  std::vector<Cell> cells;
  int states = 0;
  Cell& at(int i, int j, int m) { return cells[(static_cast<std::size_t>(i) * states + j) * workers + m]; }
  const Cell& at(int i, int j, int m) const {
    return cells[(static_cast<std::size_t>(i) * states + j) * workers + m];
  }
};

struct Solver {
  const AntichainDag& dag;
  const PipeDreamOptions& options;
  int states;
  RangeTable activation, parameter;
  std::vector<double> output_activation;
  std::vector<partition_detail::NodeSet> ancestor_sets;

  Solver(const AntichainDag& d, const PipeDreamOptions& o, const std::vector<double>& cum_act,
         const std::vector<double>& cum_param)
      : dag(d), options(o), states(static_cast<int>(d.states.size())), activation(cum_act),
        parameter(cum_param) {
    for (const AntichainState& s : dag.states) {
      output_activation.push_back(s.output_activation_bytes);
      partition_detail::NodeSet set(states);
      for (int a : s.ancestors) set.insert(a);
      ancestor_sets.push_back(std::move(set));
    }
  }

  // Memory: stashed versions (PipeDream's count), at least one copy.
  bool fits(double bytes_per_copy, std::int64_t copies) const {
    if (!options.memory_limit_bytes) return true;
    return static_cast<double>(std::max<std::int64_t>(copies, 1)) * bytes_per_copy <= *options.memory_limit_bytes;
  }

  // `compute(i, j)`: this level's compute time of a range (NaN: not available).
  template <typename Compute>
  void solve(Level& level, const Compute& compute) const {
    const int n = level.workers;
    const double bw = level.bandwidth;
    level.states = states;
    level.cells.assign(static_cast<std::size_t>(level.rows) * states * n, Cell{});
    const int max_single = options.straight ? 1 : n;
    for (int i = 0; i < level.rows; ++i) {
      for (int j = i; j < states; ++j) {
        const double time = compute(i, j);
        if (std::isnan(time)) continue;
        const double params = parameter(i, j);
        const double bytes = activation(i, j) + params;
        for (int m = 0; m < max_single; ++m) {
          if (!fits(bytes, ceil_div(n - (m + 1), m + 1))) continue;
          const double allreduce = 4.0 * m * params / (bw * (m + 1)) / level.workers_below;
          level.at(i, j, m) = Cell{(time + allreduce) / (m + 1), -1, -1, m + 1};
        }
      }
    }
    // Splits. Cell (i, j, m) reads only cells (i, k, ·) with k < j, so j can be the outer
    // loop (the per-(j, k) terms are then computed once); within a cell the candidates still
    // come in PipeDream's order (k ascending, then r), so ties resolve as in its m-outer loop.
    std::vector<double> last(n + 1), transfer(n + 1);
    const int max_r = options.straight ? 1 : n - 1;
    for (int i = 0; i < level.rows; ++i) {
      for (int j = i + 1; j < states; ++j) {
        const bool has_output = j < states - 1;
        const std::vector<int>& ancestors = dag.states[j].ancestors;
        // A[i][k] is empty for k < i: start at the first ancestor >= i.
        for (auto it = std::lower_bound(ancestors.begin(), ancestors.end(), i); it != ancestors.end(); ++it) {
          const int k = *it;
          if (i > 0 && ancestor_sets[i - 1].contains(k)) continue;
          const double last_compute = compute(k + 1, j);
          if (std::isnan(last_compute)) continue;
          const double last_params = parameter(k + 1, j);
          const double last_bytes = activation(k + 1, j) + last_params;
          for (int r = 1; r <= max_r; ++r) {
            last[r] = (last_compute + 4.0 * (r - 1) * last_params / (bw * r)) / r;
            transfer[r] = 2.0 * output_activation[k] / (bw * r);
            if (has_output) transfer[r] = std::max(transfer[r], 2.0 * output_activation[j] / (bw * r));
          }
          for (int m = 1; m < n; ++m) {
            Cell& best = level.at(i, j, m);
            const int max_last = options.straight ? 1 : m;
            for (int r = 1; r <= max_last; ++r) {
              const Cell& prefix = level.at(i, k, m - r);
              if (!prefix.ok()) continue;
              if (!fits(last_bytes, ceil_div(n - (m + 1), r))) continue;
              const double time = std::max(std::max(prefix.time, last[r]), transfer[r]);
              if (!best.ok() || best.time > time) best = Cell{time, k, m - r, r};
            }
          }
        }
      }
    }
  }
};

struct Range {
  int first = 0, end = 0;  // states [first, end)
  std::vector<int> replicas;  // top level first while splitting
};

// Splits [first, end) at one level into stages (in order) with their replicas.
std::vector<std::pair<Range, int>> split_range(const Level& level, int first, int end) {
  std::vector<std::pair<Range, int>> stages;
  const Cell* cell = &level.at(first, end - 1, level.workers - 1);
  DYNAPIPE_CHECK(cell->ok(), cat("no partition of states [", first, ", ", end, ")"));
  int stage_end = end;
  while (cell->split >= 0) {
    stages.push_back({Range{cell->split + 1, stage_end, {}}, cell->replicas});
    stage_end = cell->split + 1;
    cell = &level.at(first, cell->split, cell->split_workers);
  }
  stages.push_back({Range{first, stage_end, {}}, cell->replicas});
  std::reverse(stages.begin(), stages.end());
  return stages;
}

void validate(const PipeDreamOptions& options) {
  if (options.workers.empty()) throw Error(ErrorKind::InvalidArgument, "--workers must list at least one level");
  if (options.workers.size() != options.bandwidth.size()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--bandwidth must give one value per --workers level (", options.workers.size(), "), got ",
                    options.bandwidth.size()));
  }
  for (int w : options.workers) {
    if (w < 1 || w > 4096) throw Error(ErrorKind::InvalidArgument, cat("--workers values must be in [1, 4096], got ", w));
  }
  for (double b : options.bandwidth) {
    if (!(b > 0) || !std::isfinite(b)) {
      throw Error(ErrorKind::InvalidArgument, cat("--bandwidth values must be positive bytes/s, got ", b));
    }
  }
  if (options.memory_limit_bytes && !(*options.memory_limit_bytes > 0)) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--memory-limit must be positive, got ", *options.memory_limit_bytes, " bytes"));
  }
}

[[noreturn]] void throw_no_partition(const ProfileGraph& graph, const AntichainDag& dag,
                                     const PipeDreamOptions& options) {
  int total = 1;
  for (int w : options.workers) total *= w;
  if (!options.memory_limit_bytes) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--workers ", join(options.workers, " "), ": ", options.straight ? "--straight needs" : "needs",
                    " one stage per worker, but the graph has only ", dag.states.size(),
                    " antichain states; use fewer workers", options.straight ? " or drop --straight" : ""));
  }
  // Name the heaviest single layer when it alone does not fit; else the whole model's need.
  int heaviest = 0;
  for (int v = 1; v < static_cast<int>(graph.nodes.size()); ++v) {
    const auto bytes = [&](int u) { return graph.nodes[u].activation_bytes + graph.nodes[u].parameter_bytes; };
    if (bytes(v) > bytes(heaviest)) heaviest = v;
  }
  const ProfileNode& node = graph.nodes[heaviest];
  const double bytes = node.activation_bytes + node.parameter_bytes;
  if (bytes > *options.memory_limit_bytes) {
    throw Error(ErrorKind::Infeasible,
                cat("no stage holding layer ", node.id, " (", node.desc, ") fits --memory-limit: it needs ",
                    static_cast<std::int64_t>(bytes), " bytes (activations + parameters), the limit is ",
                    static_cast<std::int64_t>(*options.memory_limit_bytes), " bytes"));
  }
  const AntichainState& all = dag.states.back();
  throw Error(ErrorKind::Infeasible,
              cat("no partition over ", total, " workers keeps every stage's stashed versions under --memory-limit ",
                  static_cast<std::int64_t>(*options.memory_limit_bytes), " bytes (the whole model, one copy: ",
                  static_cast<std::int64_t>(all.activation_bytes + all.parameter_bytes),
                  " bytes; largest layer ", node.id, ": ", static_cast<std::int64_t>(bytes), " bytes)"));
}

}  // namespace

PipeDreamPartition partition_pipedream(const ProfileGraph& graph, const PipeDreamOptions& options) {
  validate(options);
  const ReducedGraph reduced = reduce(graph);
  const AntichainDag dag = build_antichain_dag(reduced.graph);
  const int states = static_cast<int>(dag.states.size());
  const int levels = static_cast<int>(options.workers.size());
  if (levels > 1 && static_cast<std::int64_t>(states + 1) * states * options.workers.front() > 200'000'000) {
    throw Error(ErrorKind::Unsupported,
                cat("graph: ", states, " antichain states are too many for a ", levels, "-level partition"));
  }

  std::vector<double> cum_compute, cum_act, cum_param;
  for (const AntichainState& s : dag.states) {
    cum_compute.push_back(s.compute_s);
    cum_act.push_back(s.activation_bytes);
    cum_param.push_back(s.parameter_bytes);
  }
  const Solver solver(dag, options, cum_act, cum_param);
  const RangeTable compute_table(cum_compute);

  std::vector<Level> solved(levels);
  for (int l = 0; l < levels; ++l) {
    Level& level = solved[l];
    level.workers = options.workers[l];
    level.bandwidth = options.bandwidth[l];
    level.workers_below = l == 0 ? 1 : options.workers[l - 1];
    level.rows = l == levels - 1 ? 1 : states + 1;
    if (l == 0) {
      solver.solve(level, compute_table);
    } else {
      // The level below's best times, stored by (j, i) so the split loop (fixed j, i = k+1
      // over the ancestors k) reads memory in order.
      const Level& below = solved[l - 1];
      std::vector<double> by_end(static_cast<std::size_t>(states) * (states + 1), kNone);
      for (int i = 0; i <= states; ++i) {
        for (int j = i; j < states; ++j) by_end[static_cast<std::size_t>(j) * (states + 1) + i] = below.at(i, j, below.workers - 1).time;
      }
      solver.solve(level, [&](int i, int j) { return by_end[static_cast<std::size_t>(j) * (states + 1) + i]; });
    }
  }
  const Level& top = solved.back();
  const Cell& best = top.at(0, states - 1, top.workers - 1);
  if (!best.ok()) throw_no_partition(reduced.graph, dag, options);

  PipeDreamPartition result;
  result.time_per_stage_s = best.time;
  result.num_states = states;
  result.single_worker_s = cum_compute.back();
  result.data_parallel_s = cum_compute.back();
  for (int l = 0; l < levels; ++l) {
    const int n = options.workers[l];
    const double allreduce = 4.0 * (n - 1) * cum_param.back() / (options.bandwidth[l] * n) /
                             (l == 0 ? 1 : options.workers[l - 1]);
    result.data_parallel_s = (result.data_parallel_s + allreduce) / n;
  }

  // Top level down: split each range of the level above.
  std::vector<Range> ranges{Range{0, states, {}}};
  for (int l = levels - 1; l >= 0; --l) {
    std::vector<Range> next;
    for (const Range& range : ranges) {
      for (auto& [piece, replicas] : split_range(solved[l], range.first, range.end)) {
        piece.replicas = range.replicas;
        piece.replicas.push_back(replicas);
        next.push_back(std::move(piece));
      }
    }
    ranges = std::move(next);
  }

  result.stage_of_node.assign(graph.nodes.size(), -1);
  const double bw0 = options.bandwidth.front();
  for (std::size_t s = 0; s < ranges.size(); ++s) {
    const Range& range = ranges[s];
    PipeDreamStage stage;
    stage.first_state = range.first;
    stage.end_state = range.end;
    stage.replicas_per_level.assign(range.replicas.rbegin(), range.replicas.rend());
    stage.replicas = 1;
    for (int r : stage.replicas_per_level) stage.replicas *= r;
    const int last = range.end - 1;
    const int before = range.first - 1;
    stage.compute_s = compute_table(range.first, last);
    stage.parameter_bytes = solver.parameter(range.first, last);
    stage.activation_bytes = solver.activation(range.first, last);
    const int r = stage.replicas_per_level.front();
    stage.compute_per_input_s = stage.compute_s / r;
    stage.allreduce_per_input_s = 4.0 * (r - 1) * stage.parameter_bytes / (bw0 * r) / r;
    const double in = before >= 0 ? dag.states[before].output_activation_bytes : 0.0;
    const double out = last < states - 1 ? dag.states[last].output_activation_bytes : 0.0;
    stage.transfer_per_input_s = 2.0 * std::max(in, out) / (bw0 * r);
    partition_detail::NodeSet earlier(static_cast<int>(reduced.graph.nodes.size()));
    if (before >= 0) {
      for (int v : dag.states[before].nodes) earlier.insert(v);
    }
    for (int v : dag.states[last].nodes) {
      if (!earlier.contains(v)) result.stage_of_node[reduced.original[v]] = static_cast<int>(s);
    }
    result.stages.push_back(std::move(stage));
  }
  for (int v : reduced.inputs) result.stage_of_node[v] = 0;
  for (int v : reduced.getitems) {
    for (const ProfileEdge& e : graph.edges) {
      if (e.to == v && result.stage_of_node[e.from] >= 0) {
        result.stage_of_node[v] = result.stage_of_node[e.from];
        break;
      }
    }
    if (result.stage_of_node[v] < 0) result.stage_of_node[v] = static_cast<int>(ranges.size()) - 1;
  }
  for (std::size_t v = 0; v < graph.nodes.size(); ++v) {
    DYNAPIPE_CHECK(result.stage_of_node[v] >= 0, cat("node ", graph.nodes[v].id, " has no stage"));
    result.stages[result.stage_of_node[v]].nodes.push_back(graph.nodes[v].id);
  }
  return result;
}

}  // namespace dynapipe
