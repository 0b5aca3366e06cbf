// Splitting stage programs into stage-replica programs (replicate_stages.h).
#include "dynapipe/plan/replicate_stages.h"

#include <map>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

[[noreturn]] void bad_input(const std::string& message) {
  throw Error(ErrorKind::InvalidArgument, cat("replicate_stages: ", message));
}

// Micro-batch of every buffer: the one of the instruction that writes or reads it with an
// mb (FreeBuffer carries none).
std::map<int, int> buffer_microbatches(const ExecutorProgram& program) {
  std::map<int, int> mb_of;
  for (const Instruction& in : program.instructions) {
    if (in.mb < 0) continue;
    if (in.buffer >= 0) mb_of.emplace(in.buffer, in.mb);
    for (int input : in.inputs) mb_of.emplace(input, in.mb);
  }
  return mb_of;
}

ExecutorProgram stage_replica_program(const ExecutorProgram& stage_program,
                                      const std::map<int, int>& mb_of, const RankLayout& plain,
                                      const RankLayout& ranks, int stage_replica) {
  const int stage = stage_program.device, replica = stage_program.replica;
  ExecutorProgram out;
  out.rank = ranks.rank_of(replica, stage, stage_replica);
  out.device = stage;
  out.replica = replica;
  out.stage_replica = stage_replica;
  std::map<int, int> renumbered;
  auto map = [&](int& id) {
    if (id < 0) return;
    id = renumbered.emplace(id, static_cast<int>(renumbered.size())).first->second;
  };
  for (Instruction in : stage_program.instructions) {
    if (in.op == InstructionOp::ReduceGrads || in.op == InstructionOp::OptimizerStep) continue;
    int mb = in.mb;
    if (mb < 0) {
      auto owner = mb_of.find(in.buffer);
      if (owner == mb_of.end())
        bad_input(cat("buffer ", in.buffer, " of rank ", stage_program.rank,
                      " must belong to a micro-batch, got ", to_string(in)));
      mb = owner->second;
    }
    if (ranks.stage_replica_of_mb(stage, mb) != stage_replica) continue;
    if (in.peer >= 0) {
      const int peer_stage = plain.stage_of(in.peer);
      in.peer = ranks.rank_of(replica, peer_stage, ranks.stage_replica_of_mb(peer_stage, mb));
    }
    map(in.buffer);
    for (int& input : in.inputs) map(input);
    out.instructions.push_back(std::move(in));
  }
  Instruction step;
  if (ranks.stage_group_size(stage) > 1) {
    step.op = InstructionOp::ReduceGrads;
    out.instructions.push_back(step);
  }
  step.op = InstructionOp::OptimizerStep;
  out.instructions.push_back(step);
  return out;
}

}  // namespace

std::vector<ExecutorProgram> replicate_stages(const std::vector<ExecutorProgram>& programs,
                                              const RankLayout& ranks) {
  if (static_cast<int>(programs.size()) != ranks.pp) {
    bad_input(cat("programs must have one per stage (", ranks.pp, "), got ", programs.size()));
  }
  if (!ranks.stage_replicas.empty() && static_cast<int>(ranks.stage_replicas.size()) != ranks.pp) {
    bad_input(cat("stage_replicas must have one entry per stage (", ranks.pp, "), got ",
                  ranks.stage_replicas.size()));
  }
  const RankLayout plain{.pp = ranks.pp, .dp = ranks.dp};
  std::vector<ExecutorProgram> out;
  out.reserve(static_cast<std::size_t>(ranks.ranks_per_replica()));
  for (int stage = 0; stage < ranks.pp; ++stage) {
    const ExecutorProgram& program = programs[static_cast<std::size_t>(stage)];
    if (program.device != stage || program.replica != programs.front().replica) {
      bad_input(cat("programs[", stage, "] must be stage ", stage, " of replica ",
                    programs.front().replica, ", got stage ", program.device, " of replica ",
                    program.replica));
    }
    if (ranks.replicas_of(stage) < 1) {
      bad_input(cat("stage ", stage, " must have >= 1 replicas, got ", ranks.replicas_of(stage)));
    }
    const std::map<int, int> mb_of = buffer_microbatches(program);
    for (int a = 0; a < ranks.replicas_of(stage); ++a) {
      out.push_back(stage_replica_program(program, mb_of, plain, ranks, a));
    }
  }
  return out;
}

}  // namespace dynapipe
