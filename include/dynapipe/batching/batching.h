// make_microbatches(): one global batch → micro-batches for every data-parallel replica,
// by any Strategy, with the recompute mode that gives the best pipeline objective while
// fitting the per-device memory limit. The entry point the planner calls per iteration.
//
//   BatchingOptions options{.strategy = Strategy::DynaPipe, .kind = ModelKind::Gpt,
//                           .num_stages = 4, .dp = 2, .memory_limit_bytes = 40 * kGiB,
//                           .max_seqlen = 2048};
//   BatchingResult result = make_microbatches(batch, *cost_model, options);
//   for (auto& replica : result.replicas) for (MicroBatch& mb : replica) ...
//
// Every strategy is costed the same way: t(M) = max over stages of fwd_ms + bwd_ms from
// CostModel::stage_cost() for M's rounded shape, and a replica's objective is
// Σ t + (p − 1)·max t (the classic pipeline estimate). Memory rule, for every stage s:
//   static_bytes(s) + k_s·stored_bytes(M, s) + peak_bytes(M, s) <= memory_limit_bytes
// with k_s = p − s (micro-batches in flight at stage s under 1F1B). When no recompute
// mode lets every micro-batch fit that way, k_s = 1 is used instead and the result is
// marked one_in_flight: the schedule must then limit micro-batches in flight.
//
// Shapes, rounded up to seqlen_multiple:
//   GPT: seqlen = max(input_len + target_len), dec_seqlen = 0;
//   T5:  seqlen = max(input_len), dec_seqlen = max(target_len + 1): the decoder reads
//        bos ++ target (and predicts target ++ eos), one token longer than the target.
// Thread-safety: a pure function of its arguments (the cost model is called const).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dynapipe/core/strategy.h"
#include "dynapipe/core/microbatch.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/sample.h"

namespace dynapipe {

class CostModel;

// How DynaPipe's micro-batches reach the dp replicas (docs/batching.md, "Replicas").
enum class ReplicaSplit : std::uint8_t {
  Auto,          // both below, keep the lower objective (ties: Microbatches)
  Microbatches,  // one DP over all samples with w = 1/dp, then Karmarkar–Karp on t(M)
  Samples,       // deal the ordered samples to replicas in a snake, then one DP per replica
};

// Which orders the varlen DP (Strategy::DynaPipe) cuts (docs/batching.md, "Ordering for
// varlen").
enum class VarlenOrder : std::uint8_t {
  Both,        // both below, keep the lower objective (ties: Sorted)
  Sorted,      // order_samples(): runs of similar lengths
  PackedRows,  // order_packed_rows(): packing-varlen's rows in sequence
};

// token-based's budgets where none is given: 512, 1024, ..., 65536 padded tokens.
inline constexpr std::int64_t kSmallestTokenBudget = 512, kLargestTokenBudget = 65536;

struct BatchingOptions {
  Strategy strategy = Strategy::DynaPipe;
  ModelKind kind = ModelKind::Gpt;
  int num_stages = 1;                  // p >= 1; must equal the cost model's stage count
  int dp = 1;                          // data-parallel replicas, >= 1
  std::int64_t memory_limit_bytes = 0; // per device; 0 = unlimited. Default: 0
  std::int64_t max_seqlen = 2048;      // >= 1. GPT: bound of input+target; T5: of input
  std::int64_t max_target_len = 0;     // T5: bound of target, >= 1. GPT: unused
  int seqlen_multiple = 8;             // >= 1; every length is rounded up to it
  // token-based: padded tokens (batch × (seqlen + dec_seqlen)) per micro-batch, >= 0.
  // 0 (default) = try 512, 1024, ..., 65536 and keep the best objective.
  std::int64_t token_budget = 0;
  // padding, packing and packing-megatron: rows per micro-batch, >= 0. 0 (default) =
  // chosen (size_by_objective).
  std::int64_t fixed_batch = 0;
  // With fixed_batch 0: true (default) = every size up to the largest that fits, the
  // lowest objective kept; false = the largest that fits. The planner simulates both and
  // keeps the faster: the objective's 1F1B bubble can favour smaller micro-batches than a
  // schedule with a shorter fill and drain wants.
  bool size_by_objective = true;
  // One recompute mode for every micro-batch (packing-megatron runs a whole training run
  // in one mode). Default: none set = try none, selective, full and keep the best.
  std::optional<Recompute> recompute = std::nullopt;
  // dynapipe: 0 (default) = exact DP. > 0 reproduces the reference's 5 ms-style thinning
  // of max-time thresholds (PartitionOptions::min_tmax_interval_ms).
  double min_tmax_interval_ms = 0;
  ReplicaSplit replica_split = ReplicaSplit::Auto;  // dynapipe with dp > 1
  VarlenOrder varlen_order = VarlenOrder::Both;     // dynapipe
  // dynapipe: > 0 limits a micro-batch to max_seqlen model tokens (T5: input tokens, and
  // max_target_len + 1 decoder tokens), the row capacity of packing-varlen; the planner
  // tries it as one more candidate (docs/batching.md). false (default): token count free.
  bool varlen_row_capacity = false;
  // dynapipe: true cuts the sorted order by dynapipe-padded's DP (segments costed padded
  // to their longest sample) and runs the micro-batches varlen; each is then no slower
  // and no heavier than dynapipe-padded's, so this candidate simulates like
  // dynapipe-padded or better. The planner tries it as one more candidate
  // (docs/batching.md). false (default): the varlen DP.
  bool varlen_padded_cut = false;
  // dynapipe: true holds a micro-batch of one sample only to fitting alone (one in flight)
  // where the memory rule would keep k_s of it in flight; micro-batches of several samples
  // keep the rule. A schedule that admits forwards by memory (critical-path) can run such
  // a long sample while the others wait, in a lighter recompute mode than the rule allows
  // every micro-batch. The planner tries it as one more candidate where the rule forced a
  // heavier mode (docs/batching.md, "Lone samples"). false (default): the rule for all.
  bool lone_samples_alone = false;
  // The schedule the micro-batches are planned for (docs/batching.md, "Schedule-aware
  // DP"). in_flight[s] = k_s, the micro-batches whose activations stage s holds at once
  // under that schedule (empty, the default: 1F1B's p − s); each entry >= 1, size p.
  // bubble_weight scales the fill/drain term: objective = Σ t + bubble_weight·(p − 1)·max t
  // (1 for 1F1B; less for schedules whose bubble is smaller), > 0. Every strategy is
  // costed and fitted with them.
  std::vector<int> in_flight = {};
  double bubble_weight = 1.0;
  // dynapipe, with no fixed `recompute`: true runs one DP whose segments each cost their
  // time in the lightest mode whose memory rule they fit, as the schedule search then runs
  // them (lightest_fitting_modes(); docs/batching.md, "Recompute per micro-batch"). false
  // (default): one DP per mode, every segment in that mode.
  bool mixed_recompute = false;
  // T5 ordering bucket width in input tokens (order_samples()), >= 0.
  // 0 (default) = max_seqlen / 32 rounded up to seqlen_multiple (64 for 2048).
  std::int64_t t5_bucket_tokens = 0;

  // Throws InvalidArgument naming the first field out of range.
  void validate() const;
};

struct BatchingResult {
  // replicas[r] = micro-batches of replica r in execution order; MicroBatch::id = index.
  // Every sample of the global batch is in exactly one micro-batch.
  std::vector<std::vector<MicroBatch>> replicas;
  Recompute recompute = Recompute::None;  // the mode the shapes were costed and fitted for
  double objective_ms = 0;    // max over replicas of Σ t + bubble_weight·(p − 1)·max t
  bool one_in_flight = false; // fitted with k_s = 1 (see the memory rule above)
  // The size the strategy cut with: rows per micro-batch (padding, the packings), the
  // token budget (token-based); 0 for the DP strategies.
  std::int64_t size = 0;
};

// Segment costs kept between make_microbatches() calls on the same batch and cost model:
// the varlen DP's segment costs do not depend on the memory rule or the bubble weight,
// so the planner's several DPs of one iteration compute them once. A cache given another
// batch or cost model starts over. Not thread-safe: one per planning thread.
class BatchingCache {
 public:
  BatchingCache();
  ~BatchingCache();
  BatchingCache(const BatchingCache&) = delete;
  BatchingCache& operator=(const BatchingCache&) = delete;
  struct Store;
  Store& store() { return *store_; }
  // Takes what `other` kept for sequences this cache has not costed (the planner's DPs of
  // two orders run on two threads, each on its own cache, and continue on one).
  // REQUIRES: both were used with the same batch and cost model, or one not at all.
  void absorb(BatchingCache&& other);

 private:
  std::unique_ptr<Store> store_;
};

// Throws InvalidArgument for bad options, a sample longer than max_seqlen /
// max_target_len, duplicate ids or a cost model with another stage count; Infeasible when
// one sample alone (or, for padding, one padded row) does not fit in memory under any
// recompute mode, naming the sample, its length, the bytes needed and the budget.
BatchingResult make_microbatches(const GlobalBatch& batch, const CostModel& cost_model,
                                 const BatchingOptions& options, BatchingCache* cache = nullptr);

// The samples for which BatchingOptions::lone_samples_alone changes what `options`' memory
// rule admits without recomputation: each fits alone in recompute mode none but not with
// its rule's k_s copies in flight. Counts up to limit + 1 and stops there. One cost
// evaluation where the longest lengths fit the rule (the common case), else one per sample.
int count_lone_samples(const GlobalBatch& batch, const CostModel& cost_model, const BatchingOptions& options,
                       int limit);

// t(M): the bottleneck stage's fwd_ms + bwd_ms for the micro-batch's shape and density.
double microbatch_time_ms(const CostModel& cost_model, const MicroBatch& microbatch,
                          Recompute recompute);

// Σ t + bubble_weight·(p − 1)·max t over one replica's micro-batch times (0 for none).
double pipeline_objective_ms(const std::vector<double>& times_ms, int num_stages,
                             double bubble_weight = 1.0);

// Real tokens / tokens computed over every micro-batch of every replica (docs/plan-format.md):
// Σ real_tokens / Σ shape.tokens(). 1 for an empty result.
double padding_efficiency(const BatchingResult& result);

}  // namespace dynapipe
