// The vocabulary of pipeline scheduling: a PipelineProblem (per-micro-batch, per-stage
// costs + memory), a ScheduleOrder (the compute ops each device runs, in order) and a
// SimResult (what the event simulator says that order costs).
//
// Stages are *virtual* stages: with `chunks` > 1 (interleaved schedules) device d holds
// virtual stages d, d + D, d + 2D, ... (Megatron's layout). Without interleaving stage ==
// device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dynapipe/cost/cost_model.h"

namespace dynapipe {

// Timeline op kinds; spelled as in the plan JSON. Part of plan format v1: never renumber.
enum class OpKind : std::uint8_t {
  F = 0,  // forward
  B = 1,  // full backward
  I = 2,  // backward to the input (zero-bubble)
  W = 3,  // backward to the weights (zero-bubble)
};
char op_kind_letter(OpKind kind);

struct PipelineOp {
  int mb = 0;     // micro-batch id within the replica
  int stage = 0;  // virtual stage
  OpKind kind = OpKind::F;
  friend bool operator==(const PipelineOp&, const PipelineOp&) = default;
};
// "F(mb 3, stage 1)", for messages.
std::string op_name(const PipelineOp& op);

// One op's step of its device's memory as the simulator counts it (Simulator::memory):
// the sent output is freed right before the backward (B or I) of its (mb, stage), a
// forward holds its stored activations and sent output from its start, a B or W frees
// the stored ones after it. Updates `held` (the bytes held between ops) and returns the
// bytes in use during the op (stashed weight versions aside).
inline std::int64_t step_memory(std::int64_t& held, const PipelineOp& op, const StageCost& c) {
  if (op.kind == OpKind::B || op.kind == OpKind::I) held -= c.output_bytes;
  const std::int64_t during = held + (op.kind == OpKind::F ? c.held_bytes() : 0) + c.peak_bytes;
  if (op.kind == OpKind::F) held += c.held_bytes();
  if (op.kind == OpKind::B || op.kind == OpKind::W) held -= c.stored_bytes;
  return during;
}

struct PipelineLayout {
  int num_devices = 1;  // pipeline-parallel degree
  int chunks = 1;       // virtual stages per device (> 1 only for interleaved)
  int num_stages() const { return num_devices * chunks; }
  int device_of(int stage) const { return stage % num_devices; }
  friend bool operator==(const PipelineLayout&, const PipelineLayout&) = default;
};

// When weights change (docs/schedules.md, "Asynchronous schedules"). PerIteration: one
// optimizer step after the whole global batch (every synchronous schedule). The others
// step within the iteration and keep older weight versions (weight_versions.h).
enum class WeightUpdate : std::uint8_t {
  PerIteration,  // synchronous: every op uses the weights of the iteration's start
  PerMicroBatch, // pipedream: a step after every backward, stashed versions
  VerticalSync,  // pipedream --vertical-sync: every stage uses the first stage's version
  TwoBuffer,     // pipedream-2bw: a step per group of pp micro-batches, one version delay
};

struct PipelineProblem {
  PipelineLayout layout;
  std::vector<std::vector<StageCost>> costs;  // [mb][virtual stage]
  std::vector<std::int64_t> static_bytes;     // [device]: parameters, grads, optimizer
  // [device] one copy of the device's parameters, what a stashed weight version costs;
  // empty = 0 (then asynchronous schedules' stashes are free in the simulation).
  std::vector<std::int64_t> weight_bytes;
  bool vertical_sync = false;  // pipedream: every stage uses the first stage's version
  std::int64_t memory_limit_bytes = 0;        // per device; 0 = unlimited
  double link_latency_ms = 0;                 // p2p time = latency + bytes / bandwidth
  double link_bandwidth_gbs = 0;              // 0 = communication is free
  // [device] replicated stages (PipeDream's hybrid; chunks must be 1): device d runs on
  // stage_replicas[d] devices of its own, micro-batch mb on the (mb mod r)-th. Empty: 1
  // each. The simulator then takes one op list per such device (num_sim_devices(), in
  // order: device 0's, then device 1's, ...), each with memory of its own.
  std::vector<int> stage_replicas;
  int num_microbatches() const { return static_cast<int>(costs.size()); }
  int num_stages() const { return layout.num_stages(); }
  int replicas_of(int device) const { return stage_replicas.empty() ? 1 : stage_replicas[device]; }
  // Devices the simulator runs: Σ replicas_of(d) (num_devices without replication).
  int num_sim_devices() const;
  // The simulated device that runs `op`: the first of its device's replicas + op.mb mod r.
  int sim_device_of(const PipelineOp& op) const;
  // latency + bytes / bandwidth (bandwidth in GB/s = 1e9 bytes/s); 0 when the
  // bandwidth is 0 (communication is free).
  double p2p_ms(std::int64_t bytes) const;
  // Duration of one op: F -> fwd_ms, B -> bwd_ms, I -> bwd_input_ms, W -> bwd_weight_ms.
  double op_ms(const PipelineOp& op) const;
  // Throws InvalidArgument naming the first inconsistent field (layout >= 1, costs
  // [mb][num_stages()], static_bytes [num_devices], non-negative costs and limits).
  void validate() const;
  friend bool operator==(const PipelineProblem&, const PipelineProblem&) = default;
};

// Defined here so that the schedule builders' and the simulator's per-op loops inline
// them (out of line they cost ~6% of a plan).
inline double PipelineProblem::p2p_ms(std::int64_t bytes) const {
  if (link_bandwidth_gbs <= 0) return 0;
  // GB/s = 1e9 bytes per second = 1e6 bytes per millisecond.
  return link_latency_ms + static_cast<double>(bytes) / (link_bandwidth_gbs * 1e6);
}

inline int PipelineProblem::sim_device_of(const PipelineOp& op) const {
  const int device = layout.device_of(op.stage);
  if (stage_replicas.empty()) return device;
  int first = 0;
  for (int d = 0; d < device; ++d) first += stage_replicas[d];
  return first + op.mb % stage_replicas[device];
}

inline double PipelineProblem::op_ms(const PipelineOp& op) const {
  const StageCost& c = costs[op.mb][op.stage];
  switch (op.kind) {
    case OpKind::F: return c.fwd_ms;
    case OpKind::B: return c.bwd_ms;
    case OpKind::I: return c.bwd_input_ms;
    case OpKind::W: return c.bwd_weight_ms;
  }
  return 0;
}

struct ScheduleOrder {
  std::vector<std::vector<PipelineOp>> device_ops;  // [device] -> ops in execution order
  // Synchronous (barrier) schedules only, e.g. "cyclic": [device][i] = the cycle op i
  // belongs to; an op of cycle c starts no earlier than every op of cycles < c has
  // ended. Empty = no barriers (every other schedule).
  std::vector<std::vector<int>> op_cycle;
  // How weights are updated along this order (set by the pipedream schedules).
  WeightUpdate weight_update = WeightUpdate::PerIteration;
};

struct TimedOp {
  PipelineOp op;
  int device = 0;
  double start_ms = 0, end_ms = 0;
};

// One activation (forward) or gradient (backward) message between two stages on
// different devices. `send_ms` is when the producing op ends; `arrive_ms` when the data
// is at the consumer.
struct Transfer {
  int mb = 0;
  int from_stage = 0, to_stage = 0;
  int from_device = 0, to_device = 0;
  bool is_grad = false;
  std::int64_t bytes = 0;
  double send_ms = 0, arrive_ms = 0;
};

struct SimResult {
  double makespan_ms = 0;
  std::vector<TimedOp> timeline;             // every compute op, sorted by (start, device)
  std::vector<Transfer> transfers;           // sorted by (send_ms, from_device, to_device)
  std::vector<double> busy_ms;               // [device] compute time
  std::vector<std::int64_t> peak_memory_bytes;  // [device], static included
  std::vector<PipelineOp> peak_op;           // [device] the op during which the peak is reached
  bool fits_memory = true;                   // every device's peak <= memory limit
  // SimOptions::stop_at_ms was reached: the makespan is at least that; the other fields
  // are unspecified.
  bool stopped = false;
};

}  // namespace dynapipe
