// Replicated stages (PipeDream's hybrid of pipeline and data parallelism): one replica's
// programs, one per pipeline stage as lower_to_programs() makes them, become one program
// per stage-replica. A stage with replication r runs on r ranks; micro-batch m runs on
// stage-replica m mod r (RankLayout::stage_replica_of_mb), so each stage-replica's program
// is the stage's program restricted to its micro-batches, with every message addressed to
// the rank that holds the neighbouring stage of that micro-batch.
//
//   RankLayout ranks{.pp = 2, .dp = 1, .stage_replicas = {2, 1}};
//   auto programs = replicate_stages(lower_to_programs(in), ranks);   // 3 programs
//
// Why it stays deadlock-free: the programs of a stage-replica are subsequences of the
// stage's program, and between two ranks the messages are the subsequence (by micro-batch)
// of the stage pair's messages, in the same order on both sides; any run of the stage
// programs, restricted to the kept instructions, is a run of the split ones. The planner
// verifies every split plan anyway (verify_programs with VerifyOptions::stage_replicas).
//
// Each stage's ranks (all replicas, all stage-replicas) all-reduce their gradients:
// ReduceGrads is emitted, before OptimizerStep, exactly when that group has more than one
// rank. Buffer ids are renumbered 0, 1, 2, ... per program in order of first use.
//
// Thread-safety: pure function of its input.
#pragma once

#include <vector>

#include "dynapipe/core/rank_layout.h"
#include "dynapipe/plan/instruction.h"

namespace dynapipe {

// `programs`: one replica's programs in device order, ranks as RankLayout{.pp, .dp} (no
// replication) gives them. Returns the replica's ranks.ranks_per_replica() programs in
// rank order (stage by stage, stage-replicas within). Throws InvalidArgument when the
// programs do not match `ranks` (count, device, replica) or a buffer has no micro-batch.
std::vector<ExecutorProgram> replicate_stages(const std::vector<ExecutorProgram>& programs,
                                              const RankLayout& ranks);

}  // namespace dynapipe
