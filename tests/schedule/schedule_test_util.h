// Small builders of PipelineProblems for the schedule tests.
#pragma once

#include <cstdint>

#include "dynapipe/core/rng.h"
#include "dynapipe/schedule/pipeline.h"

namespace dynapipe::testing {

// m equal micro-batches on `devices` x `chunks` virtual stages; backward split evenly
// into I and W; no memory limit, free communication.
inline PipelineProblem uniform_problem(int m, int devices, double fwd_ms, double bwd_ms,
                                       int chunks = 1) {
  PipelineProblem p;
  p.layout = {devices, chunks};
  StageCost c;
  c.fwd_ms = fwd_ms;
  c.bwd_ms = bwd_ms;
  c.bwd_input_ms = bwd_ms / 2;
  c.bwd_weight_ms = bwd_ms / 2;
  c.stored_bytes = 100;
  c.peak_bytes = 10;
  c.output_bytes = 1000;
  p.costs.assign(m, std::vector<StageCost>(p.num_stages(), c));
  p.static_bytes.assign(devices, 0);
  return p;
}

// Random per-(mb, stage) costs: times in [0.1, 5) ms (I + W = B, in random shares),
// bytes in [1, 1000]; with probability 1/2 a communication link.
inline PipelineProblem random_problem(Rng& rng, int m, int devices, int chunks) {
  PipelineProblem p;
  p.layout = {devices, chunks};
  p.costs.resize(m);
  for (auto& per_stage : p.costs) {
    // Micro-batches differ by a size factor, stages by their own jitter.
    const double size = rng.uniform(0.2, 2.0);
    for (int s = 0; s < p.num_stages(); ++s) {
      StageCost c;
      c.fwd_ms = size * rng.uniform(0.1, 2.5);
      c.bwd_ms = size * rng.uniform(0.1, 5.0);
      const double share = rng.uniform(0.2, 0.8);
      c.bwd_input_ms = c.bwd_ms * share;
      c.bwd_weight_ms = c.bwd_ms - c.bwd_input_ms;
      c.stored_bytes = static_cast<std::int64_t>(size * rng.uniform_int(1, 1000));
      c.peak_bytes = rng.uniform_int(0, 200);
      c.output_bytes = rng.uniform_int(1, 1000);
      per_stage.push_back(c);
    }
  }
  p.static_bytes.resize(devices);
  for (auto& b : p.static_bytes) b = rng.uniform_int(0, 1000);
  if (rng.uniform() < 0.5) {
    p.link_latency_ms = rng.uniform(0.0, 0.5);
    p.link_bandwidth_gbs = rng.uniform(0.001, 0.01);  // 1000 bytes: 0.1 .. 1 ms
  }
  return p;
}

}  // namespace dynapipe::testing
