// Test-local schedules for plan/ tests: tiny 1F1B / GPipe / looped-interleaved / ZB1P
// order generators and an event simulator that times an order and lists its transfers.
// The real ones live in schedule/; these only have to be valid and deterministic.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dynapipe/cost/model_spec.h"
#include "dynapipe/plan/execution_plan.h"
#include "dynapipe/plan/lowering.h"
#include "dynapipe/schedule/pipeline.h"

namespace dynapipe::testing {

// 1F1B (linear placement): device d warms up with min(D - d, M) forwards, then
// alternates backward/forward, then drains. split: B becomes I immediately followed by W
// for the last (D - d - 1) micro-batches' W deferred to the end (a ZB1P-like shape).
inline ScheduleOrder one_f_one_b(int devices, int mbs, bool split = false) {
  ScheduleOrder order;
  order.device_ops.resize(devices);
  for (int d = 0; d < devices; ++d) {
    auto& ops = order.device_ops[d];
    int warmup = std::min(devices - d, mbs);
    int next_f = 0, next_b = 0;
    std::vector<int> deferred_w;
    auto backward = [&](int mb) {
      if (!split) {
        ops.push_back({mb, d, OpKind::B});
        return;
      }
      ops.push_back({mb, d, OpKind::I});
      if (mb >= mbs - (devices - d - 1)) {
        deferred_w.push_back(mb);
      } else {
        ops.push_back({mb, d, OpKind::W});
      }
    };
    for (; next_f < warmup; ++next_f) ops.push_back({next_f, d, OpKind::F});
    while (next_b < mbs) {
      backward(next_b++);
      if (next_f < mbs) ops.push_back({next_f++, d, OpKind::F});
    }
    for (int mb : deferred_w) ops.push_back({mb, d, OpKind::W});
  }
  return order;
}

inline ScheduleOrder gpipe(int devices, int mbs) {
  ScheduleOrder order;
  order.device_ops.resize(devices);
  for (int d = 0; d < devices; ++d) {
    for (int mb = 0; mb < mbs; ++mb) order.device_ops[d].push_back({mb, d, OpKind::F});
    for (int mb = 0; mb < mbs; ++mb) order.device_ops[d].push_back({mb, d, OpKind::B});
  }
  return order;
}

// Looped breadth-first over chunks: stage v on device v % D.
inline ScheduleOrder looped(const PipelineLayout& layout, int mbs) {
  ScheduleOrder order;
  order.device_ops.resize(layout.num_devices);
  for (int d = 0; d < layout.num_devices; ++d) {
    auto& ops = order.device_ops[d];
    for (int c = 0; c < layout.chunks; ++c) {
      for (int mb = 0; mb < mbs; ++mb) ops.push_back({mb, c * layout.num_devices + d, OpKind::F});
    }
    for (int c = layout.chunks - 1; c >= 0; --c) {
      for (int mb = 0; mb < mbs; ++mb) ops.push_back({mb, c * layout.num_devices + d, OpKind::B});
    }
  }
  return order;
}

// Times an order: each device runs its ops in order as soon as their inputs are there.
// F = fwd_ms, B = 2 * fwd_ms, I = W = fwd_ms; a cross-device message takes comm_ms.
inline SimResult simulate(const ScheduleOrder& order, const PipelineLayout& layout, int mbs,
                          double fwd_ms = 1.0, double comm_ms = 0.0) {
  const int stages = layout.num_stages();
  auto key = [&](int mb, int stage, OpKind kind) {
    return (mb * stages + stage) * 4 + static_cast<int>(kind);
  };
  std::vector<double> end(static_cast<std::size_t>(mbs) * stages * 4, -1);
  std::vector<int> device_of_end(end.size(), -1);
  std::vector<std::size_t> pc(layout.num_devices, 0);
  std::vector<double> free_at(layout.num_devices, 0);
  SimResult sim;
  auto ready = [&](int mb, int stage, OpKind kind, int device, double& at) {
    auto need = [&](int m, int s, OpKind k) {
      double t = end[key(m, s, k)];
      if (t < 0) return false;
      if (device_of_end[key(m, s, k)] != device) t += comm_ms;
      at = std::max(at, t);
      return true;
    };
    if (kind == OpKind::F) return stage == 0 || need(mb, stage - 1, OpKind::F);
    if (kind == OpKind::W) return need(mb, stage, OpKind::I);
    if (!need(mb, stage, OpKind::F)) return false;
    if (stage + 1 == stages) return true;
    return end[key(mb, stage + 1, OpKind::B)] >= 0 ? need(mb, stage + 1, OpKind::B)
                                                   : need(mb, stage + 1, OpKind::I);
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int d = 0; d < layout.num_devices; ++d) {
      while (pc[d] < order.device_ops[d].size()) {
        const PipelineOp& op = order.device_ops[d][pc[d]];
        double at = free_at[d];
        if (!ready(op.mb, op.stage, op.kind, d, at)) break;
        double duration = op.kind == OpKind::B ? 2 * fwd_ms : fwd_ms;
        sim.timeline.push_back({op, d, at, at + duration});
        end[key(op.mb, op.stage, op.kind)] = at + duration;
        device_of_end[key(op.mb, op.stage, op.kind)] = d;
        free_at[d] = at + duration;
        ++pc[d];
        progress = true;
      }
    }
  }
  for (int d = 0; d < layout.num_devices; ++d) {
    if (pc[d] != order.device_ops[d].size()) throw std::runtime_error("test order deadlocks");
  }
  std::sort(sim.timeline.begin(), sim.timeline.end(), [](const TimedOp& a, const TimedOp& b) {
    return std::tie(a.start_ms, a.device) < std::tie(b.start_ms, b.device);
  });
  for (const TimedOp& t : sim.timeline) {
    sim.makespan_ms = std::max(sim.makespan_ms, t.end_ms);
    const PipelineOp& op = t.op;
    int to_stage = op.kind == OpKind::F ? op.stage + 1 : op.stage - 1;
    if (op.kind == OpKind::W || to_stage < 0 || to_stage >= stages) continue;
    int to_device = layout.device_of(to_stage);
    if (to_device == t.device) continue;
    sim.transfers.push_back({op.mb, op.stage, to_stage, t.device, to_device, op.kind != OpKind::F, 0,
                             t.end_ms, t.end_ms + comm_ms});
  }
  return sim;
}

// Stage contents: GPT — embedding on stage 0, head on the last stage. T5 — the first
// half of the stages encode, the rest decode (decoder embedding at the first of them).
inline std::vector<StageLayers> gpt_stages(int stages) {
  std::vector<StageLayers> layers(stages);
  for (int s = 0; s < stages; ++s) layers[s].enc_begin = s, layers[s].enc_end = s + 1;
  layers.front().has_embedding = true;
  layers.back().has_head = true;
  return layers;
}

inline std::vector<StageLayers> t5_stages(int stages) {
  std::vector<StageLayers> layers(stages);
  int enc = std::max(1, stages / 2);
  for (int s = 0; s < stages; ++s) {
    if (s < enc && stages > 1) {
      layers[s].enc_begin = s, layers[s].enc_end = s + 1;
    } else if (stages == 1) {
      layers[s].enc_begin = 0, layers[s].enc_end = 1, layers[s].dec_begin = 0, layers[s].dec_end = 1;
    } else {
      layers[s].dec_begin = s - enc, layers[s].dec_end = s - enc + 1;
    }
  }
  layers.front().has_embedding = true;
  layers[stages == 1 ? 0 : enc].has_dec_embedding = true;
  layers.back().has_head = true;
  return layers;
}

// A lowered replica, with the order and simulation it came from.
struct Lowered {
  PipelineLayout layout;
  ScheduleOrder order;
  SimResult sim;
  std::vector<MicroBatchShape> shapes;
  std::vector<ExecutorProgram> programs;
};

inline std::vector<MicroBatchShape> varied_shapes(int mbs, ModelKind model) {
  std::vector<MicroBatchShape> shapes;
  for (int mb = 0; mb < mbs; ++mb) {
    shapes.push_back({1 + mb % 3, 8 * (1 + (mb * 5) % 7), model == ModelKind::T5 ? 8 * (1 + mb % 2) : 0});
  }
  return shapes;
}

inline Lowered lower(ScheduleOrder order, PipelineLayout layout, int mbs, ModelKind model = ModelKind::Gpt,
                     int replica = 0, int dp = 1, double comm_ms = 0.0) {
  Lowered out;
  out.layout = layout;
  out.order = std::move(order);
  out.sim = simulate(out.order, layout, mbs, 1.0, comm_ms);
  out.shapes = varied_shapes(mbs, model);
  LoweringInput in;
  in.model = model;
  in.hidden = 16;
  in.layout = layout;
  in.microbatches = out.shapes;
  in.stages = model == ModelKind::T5 ? t5_stages(layout.num_stages()) : gpt_stages(layout.num_stages());
  in.replica = replica;
  in.dp = dp;
  in.order = &out.order;
  in.sim = &out.sim;
  out.programs = lower_to_programs(in);
  return out;
}

// A complete plan: `iterations` iterations of `dp` replicas of a 1F1B schedule over
// `pp` devices, with estimates, packed rows on one micro-batch and awkward doubles.
inline ExecutionPlan sample_plan(ModelKind model, int pp = 2, int dp = 2, int iterations = 2, int mbs = 3) {
  ExecutionPlan plan;
  plan.config.model.name = model == ModelKind::T5 ? "t5-tiny" : "gpt-tiny";
  plan.config.model.kind = model;
  plan.config.model.hidden = 16;
  plan.config.model.heads = 2;
  plan.config.model.ffn_hidden = 64;
  plan.config.model.layers = 4;
  plan.config.model.dec_layers = model == ModelKind::T5 ? 4 : 0;
  plan.config.model.vocab = 512;
  plan.config.model.max_positions = 1024;
  plan.config.samples_path = "assets/flan-mini.jsonl.gz";
  plan.config.schedule = ScheduleKind::OneFOneB;
  plan.config.pp = pp;
  plan.config.dp = dp;
  plan.config.max_seqlen = 512;
  plan.config.max_target_len = 64;
  plan.config.global_batch_tokens = 65536;
  plan.config.memory_limit_gib = 0.1;
  plan.config.seed = 18446744073709551557ull;  // needs uint64
  plan.config.iterations = iterations;
  SampleId next_id = 0;
  for (int i = 0; i < iterations; ++i) {
    IterationPlan it;
    it.index = i;
    for (int r = 0; r < dp; ++r) {
      Lowered l = lower(one_f_one_b(pp, mbs), {.num_devices = pp}, mbs, model, r, dp, 0.25);
      ReplicaPlan replica;
      for (int mb = 0; mb < mbs; ++mb) {
        MicroBatch m;
        m.id = mb;
        m.shape = l.shapes[mb];
        for (int k = 0; k < m.shape.batch; ++k) m.sample_ids.push_back(next_id++);
        if (mb == 1) m.rows = {m.sample_ids, {}};
        if (mb == 2) m.density = {0.5, 1.0 / 3.0};
        m.real_tokens = m.shape.tokens() - mb % 2;
        m.target_tokens = 7 * mb;
        it.sample_ids.insert(it.sample_ids.end(), m.sample_ids.begin(), m.sample_ids.end());
        replica.microbatches.push_back(m);
        MicroBatchEstimate e;
        for (int s = 0; s < pp; ++s) {
          e.fwd_ms.push_back(0.1 * (s + 1) + mb);
          e.bwd_ms.push_back(2.0 / 3.0 + s);
          e.activation_bytes.push_back((std::int64_t{1} << 40) + s);
        }
        replica.estimates.push_back(e);
      }
      replica.schedule = ScheduleKind::OneFOneB;
      replica.recompute = r == 0 ? Recompute::None : Recompute::Selective;
      replica.est_iteration_ms = l.sim.makespan_ms;
      replica.est_peak_memory_bytes.assign(pp, 123456789012);
      replica.timeline = l.sim.timeline;
      replica.executors = l.programs;
      it.replicas.push_back(std::move(replica));
    }
    it.truncated_ids = {it.sample_ids.front()};
    it.est_iteration_ms = 12.5 + i;
    it.padding_efficiency = 0.1 + 0.2;  // 0.30000000000000004
    it.planning_ms = 1e-7;
    plan.iterations.push_back(std::move(it));
  }
  plan.summary = {iterations, 13.0, 1.5e6, 0.3, 2.25, 4.5};
  return plan;
}

}  // namespace dynapipe::testing
