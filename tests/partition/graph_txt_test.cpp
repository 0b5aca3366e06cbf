// graph.txt reader/writer: byte-stable round trip of PipeDream's files, list-valued
// activations, and malformed input naming file, line and what was expected.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "dynapipe/core/error.h"
#include "dynapipe/partition/pipedream_partition.h"
#include "dynapipe/partition/profile_graph.h"

namespace dynapipe {
namespace {

const std::string kProfiles = DYNAPIPE_SOURCE_DIR "/assets/pipedream-profiles/";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string parse_error(const std::string& text) {
  try {
    parse_graph_txt(text, "bad.txt");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ParseError);
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

const char* kNodeA = "node1 -- Conv2d(3, 8) -- forward_compute_time=1.500, backward_compute_time=2.000, activation_size=100.0, parameter_size=40.000";
const char* kNodeB = "node2 -- ReLU(inplace) -- forward_compute_time=0.500, backward_compute_time=0.250, activation_size=100.0, parameter_size=0.000";

TEST(GraphTxt, RoundTripIsByteStableOnPipeDreamProfiles) {
  for (const char* model : {"vgg16", "resnet18", "resnet50", "gnmt"}) {
    const std::string text = slurp(kProfiles + model + ".graph.txt");
    ASSERT_FALSE(text.empty()) << model;
    const ProfileGraph graph = parse_graph_txt(text, model);
    EXPECT_EQ(format_graph_txt(graph), text) << model;
  }
}

TEST(GraphTxt, ReadsFieldsEdgesAndListActivations) {
  const ProfileGraph graph = read_graph_txt(kProfiles + "gnmt.graph.txt");
  const int lstm = graph.find("node7");
  ASSERT_GE(lstm, 0);
  EXPECT_EQ(graph.nodes[lstm].desc, "LSTM(2048, 1024)");
  EXPECT_DOUBLE_EQ(graph.nodes[lstm].forward_ms, 3.190);
  EXPECT_DOUBLE_EQ(graph.nodes[lstm].backward_ms, 5.348);
  EXPECT_DOUBLE_EQ(graph.nodes[lstm].activation_bytes, 6291456.0 + 131072.0 + 131072.0);
  EXPECT_DOUBLE_EQ(graph.nodes[lstm].parameter_bytes, 50364416.0);
  EXPECT_EQ(graph.nodes[graph.edges.front().from].id, "node1");
  EXPECT_EQ(graph.nodes[graph.edges.front().to].id, "node4");
  EXPECT_EQ(graph.find("node999"), -1);
}

TEST(GraphTxt, StageIdAndNodesBuiltInCode) {
  ProfileGraph graph = parse_graph_txt(std::string(kNodeA) + " -- stage_id=3\n" + kNodeB + "\n\tnode1 -- node2\n", "g");
  ASSERT_EQ(graph.nodes.size(), 2u);
  EXPECT_EQ(graph.nodes[0].stage_id, 3);
  EXPECT_FALSE(graph.nodes[1].stage_id.has_value());
  ProfileNode extra;
  extra.id = "node3";
  extra.desc = "Linear";
  extra.forward_ms = 1.23456;
  extra.activation_bytes = 2048;
  extra.parameter_bytes = 10;
  extra.stage_id = 1;
  graph.nodes.push_back(extra);
  graph.edges.push_back({1, 2});
  EXPECT_EQ(format_graph_txt(graph),
            std::string(kNodeA) + " -- stage_id=3\n" + kNodeB +
                "\nnode3 -- Linear -- forward_compute_time=1.235, backward_compute_time=0.000, "
                "activation_size=2048.0, parameter_size=10.000 -- stage_id=1\n\tnode1 -- node2\n\tnode2 -- node3\n");
}

TEST(GraphTxt, MalformedInputNamesFileLineAndExpectation) {
  const std::string a = kNodeA, b = kNodeB;
  EXPECT_EQ(parse_error(a + "\nnode2 -- ReLU -- forward_compute_time=0.5, backward_compute_time=0.2, activation_size=1.0"),
            "bad.txt:2: missing field parameter_size of node node2");
  EXPECT_EQ(parse_error(a + "\n" + b + "\n\tnode1 -- node9"),
            "bad.txt:3: edge names unknown node node9; expected a node defined by a node line");
  EXPECT_EQ(parse_error(a + "\n" + b + "\n\tnode1 -- node2\n\tnode2 -- node1"),
            "bad.txt:4: edge node2 -- node1 closes a cycle; expected an acyclic graph");
  EXPECT_EQ(parse_error(a + "\n" + b + "\n\tnode1 -- node1"),
            "bad.txt:3: edge node1 -- node1 closes a cycle; expected an acyclic graph");
  EXPECT_EQ(parse_error(a + "\n" + a),
            "bad.txt:2: duplicate node node1; expected each node id once");
  EXPECT_EQ(parse_error("node1 -- X -- forward_compute_time=abc, backward_compute_time=0, activation_size=0, parameter_size=0"),
            "bad.txt:1: forward_compute_time must be a non-negative number, got 'abc'");
  EXPECT_EQ(parse_error("node1 -- X -- forward_compute_time=1, backward_time=0, activation_size=0, parameter_size=0"),
            "bad.txt:1: expected 'backward_compute_time=<number>', got 'backward_time=0'");
  EXPECT_EQ(parse_error("node1 -- X -- forward_compute_time=1, backward_compute_time=0, activation_size=[1; x], parameter_size=0"),
            "bad.txt:1: activation_size list items must be non-negative numbers, got 'x'");
  EXPECT_NE(parse_error("node1 -- forward_compute_time=1").find("bad.txt:1: expected '<id> -- <description> -- "),
            std::string::npos);
  EXPECT_EQ(parse_error(a + "\n\tnode1 node2"), "bad.txt:2: expected an edge '<TAB><from> -- <to>', got 'node1 node2'");
  EXPECT_EQ(parse_error(a + "\n\n" + b), "bad.txt:2: expected a node line or a tab-indented edge line, got an empty line");
  EXPECT_EQ(parse_error(""), "bad.txt:1: expected at least one node line, got an empty file");
}

// Replays the fuzz corpus (tests/fuzz/corpus/graph_txt: seeds and any finding once fixed):
// each input parses and partitions, or throws dynapipe::Error.
TEST(GraphTxt, FuzzCorpusParsesOrThrowsError) {
  int parsed = 0, refused = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(DYNAPIPE_SOURCE_DIR "/tests/fuzz/corpus/graph_txt")) {
    SCOPED_TRACE(entry.path().filename().string());
    try {
      const ProfileGraph graph = parse_graph_txt(slurp(entry.path().string()), entry.path().string());
      EXPECT_EQ(format_graph_txt(parse_graph_txt(format_graph_txt(graph), "again")), format_graph_txt(graph));
      partition_pipedream(graph, {{2}, {1e9}, {}, false});
      ++parsed;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GE(parsed, 2);
  EXPECT_GE(refused, 3);
}

TEST(GraphTxt, MissingFileIsNotFound) {
  try {
    read_graph_txt("/nonexistent/graph.txt");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/graph.txt"), std::string::npos);
  }
}

}  // namespace
}  // namespace dynapipe
