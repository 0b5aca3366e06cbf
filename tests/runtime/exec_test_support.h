// Test doubles for the executor tests: a tiny two-layer "model" split into stages,
// a deterministic collate, and hand-written GPipe programs.
#pragma once

#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "dynapipe/plan/execution_plan.h"
#include "runtime/exec/executor.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime::testing {

inline constexpr int kHidden = 4;

// Stage 0: tokens -> Linear(1, H) -> tanh. Middle: Linear(H, H) -> tanh.
// Last: Linear(H, 1), loss = Σ (out - label)² over labelled tokens × loss_scale.
class FakeStage : public StageModel {
 public:
  FakeStage(int stage, int num_stages) : stage_(stage), num_stages_(num_stages) {
    int in = stage == 0 ? 1 : kHidden;
    int out = stage == num_stages - 1 ? 1 : kHidden;
    linear_ = register_module("linear", torch::nn::Linear(in, out));
    // Deterministic without the global RNG, so stages can be built on any thread.
    torch::NoGradGuard no_grad;
    auto w = linear_->weight;
    w.copy_(torch::sin(torch::arange(w.numel(), torch::kFloat32) * (stage + 1) + 0.3)
                .reshape(w.sizes()) * 0.5);
    linear_->bias.copy_(torch::cos(torch::arange(out, torch::kFloat32) + stage) * 0.1);
  }
  StageOutput forward(const torch::Tensor& input, const MicroBatchTensors& batch) override {
    forward_modes.push_back(recompute());
    torch::Tensor x = stage_ == 0 ? batch.tokens.to(torch::kFloat32).unsqueeze(-1) / 10.0 : input;
    torch::Tensor y = linear_->forward(x);
    if (stage_ != num_stages_ - 1) return {torch::tanh(y), {}};
    auto labels = batch.labels.to(torch::kFloat32);
    auto mask = (batch.labels != -100).to(torch::kFloat32);
    auto loss = ((y.squeeze(-1) - labels / 10.0).pow(2) * mask).sum() * batch.loss_scale;
    return {{}, loss};
  }

  std::vector<Recompute> forward_modes;  // recompute() at each forward, in call order

 private:
  int stage_, num_stages_;
  torch::nn::Linear linear_{nullptr};
};

inline MicroBatchTensors fake_collate(const MicroBatch& mb) {
  MicroBatchTensors t;
  auto b = mb.shape.batch, l = mb.shape.seqlen;
  t.tokens = torch::zeros({b, l}, torch::kInt64);
  t.labels = torch::full({b, l}, -100, torch::kInt64);
  for (std::int64_t i = 0; i < b; ++i) {
    auto id = i < static_cast<std::int64_t>(mb.sample_ids.size()) ? mb.sample_ids[i] : 0;
    for (std::int64_t j = 0; j < l; ++j) {
      t.tokens[i][j] = (id * 7 + j) % 11;
      if (j >= l / 2) t.labels[i][j] = (id * 7 + j + 1) % 11;
    }
  }
  t.segments = torch::ones({b, l}, torch::kInt64);
  t.positions = torch::arange(l).repeat({b, 1});
  return t;
}

inline MicroBatch make_mb(int id, std::vector<SampleId> samples, std::int64_t seqlen) {
  MicroBatch mb;
  mb.id = id;
  mb.sample_ids = samples;
  mb.shape = {static_cast<std::int64_t>(samples.size()), seqlen, 0};
  mb.target_tokens = static_cast<std::int64_t>(samples.size()) * (seqlen - seqlen / 2);
  mb.real_tokens = static_cast<std::int64_t>(samples.size()) * seqlen;
  return mb;
}

inline Instruction ins(InstructionOp op, int mb = -1, int stage = -1, int peer = -1,
                       std::vector<std::int64_t> shape = {}) {
  Instruction i;
  i.op = op;
  i.mb = mb;
  i.stage = stage;
  i.peer = peer;
  i.shape = std::move(shape);
  return i;
}

// GPipe over `pp` stages (one per device) for the given micro-batches of one replica:
// all forwards, then all backwards in reverse; each device's sends and receives with
// its neighbours in the same order on both sides. `step` appends ReduceGrads +
// OptimizerStep.
inline std::vector<ExecutorProgram> gpipe_programs(const std::vector<MicroBatch>& mbs, int pp,
                                                   int replica, bool step) {
  using Op = InstructionOp;
  std::vector<ExecutorProgram> programs(pp);
  for (int d = 0; d < pp; ++d) {
    auto& p = programs[d];
    p.rank = replica * pp + d;
    p.device = d;
    p.replica = replica;
    int prev = p.rank - 1, next = p.rank + 1;
    auto shape = [&](const MicroBatch& mb) {
      return std::vector<std::int64_t>{mb.shape.batch, mb.shape.seqlen, kHidden};
    };
    for (const auto& mb : mbs) {
      p.instructions.push_back(ins(Op::LoadInput, mb.id, d));
      if (d > 0) {
        p.instructions.push_back(ins(Op::RecvActivationStart, mb.id, d, prev, shape(mb)));
        p.instructions.push_back(ins(Op::RecvActivationFinish, mb.id, d, prev));
      }
      p.instructions.push_back(ins(Op::Forward, mb.id, d));
      if (d < pp - 1) p.instructions.push_back(ins(Op::SendActivationStart, mb.id, d, next, shape(mb)));
    }
    for (auto it = mbs.rbegin(); it != mbs.rend(); ++it) {
      const auto& mb = *it;
      if (d < pp - 1) {
        p.instructions.push_back(ins(Op::RecvGradStart, mb.id, d, next, shape(mb)));
        p.instructions.push_back(ins(Op::RecvGradFinish, mb.id, d, next));
      }
      p.instructions.push_back(ins(Op::Backward, mb.id, d));
      if (d > 0) p.instructions.push_back(ins(Op::SendGradStart, mb.id, d, prev, shape(mb)));
    }
    for (const auto& mb : mbs) {
      if (d < pp - 1) p.instructions.push_back(ins(Op::SendActivationFinish, mb.id, d, next));
      if (d > 0) p.instructions.push_back(ins(Op::SendGradFinish, mb.id, d, prev));
    }
    if (step) {
      p.instructions.push_back(ins(Op::ReduceGrads));
      p.instructions.push_back(ins(Op::OptimizerStep));
    }
  }
  return programs;
}

// Runs fn(rank) on one thread per rank; rethrows the first failure (lowest rank).
inline void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace dynapipe::runtime::testing
