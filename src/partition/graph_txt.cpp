// graph.txt reader and writer (format in include/dynapipe/partition/profile_graph.h).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/partition/profile_graph.h"

namespace dynapipe {

namespace {

constexpr std::string_view kSeparator = " -- ";

[[noreturn]] void fail(const std::string& source, int line, const std::string& what) {
  throw Error(ErrorKind::ParseError, cat(source, ":", line, ": ", what));
}

std::vector<std::string_view> split_on(std::string_view text, std::string_view separator) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = text.find(separator, start);
    if (at == std::string_view::npos) break;
    parts.push_back(text.substr(start, at - start));
    start = at + separator.size();
  }
  parts.push_back(text.substr(start));
  return parts;
}

// A non-negative finite number spanning all of `text`.
bool parse_number(std::string_view text, double& value) {
  if (text.empty()) return false;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  return result.ec == std::errc() && result.ptr == text.data() + text.size() &&
         std::isfinite(value) && value >= 0;
}

// "name=<number>" (or, for activation_size, "name=[a; b; ...]"): the value's text and sum.
void parse_field(std::string_view field, std::string_view name, bool allow_list,
                 const std::string& source, int line, std::string& text, double& value) {
  const std::string prefix = cat(name, "=");
  if (field.substr(0, prefix.size()) != prefix) {
    fail(source, line, cat("expected '", name, "=<number>', got '", field, "'"));
  }
  const std::string_view raw = field.substr(prefix.size());
  text = std::string(raw);
  if (allow_list && !raw.empty() && raw.front() == '[') {
    if (raw.back() != ']') fail(source, line, cat("expected ']' to close ", name, ", got '", raw, "'"));
    value = 0;
    for (std::string_view item : split_on(raw.substr(1, raw.size() - 2), "; ")) {
      double part = 0;
      if (!parse_number(item, part)) {
        fail(source, line, cat(name, " list items must be non-negative numbers, got '", item, "'"));
      }
      value += part;
    }
    return;
  }
  if (!parse_number(raw, value)) {
    fail(source, line, cat(name, " must be a non-negative number, got '", raw, "'"));
  }
}

ProfileNode parse_node(std::string_view text, const std::string& source, int line) {
  std::vector<std::string_view> parts = split_on(text, kSeparator);
  ProfileNode node;
  if (parts.size() >= 4 && parts.back().substr(0, 9) == "stage_id=") {
    const std::string_view stage = parts.back().substr(9);
    int value = -1;
    const auto result = std::from_chars(stage.data(), stage.data() + stage.size(), value);
    if (result.ec != std::errc() || result.ptr != stage.data() + stage.size() || value < 0) {
      fail(source, line, cat("stage_id must be a non-negative integer, got '", stage, "'"));
    }
    node.stage_id = value;
    parts.pop_back();
  }
  if (parts.size() < 3) {
    fail(source, line,
         "expected '<id> -- <description> -- forward_compute_time=..., backward_compute_time=..., "
         "activation_size=..., parameter_size=...'");
  }
  node.id = std::string(parts.front());
  if (node.id.empty() || node.id.find_first_of(" \t") != std::string::npos) {
    fail(source, line, cat("expected a node id without spaces, got '", node.id, "'"));
  }
  std::vector<std::string_view> desc(parts.begin() + 1, parts.end() - 1);
  node.desc = join(desc, kSeparator);
  const std::vector<std::string_view> fields = split_on(parts.back(), ", ");
  static constexpr std::string_view kNames[] = {"forward_compute_time", "backward_compute_time",
                                                "activation_size", "parameter_size"};
  for (std::size_t i = 0; i < 4; ++i) {
    if (i >= fields.size()) fail(source, line, cat("missing field ", kNames[i], " of node ", node.id));
  }
  if (fields.size() > 4) fail(source, line, cat("unexpected field '", fields[4], "' after parameter_size"));
  parse_field(fields[0], kNames[0], false, source, line, node.forward_text, node.forward_ms);
  parse_field(fields[1], kNames[1], false, source, line, node.backward_text, node.backward_ms);
  parse_field(fields[2], kNames[2], true, source, line, node.activation_text, node.activation_bytes);
  parse_field(fields[3], kNames[3], false, source, line, node.parameter_text, node.parameter_bytes);
  return node;
}

// Throws naming the line of an edge that closes a cycle (a back edge of a depth-first search).
void check_acyclic(const ProfileGraph& graph, const std::vector<int>& edge_lines, const std::string& source) {
  const int n = static_cast<int>(graph.nodes.size());
  std::vector<std::vector<int>> out(n);  // edge indices
  for (std::size_t e = 0; e < graph.edges.size(); ++e) out[graph.edges[e].from].push_back(static_cast<int>(e));
  enum Color : char { White, Gray, Black };
  std::vector<Color> color(n, White);
  std::vector<std::pair<int, std::size_t>> stack;  // node, next out-edge position
  for (int root = 0; root < n; ++root) {
    if (color[root] != White) continue;
    color[root] = Gray;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next == out[node].size()) {
        color[node] = Black;
        stack.pop_back();
        continue;
      }
      const int e = out[node][next++];
      const int to = graph.edges[e].to;
      if (color[to] == Gray) {
        fail(source, edge_lines[e],
             cat("edge ", graph.nodes[graph.edges[e].from].id, " -- ", graph.nodes[to].id,
                 " closes a cycle; expected an acyclic graph"));
      }
      if (color[to] == White) {
        color[to] = Gray;
        stack.push_back({to, 0});
      }
    }
  }
}

std::string format_number(double value, const char* format) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

}  // namespace

int ProfileGraph::find(std::string_view id) const {
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].id == id) return static_cast<int>(i);
  }
  return -1;
}

ProfileGraph parse_graph_txt(std::string_view text, const std::string& source) {
  ProfileGraph graph;
  graph.trailing_newline = !text.empty() && text.back() == '\n';
  if (graph.trailing_newline) text.remove_suffix(1);
  if (text.empty()) fail(source, 1, "expected at least one node line, got an empty file");
  struct PendingEdge {
    std::string from, to;
    int line;
  };
  std::vector<PendingEdge> pending;
  std::unordered_map<std::string, int> index;
  int line_number = 0;
  for (std::string_view line : split_on(text, "\n")) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) fail(source, line_number, "expected a node line or a tab-indented edge line, got an empty line");
    if (line.front() == '\t') {
      const std::vector<std::string_view> ends = split_on(line.substr(1), kSeparator);
      if (ends.size() != 2 || ends[0].empty() || ends[1].empty()) {
        fail(source, line_number, cat("expected an edge '<TAB><from> -- <to>', got '", line.substr(1), "'"));
      }
      pending.push_back({std::string(ends[0]), std::string(ends[1]), line_number});
      continue;
    }
    ProfileNode node = parse_node(line, source, line_number);
    if (!index.emplace(node.id, static_cast<int>(graph.nodes.size())).second) {
      fail(source, line_number, cat("duplicate node ", node.id, "; expected each node id once"));
    }
    graph.nodes.push_back(std::move(node));
  }
  std::vector<int> edge_lines;
  for (const PendingEdge& edge : pending) {
    const auto from = index.find(edge.from);
    const auto to = index.find(edge.to);
    if (from == index.end() || to == index.end()) {
      fail(source, edge.line,
           cat("edge names unknown node ", from == index.end() ? edge.from : edge.to,
               "; expected a node defined by a node line"));
    }
    graph.edges.push_back({from->second, to->second});
    edge_lines.push_back(edge.line);
  }
  if (graph.nodes.empty()) fail(source, 1, "expected at least one node line");
  check_acyclic(graph, edge_lines, source);
  return graph;
}

ProfileGraph read_graph_txt(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::NotFound, cat("--graph-txt ", path, ": cannot open the file"));
  std::ostringstream contents;
  contents << in.rdbuf();
  return parse_graph_txt(contents.str(), path);
}

std::string format_graph_txt(const ProfileGraph& graph) {
  std::string out;
  auto text_or = [](const std::string& text, double value, const char* format) {
    return text.empty() ? format_number(value, format) : text;
  };
  for (const ProfileNode& node : graph.nodes) {
    if (!out.empty()) out += '\n';
    out += cat(node.id, kSeparator, node.desc, kSeparator,
               "forward_compute_time=", text_or(node.forward_text, node.forward_ms, "%.3f"),
               ", backward_compute_time=", text_or(node.backward_text, node.backward_ms, "%.3f"),
               ", activation_size=", text_or(node.activation_text, node.activation_bytes, "%.1f"),
               ", parameter_size=", text_or(node.parameter_text, node.parameter_bytes, "%.3f"));
    if (node.stage_id) out += cat(kSeparator, "stage_id=", *node.stage_id);
  }
  for (const ProfileEdge& edge : graph.edges) {
    out += cat("\n\t", graph.nodes[edge.from].id, kSeparator, graph.nodes[edge.to].id);
  }
  if (graph.trailing_newline) out += '\n';
  return out;
}

}  // namespace dynapipe
