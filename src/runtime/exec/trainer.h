// The training loop of one rank, with its collaborators injected (so tests run ranks as
// threads with fake models, a fake planner, local communicators and an in-memory store),
// plus checkpoints. Private to runtime/ (includes torch).
#pragma once

#include <cstdint>
#include <functional>

#include <memory>
#include <string>

#include "dynapipe/core/rank_layout.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/runtime/launcher.h"
#include "dynapipe/runtime/plan_store.h"
#include "dynapipe/runtime/train.h"
#include "runtime/exec/communicator.h"
#include "runtime/exec/executor.h"
#include "runtime/model/collate.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime {

// Compute time one pipeline device spent on a step, averaged over its replicas, and its
// peak memory (the largest replica's resident peak above the process's start).
struct MeasuredStageTimes {
  double forward_ms = 0;
  double backward_ms = 0;  // Backward + BackwardInput + BackwardWeight
  double peak_memory_bytes = 0;
};

struct TrainHooks {
  int num_stages = 1;  // virtual stages of the pipeline (pp x chunks)
  // Rank 0 only: plans iteration i (its global batch is data position i, cycling) and
  // encodes it for the store. Called from planning worker threads: must be thread-safe.
  std::function<std::string(std::int64_t iteration)> produce_plan;
  // Builds the model of one virtual stage (same parameters whatever the process).
  std::function<std::shared_ptr<StageModel>(int stage)> make_stage;
  CollateFn collate;  // this rank's micro-batch tensors
  // Rank 0 only, optional: after every step, what each pipeline device measured
  // (--refine-cost-model feeds it to the planner's calibration), and a one-line account
  // of what was learnt for the summary.
  std::function<void(const IterationPlan& plan, const std::vector<MeasuredStageTimes>& devices)> observe_step;
  std::function<std::string()> describe_refinement;
};

struct RankContext {
  int rank = 0;
  RankLayout ranks;  // pp stages (each replicated stage_replicas ways) x dp replicas
  Communicator* pipe = nullptr;      // all ranks; peers are global ranks
  // Every rank of this stage (replicas x stage-replicas); nullptr when this rank is alone.
  Communicator* dp_group = nullptr;
  PlanStore* store = nullptr;
};

// Runs steps [start, options.steps) where start is 0 or the checkpoint's step. On rank 0
// returns the run's summary (restored steps included) and writes metrics; other ranks
// return an empty summary. On failure reports it to the plan store, then rethrows.
TrainSummary train_rank(const TrainOptions& options, const RankContext& context, const TrainHooks& hooks);

// One rank's process: hosts (rank 0) or joins the TCPStore at MASTER_ADDR:MASTER_PORT,
// opens the plan store, connects the Gloo groups, builds the hooks, runs train_rank.
using HooksFactory = std::function<TrainHooks(const TrainOptions&, int rank)>;
TrainSummary run_rank_process(const TrainOptions& options, const DistributedEnv& env,
                              const HooksFactory& make_hooks);

// Everything the real system can reject before a rank starts: the plan config (the
// Planner's validation: pp vs layers, memory limit vs static memory, cost model), the
// samples file (every line) and that it yields at least one global batch. run_training()
// calls it in the launching process, so bad input is one line and exit 2 in well under
// a second instead of world_size processes failing one by one. (default_hooks.cpp)
void check_training_inputs(const TrainOptions& options);

// Hooks of the real system: data/ global batches, planner/ Planner, the GPT/T5 stage
// models and collate of runtime/model/. (default_hooks.cpp)
TrainHooks make_default_hooks(const TrainOptions& options, int rank);

// The samples file's tokens as collate() reads them: byte tokens for text samples, the
// data module's deterministic pattern for lengths-only ones. (default_hooks.cpp)
std::shared_ptr<const TokenSource> make_dataset_token_source(std::shared_ptr<const Dataset> dataset);

// The attention `mb` of a `strategy` plan trains with: its strategy's (varlen, packed or
// padded), except a dense micro-batch of a varlen plan, which runs padded, and a lone
// sample, which runs varlen. (default_hooks.cpp)
AttentionMode trained_attention_mode(Strategy strategy, const MicroBatch& mb);

}  // namespace dynapipe::runtime
