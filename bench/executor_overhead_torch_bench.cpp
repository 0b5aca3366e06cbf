// The executor's overhead: one training step of a planned iteration run by the Executor
// (instruction dispatch, validation, buffer bookkeeping, per-op timing) against a plain
// single-process LibTorch step (ReferenceTrainer) on exactly the same micro-batches, same
// model, same AdamW. pp = 1, so no communication is involved: the difference is the
// executor itself. Both collate their micro-batches inside the timed step.
//
//   build/bench/executor_overhead_torch_bench --benchmark_repetitions=5
//       (add --benchmark_report_aggregates_only=true for medians only)
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include "dynapipe/data/dataset.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/planner/planner.h"
#include "runtime/exec/communicator.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/trainer.h"
#include "runtime/model/collate.h"
#include "runtime/model/reference_trainer.h"

namespace dynapipe::runtime {
namespace {

struct Setup {
  PlanConfig config;
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<const TokenSource> tokens;
  IterationPlan plan;
  double loss_scale = 0;

  Setup(const std::string& model, std::int64_t max_seqlen, std::int64_t tokens_per_batch) {
    at::set_num_threads(1);
    config.model = load_model_spec(model);
    config.samples_path = DYNAPIPE_SOURCE_DIR "/assets/flan_like_mix.jsonl.gz";
    config.cost_model = "analytic:cpu";
    config.max_seqlen = max_seqlen;
    config.max_target_len = config.model.kind == ModelKind::T5 ? 512 : max_seqlen;
    config.global_batch_tokens = tokens_per_batch;
    const TruncationLimits limits = truncation_limits(config);
    dataset = std::make_shared<const Dataset>(Dataset::load(config.samples_path, limits));
    tokens = make_dataset_token_source(dataset);
    const GlobalBatch batch = form_global_batches(*dataset, tokens_per_batch, 1).at(0);
    PlannerOptions options;
    options.fixed_layout = true;
    plan = Planner(config, options).plan_iteration(batch);
    double target = 0;
    for (const MicroBatch& mb : plan.replicas[0].microbatches) target += mb.target_tokens;
    loss_scale = 1.0 / target;
  }

  MicroBatchTensors collate_mb(const MicroBatch& mb) const {
    return collate(mb, *tokens, config.model.kind, AttentionMode::Padded, loss_scale);
  }
};

const Setup& setup_of(int model) {
  static const Setup gpt("gpt-tiny", 1024, 8192), t5("t5-tiny", 1024, 8192);
  return model == 0 ? gpt : t5;
}

void label(benchmark::State& state, const Setup& s) {
  state.counters["microbatches"] = static_cast<double>(s.plan.replicas[0].microbatches.size());
  state.counters["tokens"] = static_cast<double>(s.config.global_batch_tokens);
  state.SetLabel(s.config.model.name);
}

void BM_single_process(benchmark::State& state) {
  const Setup& s = setup_of(static_cast<int>(state.range(0)));
  ReferenceTrainer trainer(s.config.model, assign_layers_uniform(s.config.model, 1), ModelOptions{},
                           TrainerOptions{.lr = 3e-4});
  for (auto _ : state) {
    std::vector<MicroBatchTensors> tensors;
    for (const MicroBatch& mb : s.plan.replicas[0].microbatches) tensors.push_back(s.collate_mb(mb));
    benchmark::DoNotOptimize(trainer.train_step(tensors));
  }
  label(state, s);
}

void BM_executor(benchmark::State& state) {
  const Setup& s = setup_of(static_cast<int>(state.range(0)));
  auto comms = make_local_communicators(1);
  std::map<int, std::shared_ptr<StageModel>> stages{
      {0, make_stage_model(s.config.model, assign_layers_uniform(s.config.model, 1).at(0), ModelOptions{})}};
  Executor executor(ExecutorConfig{.lr = 3e-4}, stages, *comms[0], nullptr,
                    [&s](const MicroBatch& mb) { return s.collate_mb(mb); });
  std::int64_t iteration = s.plan.index;
  for (auto _ : state) {
    auto result = executor.run({.iteration = iteration,
                                .replica = &s.plan.replicas[0],
                                .program = &s.plan.replicas[0].executors.at(0),
                                .loss_scale = s.loss_scale});
    benchmark::DoNotOptimize(result.loss);
  }
  label(state, s);
}

// Each step takes about a second: a few iterations per repetition are enough.
BENCHMARK(BM_single_process)->Arg(0)->Arg(1)->Iterations(4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_executor)->Arg(0)->Arg(1)->Iterations(4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace dynapipe::runtime

BENCHMARK_MAIN();
