// libFuzzer target: the graph.txt reader (parse_graph_txt) and PipeDream's partitioner on
// arbitrary bytes. Properties: only dynapipe::Error escapes; an accepted graph written and
// read again writes the same text; a small accepted graph partitions over 1-3 workers
// (or throws Error) with every node in exactly one stage.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dynapipe/core/error.h"
#include "dynapipe/partition/pipedream_partition.h"
#include "dynapipe/partition/profile_graph.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dynapipe;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ProfileGraph graph = parse_graph_txt(text, "fuzz");
    const std::string once = format_graph_txt(graph);
    if (format_graph_txt(parse_graph_txt(once, "fuzz (again)")) != once) fuzz::finding("graph.txt does not round-trip");
    if (graph.nodes.size() > 12) return 0;  // the antichain DAG grows exponentially with branches
    const int workers = 1 + static_cast<int>(size % 3);
    const PipeDreamPartition result = partition_pipedream(graph, {{workers}, {1e9}, {}, false});
    std::size_t listed = 0;
    for (const PipeDreamStage& stage : result.stages) listed += stage.nodes.size();
    if (listed != graph.nodes.size()) fuzz::finding("partition lost or repeated nodes");
  } catch (const Error&) {
  }
  return 0;
}
