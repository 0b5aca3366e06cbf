// PipeDream's stage partitioner: the hierarchical dynamic program of the PipeDream paper
// (seed 002) over the antichain DAG, with a replication factor per stage.
//
// Cost model (PipeDream's, seconds per input in steady state): a stage over layers L with r
// replicas takes (compute(L) + 4·(r−1)·params(L) / (B·r)) / r (forward+backward, plus the
// data-parallel all-reduce of its weights, ring-style), and the link into and out of it
// carries 2·activation / (B·r) (the activation forward, its gradient back; compression
// ratio 1). The pipeline's time per input is the slowest of these (the bottleneck). Levels
// of workers (`workers = {4, 2}`, `bandwidth = {B1, B2}`: 4 workers per machine at B1,
// 2 machines at B2) are solved bottom up; a level's best time for a layer range becomes the
// next level's compute time for it, and its all-reduce term is divided by the lower
// level's worker count, as PipeDream's optimizer does.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dynapipe/partition/profile_graph.h"

namespace dynapipe {

struct PipeDreamOptions {
  std::vector<int> workers;       // per level, bottom (fastest link) first; each >= 1
  std::vector<double> bandwidth;  // bytes/s per level, same length as workers
  // Per-worker memory in bytes. A stage with r replicas, when m workers serve it and the
  // stages before it, stashes ceil((N − m) / r) weight+activation versions (PipeDream's
  // count; N = the level's workers), and at least one copy must fit.
  std::optional<double> memory_limit_bytes;
  bool straight = false;  // no replication: one worker per stage
};

struct PipeDreamStage {
  int first_state = 0;  // [first_state, end_state) in antichain-state numbering
  int end_state = 0;
  std::vector<int> replicas_per_level;  // bottom level first
  int replicas = 1;                     // product over levels: workers running this stage
  std::vector<std::string> nodes;       // graph node ids, in file order
  double compute_s = 0;                 // forward+backward of one input on one worker
  double parameter_bytes = 0;
  double activation_bytes = 0;
  // Per input, as PipeDream prints them for the bottom level: compute and all-reduce
  // divided by the bottom-level replicas r, and max(in, out) activation transfer 2a/(B·r).
  double compute_per_input_s = 0;
  double allreduce_per_input_s = 0;
  double transfer_per_input_s = 0;
};

struct PipeDreamPartition {
  double time_per_stage_s = 0;   // the bottleneck: seconds per input in steady state
  double single_worker_s = 0;    // forward+backward of the whole model on one worker
  double data_parallel_s = 0;    // per input with every worker data-parallel
  int num_states = 0;            // antichain states the DP ran over
  std::vector<PipeDreamStage> stages;
  std::vector<int> stage_of_node;  // per graph node; Input* sources are in stage 0

  double speedup_over_data_parallel() const { return data_parallel_s / time_per_stage_s; }
  double speedup_over_single_worker() const { return single_worker_s / time_per_stage_s; }
};

// Throws InvalidArgument for bad options or when the workers cannot be matched by stages
// (--straight with more workers than states), Infeasible when no partition fits the
// memory limit (naming the layer and its bytes).
PipeDreamPartition partition_pipedream(const ProfileGraph& graph, const PipeDreamOptions& options);

// JSON: the full result (`summary` false) or exactly {"time_per_stage", "stages": [...]}.
std::string pipedream_partition_json(const PipeDreamPartition& partition, bool summary);

}  // namespace dynapipe
