// RankLayout: how global executor ranks map to (data-parallel replica, pipeline stage,
// stage-replica). The one place this arithmetic lives; planner, lowering, verifier and
// runtime all use it. With tensor parallelism each executor rank (one plan program)
// stands for tp devices that run the same program on their shards.
//
// Without replicated stages the pp stages of one replica are consecutive ranks:
// rank = replica · pp + stage. A stage with replication r (PipeDream's hybrid of pipeline
// and data parallelism) runs on r consecutive ranks; micro-batch m of a replica runs on
// its stage-replica m mod r (round robin). One replica then holds Σ r ranks, stage by stage:
// rank = replica · Σ r + (r_0 + ... + r_{stage-1}) + stage_replica.
//
//   RankLayout layout{.pp = 4, .dp = 2};
//   layout.rank_of(1, 2) == 6; layout.replica_of(6) == 1; layout.stage_of(6) == 2;
//   RankLayout hybrid{.pp = 2, .dp = 1, .stage_replicas = {2, 1}};
//   hybrid.world_size() == 3; hybrid.rank_of(0, 1) == 2; hybrid.stage_replica_of(1) == 1;
#pragma once

#include <vector>

namespace dynapipe {

struct RankLayout {
  int tp = 1;  // tensor-parallel devices per executor rank, >= 1
  int pp = 1;  // pipeline stages per replica, >= 1
  int dp = 1;  // data-parallel replicas, >= 1
  // [stage] ranks that run the stage (each >= 1); empty = 1 per stage.
  std::vector<int> stage_replicas = {};

  int replicas_of(int stage) const { return stage_replicas.empty() ? 1 : stage_replicas[stage]; }
  int ranks_per_replica() const {
    int total = 0;
    for (int s = 0; s < pp; ++s) total += replicas_of(s);
    return total;
  }
  int world_size() const { return ranks_per_replica() * dp; }  // executor ranks (plan programs)
  int gpus() const { return tp * world_size(); }               // devices
  // Position of (stage, stage_replica) among one replica's ranks.
  int local_index(int stage, int stage_replica = 0) const {
    int index = stage_replica;
    for (int s = 0; s < stage; ++s) index += replicas_of(s);
    return index;
  }
  int rank_of(int replica, int stage, int stage_replica = 0) const {
    return replica * ranks_per_replica() + local_index(stage, stage_replica);
  }
  int replica_of(int rank) const { return rank / ranks_per_replica(); }
  int local_index_of(int rank) const { return rank % ranks_per_replica(); }
  int stage_of(int rank) const {
    int index = local_index_of(rank), stage = 0;
    while (index >= replicas_of(stage)) index -= replicas_of(stage++);
    return stage;
  }
  int stage_replica_of(int rank) const {
    return local_index_of(rank) - local_index(stage_of(rank));
  }
  // Round robin: the stage-replica that runs micro-batch `mb` of a replica at `stage`.
  int stage_replica_of_mb(int stage, int mb) const { return mb % replicas_of(stage); }
  // The ranks that hold `stage` (every replica, every stage-replica) all-reduce its
  // gradients: group size and this rank's place in it.
  int stage_group_size(int stage) const { return dp * replicas_of(stage); }
  int stage_group_rank(int rank) const {
    return replica_of(rank) * replicas_of(stage_of(rank)) + stage_replica_of(rank);
  }
  friend bool operator==(const RankLayout&, const RankLayout&) = default;
};

}  // namespace dynapipe
