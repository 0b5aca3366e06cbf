// The plan verifier: replays instruction lists under NCCL/Gloo point-to-point semantics
// and rejects any plan that could deadlock, mismatch a message, compute without its
// inputs, misuse a buffer or (optionally) exceed memory.
//
//   VerifyOptions options;
//   options.layout = {.num_devices = 4};
//   options.num_microbatches = 16;
//   VerifyReport report = verify_programs(programs, options);  // throws on a bad plan
//
// Semantics replayed (docs/plan-format.md, "Matching rules"):
//   - *Start never blocks. A SendXFinish blocks until the peer has posted the matching
//     receive, a RecvXFinish until the peer has posted the matching send (rendezvous:
//     stricter than NCCL's eager small sends, so a plan that passes runs on both).
//   - Between an ordered pair (sender, receiver) the k-th send matches the k-th receive;
//     both must agree on kind (activation/grad), mb, shape, and stages (receiver stage =
//     sender stage + 1 for activations, - 1 for gradients).
//   - ReduceGrads is a collective over the executors given that share a device (every
//     replica and stage-replica of it).
//   - Compute never blocks: its inputs must already be complete when it runs.
//   - Weight versions (a program with any `version`, asynchronous schedules): Forward and
//     Backward run on the current version or a stashed one, a Backward on its Forward's;
//     StashWeights copies the current version, FreeWeights frees a stashed one, each
//     OptimizerStep makes the next version current, and nothing stays stashed at the end.
//
// Thread-safety: pure function of its input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dynapipe/core/error.h"
#include "dynapipe/plan/instruction.h"
#include "dynapipe/schedule/pipeline.h"

namespace dynapipe {

struct VerifyOptions {
  PipelineLayout layout;     // stage -> device; required
  int num_microbatches = 0;  // per replica; every (mb, stage) must run. >= 1
  // [device] replication of each pipeline stage (replicate_stages.h); empty = 1 each. An
  // executor of stage-replica a of a device with r replicas runs exactly the micro-batches
  // m with m mod r == a, and its rank is RankLayout::rank_of(replica, device, a).
  std::vector<int> stage_replicas;
  // Kind of the Error thrown on a bad plan. Internal (default) for plans the planner
  // just made; InvalidArgument for plans read from a file or a store.
  ErrorKind error_kind = ErrorKind::Internal;
  // Memory check, off when stored_bytes is empty. An executor holds static_bytes of its
  // device, plus stored_bytes[mb][stage] from F(mb, stage) until its B (or W), plus every
  // live buffer with a shape (elements * bytes_per_element) from its write to its free.
  std::vector<std::vector<std::int64_t>> stored_bytes;  // [mb][virtual stage]
  std::vector<std::int64_t> static_bytes;               // [device]; empty = 0
  std::int64_t memory_limit_bytes = 0;                  // 0 = no limit (peaks still reported)
  int bytes_per_element = 2;                            // >= 1
  // [device] one copy of the weights, held by each stashed version (StashWeights to
  // FreeWeights) of an asynchronous plan; empty = 0.
  std::vector<std::int64_t> weight_bytes;
};

struct VerifyReport {
  std::int64_t instructions = 0;                // replayed, over all executors
  std::int64_t messages = 0;                    // matched send/receive pairs
  std::vector<std::int64_t> peak_memory_bytes;  // [program index]; empty without the memory check
};

// Throws Error(options.error_kind) on the first violation, with a multi-line message:
// a one-line summary, then the executors involved, each with the instruction index and
// the instruction it stopped at. For a deadlock, every blocked executor is listed with
// what it waits for, e.g.
//   deadlock: 2 of 2 executors blocked
//     rank 0 waits at #5 RecvGradFinish(mb 0, ...) for rank 1 to post SendGradStart; rank 1 is at #3 ...
// Complexity: O(total instructions + total shape dims) time.
VerifyReport verify_programs(const std::vector<ExecutorProgram>& programs,
                             const VerifyOptions& options);

}  // namespace dynapipe
