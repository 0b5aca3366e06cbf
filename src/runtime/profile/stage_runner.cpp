// StageRunner (stage_runner.h): one thread per stage, rounds started together by a barrier.
#include "runtime/profile/stage_runner.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <exception>
#include <optional>
#include <thread>

#include "dynapipe/core/error.h"
#include "dynapipe/core/statistics.h"
#include "dynapipe/core/strings.h"
#include "runtime/model/collate.h"
#include "runtime/model/model.h"
#include "runtime/model/reference_trainer.h"

namespace dynapipe::runtime::profile {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

struct StageRunner::Stage {
  std::shared_ptr<StageModel> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::optional<StageLayers> previous;  // the stage it receives a random activation from
};

StageRunner::StageRunner(const ModelSpec& spec, const std::vector<StageLayers>& stages,
                         std::uint64_t seed, int threads)
    : spec_(spec), seed_(seed), threads_(threads) {
  for (std::size_t i = 0; i < stages.size(); ++i) {
    auto stage = std::make_unique<Stage>();
    stage->model = make_stage_model(spec, stages[i], ModelOptions{.seed = seed});
    std::vector<torch::Tensor> params;
    for (auto& p : stage->model->parameters()) params.push_back(p);
    stage->optimizer = make_adamw(params, TrainerOptions{});
    if (i > 0) stage->previous = stages[i - 1];
    stages_.push_back(std::move(stage));
  }
}

StageRunner::~StageRunner() = default;

StageRoundTimes StageRunner::run(const Shape& shape, Recompute mode, int warmup, int repeats) {
  const bool t5 = spec_.kind == ModelKind::T5;
  const std::int64_t b = shape.batch, s = shape.seqlen, d = t5 ? shape.dec_seqlen : 0;
  // Full rows of one sample each; GPT samples split half input, half target.
  std::vector<Sample> samples;
  MicroBatch mb;
  std::int64_t target_tokens = 0;
  for (std::int64_t r = 0; r < b; ++r) {
    Sample sample{.id = static_cast<SampleId>(r),
                  .input_len = static_cast<std::int32_t>(t5 ? s : s / 2),
                  .target_len = static_cast<std::int32_t>(t5 ? d : s - s / 2)};
    samples.push_back(sample);
    mb.sample_ids.push_back(sample.id);
    target_tokens += loss_tokens(sample, spec_.kind);
  }
  mb.shape = {.batch = b, .seqlen = s, .dec_seqlen = d};
  const SyntheticTokenSource source(samples, spec_.vocab, /*seed=*/1);
  const double loss_scale = 1.0 / static_cast<double>(std::max<std::int64_t>(1, target_tokens));
  return run_rounds([&] { return collate(mb, source, spec_.kind, AttentionMode::Varlen, loss_scale); }, mb.shape,
                    mode, warmup, repeats);
}

StageRoundTimes StageRunner::run(const MicroBatchTensors& batch, const MicroBatchShape& shape, Recompute mode,
                                 int warmup, int repeats) {
  return run_rounds([&] { return batch; }, shape, mode, warmup, repeats);
}

StageRoundTimes StageRunner::run_rounds(const std::function<MicroBatchTensors()>& batch_of_round,
                                        const MicroBatchShape& shape, Recompute mode, int warmup, int repeats) {
  const std::size_t n = stages_.size();
  std::barrier sync(static_cast<std::ptrdiff_t>(n));
  std::vector<std::vector<double>> fwd(n), bwd(n), opt(n);
  std::vector<std::exception_ptr> errors(n);
  auto body = [&](std::size_t i) {
    try {
      at::set_num_threads(threads_);  // per thread: OpenMP's count is a per-thread setting
      Stage& stage = *stages_[i];
      stage.model->set_recompute(mode);
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + 1 + i);
      at::Tensor input, grad;
      if (stage.previous) {
        input = at::randn(stage_output_shape(spec_, *stage.previous, shape), gen);
        input.requires_grad_(true);
      }
      for (int round = 0; round < warmup + repeats; ++round) {
        sync.arrive_and_wait();
        const auto start = Clock::now();
        const MicroBatchTensors batch = batch_of_round();
        StageOutput out = stage.model->forward(input, batch);
        const auto forwarded = Clock::now();
        const bool last = out.loss.defined();
        at::Tensor y = last ? out.loss : out.hidden;
        if (!last && !grad.defined()) grad = at::randn(y.sizes(), gen);
        backward(y, last ? at::Tensor() : grad);
        const auto backwarded = Clock::now();
        y.reset();
        out = StageOutput{};
        if (input.defined()) input.mutable_grad().reset();
        stage.optimizer->step();
        stage.optimizer->zero_grad();
        if (round >= warmup) {
          fwd[i].push_back(ms_between(start, forwarded));
          bwd[i].push_back(ms_between(forwarded, backwarded));
          opt[i].push_back(ms_between(backwarded, Clock::now()));
        }
      }
    } catch (...) {
      errors[i] = std::current_exception();
      sync.arrive_and_drop();  // the other stages must not wait for this one
    }
  };
  {
    std::vector<std::jthread> workers;
    for (std::size_t i = 0; i < n; ++i) workers.emplace_back(body, i);
  }
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Error&) {
      throw;
    } catch (const c10::Error& c) {
      throw Error(ErrorKind::Internal, cat("profile --stages: ", c.what_without_backtrace()));
    }
  }
  StageRoundTimes times;
  for (std::size_t i = 0; i < n; ++i) {
    times.fwd_ms.push_back(median(fwd[i]));
    times.bwd_ms.push_back(median(bwd[i]));
    times.optimizer_ms = std::max(times.optimizer_ms, median(opt[i]));
  }
  return times;
}

}  // namespace dynapipe::runtime::profile
