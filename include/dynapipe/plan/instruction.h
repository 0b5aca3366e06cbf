// The execution-plan instruction set: what one executor (one rank) runs, in order.
//
// Compute: LoadInput, Forward, Backward, BackwardInput, BackwardWeight.
// Communication: *Start posts a non-blocking operation, *Finish waits for it. Between
// two executors, sends and receives are matched in posting order and must agree on
// kind, mb and shape. Memory: FreeBuffer. Step: ReduceGrads (data-parallel all-reduce),
// OptimizerStep. Weight versions (asynchronous schedules, docs/plan-format.md): StashWeights
// keeps a copy of the current version, FreeWeights drops a stashed one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dynapipe {

// Spelled as in the plan JSON (docs/plan-format.md). Part of plan format v1: never renumber.
enum class InstructionOp : std::uint8_t {
  LoadInput = 0,
  Forward = 1,
  Backward = 2,
  BackwardInput = 3,
  BackwardWeight = 4,
  SendActivationStart = 5,
  SendActivationFinish = 6,
  RecvActivationStart = 7,
  RecvActivationFinish = 8,
  SendGradStart = 9,
  SendGradFinish = 10,
  RecvGradStart = 11,
  RecvGradFinish = 12,
  FreeBuffer = 13,
  ReduceGrads = 14,
  OptimizerStep = 15,
  StashWeights = 16,
  FreeWeights = 17,
};
inline constexpr int kNumInstructionOps = 18;

std::string_view instruction_op_name(InstructionOp op);
std::optional<InstructionOp> parse_instruction_op(std::string_view name);

// Op classes. Compute: LoadInput, Forward, Backward, BackwardInput, BackwardWeight.
// Communication: the eight Send*/Recv* ops. Start ops post, Finish ops wait.
bool is_compute(InstructionOp op);
bool is_communication(InstructionOp op);
bool is_comm_start(InstructionOp op);
bool is_send(InstructionOp op);           // SendActivation*, SendGrad*
bool is_grad_comm(InstructionOp op);      // SendGrad*, RecvGrad*
// The Finish op of a Start op (SendActivationStart -> SendActivationFinish, ...).
InstructionOp comm_finish_of(InstructionOp start);

// Which fields an op carries (docs/plan-format.md, "Instructions"); the others stay at
// their defaults (-1 / empty) and are omitted from the JSON.
//
//   op                  mb stage peer shape buffer         inputs
//   LoadInput           x  x               writes          -
//   Forward             x  x          out  writes out|-1   activation / loaded buffers
//   Backward(Input)     x  x          out  writes out|-1   gradient buffer (not last stage)
//   BackwardWeight      x  x               -               -
//   Send*Start/Finish   x  x     x    x    reads           -      (stage: the sender's)
//   Recv*Start/Finish   x  x     x    x    writes          -      (stage: the receiver's)
//   FreeBuffer                             frees           -
//   ReduceGrads, OptimizerStep             -               -
//   StashWeights, FreeWeights  x           -               -      + version
//
// `version` (asynchronous schedules only, else -1): the weight version of the stage that
// Forward / Backward use, that StashWeights copies (the current one) and FreeWeights
// drops. Versions count the stage's optimizer steps within the iteration.
struct Instruction {
  InstructionOp op = InstructionOp::Forward;
  int mb = -1;                      // micro-batch id, where it applies
  int stage = -1;                   // virtual stage, for compute and communication
  int peer = -1;                    // peer executor rank, for communication
  std::vector<std::int64_t> shape;  // communicated tensor shape; compute: shape of `buffer`
  int buffer = -1;                  // buffer id the instruction reads/writes/frees (-1: none)
  std::vector<int> inputs;          // compute: buffer ids it consumes, in a fixed order
  int version = -1;                 // weight version (see above); -1: none
  friend bool operator==(const Instruction&, const Instruction&) = default;
};

// "RecvGradFinish(mb 3, stage 1, peer 2, shape [2,8,16], buffer 5)", for messages.
std::string to_string(const Instruction& instruction);

struct ExecutorProgram {
  int rank = 0;     // global executor rank (RankLayout::rank_of(replica, device, stage_replica))
  int device = 0;   // position in the pipeline (0 .. pp-1)
  int replica = 0;  // data-parallel replica
  // Which of the stage's replicated ranks this is (0 .. r-1; docs/plan-format.md,
  // "Replicated stages"): it runs the replica's micro-batches m with m mod r == stage_replica.
  int stage_replica = 0;
  std::vector<Instruction> instructions;
  friend bool operator==(const ExecutorProgram&, const ExecutorProgram&) = default;
};

}  // namespace dynapipe
