// The training loop with ranks as threads: fake stage models and a fake planner,
// in-process communicators, an in-memory plan store. Data-parallel equivalence,
// checkpoint/resume reproduces the uninterrupted run, and failures end every rank.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dynapipe/core/error.h"
#include "exec_test_support.h"
#include "runtime/exec/metrics.h"
#include "runtime/exec/plan_codec.h"
#include "runtime/exec/trainer.h"
#include "dynapipe/runtime/launcher.h"

namespace dynapipe::runtime {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace fs = std::filesystem;

// Iteration i's global batch: 4 micro-batches of varying shapes; with dp replicas each
// replica gets 4 / dp of them (renumbered from 0).
IterationPlan fake_plan(std::int64_t i, int pp, int dp) {
  std::vector<MicroBatch> all;
  for (int k = 0; k < 4; ++k) {
    std::vector<SampleId> ids;
    for (int j = 0; j <= (k + i) % 3; ++j) ids.push_back(i * 100 + k * 10 + j);
    all.push_back(make_mb(k, ids, 4 + 2 * ((k + i) % 4)));
  }
  IterationPlan plan;
  plan.index = i;
  plan.est_iteration_ms = 1.5;
  plan.planning_ms = 0.25;
  int per = 4 / dp;
  for (int r = 0; r < dp; ++r) {
    ReplicaPlan replica;
    for (int k = 0; k < per; ++k) {
      auto mb = all[r * per + k];
      mb.id = k;
      replica.microbatches.push_back(mb);
    }
    replica.executors = gpipe_programs(replica.microbatches, pp, r, /*step=*/true);
    replica.schedule = ScheduleKind::GPipe;
    replica.est_peak_memory_bytes = std::vector<std::int64_t>(pp, 1000);
    plan.replicas.push_back(std::move(replica));
  }
  return plan;
}

struct Job {
  int pp = 2, dp = 1;
  TrainOptions options;
  std::function<std::string(std::int64_t)> produce;  // default: fake_plan
  std::function<void(int rank, std::unique_ptr<Communicator>&)> wrap_comm;
  std::vector<std::vector<torch::Tensor>> final_params;  // per rank
};

TrainSummary run_job(Job& job) {
  int world = job.pp * job.dp;
  job.options.plan.pp = job.pp;
  job.options.plan.dp = job.dp;
  job.options.progress = false;
  auto pipe = make_local_communicators(world);
  if (job.wrap_comm)
    for (int r = 0; r < world; ++r) job.wrap_comm(r, pipe[r]);
  std::vector<std::vector<std::unique_ptr<Communicator>>> dps;
  for (int d = 0; d < job.pp; ++d) dps.push_back(make_local_communicators(job.dp));
  std::shared_ptr<KeyValue> kv = make_in_memory_key_value();
  TrainSummary summary;
  job.final_params.assign(world, {});
  run_threads(world, [&](int rank) {
    PlanStore store(kv, "test");
    TrainHooks hooks;
    hooks.num_stages = job.pp;
    if (rank == 0) {
      int pp = job.pp, dp = job.dp;
      hooks.produce_plan = job.produce ? job.produce
                                       : [pp, dp](std::int64_t i) { return encode_plan(fake_plan(i, pp, dp)); };
    }
    int num_stages = job.pp;
    std::shared_ptr<FakeStage> model;
    hooks.make_stage = [&, num_stages](int s) {
      model = std::make_shared<FakeStage>(s, num_stages);
      return model;
    };
    hooks.collate = fake_collate;
    RankContext context{.rank = rank, .ranks = {.pp = job.pp, .dp = job.dp},
                        .pipe = pipe[rank].get(),
                        .dp_group = job.dp > 1 ? dps[rank % job.pp][rank / job.pp].get() : nullptr,
                        .store = &store};
    auto s = train_rank(job.options, context, hooks);
    if (rank == 0) summary = s;
    for (auto& p : model->parameters()) job.final_params[rank].push_back(p.detach().clone());
  });
  return summary;
}

// Hooks of the fake system, for a rank process. `die_rank` kills itself (SIGKILL) when it
// collates its `die_after`-th micro-batch.
TrainHooks fake_hooks(int rank, int pp, int dp, int die_rank, int die_after) {
  TrainHooks hooks;
  hooks.num_stages = pp;
  if (rank == 0) hooks.produce_plan = [pp, dp](std::int64_t i) { return encode_plan(fake_plan(i, pp, dp)); };
  hooks.make_stage = [pp](int s) { return std::make_shared<FakeStage>(s, pp); };
  auto count = std::make_shared<int>(0);
  hooks.collate = [=](const MicroBatch& mb) {
    if (rank == die_rank && ++*count >= die_after) ::raise(SIGKILL);
    return fake_collate(mb);
  };
  return hooks;
}

// Test entry: with DYNAPIPE_TEST_WORKER="pp,dp,steps,die_rank,die_after,metrics" this
// binary is one rank of a job a TrainProcessTest launched (RANK etc. set by the
// launcher). It runs before gtest's main and never returns.
const bool kIsWorker = [] {
  const char* spec = std::getenv("DYNAPIPE_TEST_WORKER");
  if (spec == nullptr) return false;
  auto fields = split(spec, ',');
  int pp = std::stoi(fields.at(0)), dp = std::stoi(fields.at(1)), die_rank = std::stoi(fields.at(3)),
      die_after = std::stoi(fields.at(4));
  TrainOptions options;
  options.plan.pp = pp;
  options.plan.dp = dp;
  options.steps = std::stoi(fields.at(2));
  options.metrics_path = fields.at(5);
  options.comm_timeout_s = 10;
  options.store_timeout_s = 20;
  options.progress = false;
  try {
    auto env = distributed_env_from_environment();
    run_rank_process(options, env.value(), [&](const TrainOptions&, int rank) {
      return fake_hooks(rank, pp, dp, die_rank, die_after);
    });
    std::fflush(nullptr);
    std::_Exit(0);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(nullptr);
    std::_Exit(exit_code(e.kind()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    std::fflush(nullptr);
    std::_Exit(1);
  }
}();

fs::path temp_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / cat("dynapipe_", name, "_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(TrainTest, DataParallelMatchesOneReplicaAndWritesMetrics) {
  auto dir = temp_dir("train_metrics");
  Job one;
  one.pp = 2;
  one.dp = 1;
  one.options.steps = 4;
  auto s1 = run_job(one);
  Job two;
  two.pp = 2;
  two.dp = 2;
  two.options.steps = 4;
  two.options.metrics_path = (dir / "m.jsonl").string();
  auto s2 = run_job(two);
  ASSERT_EQ(s1.losses.size(), 4u);
  ASSERT_EQ(s2.losses.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(s1.losses[i], s2.losses[i], 1e-6 * std::abs(s1.losses[i]) + 1e-9);
  EXPECT_LT(s1.losses[3], s1.losses[0]) << "the loss should go down on this toy problem";
  for (int rank = 0; rank < 4; ++rank)
    for (std::size_t k = 0; k < two.final_params[rank].size(); ++k)
      EXPECT_TRUE(torch::allclose(two.final_params[rank][k], one.final_params[rank % 2][k], 1e-5, 1e-6));

  std::ifstream in(dir / "m.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  auto m = from_json_line(lines[2]);
  EXPECT_EQ(m.step, 2);
  EXPECT_GT(m.real_tokens, 0);
  EXPECT_GE(m.padded_tokens, m.real_tokens);
  EXPECT_GT(m.step_time_s, 0);
  EXPECT_DOUBLE_EQ(m.est_step_time_s, 0.0015);
  EXPECT_DOUBLE_EQ(m.planning_ms, 0.25);
  EXPECT_GT(m.peak_memory_bytes, 0);
  EXPECT_EQ(m.est_peak_memory_bytes, 1000);
  EXPECT_GT(m.op_ms.count("Forward"), 0u);
  EXPECT_NE(lines[4].find("\"summary\":true"), std::string::npos);
  for (const char* field : {"loss", "real_tokens", "padded_tokens", "step_time_s", "est_step_time_s",
                            "tokens_per_s", "planning_ms", "peak_memory_bytes", "est_peak_memory_bytes"})
    EXPECT_NE(lines[4].find(cat("\"", field, "\":")), std::string::npos) << field;
  fs::remove_all(dir);
}

TEST(TrainTest, ResumeFromCheckpointReproducesTheUninterruptedRun) {
  auto dir_a = temp_dir("ckpt_a"), dir_b = temp_dir("ckpt_b");
  Job full;
  full.pp = 2;
  full.dp = 2;
  full.options.steps = 6;
  full.options.checkpoint_dir = dir_a.string();
  full.options.checkpoint_every = 3;
  auto a = run_job(full);

  Job first_half;
  first_half.pp = 2;
  first_half.dp = 2;
  first_half.options.steps = 3;
  first_half.options.checkpoint_dir = dir_b.string();
  first_half.options.checkpoint_every = 3;
  run_job(first_half);
  ASSERT_TRUE(fs::exists(dir_b / "latest"));
  Job resumed;
  resumed.pp = 2;
  resumed.dp = 2;
  resumed.options.steps = 6;
  resumed.options.checkpoint_dir = dir_b.string();
  resumed.options.resume = true;
  resumed.options.metrics_path = (dir_b / "m.jsonl").string();
  auto b = run_job(resumed);

  ASSERT_EQ(a.losses.size(), 6u);
  ASSERT_EQ(b.losses.size(), 6u) << "restored steps are part of the run";
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i;
  for (int rank = 0; rank < 4; ++rank)
    for (std::size_t k = 0; k < full.final_params[rank].size(); ++k)
      EXPECT_TRUE(torch::equal(full.final_params[rank][k], resumed.final_params[rank][k]));
  std::ifstream in(dir_b / "m.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 7) << "6 steps (3 restored) + summary";

  Job wrong_shape;
  wrong_shape.pp = 2;
  wrong_shape.dp = 1;
  wrong_shape.options.steps = 6;
  wrong_shape.options.checkpoint_dir = dir_b.string();
  wrong_shape.options.resume = true;
  try {
    run_job(wrong_shape);
    FAIL() << "resumed a dp=2 checkpoint with dp=1";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("world_size 4, this run has 2"), std::string::npos) << e.what();
  }
  fs::remove_all(dir_a);
  fs::remove_all(dir_b);
}

TEST(TrainTest, PlanningErrorEndsEveryRankWithItsMessage) {
  Job job;
  job.pp = 2;
  job.dp = 1;
  job.options.steps = 5;
  job.options.comm_timeout_s = 2;
  job.options.store_timeout_s = 5;
  job.produce = [](std::int64_t i) -> std::string {
    if (i == 2) throw Error(ErrorKind::Infeasible, "iteration 2: no plan fits 1 GiB");
    return encode_plan(fake_plan(i, 2, 1));
  };
  auto start = std::chrono::steady_clock::now();
  try {
    run_job(job);
    FAIL();
  } catch (const Error& e) {
    // Rank 0's own error is the planner's; rank 1 fails with PeerFailure naming it.
    EXPECT_EQ(e.kind(), ErrorKind::Infeasible) << e.what();
    EXPECT_NE(std::string(e.what()).find("no plan fits 1 GiB"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(TrainTest, DyingRankEndsTheOthersWithinTheTimeout) {
  Job job;
  job.pp = 2;
  job.dp = 1;
  job.options.steps = 5;
  job.options.comm_timeout_s = 1;
  job.wrap_comm = [](int rank, std::unique_ptr<Communicator>& comm) {
    if (rank == 1) comm = std::make_unique<FaultyCommunicator>(std::move(comm), FaultOptions{.die_after_ops = 10});
  };
  auto start = std::chrono::steady_clock::now();
  try {
    run_job(job);
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == ErrorKind::Timeout || e.kind() == ErrorKind::PeerFailure) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(TrainTest, OptionsAreValidatedNamingTheFlag) {
  TrainOptions o;
  o.steps = 0;
  try {
    o.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_STREQ(e.what(), "--steps must be >= 1, got 0");
  }
  o.steps = 1;
  o.resume = true;
  EXPECT_THROW(o.validate(), Error);
}

TEST(TrainProcessTest, RanksAsProcessesOverGlooMatchThreads) {
  auto dir = temp_dir("train_procs");
  auto metrics = (dir / "m.jsonl").string();
  launch_local({.command = {"/proc/self/exe"},
                .world_size = 4,
                .env = {{"DYNAPIPE_TEST_WORKER", cat("2,2,3,-1,0,", metrics)}}});
  Job threads;
  threads.pp = 2;
  threads.dp = 2;
  threads.options.steps = 3;
  auto expected = run_job(threads);
  std::ifstream in(metrics);
  std::vector<StepMetrics> rows;
  for (std::string line; std::getline(in, line);)
    if (line.find("\"summary\"") == std::string::npos) rows.push_back(from_json_line(line));
  ASSERT_EQ(rows.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(rows[i].loss, expected.losses[i], 1e-9) << "step " << i;
  fs::remove_all(dir);
}

TEST(TrainProcessTest, KilledRankEndsTheJobNamingIt) {
  auto dir = temp_dir("train_kill");
  auto start = std::chrono::steady_clock::now();
  try {
    launch_local({.command = {"/proc/self/exe"},
                  .world_size = 2,
                  .env = {{"DYNAPIPE_TEST_WORKER", cat("2,1,50,1,5,", (dir / "m.jsonl").string())}},
                  .kill_grace = 2000ms});
    FAIL() << "the job survived a killed rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PeerFailure);
    EXPECT_NE(std::string(e.what()).find("rank 1 failed (killed by signal 9"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  fs::remove_all(dir);
}

TEST(MetricsTest, SummaryLineHasMedians) {
  std::vector<StepMetrics> rows(3);
  for (int i = 0; i < 3; ++i) {
    rows[i].step = i;
    rows[i].loss = 3.0 - i;
    rows[i].tokens_per_s = 100.0 * (i + 1);
    rows[i].real_tokens = 90;
    rows[i].padded_tokens = 100;
  }
  auto line = summary_json_line(rows);
  EXPECT_NE(line.find("\"loss\":2.0"), std::string::npos) << line;
  EXPECT_NE(line.find("\"tokens_per_s\":200.0"), std::string::npos) << line;
  auto s = summarize_steps(rows);
  EXPECT_DOUBLE_EQ(s.padding_efficiency, 0.9);
  EXPECT_DOUBLE_EQ(s.final_loss, 1.0);
  EXPECT_EQ(summary_from_json(summary_to_json(s)).losses, s.losses);
}

// The summary says when its RSS figures hold the allocator's cache, across the launcher's
// JSON hand-over too.
TEST(MetricsTest, SummarySaysWhenFreedPagesAreKept) {
  TrainSummary s;
  EXPECT_EQ(format_summary(s).find("freed pages"), std::string::npos);
  s.freed_memory_kept = true;
  const TrainSummary again = summary_from_json(summary_to_json(s));
  EXPECT_TRUE(again.freed_memory_kept);
  EXPECT_NE(format_summary(again).find("--release-freed-memory"), std::string::npos);
}

}  // namespace
}  // namespace dynapipe::runtime
