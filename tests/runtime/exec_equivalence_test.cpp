// The core correctness test of the runtime: the real system (data/ global batches,
// planner/ plans, GPT/T5 stage models, executors) trained with any strategy, schedule,
// pp and dp gives the per-step losses of a plain single-process LibTorch step on the
// whole global batch. Ranks run as threads over in-process communicators.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <tuple>

#include "dynapipe/core/rng.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/planner/planner.h"
#include "exec_test_support.h"
#include "dynapipe/runtime/plan_store.h"
#include "runtime/exec/plan_codec.h"
#include "runtime/exec/trainer.h"
#include "runtime/model/reference_trainer.h"

namespace dynapipe::runtime {
namespace {

namespace fs = std::filesystem;
using testing::run_threads;

constexpr int kSteps = 10;
constexpr double kRelativeTolerance = 1e-4;

// Lengths-only samples of very different sizes (some past the truncation limits), so
// every strategy cuts the global batches differently.
const std::string& samples_file() {
  static const std::string path = [] {
    auto file = fs::temp_directory_path() / cat("dynapipe_equivalence_", ::getpid(), ".jsonl");
    std::ofstream out(file);
    Rng rng(11);
    for (int i = 0; i < 90; ++i) {
      bool long_task = i % 7 == 3;
      int input = long_task ? 90 + static_cast<int>(rng.uniform_int(0, 80)) : 4 + static_cast<int>(rng.uniform_int(0, 40));
      int target = long_task ? 20 + static_cast<int>(rng.uniform_int(0, 30)) : 1 + static_cast<int>(rng.uniform_int(0, 6));
      out << "{\"id\": " << i << ", \"task\": \"" << (long_task ? "summarize" : "classify")
          << "\", \"input_len\": " << input << ", \"target_len\": " << target << "}\n";
    }
    return file.string();
  }();
  return path;
}

PlanConfig plan_config(ModelKind kind, std::string_view strategy, int pp, int dp) {
  PlanConfig config;
  config.model = load_model_spec(kind == ModelKind::Gpt ? "gpt-tiny" : "t5-tiny");
  config.samples_path = samples_file();
  config.strategy = *parse_strategy(strategy);
  config.cost_model = "analytic:cpu";
  config.pp = pp;
  config.dp = dp;
  config.max_seqlen = 128;
  config.max_target_len = kind == ModelKind::Gpt ? 128 : 32;
  config.global_batch_tokens = 1024;
  config.seed = 5;
  return config;
}

TrainOptions train_options(const PlanConfig& config) {
  TrainOptions options;
  options.plan = config;
  options.steps = kSteps;
  options.lr = 1e-3;
  options.progress = false;
  options.comm_timeout_s = 60;
  return options;
}

// Summary of the planned, pipelined, data-parallel run (ranks as threads).
// With replicated stages each stage's group holds its replicas x stage-replicas.
// `edit_plan`, if given, changes each iteration's plan before the ranks get it.
TrainSummary pipelined_run(const TrainOptions& options,
                           std::function<void(IterationPlan&)> edit_plan = {}) {
  const RankLayout ranks = rank_layout_of(options.plan);
  const int world = ranks.world_size();
  auto pipe = make_local_communicators(world);
  std::vector<std::vector<std::unique_ptr<Communicator>>> dp_groups;
  for (int d = 0; d < ranks.pp; ++d)
    dp_groups.push_back(make_local_communicators(ranks.stage_group_size(d)));
  std::shared_ptr<KeyValue> kv = make_in_memory_key_value();
  TrainSummary summary;
  run_threads(world, [&](int rank) {
    PlanStore store(kv, "equivalence");
    const int stage = ranks.stage_of(rank);
    RankContext context{.rank = rank,
                        .ranks = ranks,
                        .pipe = pipe[rank].get(),
                        .dp_group = ranks.stage_group_size(stage) > 1
                                        ? dp_groups[stage][ranks.stage_group_rank(rank)].get()
                                        : nullptr,
                        .store = &store};
    TrainHooks hooks = make_default_hooks(options, rank);
    if (edit_plan && hooks.produce_plan) {
      hooks.produce_plan = [edit_plan, produce = hooks.produce_plan](std::int64_t i) {
        IterationPlan plan = decode_plan(produce(i), i, 0);
        edit_plan(plan);
        return encode_plan(plan);
      };
    }
    auto s = train_rank(options, context, std::move(hooks));
    if (rank == 0) summary = s;
  });
  return summary;
}

std::vector<double> pipelined_losses(const TrainOptions& options) { return pipelined_run(options).losses; }

// Per-step losses of one process training the whole model on each whole global batch:
// one padded micro-batch, loss = Σ token losses / target tokens of the batch.
std::vector<double> single_process_losses(const TrainOptions& options) {
  const PlanConfig& config = options.plan;
  const TruncationLimits limits = truncation_limits(config);
  auto dataset = std::make_shared<const Dataset>(Dataset::load(config.samples_path, limits));
  auto batches = form_global_batches(*dataset, config.global_batch_tokens);
  auto tokens = make_dataset_token_source(dataset);
  TrainerOptions trainer_options;
  trainer_options.lr = options.lr;
  trainer_options.weight_decay = options.weight_decay;
  ReferenceTrainer trainer(config.model, assign_layers_uniform(config.model, 1),
                           ModelOptions{.seed = config.seed}, trainer_options);
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    const GlobalBatch& batch = batches[step % batches.size()];
    MicroBatch whole;
    double loss_tokens_sum = 0;
    for (const Sample& s : batch.samples) {
      whole.sample_ids.push_back(s.id);
      loss_tokens_sum += static_cast<double>(loss_tokens(s, config.model.kind));
      whole.shape.batch += 1;
      if (config.model.kind == ModelKind::Gpt) {
        whole.shape.seqlen = std::max<std::int64_t>(whole.shape.seqlen, s.input_len + s.target_len);
      } else {
        whole.shape.seqlen = std::max<std::int64_t>(whole.shape.seqlen, s.input_len);
        whole.shape.dec_seqlen = std::max<std::int64_t>(whole.shape.dec_seqlen, s.target_len);
      }
    }
    losses.push_back(trainer.train_step(
        {collate(whole, *tokens, config.model.kind, AttentionMode::Padded, 1.0 / loss_tokens_sum)}));
  }
  return losses;
}

void expect_same_losses(const std::vector<double>& expected, const std::vector<double>& got,
                        const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], kRelativeTolerance * std::abs(expected[i]))
        << what << ", step " << i;
  }
}

void check_every_strategy(ModelKind kind) {
  const auto expected = single_process_losses(train_options(plan_config(kind, "dynapipe", 1, 1)));
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kSteps));
  EXPECT_LT(expected.back(), expected.front()) << "the reference should learn something";
  for (const char* strategy : {"dynapipe", "padding", "token-based", "packing", "packing-varlen"}) {
    for (int pp : {1, 2}) {
      for (int dp : {1, 2}) {
        auto options = train_options(plan_config(kind, strategy, pp, dp));
        expect_same_losses(expected, pipelined_losses(options),
                           cat(model_kind_name(kind), " ", strategy, " pp ", pp, " dp ", dp));
      }
    }
  }
}

void check_every_schedule(ModelKind kind) {
  const auto expected = single_process_losses(train_options(plan_config(kind, "dynapipe", 2, 1)));
  for (const char* schedule :
       {"gpipe", "1f1b", "interleaved", "cyclic", "wait-free-cyclic", "zb1p", "critical-path"}) {
    auto options = train_options(plan_config(kind, "dynapipe", 2, 1));
    options.plan.schedule = *parse_schedule_kind(schedule);
    expect_same_losses(expected, pipelined_losses(options),
                       cat(model_kind_name(kind), " schedule ", schedule));
  }
}

// A non-uniform layer split (what --partition balanced often picks): the stage models,
// the plan and, under interleaving, the chunks of each device's unequal share of layers
// still compute the single-process step. Five layers split 2,3 (the uniform split is 3,2), two
// chunks per device.
void check_uneven_split(ModelKind kind) {
  PlanConfig config = plan_config(kind, "dynapipe", 2, 1);
  if (kind == ModelKind::Gpt) {
    config.model.layers = 5;
  } else {
    config.model.layers = 3;
    config.model.dec_layers = 2;
  }
  config.stage_layers = assign_layers(config.model, {2, 3});
  const auto expected = single_process_losses(train_options(config));
  for (const char* schedule : {"1f1b", "interleaved"}) {
    auto options = train_options(config);
    options.plan.schedule = *parse_schedule_kind(schedule);
    expect_same_losses(expected, pipelined_losses(options),
                       cat(model_kind_name(kind), " split 2,3, schedule ", schedule));
  }
}

// Micro-batches of one iteration in different recompute modes (what the planner picks
// per micro-batch): selective, full and none in turn, every step, under 1F1B and ZB1P
// (its split backward re-runs a full-recompute forward in BackwardInput).
void check_mixed_recompute(ModelKind kind) {
  const auto expected = single_process_losses(train_options(plan_config(kind, "dynapipe", 2, 1)));
  for (const char* schedule : {"1f1b", "zb1p"}) {
    auto options = train_options(plan_config(kind, "dynapipe", 2, 1));
    options.plan.schedule = *parse_schedule_kind(schedule);
    std::atomic<int> mixed = 0;  // planning workers run concurrently
    auto losses = pipelined_run(options, [&mixed](IterationPlan& plan) {
      for (ReplicaPlan& replica : plan.replicas) {
        for (MicroBatch& mb : replica.microbatches) {
          mb.recompute = kRecomputeModes[static_cast<std::size_t>(mb.id + 1) % kRecomputeModes.size()];
          if (mb.recompute != replica.recompute) ++mixed;
        }
      }
    }).losses;
    EXPECT_GE(mixed, kSteps) << "the plans should mix modes";
    expect_same_losses(expected, losses, cat(model_kind_name(kind), " mixed recompute, ", schedule));
  }
}

// dynapipe on a measured profile makes a lone sample one dense row
// (CostModel::lone_samples_dense()): the same losses. The runtime runs such a row as one
// varlen span (no s x s masks), and a dense micro-batch of several samples (dynapipe-padded's
// cut in a varlen plan) with padded attention, as it was priced.
void check_dense_lone_samples(ModelKind kind) {
  auto options = train_options(plan_config(kind, "dynapipe", 2, 1));
  options.plan.cost_model = cat(DYNAPIPE_SOURCE_DIR "/assets/profiles/",
                                kind == ModelKind::Gpt ? "gpt-tiny" : "t5-tiny", ".cpu.json");
  std::atomic<int> varlen = 0;  // planning workers run concurrently
  std::mutex lone_mutex;
  std::vector<MicroBatch> lone;  // the plans' dense lone samples
  auto losses = pipelined_run(options, [&](IterationPlan& plan) {
    for (const ReplicaPlan& replica : plan.replicas) {
      for (const MicroBatch& mb : replica.microbatches) {
        if (mb.sample_ids.size() != 1) continue;
        if (!mb.rows.empty() || !(mb.density == AttentionDensity{})) {
          ++varlen;
          continue;
        }
        std::lock_guard<std::mutex> lock(lone_mutex);
        lone.push_back(mb);
      }
    }
  }).losses;
  EXPECT_GE(lone.size(), 1u) << "the plans should hold lone samples";
  EXPECT_EQ(varlen, 0) << "lone samples should be dense rows";
  expect_same_losses(single_process_losses(options), losses, cat(model_kind_name(kind), " dense lone samples"));

  ASSERT_GE(lone.size(), 2u);
  const TrainHooks hooks = make_default_hooks(options, 1);  // models and collate only
  EXPECT_EQ(hooks.collate(lone[0]).mode, AttentionMode::Varlen);
  MicroBatch two = lone[0];  // two of them as one dense micro-batch
  two.sample_ids.push_back(lone[1].sample_ids[0]);
  two.shape.batch = 2;
  two.shape.seqlen = std::max(lone[0].shape.seqlen, lone[1].shape.seqlen);
  two.shape.dec_seqlen = std::max(lone[0].shape.dec_seqlen, lone[1].shape.dec_seqlen);
  EXPECT_EQ(hooks.collate(two).mode, AttentionMode::Padded);
}

TEST(EquivalenceTest, GptDenseLoneSamplesMatchSingleProcess) { check_dense_lone_samples(ModelKind::Gpt); }
TEST(EquivalenceTest, T5DenseLoneSamplesMatchSingleProcess) { check_dense_lone_samples(ModelKind::T5); }

TEST(EquivalenceTest, GptMixedRecomputeModesMatchSingleProcess) { check_mixed_recompute(ModelKind::Gpt); }
TEST(EquivalenceTest, T5MixedRecomputeModesMatchSingleProcess) { check_mixed_recompute(ModelKind::T5); }

TEST(EquivalenceTest, GptUnevenSplitMatchesSingleProcess) { check_uneven_split(ModelKind::Gpt); }
TEST(EquivalenceTest, T5UnevenSplitMatchesSingleProcess) { check_uneven_split(ModelKind::T5); }

// --refine-cost-model changes the plans as it learns, never the math.
TEST(EquivalenceTest, RefiningTheCostModelKeepsTheLossesAndLearnsFactors) {
  auto options = train_options(plan_config(ModelKind::Gpt, "dynapipe", 2, 1));
  const auto expected = single_process_losses(options);
  options.refine_cost_model = true;
  const TrainSummary summary = pipelined_run(options);
  expect_same_losses(expected, summary.losses, "gpt dynapipe pp 2, refined");
  EXPECT_NE(summary.cost_calibration.find("stage 1: fwd x"), std::string::npos) << summary.cost_calibration;
  // The analytic CPU model is not exact: after 10 steps some factor has moved off 1.
  EXPECT_EQ(summary.cost_calibration.find("stage 0: fwd x1.00 bwd x1.00 mem x1.00, stage 1: fwd x1.00 bwd x1.00"),
            std::string::npos) << summary.cost_calibration;
  // Peak memory is observed too: resident memory never matches the model to the byte.
  EXPECT_EQ(summary.cost_calibration.find("mem x1.00, stage 1"), std::string::npos) << summary.cost_calibration;
}

// Checkpoint + --resume with the real models: the resumed run's losses are the
// uninterrupted run's, bit for bit.
// Trains `steps` steps uninterrupted, then again with a checkpoint at steps / 2 and a
// resume from it: the losses must be the same, bit for bit.
void expect_resume_reproduces(TrainOptions options, int steps, const std::string& tag) {
  const auto dir = fs::temp_directory_path() / cat("dynapipe_resume_", tag, "_", ::getpid());
  fs::remove_all(dir);
  options.steps = steps;
  const auto uninterrupted = pipelined_losses(options);
  options.checkpoint_dir = dir.string();
  options.checkpoint_every = steps / 2;
  options.steps = steps / 2;
  pipelined_losses(options);
  options.steps = steps;
  options.resume = true;
  const auto resumed = pipelined_losses(options);
  ASSERT_EQ(resumed.size(), static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) EXPECT_EQ(resumed[i], uninterrupted[i]) << tag << " step " << i;
  fs::remove_all(dir);
}

TEST(EquivalenceTest, ResumeWithRealModelsReproducesTheUninterruptedRun) {
  expect_resume_reproduces(train_options(plan_config(ModelKind::T5, "dynapipe", 2, 2)), 6, "real");
}

// Varlen micro-batches of one long row holding many samples (the shape varlen dynapipe
// plans): packing-varlen with rows as long as the whole global batch yields them.
void check_long_varlen_rows(ModelKind kind) {
  PlanConfig config = plan_config(kind, "packing-varlen", 2, 1);
  config.max_seqlen = 1024;      // row capacity: every sample of a global batch fits one row
  config.max_target_len = 1024;  // T5: the decoder row too
  const auto options = train_options(config);
  const auto dataset = Dataset::load(config.samples_path, truncation_limits(config));
  const GlobalBatch batch = form_global_batches(dataset, config.global_batch_tokens).at(0);
  const IterationPlan plan = Planner(config).plan_iteration(batch);
  std::size_t longest_row = 0;
  for (const MicroBatch& mb : plan.replicas.at(0).microbatches) {
    for (const auto& row : mb.rows) longest_row = std::max(longest_row, row.size());
  }
  ASSERT_GE(longest_row, 10u) << "the layout under test needs rows of many samples";
  expect_same_losses(single_process_losses(options), pipelined_losses(options),
                     cat(model_kind_name(kind), " long varlen rows, pp 2"));
}

TEST(EquivalenceTest, GptLongVarlenRowsMatchSingleProcess) { check_long_varlen_rows(ModelKind::Gpt); }
TEST(EquivalenceTest, T5LongVarlenRowsMatchSingleProcess) { check_long_varlen_rows(ModelKind::T5); }

// ZeRO-1 shards AdamW's states over the replicas and syncs parameters from their owners:
// the same math, so the same losses bit for bit (GPT pp 2 x dp 2, T5 pp 1 x dp 2; with two
// replicas a sum all-reduce does not depend on arrival order, with three the threads'
// order changes the last bits), and a checkpoint of the shards resumes exactly.
TEST(EquivalenceTest, ZeroOneKeepsTheLossesExactlyAndResumes) {
  for (auto [kind, pp, dp] : {std::tuple{ModelKind::Gpt, 2, 2}, std::tuple{ModelKind::T5, 1, 2}}) {
    auto options = train_options(plan_config(kind, "dynapipe", pp, dp));
    options.steps = 4;
    const auto plain = pipelined_losses(options);
    options.plan.zero = 1;
    const auto sharded = pipelined_losses(options);
    ASSERT_EQ(sharded.size(), plain.size());
    for (std::size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(sharded[i], plain[i]) << model_kind_name(kind) << " step " << i;
    }
  }
  auto sharded = train_options(plan_config(ModelKind::Gpt, "dynapipe", 1, 2));
  sharded.plan.zero = 1;
  expect_resume_reproduces(sharded, 4, "zero");
}

// Replicated stages (PipeDream's hybrid): a stage's replicas take its micro-batches round
// robin and all-reduce their gradients, so the losses are the unreplicated run's (the
// global batch and its token-mean loss do not change), with dp 1 and 2, GPT and T5.
TEST(EquivalenceTest, ReplicatedStagesMatchTheUnreplicatedRun) {
  for (ModelKind kind : {ModelKind::Gpt, ModelKind::T5}) {
    for (int dp : {1, 2}) {
      auto options = train_options(plan_config(kind, "dynapipe", 2, dp));
      options.steps = 4;
      const auto unreplicated = pipelined_losses(options);
      for (std::vector<int> replicas : {std::vector<int>{2, 1}, std::vector<int>{1, 2}}) {
        auto replicated = options;
        replicated.plan.stage_replicas = replicas;
        expect_same_losses(
            unreplicated, pipelined_losses(replicated),
            cat(model_kind_name(kind), " dp ", dp, " --replicas ", join(replicas, ",")));
      }
    }
  }
}

TEST(EquivalenceTest, GptEveryStrategyPpDpMatchesSingleProcess) { check_every_strategy(ModelKind::Gpt); }
TEST(EquivalenceTest, T5EveryStrategyPpDpMatchesSingleProcess) { check_every_strategy(ModelKind::T5); }
TEST(EquivalenceTest, GptEveryScheduleMatchesSingleProcess) { check_every_schedule(ModelKind::Gpt); }
TEST(EquivalenceTest, T5EveryScheduleMatchesSingleProcess) { check_every_schedule(ModelKind::T5); }

}  // namespace
}  // namespace dynapipe::runtime
