// `dynapipe partition`: PipeDream's stage partitioner on a PipeDream profile (graph.txt).
//
//   dynapipe partition --graph-txt FILE --workers 4 2 --bandwidth 1e10 1e9
//                      [--memory-limit GIB] [--straight] [--out partition.json] [--summary-json]
//   dynapipe partition --model gpt-6.7b [--cost-model analytic:a100-40g] [--batch 1 --seqlen 2048
//                      --dec-seqlen 0] ... [--write-graph-txt FILE]   (the transformer's layers)
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/output_file.h"
#include "cli/transformer_graph.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/partition/pipedream_partition.h"
#include "dynapipe/partition/profile_graph.h"
#include "dynapipe/report/table.h"

namespace dynapipe::cli {
namespace {

struct PartitionFlags {
  std::string graph_txt;
  std::string model;  // instead of --graph-txt: a transformer's layers under a cost model
  std::string cost_model = "analytic:a100-40g";
  std::int64_t batch = 1;
  std::int64_t seqlen = 2048;
  std::int64_t dec_seqlen = 0;  // T5: decoder length (0: --seqlen)
  std::string write_graph_txt;
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
  const std::string source = flags.graph_txt.empty() ? cat(flags.model, " on ", flags.cost_model) : flags.graph_txt;
  std::printf("dynapipe partition: %s, workers %s, bandwidth %s bytes/s%s%s; %d antichain states, %.3f s\n\n",
              source.c_str(), join(flags.workers, " ").c_str(), join(flags.bandwidth, " ").c_str(),
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
  if (flags.graph_txt.empty() == flags.model.empty()) {
    throw Error(ErrorKind::InvalidArgument, "give exactly one of --graph-txt FILE and --model NAME");
  }
  ProfileGraph graph;
  if (!flags.graph_txt.empty()) {
    graph = read_graph_txt(flags.graph_txt);
  } else {
    const ModelSpec spec = load_model_spec(flags.model);
    const MicroBatchShape shape{.batch = flags.batch,
                                .seqlen = flags.seqlen,
                                .dec_seqlen = spec.kind == ModelKind::T5 ? (flags.dec_seqlen > 0 ? flags.dec_seqlen : flags.seqlen) : 0};
    graph = transformer_graph(flags.cost_model, spec, shape, /*seqlen_multiple=*/1);
  }
  PipeDreamOptions options;
  options.workers = flags.workers;
  options.bandwidth = flags.bandwidth;
  if (flags.memory_limit_gib > 0) options.memory_limit_bytes = flags.memory_limit_gib * static_cast<double>(kGiB);
  options.straight = flags.straight;
  const PipeDreamPartition result = partition_pipedream(graph, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!flags.out.empty()) write_file_atomically(flags.out, pipedream_partition_json(result, false) + "\n");
  if (!flags.write_graph_txt.empty()) {
    ProfileGraph staged = graph;
    for (std::size_t v = 0; v < staged.nodes.size(); ++v) staged.nodes[v].stage_id = result.stage_of_node[v];
    write_file_atomically(flags.write_graph_txt, format_graph_txt(staged));
  }
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
  command->add_option("--graph-txt", flags->graph_txt, "PipeDream profile (graph.txt)");
  command->add_option("--model", flags->model,
                      "Instead of --graph-txt: a model preset or JSON file, one node per layer costed by --cost-model");
  command->add_option("--cost-model", flags->cost_model, "With --model: analytic:<device> or a profile JSON")
      ->capture_default_str();
  command->add_option("--batch", flags->batch, "With --model: micro-batch rows")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))->capture_default_str();
  command->add_option("--seqlen", flags->seqlen, "With --model: tokens per row (T5: encoder)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))->capture_default_str();
  command->add_option("--dec-seqlen", flags->dec_seqlen, "With --model, T5: decoder tokens per row (0: --seqlen)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 24));
  command->add_option("--write-graph-txt", flags->write_graph_txt,
                      "Write the graph with each node's stage_id (PipeDream's format) to this file");
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
