// StageRunner: the stages of a pipeline layout, built as the trainer builds them, run
// together on one micro-batch shape -- one thread per stage, every round started in step,
// as pipelined ranks are busy at once -- so that their times carry the contention of a
// real step. Private to runtime/profile/.
//
//   StageRunner runner(spec, assign_layers_uniform(spec, 2), /*seed=*/0, /*threads=*/1);
//   StageRoundTimes t = runner.run({4, 256, 0}, Recompute::None, /*warmup=*/1, /*repeats=*/2);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dynapipe/core/microbatch.h"
#include "dynapipe/cost/model_spec.h"
#include "runtime/profile/piece.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime::profile {

struct StageRoundTimes {
  std::vector<double> fwd_ms, bwd_ms;  // per stage, medians of the timed rounds
  double optimizer_ms = 0;             // slowest stage, median
};

class StageRunner {
 public:
  StageRunner(const ModelSpec& spec, const std::vector<StageLayers>& stages, std::uint64_t seed,
              int threads);
  ~StageRunner();
  StageRunner(const StageRunner&) = delete;
  StageRunner& operator=(const StageRunner&) = delete;

  // Each round, on every stage at once: collate() of `shape` (b samples of seqlen tokens,
  // T5 with dec_seqlen targets) into a varlen micro-batch, forward of a random received
  // activation (stage 0: token ids only), backward of a random output gradient (the last
  // stage: of its loss), then AdamW step + zero_grad. Forward time includes the collate.
  StageRoundTimes run(const Shape& shape, Recompute mode, int warmup, int repeats);

  // The same rounds on one micro-batch the caller collated (its tensors and its shape, as
  // a plan holds it), so the forward time leaves the collate out
  // (bench/microbatch_time_torch_bench).
  StageRoundTimes run(const MicroBatchTensors& batch, const MicroBatchShape& shape, Recompute mode, int warmup,
                      int repeats);

 private:
  // The rounds: `batch_of_round` (timed with the forward) gives each round's tensors.
  StageRoundTimes run_rounds(const std::function<MicroBatchTensors()>& batch_of_round, const MicroBatchShape& shape,
                             Recompute mode, int warmup, int repeats);

  struct Stage;
  ModelSpec spec_;
  std::uint64_t seed_;
  int threads_;
  std::vector<std::unique_ptr<Stage>> stages_;
};

}  // namespace dynapipe::runtime::profile
