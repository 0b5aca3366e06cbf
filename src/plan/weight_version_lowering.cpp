// add_weight_versions(): the asynchronous schedules' version instructions over a lowered
// synchronous program (lowering.h).
#include <map>
#include <utility>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/plan/lowering.h"
#include "dynapipe/schedule/weight_versions.h"

namespace dynapipe {
namespace {

Instruction weight_op(InstructionOp op, int stage, int version) {
  Instruction in;
  in.op = op;
  in.stage = stage;
  in.version = version;
  return in;
}

void version_program(ExecutorProgram& program, const std::vector<PipelineOp>& ops,
                     const DeviceVersions& versions) {
  using Op = InstructionOp;
  std::map<std::pair<int, OpKind>, const VersionedOp*> by_op;  // (mb, F/B) -> versions
  for (std::size_t k = 0; k < ops.size(); ++k) by_op[{ops[k].mb, ops[k].kind}] = &versions.ops[k];
  std::vector<Instruction> out;
  out.reserve(program.instructions.size() + 3 * ops.size());
  std::vector<Instruction> after;  // the step group waiting for the sends after a Backward
  auto flush = [&] {
    out.insert(out.end(), after.begin(), after.end());
    after.clear();
  };
  int current = 0;
  for (Instruction in : program.instructions) {
    if (in.op == Op::ReduceGrads) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("weight versions: asynchronous schedules need dp 1, got ReduceGrads on rank ",
                      program.rank));
    }
    if (in.op == Op::OptimizerStep) continue;  // the synchronous step at the end
    // Sends of the Backward's gradient go out before its step.
    if (!after.empty() && in.op != Op::SendGradStart) flush();
    if (in.op != Op::Forward && in.op != Op::Backward) {
      out.push_back(std::move(in));
      continue;
    }
    auto it = by_op.find({in.mb, in.op == Op::Forward ? OpKind::F : OpKind::B});
    if (it == by_op.end()) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("weight versions: ", to_string(in), " on rank ", program.rank,
                      " is not in the schedule order"));
    }
    const VersionedOp& v = *it->second;
    in.version = v.version;
    const int stage = in.stage;
    out.push_back(std::move(in));
    for (int freed : v.free_after) after.push_back(weight_op(Op::FreeWeights, stage, freed));
    if (v.stash_before) after.push_back(weight_op(Op::StashWeights, stage, current));
    if (v.step_after) {
      Instruction step;
      step.op = Op::OptimizerStep;
      after.push_back(step);
      ++current;
    }
  }
  flush();
  program.instructions = std::move(out);
}

}  // namespace

void add_weight_versions(std::vector<ExecutorProgram>& programs, const ScheduleOrder& order) {
  const WeightVersionPlan plan = weight_versions(order);
  for (ExecutorProgram& program : programs) {
    if (program.device < 0 || program.device >= static_cast<int>(order.device_ops.size())) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("weight versions: program device must be in [0, ", order.device_ops.size(),
                      "), got ", program.device));
    }
    const auto d = static_cast<std::size_t>(program.device);
    version_program(program, order.device_ops[d], plan.devices[d]);
  }
}

}  // namespace dynapipe
