// `dynapipe partition`: PipeDream's stage partitioner on a PipeDream profile (graph.txt).
//
//   dynapipe partition --graph-txt FILE --workers 4 2 --bandwidth 1e10 1e9
//                      [--memory-limit GIB] [--straight] [--out partition.json] [--summary-json]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/output_file.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/partition/pipedream_partition.h"
#include "dynapipe/partition/profile_graph.h"
#include "dynapipe/report/table.h"

namespace dynapipe::cli {
namespace {

struct PartitionFlags {
  std::string graph_txt;
  std::vector<int> workers{4};
  std::vector<double> bandwidth{1e9};
  double memory_limit_gib = 0;  // 0: no limit
  bool straight = false;
  std::string out;
  bool summary_json = false;
};

std::string format_ms(double seconds) { return format_fixed(seconds * 1e3, 3); }

std::string node_range(const PipeDreamStage& stage) {
  if (stage.nodes.empty()) return "-";
  if (stage.nodes.size() == 1) return stage.nodes.front();
  return cat(stage.nodes.front(), "..", stage.nodes.back(), " (", stage.nodes.size(), ")");
}

void print_table(const PartitionFlags& flags, const PipeDreamPartition& result, double seconds) {
  std::printf("dynapipe partition: %s, workers %s, bandwidth %s bytes/s%s%s; %d antichain states, %.3f s\n\n",
              flags.graph_txt.c_str(), join(flags.workers, " ").c_str(), join(flags.bandwidth, " ").c_str(),
              flags.straight ? ", straight" : "",
              flags.memory_limit_gib > 0 ? cat(", memory limit ", flags.memory_limit_gib, " GiB").c_str() : "",
              result.num_states, seconds);
  TextTable table({"stage", "states", "nodes", "replicas", "compute ms", "all-reduce ms", "transfer ms"});
  for (std::size_t s = 0; s < result.stages.size(); ++s) {
    const PipeDreamStage& stage = result.stages[s];
    table.add_row({std::to_string(s), cat(stage.first_state, "-", stage.end_state), node_range(stage),
                   std::to_string(stage.replicas), format_ms(stage.compute_per_input_s),
                   format_ms(stage.allreduce_per_input_s), format_ms(stage.transfer_per_input_s)});
  }
  std::fputs(table.to_markdown().c_str(), stdout);
  std::printf("\ntime per stage (bottleneck): %.6f ms per input\n", result.time_per_stage_s * 1e3);
  std::printf("speed-up over data parallelism on the same workers: %.3fx (data parallel %.6f ms per input)\n",
              result.speedup_over_data_parallel(), result.data_parallel_s * 1e3);
  std::printf("speed-up over one worker: %.3fx\n", result.speedup_over_single_worker());
}

void run_partition(const PartitionFlags& flags) {
  if (flags.memory_limit_gib < 0) {
    throw Error(ErrorKind::InvalidArgument, cat("--memory-limit must be >= 0 GiB, got ", flags.memory_limit_gib));
  }
  const auto start = std::chrono::steady_clock::now();
  const ProfileGraph graph = read_graph_txt(flags.graph_txt);
  PipeDreamOptions options;
  options.workers = flags.workers;
  options.bandwidth = flags.bandwidth;
  if (flags.memory_limit_gib > 0) options.memory_limit_bytes = flags.memory_limit_gib * static_cast<double>(kGiB);
  options.straight = flags.straight;
  const PipeDreamPartition result = partition_pipedream(graph, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!flags.out.empty()) write_file_atomically(flags.out, pipedream_partition_json(result, false) + "\n");
  if (flags.summary_json) {
    std::printf("%s\n", pipedream_partition_json(result, true).c_str());
  } else {
    print_table(flags, result, seconds);
  }
}

void setup_partition(CLI::App& app) {
  auto flags = std::make_shared<PartitionFlags>();
  CLI::App* command = app.add_subcommand(
      "partition", "PipeDream's stage partitioner: stages and replicas for a PipeDream profile (graph.txt)");
  command->add_option("--graph-txt", flags->graph_txt, "PipeDream profile (graph.txt)")->required();
  command->add_option("--workers", flags->workers, "workers per level, bottom level first (e.g. 4 2)")
      ->expected(1, 8)
      ->capture_default_str();
  command->add_option("--bandwidth", flags->bandwidth, "bytes/s per level, same count as --workers")
      ->expected(1, 8)
      ->capture_default_str();
  command->add_option("--memory-limit", flags->memory_limit_gib,
                      "per-worker memory in GiB, stashed weight versions counted (0: no limit)");
  command->add_flag("--straight", flags->straight, "no replication: one worker per stage");
  command->add_option("--out", flags->out, "write the partition as JSON to this file");
  command->add_flag("--summary-json", flags->summary_json,
                    "print only {\"time_per_stage\", \"stages\"} as one JSON object");
  command->callback([flags] { run_partition(*flags); });
}

const bool registered = register_command({"partition", &setup_partition});

}  // namespace
}  // namespace dynapipe::cli
