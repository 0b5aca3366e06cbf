// Executor on hand-written pipeline programs: the same gradients and updates as running
// the stages by hand; mismatched plans fail with an error naming the rank, not a hang.
#include "runtime/exec/executor.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dynapipe/core/error.h"
#include "exec_test_support.h"

namespace dynapipe::runtime {
namespace {

using namespace std::chrono_literals;
using namespace testing;
using Op = InstructionOp;

std::vector<MicroBatch> two_microbatches() {
  return {make_mb(0, {1, 2}, 6), make_mb(1, {3, 4, 5}, 8)};
}

double total_target_tokens(const std::vector<std::vector<MicroBatch>>& replicas) {
  double n = 0;
  for (const auto& mbs : replicas)
    for (const auto& mb : mbs) n += static_cast<double>(mb.target_tokens);
  return n;
}

// The reference: every stage in one thread, micro-batch by micro-batch, all replicas'
// losses summed (that is what the data-parallel all-reduce computes).
struct Reference {
  std::vector<std::shared_ptr<FakeStage>> stages;
  double loss = 0;
  explicit Reference(int num_stages) {
    for (int s = 0; s < num_stages; ++s) stages.push_back(std::make_shared<FakeStage>(s, num_stages));
  }
  void run(const std::vector<std::vector<MicroBatch>>& replicas) {
    double scale = 1.0 / total_target_tokens(replicas);
    for (const auto& mbs : replicas) {
      for (const auto& mb : mbs) {
        auto batch = fake_collate(mb);
        batch.loss_scale = scale;
        torch::Tensor x;
        StageOutput out;
        for (auto& s : stages) {
          out = s->forward(x, batch);
          x = out.hidden;
        }
        out.loss.backward();
        loss += out.loss.item<double>();
      }
    }
  }
  std::vector<torch::Tensor> grads(int stage) const {
    std::vector<torch::Tensor> g;
    for (auto& p : stages[stage]->parameters()) g.push_back(p.grad().clone());
    return g;
  }
};

struct Rank {
  std::shared_ptr<FakeStage> stage;
  std::unique_ptr<Executor> executor;
  IterationResult result;
};

// pp x dp ranks as threads over local communicators (or Gloo when `store_port` > 0).
std::vector<Rank> run_pipeline(int pp, int dp, const std::vector<std::vector<MicroBatch>>& replicas,
                               bool step, Millis timeout = 3000ms,
                               std::function<void(std::vector<ExecutorProgram>&)> edit = {}) {
  int world = pp * dp;
  auto pipe = make_local_communicators(world);
  std::vector<std::vector<std::unique_ptr<Communicator>>> dps;
  for (int d = 0; d < pp; ++d) dps.push_back(make_local_communicators(dp));
  std::vector<ReplicaPlan> plans(dp);
  std::vector<ExecutorProgram> programs;
  for (int r = 0; r < dp; ++r) {
    plans[r].microbatches = replicas[r];
    plans[r].executors = gpipe_programs(replicas[r], pp, r, step);
    for (auto& p : plans[r].executors) programs.push_back(p);
  }
  if (edit) edit(programs);
  double scale = 1.0 / total_target_tokens(replicas);
  std::vector<Rank> ranks(world);
  for (int rank = 0; rank < world; ++rank) {
    int d = rank % pp, r = rank / pp;
    ranks[rank].stage = std::make_shared<FakeStage>(d, pp);
    ExecutorConfig config{.rank = rank, .ranks = {.pp = pp, .dp = world / pp}, .num_stages = pp,
                          .comm_timeout = timeout};
    ranks[rank].executor = std::make_unique<Executor>(
        config, std::map<int, std::shared_ptr<StageModel>>{{d, ranks[rank].stage}}, *pipe[rank],
        dps[d][r].get(), fake_collate);
  }
  run_threads(world, [&](int rank) {
    ranks[rank].result = ranks[rank].executor->run(
        {.iteration = 0, .replica = &plans[rank / pp], .program = &programs[rank], .loss_scale = scale});
  });
  return ranks;
}

void expect_near(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << a[i] << "\nvs\n" << b[i];
}

std::vector<torch::Tensor> grads_of(const StageModel& m) {
  std::vector<torch::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad());
  return g;
}

TEST(ExecutorTest, TwoStageGpipeMatchesStagesByHand) {
  auto replicas = std::vector<std::vector<MicroBatch>>{two_microbatches()};
  Reference ref(2);
  ref.run(replicas);
  auto ranks = run_pipeline(2, 1, replicas, /*step=*/false);
  EXPECT_FALSE(ranks[0].result.has_loss);
  ASSERT_TRUE(ranks[1].result.has_loss);
  EXPECT_NEAR(ranks[1].result.loss, ref.loss, 1e-6);
  expect_near(grads_of(*ranks[0].stage), ref.grads(0));
  expect_near(grads_of(*ranks[1].stage), ref.grads(1));
  EXPECT_EQ(ranks[0].result.op_count[static_cast<int>(Op::Forward)], 2);
  EXPECT_GT(ranks[0].result.peak_held_bytes, 0);
}

// A micro-batch with its own recompute mode runs its forwards in it; the others in the
// replica's mode. (Recompute never changes the numbers: the loss is the hand-made one.)
TEST(ExecutorTest, EachForwardRunsInItsMicroBatchsRecomputeMode) {
  auto mbs = two_microbatches();
  mbs[1].recompute = Recompute::Full;
  Reference ref(2);
  ref.run({mbs});
  auto ranks = run_pipeline(2, 1, {mbs}, /*step=*/false);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(ranks[rank].stage->forward_modes,
              (std::vector<Recompute>{Recompute::None, Recompute::Full}))
        << "rank " << rank;
  }
  EXPECT_NEAR(ranks[1].result.loss, ref.loss, 1e-6);
}

TEST(ExecutorTest, ThreeStagesTwoReplicasReduceAndStepLikeByHand) {
  auto replicas = std::vector<std::vector<MicroBatch>>{two_microbatches(),
                                                      {make_mb(0, {6}, 4), make_mb(1, {7, 8}, 10)}};
  Reference ref(3);
  ref.run(replicas);
  // One AdamW step by hand on the summed gradients.
  for (auto& s : ref.stages) {
    torch::optim::AdamW opt(s->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.0));
    opt.step();
  }
  auto ranks = run_pipeline(3, 2, replicas, /*step=*/true);
  EXPECT_NEAR(ranks[2].result.loss + ranks[5].result.loss, ref.loss, 1e-6);
  for (int rank = 0; rank < 6; ++rank) {
    auto params = ranks[rank].stage->parameters();
    auto expected = ref.stages[rank % 3]->parameters();
    expect_near(params, expected);
  }
}

TEST(ExecutorTest, MissingSendFailsWithTimeoutNamingRankNotHang) {
  auto replicas = std::vector<std::vector<MicroBatch>>{two_microbatches()};
  auto start = std::chrono::steady_clock::now();
  try {
    run_pipeline(2, 1, replicas, false, 1000ms, [](std::vector<ExecutorProgram>& programs) {
      auto& ins0 = programs[0].instructions;
      // Rank 0 "forgets" to send mb 1's activation (and its Finish).
      std::erase_if(ins0, [](const Instruction& i) {
        return i.mb == 1 && (i.op == Op::SendActivationStart || i.op == Op::SendActivationFinish);
      });
    });
    FAIL() << "a mismatched plan ran to completion";
  } catch (const Error& e) {
    // Rank 0 fails first in rank order: it waits for mb 1's gradient that never comes
    // (or cannot send it: the activation was never sent).
    EXPECT_TRUE(e.kind() == ErrorKind::Timeout || e.kind() == ErrorKind::ParseError) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0, iteration 0, instruction"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(ExecutorTest, MismatchedPlanOverGlooFailsWithinDeadline) {
  // Real transport: rank 1 expects a bigger activation than rank 0 sends for mb 0, and
  // rank 0 sends mb 1 to nobody. Both ranks must end with an error in ~2 s.
  auto mbs = two_microbatches();
  ReplicaPlan plan;
  plan.microbatches = mbs;
  plan.executors = gpipe_programs(mbs, 2, 0, false);
  for (auto& i : plan.executors[1].instructions)
    if (i.op == Op::RecvActivationStart) i.shape[2] += 1;
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = 2000ms;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  std::vector<std::string> errors(2);
  auto start = std::chrono::steady_clock::now();
  run_threads(2, [&](int rank) {
    c10d::TCPStoreOptions o;
    o.port = server->getPort();
    o.timeout = 2000ms;
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
    auto comm = make_gloo_communicator(store, "pipe", rank, 2, 2000ms);
    auto stage = std::make_shared<FakeStage>(rank, 2);
    Executor executor({.rank = rank, .ranks = {.pp = 2, .dp = 1}, .num_stages = 2, .comm_timeout = 2000ms},
                      {{rank, stage}}, *comm, nullptr, fake_collate);
    try {
      executor.run({.iteration = 7, .replica = &plan, .program = &plan.executors[rank], .loss_scale = 0.01});
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find(cat("rank ", r, ", iteration 7")), std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

TEST(ExecutorTest, ValidationRejectsBadProgramsBeforeRunning) {
  auto mbs = two_microbatches();
  ReplicaPlan plan;
  plan.microbatches = mbs;
  plan.executors = gpipe_programs(mbs, 2, 0, false);
  ExecutorConfig config{.rank = 0, .ranks = {.pp = 2, .dp = 1}, .num_stages = 2};
  EXPECT_NO_THROW(validate_program(plan.executors[0], plan, 3, config, {0}));
  auto expect_parse_error = [&](std::function<void(ExecutorProgram&)> edit, const std::string& what) {
    auto p = plan.executors[0];
    edit(p);
    try {
      validate_program(p, plan, 3, config, {0});
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ParseError);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("iteration 3, rank 0"), std::string::npos) << e.what();
    }
  };
  expect_parse_error([](auto& p) { p.instructions[2].peer = 5; }, "peer must be another rank in [0, 2), got 5");
  expect_parse_error([](auto& p) { p.instructions[2].shape[1] = -1; }, "shape dimensions must be >= 0, got -1");
  expect_parse_error([](auto& p) { p.instructions[1].mb = 9; }, "micro-batch ids, got 9");
  expect_parse_error([](auto& p) { p.instructions[1].stage = 1; }, "stage must be one this executor holds");
  expect_parse_error([](auto& p) { p.rank = 1; }, "program rank must be 0, got 1");
  expect_parse_error(
      [](auto& p) { p.instructions.insert(p.instructions.begin(), ins(Op::RecvGradFinish, 0, 0, 1)); },
      "must follow a matching RecvGradStart");
}

TEST(ExecutorTest, SingleStageRunsWithoutCommunication) {
  auto mbs = two_microbatches();
  Reference ref(1);
  ref.run({mbs});
  auto ranks = run_pipeline(1, 1, {mbs}, false);
  EXPECT_NEAR(ranks[0].result.loss, ref.loss, 1e-6);
  expect_near(grads_of(*ranks[0].stage), ref.grads(0));
}

// ZeRO-1: each replica's AdamW holds only the parameters it owns, together every one once.
TEST(ExecutorTest, ZeroShardsTheOptimizerOverTheReplicas) {
  auto pipe = make_local_communicators(2);
  auto dp = make_local_communicators(2);
  std::size_t total = 0, held = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto stage = std::make_shared<FakeStage>(0, 1);
    total = stage->parameters().size();
    for (bool zero : {false, true}) {
      Executor executor({.rank = rank, .ranks = {.pp = 1, .dp = 2}, .num_stages = 1, .zero = zero},
                        {{0, stage}}, *pipe[rank], dp[rank].get(), fake_collate);
      std::size_t params = 0;
      for (const auto& group : executor.optimizer().param_groups()) params += group.params().size();
      if (zero) {
        held += params;
        EXPECT_LT(params, total) << "rank " << rank;
      } else {
        EXPECT_EQ(params, total);
      }
    }
  }
  EXPECT_EQ(held, total);
  ASSERT_GE(total, 2u);
}

TEST(ExecutorTest, ZeroOwnersBalanceElementsDeterministically) {
  // Largest first to the lightest replica: 100 -> 0, 60 -> 1, 50 -> 1, 10 -> 0, 5 -> 0.
  EXPECT_EQ(zero_owner({10, 100, 50, 60, 5}, 2), (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(zero_owner({7, 7, 7}, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(zero_owner({4, 4}, 1), (std::vector<int>{0, 0}));
  EXPECT_EQ(zero_owner({}, 2), std::vector<int>{});
}

}  // namespace
}  // namespace dynapipe::runtime
