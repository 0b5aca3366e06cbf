// Schedule module timings: one simulation (what the search repeats) and a full search
// (6 schedules x 3 recompute modes x micro-batch orders), for m = 16, 32, 64
// micro-batches on p = 4, 8 stages with heterogeneous micro-batches.
//
//   build/schedule_bench --benchmark_filter=Simulate
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "dynapipe/core/rng.h"
#include "dynapipe/schedule/schedule.h"
#include "dynapipe/schedule/schedule_search.h"
#include "dynapipe/schedule/simulator.h"

namespace dynapipe {
namespace {

// Micro-batches whose costs vary by 10x, as after DynaPipe's DP; memory per micro-batch
// about 1/8 of the limit; communication on.
PipelineProblem bench_problem(int m, int devices, int chunks, double recompute_factor) {
  Rng rng(42);
  PipelineProblem p;
  p.layout = {devices, chunks};
  p.costs.resize(m);
  for (auto& per_stage : p.costs) {
    const double size = rng.uniform(0.2, 2.0);
    for (int s = 0; s < p.num_stages(); ++s) {
      StageCost c;
      c.fwd_ms = size * 2.0 / chunks;
      c.bwd_ms = size * 4.0 * recompute_factor / chunks;
      c.bwd_input_ms = c.bwd_ms / 2;
      c.bwd_weight_ms = c.bwd_ms / 2;
      c.stored_bytes = static_cast<std::int64_t>(size * (1 << 30) / recompute_factor / chunks);
      c.peak_bytes = 1 << 28;
      c.output_bytes = static_cast<std::int64_t>(size * (16 << 20));
      per_stage.push_back(c);
    }
  }
  p.static_bytes.assign(devices, std::int64_t{20} << 30);
  p.memory_limit_bytes = std::int64_t{28} << 30;
  p.link_latency_ms = 0.01;
  p.link_bandwidth_gbs = 25;
  return p;
}

void BM_Simulate(benchmark::State& state, const std::string& name) {
  const int m = static_cast<int>(state.range(0)), devices = static_cast<int>(state.range(1));
  const PipelineProblem p = bench_problem(m, devices, name == "interleaved" ? 2 : 1, 1.0);
  const auto order = make_schedule(name)->build(p, nullptr);
  Simulator simulator;
  SimResult result;
  for (auto _ : state) {
    simulator.run(p, *order, SimOptions{.record = false}, &result);
    benchmark::DoNotOptimize(result.makespan_ms);
  }
  state.counters["ops"] = 2.0 * m * p.num_stages();
}

void BM_SimulateRecorded(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0)), devices = static_cast<int>(state.range(1));
  const PipelineProblem p = bench_problem(m, devices, 1, 1.0);
  const auto order = make_schedule("1f1b")->build(p, nullptr);
  Simulator simulator;
  SimResult result;
  for (auto _ : state) {
    simulator.run(p, *order, SimOptions{.record = true}, &result);
    benchmark::DoNotOptimize(result.timeline.data());
  }
}

void BM_Build(benchmark::State& state, const std::string& name) {
  const int m = static_cast<int>(state.range(0)), devices = static_cast<int>(state.range(1));
  const PipelineProblem p = bench_problem(m, devices, name == "interleaved" ? 2 : 1, 1.0);
  const auto schedule = make_schedule(name);
  for (auto _ : state) benchmark::DoNotOptimize(schedule->build(p, nullptr));
}

void BM_Search(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0)), devices = static_cast<int>(state.range(1));
  std::vector<SearchCandidate> candidates;
  const std::pair<Recompute, double> modes[] = {
      {Recompute::None, 1.0}, {Recompute::Selective, 1.1}, {Recompute::Full, 1.33}};
  for (const auto& [recompute, factor] : modes) {
    for (ScheduleKind kind : schedule_kinds()) {
      candidates.push_back({kind,
                            recompute,
                            std::make_shared<const PipelineProblem>(bench_problem(
                                m, devices, kind == ScheduleKind::Interleaved ? 2 : 1, factor)),
                            {}});
    }
  }
  int simulations = 0;
  for (auto _ : state) {
    SearchResult r = search_schedule(candidates);
    simulations = r.simulations;
    benchmark::DoNotOptimize(r.sim.makespan_ms);
  }
  state.counters["simulations"] = simulations;
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int devices : {4, 8}) {
    for (int m : {16, 32, 64}) b->Args({m, devices});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_Simulate, 1f1b, std::string("1f1b"))->Apply(shapes);
BENCHMARK_CAPTURE(BM_Simulate, wait_free_cyclic, std::string("wait-free-cyclic"))->Apply(shapes);
BENCHMARK_CAPTURE(BM_Simulate, cyclic, std::string("cyclic"))->Apply(shapes);
BENCHMARK_CAPTURE(BM_Simulate, zb1p, std::string("zb1p"))->Apply(shapes);
BENCHMARK_CAPTURE(BM_Simulate, critical_path, std::string("critical-path"))->Apply(shapes);
BENCHMARK_CAPTURE(BM_Simulate, interleaved, std::string("interleaved"))->Apply(shapes);
BENCHMARK(BM_SimulateRecorded)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Build, cyclic, std::string("cyclic"))->Apply(shapes);
BENCHMARK_CAPTURE(BM_Build, zb1p, std::string("zb1p"))->Apply(shapes);
BENCHMARK_CAPTURE(BM_Build, critical_path, std::string("critical-path"))->Apply(shapes);
BENCHMARK(BM_Search)->Apply(shapes);

}  // namespace
}  // namespace dynapipe

BENCHMARK_MAIN();
