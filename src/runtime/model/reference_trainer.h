// ReferenceTrainer: trains a whole model in one process, pipeline stages run one after
// another, as the ground truth the distributed executor must reproduce.
//
//   ReferenceTrainer trainer(spec, stage_layers, ModelOptions{.seed = 1}, TrainerOptions{});
//   double loss = trainer.train_step(micro_batches);  // token-mean loss of the batch
//
// Each micro-batch flows through the stages as in a pipeline: a stage's output is
// detached and re-enters the next stage as a fresh leaf; backward runs stage by stage,
// handing input gradients back. So pp = N runs the same computations as the executor.
// Not thread-safe.
#pragma once

#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>

#include "dynapipe/cost/model_spec.h"
#include "runtime/model/model.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime {

struct TrainerOptions {
  double lr = 1e-3;            // AdamW learning rate, > 0. Default 1e-3.
  double beta1 = 0.9;          // [0, 1). Default 0.9.
  double beta2 = 0.95;         // [0, 1). Default 0.95.
  double eps = 1e-8;           // > 0. Default 1e-8.
  double weight_decay = 0.0;   // decoupled, on matrices only (dim >= 2), >= 0. Default 0.
  double grad_clip = 0.0;      // max global grad norm; 0 = off (default).
  // Run backward as BackwardInput (backward_input) per stage and micro-batch, and all
  // BackwardWeight (flush) after the last micro-batch, as a zero-bubble schedule would.
  bool split_backward = false;
  // Throws InvalidArgument naming the field.
  void validate() const;
};

// AdamW over `params` with two groups: matrices (dim >= 2) decay, vectors (biases, norms)
// do not. The executor uses the same so that losses match the reference.
std::unique_ptr<torch::optim::Optimizer> make_adamw(const std::vector<torch::Tensor>& params,
                                                    const TrainerOptions& options);

class ReferenceTrainer {
 public:
  // `stages` is a layer split (assign_layers_uniform); one StageModel per entry.
  ReferenceTrainer(const ModelSpec& spec, const std::vector<StageLayers>& stages,
                   const ModelOptions& model_options, const TrainerOptions& options);

  // Forward + backward of every micro-batch, then one optimizer step. Each micro-batch
  // carries its loss_scale (1 / target tokens of the global batch), so the returned sum
  // is the token-mean loss of the global batch, however it was split.
  double train_step(const std::vector<MicroBatchTensors>& micro_batches);
  // Loss without gradients or an update.
  double eval_loss(const std::vector<MicroBatchTensors>& micro_batches);
  // Forward and backward only (gradients accumulate in .grad; no step, no zeroing).
  double forward_backward(const std::vector<MicroBatchTensors>& micro_batches);

  void set_recompute(Recompute mode);
  const std::vector<std::shared_ptr<StageModel>>& stages() const { return stages_; }
  std::vector<torch::Tensor> parameters() const;
  void zero_grad();

 private:
  TrainerOptions options_;
  std::vector<std::shared_ptr<StageModel>> stages_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace dynapipe::runtime
