// The execution-plan instruction set: what one executor (one rank) runs, in order.
//
// Compute: LoadInput, Forward, Backward, BackwardInput, BackwardWeight.
// Communication: *Start posts a non-blocking operation, *Finish waits for it. Between
// two executors, sends and receives are matched in posting order and must agree on
// kind, mb and shape. Memory: FreeBuffer. Step: ReduceGrads (data-parallel all-reduce),
// OptimizerStep.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace dynapipe {

// Spelled as in the plan JSON (CONTRACTS.md). Part of plan format v1: never renumber.
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
};
inline constexpr int kNumInstructionOps = 16;

std::string_view instruction_op_name(InstructionOp op);
std::optional<InstructionOp> parse_instruction_op(std::string_view name);

struct Instruction {
  InstructionOp op = InstructionOp::Forward;
  int mb = -1;                      // micro-batch id, where it applies
  int stage = -1;                   // virtual stage, for compute and communication
  int peer = -1;                    // peer executor rank, for communication
  std::vector<std::int64_t> shape;  // communicated tensor shape
  int buffer = -1;                  // buffer id the instruction reads/writes/frees (-1: none)
  friend bool operator==(const Instruction&, const Instruction&) = default;
};

struct ExecutorProgram {
  int rank = 0;     // global executor rank = replica * pp + device
  int device = 0;   // position in the pipeline (0 .. pp-1)
  int replica = 0;  // data-parallel replica
  std::vector<Instruction> instructions;
  friend bool operator==(const ExecutorProgram&, const ExecutorProgram&) = default;
};

}  // namespace dynapipe
