// Lowering: one replica's chosen schedule (ScheduleOrder + the SimResult of that order)
// becomes one instruction list per executor, with explicit communication, tensor shapes
// known ahead, buffer ids and FreeBuffer after last use.
//
//   LoweringInput in;
//   in.model = ModelKind::Gpt; in.hidden = 4096; in.layout = {.num_devices = 4};
//   in.microbatches = shapes;            // [mb id]
//   in.stages = cost_model.stages();     // [virtual stage]
//   in.order = &order; in.sim = &sim;    // not owned
//   std::vector<ExecutorProgram> programs = lower_to_programs(in);
//
// The placement rules (docs/plan-format.md, "Lowering") in one paragraph: every device's
// compute ops run in ScheduleOrder; each cross-device boundary crossing is one message
// posted by SendXStart right after its producer; the receiver posts RecvXStart right
// before its first compute op the simulation starts at or after the send time (so both
// sides of a pair post in send-time order), and RecvXFinish right before the consumer.
// SendActivationFinish waits right before the backward (B or I) of the same (mb, stage),
// since backward keeps that tensor alive anyway; SendGradFinish right before the first
// compute op that starts at or after the simulated arrival, else at the end. With these
// rules every blocking instruction waits only for an instruction that the simulation
// placed strictly earlier, so the lists cannot deadlock (proof sketch in the docs), and
// verify_programs() checks it for every plan.
//
// Thread-safety: pure function of its input.
#pragma once

#include <cstdint>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/plan/instruction.h"
#include "dynapipe/schedule/pipeline.h"

namespace dynapipe {

struct LoweringInput {
  ModelKind model = ModelKind::Gpt;
  std::int64_t hidden = 0;                 // d_model; > 0
  PipelineLayout layout;                   // virtual stage v runs on device v % num_devices
  std::vector<MicroBatchShape> microbatches;  // [mb id] padded shapes; non-empty
  // [virtual stage] what each stage holds (layout.num_stages() entries). A stage loads
  // input (LoadInput before each of its forwards) when it has an embedding, the T5
  // decoder embedding or the head (labels); has_decoder() selects the T5 shape rule.
  std::vector<StageLayers> stages;
  int replica = 0;  // data-parallel replica; ranks are replica * num_devices + device
  int dp = 1;       // data-parallel degree; ReduceGrads is emitted only when dp > 1
  // The chosen schedule and what the simulator says it costs; not owned, must outlive
  // the call. Every op of `order` must appear in sim->timeline. sim->transfers gives
  // arrival times; a crossing without a Transfer arrives when it is sent.
  const ScheduleOrder* order = nullptr;
  const SimResult* sim = nullptr;
};

// The tensor that crosses the boundary after `sender` (to the next stage; the gradient
// going back has the same shape), as a pure function of the boundary and the padded
// micro-batch shape:
//   GPT:                               [batch, seqlen, hidden]
//   T5, sender holds no decoder layer: [batch, enc_seqlen, hidden]   (encoder hidden /
//                                       the encoder output at the encoder->decoder cut)
//   T5, sender holds decoder layers:   [batch, enc_seqlen + dec_seqlen, hidden]
//                                       (encoder output ++ decoder hidden along seq)
std::vector<std::int64_t> boundary_shape(ModelKind model, const StageLayers& sender,
                                         const MicroBatchShape& shape, std::int64_t hidden);

// True when the stage runs LoadInput before each forward (see LoweringInput::stages).
bool stage_loads_input(const StageLayers& stage);

// One program per device of the replica, in device order. Throws InvalidArgument naming
// the field when the input is inconsistent (missing ops, an op on the wrong device, a
// timeline that disagrees with the order); the result always passes verify_programs().
//
// Invariants: per device, instructions follow ScheduleOrder; between every ordered pair
// of executors, sends and receives are posted in the same order (send time, ties broken
// by the sender's order); buffer ids are 0, 1, 2, ... per executor in order of first
// write, never reused, each freed once after its last use.
// Complexity: O(ops + transfers · log) time and memory.
std::vector<ExecutorProgram> lower_to_programs(const LoweringInput& input);

// Asynchronous schedules (order.weight_update != PerIteration; docs/plan-format.md,
// "Weight versions"): rewrites the programs lower_to_programs() made from `order` so that
// every Forward / Backward names its weight version (weight_versions(order)), each
// optimizer step of a device follows its Backward (after the sends posted right after
// it), preceded by StashWeights when a later op still needs the version it leaves
// behind; FreeWeights follows a stashed version's last use (before that stash). The trailing
// OptimizerStep of the synchronous lowering goes. Throws InvalidArgument for dp > 1
// programs (ReduceGrads) or a compute op the order does not have.
void add_weight_versions(std::vector<ExecutorProgram>& programs, const ScheduleOrder& order);

}  // namespace dynapipe
