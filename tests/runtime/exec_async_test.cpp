// Asynchronous schedules (pipedream, pipedream-2bw) against their update rule: a single
// process that applies the delayed updates directly (docs/schedules.md, "Asynchronous
// schedules") gives the losses and final weights of `train` with pp 2 and pp 4 over 10
// steps; without weight stashing (the executor's debug flag) it does not.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "dynapipe/core/rng.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/runtime/plan_store.h"
#include "exec_test_support.h"
#include "runtime/exec/plan_codec.h"
#include "runtime/exec/trainer.h"
#include "runtime/model/reference_trainer.h"

namespace dynapipe::runtime {
namespace {

namespace fs = std::filesystem;
using testing::run_threads;

constexpr int kSteps = 10;
constexpr double kRelativeTolerance = 1e-5;

const std::string& samples_file() {
  static const std::string path = [] {
    auto file = fs::temp_directory_path() / cat("dynapipe_async_", ::getpid(), ".jsonl");
    std::ofstream out(file);
    Rng rng(23);
    for (int i = 0; i < 80; ++i) {
      const int input = 4 + static_cast<int>(rng.uniform_int(0, 40));
      const int target = 1 + static_cast<int>(rng.uniform_int(0, 8));
      out << "{\"id\": " << i << ", \"task\": \"t\", \"input_len\": " << input
          << ", \"target_len\": " << target << "}\n";
    }
    return file.string();
  }();
  return path;
}

TrainOptions train_options(ScheduleKind schedule, int pp, bool vertical_sync) {
  TrainOptions options;
  PlanConfig& config = options.plan;
  config.model = load_model_spec("gpt-tiny");
  config.samples_path = samples_file();
  // Two samples per micro-batch: about ten micro-batches per global batch, so that
  // every stage runs several versions behind.
  config.strategy = Strategy::Padding;
  config.micro_batch_size = 2;
  config.schedule = schedule;
  config.vertical_sync = vertical_sync;
  config.cost_model = "analytic:cpu";
  config.pp = pp;
  config.max_seqlen = 64;
  config.max_target_len = 64;
  config.global_batch_tokens = 600;
  config.seed = 7;
  options.steps = kSteps;
  options.lr = 1e-3;
  options.progress = false;
  options.comm_timeout_s = 120;
  return options;
}

struct RunResult {
  std::vector<double> losses;
  std::map<int, std::shared_ptr<StageModel>> stages;  // the trained models, by stage
  std::map<std::int64_t, IterationPlan> plans;        // what each step ran
};

RunResult pipelined_run(const TrainOptions& options) {
  const int pp = options.plan.pp;
  auto pipe = make_local_communicators(pp);
  std::shared_ptr<KeyValue> kv = make_in_memory_key_value();
  RunResult result;
  std::mutex mutex;
  run_threads(pp, [&](int rank) {
    PlanStore store(kv, "async");
    RankContext context{.rank = rank, .ranks = {.pp = pp, .dp = 1}, .pipe = pipe[rank].get(),
                        .dp_group = nullptr, .store = &store};
    TrainHooks hooks = make_default_hooks(options, rank);
    auto make_stage = hooks.make_stage;
    hooks.make_stage = [&, make_stage](int stage) {
      auto model = make_stage(stage);
      std::lock_guard lock(mutex);
      result.stages[stage] = model;
      return model;
    };
    if (rank == 0) {
      auto produce = hooks.produce_plan;
      hooks.produce_plan = [&, produce](std::int64_t i) {
        std::string bytes = produce(i);
        std::lock_guard lock(mutex);
        result.plans[i] = decode_plan(bytes, i, 0);
        return bytes;
      };
    }
    auto summary = train_rank(options, context, hooks);
    if (rank == 0) result.losses = summary.losses;
  });
  return result;
}

// Which version of stage s's weights micro-batch i (injection order) runs on, and
// whether stage s steps after it: the rule of docs/schedules.md, written out directly.
int version_of(ScheduleKind schedule, bool vertical_sync, int pp, int s, int i) {
  if (schedule == ScheduleKind::PipeDream2BW) return std::max(0, i / pp - 1);
  return std::max(0, i - (pp - 1 - (vertical_sync ? 0 : s)));
}
bool steps_after(ScheduleKind schedule, int pp, int i, int m) {
  return schedule != ScheduleKind::PipeDream2BW || i % pp == pp - 1 || i == m - 1;
}

// The single-process reference: every micro-batch goes forward and backward through all
// stages at once, each stage on the version the rule names (kept as copies), then the
// stages step; the same models, data, plans' micro-batches and AdamW.
RunResult reference_run(const TrainOptions& options, const RunResult& pipelined) {
  const PlanConfig& config = options.plan;
  const int pp = config.pp;
  TrainHooks hooks = make_default_hooks(options, 1);  // models and collate only
  RunResult result;
  std::vector<std::shared_ptr<StageModel>> stages;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;
  TrainerOptions adamw;
  adamw.lr = options.lr;
  for (int s = 0; s < pp; ++s) {
    stages.push_back(hooks.make_stage(s));
    result.stages[s] = stages.back();
    optimizers.push_back(make_adamw(stages.back()->parameters(), adamw));
  }
  auto load = [&](int s, const std::vector<torch::Tensor>& values) {
    torch::NoGradGuard no_grad;
    auto params = stages[s]->parameters();
    for (std::size_t k = 0; k < params.size(); ++k) params[k].detach().copy_(values[k]);
  };
  auto copy_of = [&](int s) {
    std::vector<torch::Tensor> values;
    for (const auto& p : stages[s]->parameters()) values.push_back(p.detach().clone());
    return values;
  };
  for (int step = 0; step < kSteps; ++step) {
    const ReplicaPlan& replica = pipelined.plans.at(step).replicas.at(0);
    std::vector<int> order;  // injection order: the first stage's forwards
    for (const Instruction& in : replica.executors.at(0).instructions)
      if (in.op == InstructionOp::Forward) order.push_back(in.mb);
    double target_tokens = 0;
    for (const MicroBatch& mb : replica.microbatches) {
      target_tokens += static_cast<double>(mb.target_tokens);
    }
    std::vector<std::vector<std::vector<torch::Tensor>>> versions(static_cast<std::size_t>(pp));
    for (int s = 0; s < pp; ++s) versions[s].push_back(copy_of(s));  // version 0
    for (auto& opt : optimizers) opt->zero_grad();
    double loss_sum = 0;
    const int m = static_cast<int>(order.size());
    for (int i = 0; i < m; ++i) {
      const MicroBatch* mb = nullptr;
      for (const MicroBatch& candidate : replica.microbatches)
        if (candidate.id == order[i]) mb = &candidate;
      MicroBatchTensors tensors = hooks.collate(*mb);
      tensors.loss_scale = 1.0 / target_tokens;
      for (int s = 0; s < pp; ++s)
        load(s, versions[s].at(version_of(config.schedule, config.vertical_sync, pp, s, i)));
      std::vector<torch::Tensor> inputs(pp), outputs(pp);
      torch::Tensor loss;
      for (int s = 0; s < pp; ++s) {
        if (s > 0) inputs[s] = outputs[s - 1].detach().requires_grad_(true);
        StageOutput out = stages[s]->forward(inputs[s], tensors);
        outputs[s] = out.hidden;
        loss = out.loss;
      }
      loss_sum += loss.item<double>();
      loss.backward();  // the last stage; each earlier one from the next one's input grad
      for (int s = pp - 2; s >= 0; --s) {
        torch::autograd::backward({outputs[s]}, {inputs[s + 1].grad()});
      }
      for (int s = 0; s < pp; ++s) {
        load(s, versions[s].back());  // the live weights take the step
        if (steps_after(config.schedule, pp, i, m)) {
          optimizers[s]->step();
          optimizers[s]->zero_grad();
          versions[s].push_back(copy_of(s));
        }
      }
    }
    result.losses.push_back(loss_sum);
  }
  return result;
}

double max_relative_weight_difference(const RunResult& a, const RunResult& b) {
  double worst = 0;
  for (const auto& [stage, model] : a.stages) {
    auto pa = model->parameters();
    auto pb = b.stages.at(stage)->parameters();
    for (std::size_t k = 0; k < pa.size(); ++k) {
      const double scale = std::max(1e-6, pb[k].abs().max().item<double>());
      worst = std::max(worst, (pa[k] - pb[k]).abs().max().item<double>() / scale);
    }
  }
  return worst;
}

double max_relative_loss_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  }
  return worst;
}

void expect_rule_matches(ScheduleKind schedule, int pp, bool vertical_sync) {
  const std::string what =
      cat(schedule_kind_name(schedule), vertical_sync ? " --vertical-sync" : "", " pp ", pp);
  const TrainOptions options = train_options(schedule, pp, vertical_sync);
  const RunResult trained = pipelined_run(options);
  ASSERT_EQ(trained.losses.size(), static_cast<std::size_t>(kSteps)) << what;
  // The plans really are asynchronous: several steps per iteration on every stage.
  int steps = 0;
  for (const Instruction& in : trained.plans.at(0).replicas[0].executors[0].instructions)
    steps += in.op == InstructionOp::OptimizerStep;
  EXPECT_GE(steps, schedule == ScheduleKind::PipeDream ? 6 : 2) << what;
  const RunResult reference = reference_run(options, trained);
  EXPECT_LE(max_relative_loss_difference(trained.losses, reference.losses), kRelativeTolerance)
      << what;
  EXPECT_LE(max_relative_weight_difference(trained, reference), kRelativeTolerance) << what;
  EXPECT_LT(reference.losses.back(), reference.losses.front()) << what << ": it should learn";
}

TEST(AsyncTrainingTest, PipeDreamFollowsItsUpdateRule) {
  for (int pp : {2, 4}) expect_rule_matches(ScheduleKind::PipeDream, pp, false);
}

TEST(AsyncTrainingTest, VerticalSyncFollowsItsUpdateRule) {
  for (int pp : {2, 4}) expect_rule_matches(ScheduleKind::PipeDream, pp, true);
}

TEST(AsyncTrainingTest, TwoBufferFollowsItsUpdateRule) {
  for (int pp : {2, 4}) expect_rule_matches(ScheduleKind::PipeDream2BW, pp, false);
}

// Without stashing the backward runs on newer weights than its forward: the comparison
// above must notice.
TEST(AsyncTrainingTest, WithoutWeightStashingTheRuleDoesNotHold) {
  TrainOptions options = train_options(ScheduleKind::PipeDream, 2, false);
  options.debug_no_weight_stash = true;
  const RunResult trained = pipelined_run(options);
  const RunResult reference = reference_run(options, trained);
  EXPECT_GT(max_relative_weight_difference(trained, reference), 100 * kRelativeTolerance);
  EXPECT_GT(max_relative_loss_difference(trained.losses, reference.losses), kRelativeTolerance);
}

}  // namespace
}  // namespace dynapipe::runtime
