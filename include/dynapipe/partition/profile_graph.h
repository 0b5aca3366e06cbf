// PipeDream's per-layer profile (graph.txt): nodes with forward/backward time, output
// activation and parameter bytes, and the edges of the layer DAG.
//
//   node4 -- Conv2d(3, 64) -- forward_compute_time=1.2, backward_compute_time=2.5, activation_size=102760448.0, parameter_size=7168.000[ -- stage_id=0]
//   <TAB>node4 -- node5
//
// Times are milliseconds and sizes bytes, for the minibatch the profile was taken with.
// activation_size may be a list "[a; b; c]" (a layer with several outputs); it counts as
// the sum. The reader keeps every field's text, so format_graph_txt(parse_graph_txt(t)) == t
// byte for byte for files written by PipeDream (all node lines, then all edge lines).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dynapipe {

struct ProfileNode {
  std::string id;    // "node4"
  std::string desc;  // "Conv2d(3, 64, ...)"; "Input*" sources and "__getitem__" sinks are special
  double forward_ms = 0;
  double backward_ms = 0;
  double activation_bytes = 0;  // the sum when the file lists several outputs
  double parameter_bytes = 0;
  std::optional<int> stage_id;
  // The numbers' text as read, so a round trip is byte-stable; empty for nodes built in
  // code (then written with PipeDream's "%.3f").
  std::string forward_text, backward_text, activation_text, parameter_text;
};

struct ProfileEdge {
  int from = 0;  // indices into ProfileGraph::nodes
  int to = 0;
};

struct ProfileGraph {
  std::vector<ProfileNode> nodes;  // in file order
  std::vector<ProfileEdge> edges;  // in file order
  bool trailing_newline = false;

  // Index of the node with this id, or -1.
  int find(std::string_view id) const;
};

// Parses graph.txt text; `source` names the file in errors ("<source>:<line>: ...").
// Throws ParseError for a missing or malformed field, a duplicate node, an edge naming an
// unknown node, or a cycle (naming the edge that closes it).
ProfileGraph parse_graph_txt(std::string_view text, const std::string& source);

// Reads and parses a file; NotFound if it cannot be opened.
ProfileGraph read_graph_txt(const std::string& path);

// The graph.txt text: node lines, then edge lines, separated by '\n'.
std::string format_graph_txt(const ProfileGraph& graph);

}  // namespace dynapipe
