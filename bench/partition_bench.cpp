// PipeDream's partitioner on its public profiles (assets/pipedream-profiles), 16 workers:
// parse + antichain DAG + DP, the whole of `dynapipe partition` but printing. Target: <= 1 s.
//
//   build/bench/partition_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "dynapipe/partition/pipedream_partition.h"
#include "dynapipe/partition/profile_graph.h"

namespace {

const char* const kModels[] = {"vgg16", "resnet18", "resnet50", "gnmt"};

void BM_PartitionProfile(benchmark::State& state) {
  const std::string path =
      std::string(DYNAPIPE_SOURCE_DIR "/assets/pipedream-profiles/") + kModels[state.range(0)] + ".graph.txt";
  dynapipe::PipeDreamOptions options;
  if (state.range(1) == 1) {
    options.workers = {16};
    options.bandwidth = {1e9};
  } else {
    options.workers = {8, 2};  // 8 workers per machine, 2 machines
    options.bandwidth = {1e10, 1e9};
  }
  for (auto _ : state) {
    const dynapipe::ProfileGraph graph = dynapipe::read_graph_txt(path);
    benchmark::DoNotOptimize(dynapipe::partition_pipedream(graph, options).time_per_stage_s);
  }
  state.SetLabel(std::string(kModels[state.range(0)]) + (state.range(1) == 1 ? " 16" : " 8x2"));
}
BENCHMARK(BM_PartitionProfile)
    ->ArgsProduct({{0, 1, 2, 3}, {1, 2}})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
