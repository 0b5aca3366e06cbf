// RankLayout: how global executor ranks map to (data-parallel replica, pipeline stage).
// The pp stages of one replica are consecutive ranks: rank = replica · pp + stage. The
// one place this arithmetic lives; planner, lowering, verifier and runtime all use it.
// With tensor parallelism each executor rank (one plan program) stands for tp devices
// that run the same program on their shards: gpus() = tp · pp · dp.
//
//   RankLayout layout{.pp = 4, .dp = 2};
//   layout.rank_of(1, 2) == 6; layout.replica_of(6) == 1; layout.stage_of(6) == 2;
#pragma once

namespace dynapipe {

struct RankLayout {
  int tp = 1;  // tensor-parallel devices per executor rank, >= 1
  int pp = 1;  // pipeline stages (devices) per replica, >= 1
  int dp = 1;  // data-parallel replicas, >= 1

  int world_size() const { return pp * dp; }  // executor ranks (plan programs)
  int gpus() const { return tp * pp * dp; }   // devices
  int rank_of(int replica, int stage) const { return replica * pp + stage; }
  int replica_of(int rank) const { return rank / pp; }
  int stage_of(int rank) const { return rank % pp; }
  friend bool operator==(const RankLayout&, const RankLayout&) = default;
};

}  // namespace dynapipe
