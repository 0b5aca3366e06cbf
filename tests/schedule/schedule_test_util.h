// Small builders of PipelineProblems for the schedule tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dynapipe/core/rng.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/schedule/pipeline.h"

namespace dynapipe::testing {

// One device's ops as "F0 B0 I1 W1 ...", to compare with an order checked by hand.
inline std::string letters(const std::vector<PipelineOp>& ops) {
  std::string text;
  for (const PipelineOp& op : ops) text += cat(op_kind_letter(op.kind), op.mb, ' ');
  return text;
}

// m equal micro-batches on `devices` x `chunks` virtual stages; backward split evenly
// into I and W; no memory limit, free communication; no sent output (output_bytes 0), so
// memory is stored and peak bytes only (tests of held outputs and of message times set
// output_bytes themselves).
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

// Whole backward only (I = W = 0), so the schedules run B.
inline PipelineProblem fused(PipelineProblem p) {
  for (auto& per_stage : p.costs) {
    for (StageCost& c : per_stage) c.bwd_input_ms = c.bwd_weight_ms = 0;
  }
  return p;
}

// 2 devices, free messages, no limit, whole backward. mb 0: f = 2, b = 4; mbs 1, 2: f = 1,
// b = 2 (critical-path's makespan 16, 1F1B's 18: CriticalPathTest.LongThenShort...).
inline PipelineProblem long_then_short_problem() {
  PipelineProblem p = fused(uniform_problem(3, 2, 1.0, 2.0));
  for (StageCost& c : p.costs[0]) {
    c.fwd_ms = 2.0;
    c.bwd_ms = 4.0;
  }
  return p;
}

// A problem for SearchCandidate::problem.
inline std::shared_ptr<const PipelineProblem> shared(PipelineProblem p) {
  return std::make_shared<const PipelineProblem>(std::move(p));
}

}  // namespace dynapipe::testing
