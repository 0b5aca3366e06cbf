// ReferenceTrainer and make_adamw(); see reference_trainer.h.
#include "runtime/model/reference_trainer.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {

void TrainerOptions::validate() const {
  auto fail = [](const char* field, const char* expected, double got) {
    throw Error(ErrorKind::InvalidArgument,
                cat("trainer options: ", field, " must be ", expected, ", got ", got));
  };
  if (!(lr > 0)) fail("lr", "> 0", lr);
  if (!(beta1 >= 0 && beta1 < 1)) fail("beta1", "in [0, 1)", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) fail("beta2", "in [0, 1)", beta2);
  if (!(eps > 0)) fail("eps", "> 0", eps);
  if (!(weight_decay >= 0)) fail("weight_decay", ">= 0", weight_decay);
  if (!(grad_clip >= 0)) fail("grad_clip", ">= 0", grad_clip);
}

std::unique_ptr<torch::optim::Optimizer> make_adamw(const std::vector<torch::Tensor>& params,
                                                    const TrainerOptions& options) {
  options.validate();
  std::vector<torch::Tensor> decay, no_decay;
  for (const torch::Tensor& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto group_options = [&](double wd) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(options.lr);
    o->betas(std::make_tuple(options.beta1, options.beta2)).eps(options.eps).weight_decay(wd);
    return o;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, group_options(options.weight_decay));
  groups.emplace_back(no_decay, group_options(0.0));
  torch::optim::AdamWOptions defaults(options.lr);
  return std::make_unique<torch::optim::AdamW>(std::move(groups), defaults);
}

ReferenceTrainer::ReferenceTrainer(const ModelSpec& spec, const std::vector<StageLayers>& stages,
                                   const ModelOptions& model_options, const TrainerOptions& options)
    : options_(options) {
  options_.validate();
  if (stages.empty()) {
    throw Error(ErrorKind::InvalidArgument, "reference trainer: stages must not be empty, got 0");
  }
  for (const StageLayers& layers : stages) stages_.push_back(make_stage_model(spec, layers, model_options));
  optimizer_ = make_adamw(parameters(), options_);
}

std::vector<torch::Tensor> ReferenceTrainer::parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& stage : stages_) {
    for (const torch::Tensor& p : stage->parameters()) params.push_back(p);
  }
  return params;
}

void ReferenceTrainer::set_recompute(Recompute mode) {
  for (auto& stage : stages_) stage->set_recompute(mode);
}

void ReferenceTrainer::zero_grad() {
  for (torch::Tensor& p : parameters()) {
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
}

double ReferenceTrainer::forward_backward(const std::vector<MicroBatchTensors>& micro_batches) {
  const std::size_t n = stages_.size();
  std::vector<DeferredWeightGrads> deferred;
  double total = 0.0;
  try {
    for (const MicroBatchTensors& mb : micro_batches) {
      std::vector<torch::Tensor> inputs(n), outputs(n);
      torch::Tensor loss;
      for (std::size_t s = 0; s < n; ++s) {
        // A fresh leaf per stage boundary: exactly what a receiving stage sees.
        if (s > 0) inputs[s] = outputs[s - 1].detach().requires_grad_(true);
        StageOutput out = stages_[s]->forward(inputs[s], mb);
        outputs[s] = out.hidden;
        if (s + 1 == n) loss = out.loss;
      }
      DYNAPIPE_CHECK(loss.defined(), "reference trainer: the last stage returned no loss");
      total += loss.item<double>();
      torch::Tensor grad;  // gradient wrt the output of stage s
      for (std::size_t s = n; s-- > 0;) {
        torch::Tensor root = s + 1 == n ? loss : outputs[s];
        if (options_.split_backward) {
          deferred.push_back(backward_input(root, grad));
        } else if (grad.defined()) {
          torch::autograd::backward({root}, {grad});
        } else {
          torch::autograd::backward({root});
        }
        if (s > 0) {
          grad = inputs[s].grad();
          if (!grad.defined()) grad = torch::zeros_like(inputs[s]);
        }
      }
    }
    for (DeferredWeightGrads& d : deferred) d.flush();
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::Internal, cat("reference trainer: ", e.what_without_backtrace()));
  }
  return total;
}

double ReferenceTrainer::train_step(const std::vector<MicroBatchTensors>& micro_batches) {
  zero_grad();
  double loss = forward_backward(micro_batches);
  if (options_.grad_clip > 0) torch::nn::utils::clip_grad_norm_(parameters(), options_.grad_clip);
  optimizer_->step();
  return loss;
}

double ReferenceTrainer::eval_loss(const std::vector<MicroBatchTensors>& micro_batches) {
  torch::NoGradGuard no_grad;
  double total = 0.0;
  for (const MicroBatchTensors& mb : micro_batches) {
    torch::Tensor x;
    for (std::size_t s = 0; s < stages_.size(); ++s) {
      StageOutput out = stages_[s]->forward(x, mb);
      x = out.hidden;
      if (s + 1 == stages_.size()) total += out.loss.item<double>();
    }
  }
  return total;
}

}  // namespace dynapipe::runtime
