#include "dynapipe/plan/instruction.h"

#include <array>
#include <sstream>

#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

// Indexed by the enum value; spellings are part of plan format v1.
constexpr std::array<std::string_view, kNumInstructionOps> kOpNames = {
    "LoadInput",           "Forward",              "Backward",
    "BackwardInput",       "BackwardWeight",       "SendActivationStart",
    "SendActivationFinish", "RecvActivationStart", "RecvActivationFinish",
    "SendGradStart",       "SendGradFinish",       "RecvGradStart",
    "RecvGradFinish",      "FreeBuffer",           "ReduceGrads",
    "OptimizerStep",       "StashWeights",         "FreeWeights",
};

}  // namespace

std::string_view instruction_op_name(InstructionOp op) {
  auto index = static_cast<std::size_t>(op);
  return index < kOpNames.size() ? kOpNames[index] : std::string_view("?");
}

std::optional<InstructionOp> parse_instruction_op(std::string_view name) {
  for (std::size_t i = 0; i < kOpNames.size(); ++i) {
    if (kOpNames[i] == name) return static_cast<InstructionOp>(i);
  }
  return std::nullopt;
}

bool is_compute(InstructionOp op) {
  return op == InstructionOp::LoadInput || op == InstructionOp::Forward ||
         op == InstructionOp::Backward || op == InstructionOp::BackwardInput ||
         op == InstructionOp::BackwardWeight;
}

bool is_communication(InstructionOp op) {
  return op >= InstructionOp::SendActivationStart && op <= InstructionOp::RecvGradFinish;
}

bool is_comm_start(InstructionOp op) {
  return op == InstructionOp::SendActivationStart || op == InstructionOp::RecvActivationStart ||
         op == InstructionOp::SendGradStart || op == InstructionOp::RecvGradStart;
}

bool is_send(InstructionOp op) {
  return op == InstructionOp::SendActivationStart || op == InstructionOp::SendActivationFinish ||
         op == InstructionOp::SendGradStart || op == InstructionOp::SendGradFinish;
}

bool is_grad_comm(InstructionOp op) {
  return op >= InstructionOp::SendGradStart && op <= InstructionOp::RecvGradFinish;
}

InstructionOp comm_finish_of(InstructionOp start) {
  // Every Start is directly followed by its Finish in the enum.
  return static_cast<InstructionOp>(static_cast<int>(start) + 1);
}

std::string to_string(const Instruction& instruction) {
  std::ostringstream out;
  out << instruction_op_name(instruction.op) << '(';
  const char* separator = "";
  auto field = [&](const char* name, auto value) {
    out << separator << name << ' ' << value;
    separator = ", ";
  };
  if (instruction.mb >= 0) field("mb", instruction.mb);
  if (instruction.stage >= 0) field("stage", instruction.stage);
  if (instruction.peer >= 0) field("peer", instruction.peer);
  if (!instruction.shape.empty()) field("shape", cat('[', join(instruction.shape, ","), ']'));
  if (instruction.buffer >= 0) field("buffer", instruction.buffer);
  if (!instruction.inputs.empty()) field("inputs", cat('[', join(instruction.inputs, ","), ']'));
  if (instruction.version >= 0) field("version", instruction.version);
  out << ')';
  return out.str();
}

}  // namespace dynapipe
