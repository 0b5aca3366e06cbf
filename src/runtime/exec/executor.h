// Executor: runs one executor's instruction list (ExecutorProgram) of an IterationPlan
// with LibTorch stage models and a Communicator. Private to runtime/ (includes torch).
//
// Weight versions (asynchronous schedules, docs/runtime.md "Weight versions"): a Forward
// with a `version` runs without autograd on that version's weights and keeps its input;
// its Backward re-runs the forward on the same version with autograd, then backward, so
// no autograd graph outlives an optimizer step. StashWeights copies the current
// parameters, FreeWeights drops a copy, OptimizerStep makes the next version current.
//
// Instructions run strictly in order, with no synchronisation between them beyond the
// *Finish waits the plan contains (docs/runtime.md "Instruction semantics"). State is
// keyed by (micro-batch id, local virtual stage), not by buffer slot, so a plan cannot
// make the executor read the wrong tensor; `buffer` ids are honoured by FreeBuffer.
//
// Plans come from the plan store, i.e. from outside: validate_program() checks a program
// against its replica plan before anything runs, and run() rethrows any failure with
// context "rank R, iteration I, instruction K (Op mb M stage S): ...".
//
//   Executor executor(config, stages, pipe_comm, dp_comm, collate);
//   IterationResult r = executor.run({.iteration = 3, .replica = &plan.replicas[0],
//                                     .program = &plan.replicas[0].executors[1],
//                                     .loss_scale = 1.0 / target_tokens});
#pragma once

#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "dynapipe/core/rank_layout.h"
#include "dynapipe/plan/execution_plan.h"
#include "runtime/exec/communicator.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime {

// Builds the tensors of one micro-batch (the model module's collate(), bound to a token
// source and attention mode).
using CollateFn = std::function<MicroBatchTensors(const MicroBatch&)>;

struct ExecutorConfig {
  int rank = 0;          // global rank (RankLayout: replica * pp + device)
  RankLayout ranks;      // pipeline devices x replicas
  int num_stages = 1;    // virtual stages of the pipeline (pp * chunks)
  Millis comm_timeout{30000};  // bound on every *Finish / ReduceGrads wait. Default 30 s.
  double lr = 3e-4;            // AdamW learning rate
  double weight_decay = 0.0;   // AdamW weight decay
  // ZeRO stage 1: the AdamW states of this device's parameters are sharded over its dp
  // replicas. Each replica steps only the parameters it owns (zero_owner()), then every
  // parameter is synchronised from its owner. Same math as without it, 1/dp of the states.
  bool zero = false;
  // Debug only: ignore the plan's weight versions and run every Forward / Backward on the
  // current weights (no stashing), to show that the asynchronous equivalence tests see
  // the difference. Never set in training.
  bool debug_no_weight_stash = false;
  // > 0: after each instruction, when the host allocator holds more than this resident
  // (live tensors plus its cache of freed pages, runtime/exec/host_allocator.h), its
  // cache goes back to the OS. 0: no bound.
  std::int64_t host_cache_limit_bytes = 0;
};

// Which of `dp` replicas owns each parameter under ZeRO-1: greedy by size, largest first,
// to the replica holding the fewest elements so far (ties: the lower index). Deterministic,
// so every replica computes the same split.
std::vector<int> zero_owner(const std::vector<std::int64_t>& numels, int dp);

// What one run() measured. Times are wall-clock milliseconds.
struct IterationResult {
  double loss = 0;                 // sum of the scaled losses of the last stage (else 0)
  bool has_loss = false;           // this executor holds the last stage
  double wall_ms = 0;
  std::array<double, kNumInstructionOps> op_ms{};  // total time per instruction op
  std::array<int, kNumInstructionOps> op_count{};
  std::int64_t peak_held_bytes = 0;  // high-water mark of tensors the executor holds
                                     // between instructions (activations, received and
                                     // outgoing tensors); autograd internals not counted
};

struct IterationInput {
  std::int64_t iteration = 0;
  const ReplicaPlan* replica = nullptr;     // its micro-batches
  const ExecutorProgram* program = nullptr; // this rank's instructions
  double loss_scale = 1.0;  // 1 / target tokens of the whole global batch (all replicas)
};

// Throws Error{ParseError} "iteration I, rank R: instruction K (...): <what> must be
// <expected>, got <actual>" if the program cannot run on this executor: wrong rank,
// peers out of range or in another replica, negative shapes, unknown micro-batch ids,
// stages this executor does not hold, a *Finish without its *Start.
void validate_program(const ExecutorProgram& program, const ReplicaPlan& replica,
                      std::int64_t iteration, const ExecutorConfig& config,
                      const std::set<int>& local_stages);

class Executor {
 public:
  // `stages`: virtual stage -> model, the stages this rank holds (device d holds d, d+pp,
  // ...). `pipe` is the global group (peers are global ranks); `dp` the group of this
  // device's replicas (nullptr or size 1 when dp == 1). The executor owns the AdamW
  // optimizer over all its stages' parameters (make_adamw, as the reference trainer).
  Executor(ExecutorConfig config, std::map<int, std::shared_ptr<StageModel>> stages,
           Communicator& pipe, Communicator* dp, CollateFn collate);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Validates and runs one program. Gradients are zeroed first; OptimizerStep applies and
  // zeroes them. Throws Error (Timeout / PeerFailure from communication, ParseError for a
  // bad program, Internal for LibTorch errors) with the context above.
  IterationResult run(const IterationInput& input);

  torch::optim::Optimizer& optimizer();
  const std::map<int, std::shared_ptr<StageModel>>& stages() const;
  std::vector<torch::Tensor> parameters() const;  // all stages, in stage order

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dynapipe::runtime
