// The planner end to end on the bundled data: every plan covers its batch exactly, keeps
// to the memory limit and is deterministic; the tighter-budget DP and the calibration
// only ever change plans the way they promise.
#include "dynapipe/planner/planner.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/data/synth.h"
#include "dynapipe/plan/plan_binary.h"

namespace dynapipe {
namespace {

PlannerOptions options_with(bool fixed_layout, std::vector<double> shares = {0.75},
                            std::shared_ptr<const CostCalibration> calibration = nullptr) {
  PlannerOptions options;
  options.fixed_layout = fixed_layout;
  options.activation_budget_shares = std::move(shares);
  options.calibration = std::move(calibration);
  return options;
}

PlanConfig gpt_config(std::string_view strategy, int pp, int dp, std::int64_t max_seqlen) {
  PlanConfig config;
  config.model = load_model_spec("gpt-6.7b");
  config.samples_path = DYNAPIPE_SOURCE_DIR "/assets/flan_like_mix.jsonl.gz";
  config.strategy = *parse_strategy(strategy);
  config.cost_model = "analytic:a100-40g";
  config.pp = pp;
  config.dp = dp;
  config.max_seqlen = max_seqlen;
  config.max_target_len = max_seqlen;
  config.global_batch_tokens = 65536;
  config.memory_limit_gib = 40;
  return config;
}

// gpt_config() on the H100 preset at 80 GiB, `tokens` per global batch.
PlanConfig gpt_h100_config(std::string_view strategy, int pp, int dp, std::int64_t max_seqlen,
                           std::int64_t tokens = 65536) {
  PlanConfig config = gpt_config(strategy, pp, dp, max_seqlen);
  config.cost_model = "analytic:h100-80g";
  config.memory_limit_gib = 80;
  config.global_batch_tokens = tokens;
  return config;
}

// T5-11B, dynapipe, 65,536-token batches of the bundled data.
PlanConfig t5_config(const std::string& cost_model, int pp, std::int64_t max_seqlen,
                     std::int64_t max_target_len, double memory_limit_gib) {
  PlanConfig config;
  config.model = load_model_spec("t5-11b");
  config.samples_path = DYNAPIPE_SOURCE_DIR "/assets/flan_like_mix.jsonl.gz";
  config.strategy = Strategy::DynaPipe;
  config.cost_model = cost_model;
  config.pp = pp;
  config.max_seqlen = max_seqlen;
  config.max_target_len = max_target_len;
  config.global_batch_tokens = 65536;
  config.memory_limit_gib = memory_limit_gib;
  return config;
}

std::vector<GlobalBatch> batches_of(const PlanConfig& config, std::int64_t count) {
  const TruncationLimits limits = truncation_limits(config);
  // Loading is the slow part; the truncation depends on the model kind and both limits.
  static std::map<std::tuple<ModelKind, std::int64_t, std::int64_t>, Dataset> cache;
  const auto key = std::tuple(config.model.kind, config.max_seqlen, config.max_target_len);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, Dataset::load(config.samples_path, limits)).first;
  return form_global_batches(it->second, config.global_batch_tokens, count);
}

// `a` plans every batch no slower than `b` (1e-9: rounding in the simulated sums).
void expect_no_slower(const Planner& a, const Planner& b, const std::vector<GlobalBatch>& batches) {
  for (const GlobalBatch& batch : batches) {
    EXPECT_LE(a.plan_iteration(batch).est_iteration_ms, b.plan_iteration(batch).est_iteration_ms * (1 + 1e-9))
        << "iteration " << batch.index;
  }
}

// `--schedule auto` plans the first `count` batches no slower than the `named` schedule.
void expect_auto_no_slower_than(const PlanConfig& config, ScheduleKind named, std::int64_t count) {
  PlanConfig fixed = config;
  fixed.schedule = named;
  expect_no_slower(Planner(config, options_with(false, {})), Planner(fixed, options_with(false, {})),
                   batches_of(config, count));
}

// dynapipe plans the first `count` batches no slower than `other` on the same split.
void expect_no_slower_than(const PlanConfig& config, Strategy other, std::int64_t count) {
  PlanConfig theirs = config;
  theirs.strategy = other;
  expect_no_slower(Planner(config, options_with(false, {})), Planner(theirs, options_with(false, {})),
                   batches_of(config, count));
}

// dynapipe's estimate for `batch`, checked to be no slower than `other`'s on the same split.
double dynapipe_no_slower_than(const PlanConfig& config, Strategy other, const GlobalBatch& batch) {
  PlanConfig theirs = config;
  theirs.strategy = other;
  const double dynapipe = Planner(config, options_with(false, {})).plan_iteration(batch).est_iteration_ms;
  EXPECT_LE(dynapipe, Planner(theirs, options_with(false, {})).plan_iteration(batch).est_iteration_ms)
      << strategy_name(other);
  return dynapipe;
}

TEST(PlannerTest, EveryStrategyCoversTheBatchWithinMemoryDeterministically) {
  for (const char* strategy :
       {"dynapipe", "padding", "packing", "packing-varlen", "token-based", "dynapipe-padded"}) {
    for (int dp : {1, 2}) {
      const PlanConfig config = gpt_config(strategy, 4, dp, 2048);
      const Planner planner(config, options_with(true));
      for (const GlobalBatch& batch : batches_of(config, 3)) {
        const IterationPlan plan = planner.plan_iteration(batch);
        ASSERT_EQ(plan.replicas.size(), static_cast<std::size_t>(dp));
        std::multiset<SampleId> planned;
        for (const ReplicaPlan& replica : plan.replicas) {
          ASSERT_FALSE(replica.microbatches.empty());
          ASSERT_EQ(replica.executors.size(), 4u);
          for (const MicroBatch& mb : replica.microbatches) planned.insert(mb.sample_ids.begin(), mb.sample_ids.end());
          for (std::int64_t bytes : replica.est_peak_memory_bytes) EXPECT_LE(bytes, gib_to_bytes(40)) << strategy;
        }
        const std::multiset<SampleId> expected(plan.sample_ids.begin(), plan.sample_ids.end());
        EXPECT_EQ(planned, expected) << strategy << ": every sample exactly once";
        EXPECT_GT(plan.est_iteration_ms, 0);
        EXPECT_EQ(encode_iteration(planner.plan_iteration(batch)).size(), encode_iteration(plan).size());
        IterationPlan again = planner.plan_iteration(batch);
        again.planning_ms = plan.planning_ms;  // the only field allowed to differ
        EXPECT_EQ(encode_iteration(again), encode_iteration(plan)) << strategy << ": deterministic";
      }
    }
  }
}

// PlannerOptions::threads: one plan on several threads (dynapipe's first DPs by varlen
// order side by side, then the steps from their cuts; the baselines' cuts beside both) is
// bit for bit the plan on one, errors included: the DP strategies, both models, dp 2, and a batch
// of many short samples.
TEST(PlannerTest, OnePlanOnSeveralThreadsIsThePlanOnOne) {
  PlannerOptions threaded;
  threaded.threads = 3;
  std::vector<PlanConfig> configs = {gpt_config("dynapipe", 4, 1, 2048), gpt_config("dynapipe", 4, 2, 4096),
                                     gpt_config("dynapipe-padded", 4, 1, 2048),
                                     t5_config("analytic:a100-40g", 8, 2048, 2048, 40)};
  for (const PlanConfig& config : configs) {
    const Planner one(config), several(config, threaded);
    std::vector<GlobalBatch> batches = batches_of(config, 2);
    GlobalBatch& short_only = batches.emplace_back(batches.front());
    std::erase_if(short_only.samples, [](const Sample& s) { return s.input_len + s.target_len > 256; });
    for (const GlobalBatch& batch : batches) {
      IterationPlan a = one.plan_iteration(batch);
      IterationPlan b = several.plan_iteration(batch);
      b.planning_ms = a.planning_ms;  // the only field allowed to differ
      EXPECT_EQ(encode_iteration(b), encode_iteration(a))
          << strategy_name(config.strategy) << " pp " << config.pp << " dp " << config.dp << ", iteration "
          << batch.index << " (" << batch.samples.size() << " samples)";
    }
  }
  // The first DP's error is the plan's, on any thread count.
  const PlanConfig long_samples = gpt_config("dynapipe", 4, 1, 65536);
  GlobalBatch too_long;
  too_long.samples = {{.id = 0, .input_len = 300, .target_len = 16},
                      {.id = 1, .input_len = 60000, .target_len = 16}};
  std::string errors[2];
  for (int k = 0; k < 2; ++k) {
    const Planner planner(long_samples, k == 0 ? PlannerOptions{} : threaded);
    try {
      planner.plan_iteration(too_long);
    } catch (const Error& e) {
      errors[k] = e.what();
    }
  }
  EXPECT_FALSE(errors[0].empty());
  EXPECT_EQ(errors[1], errors[0]);
  // A negative count is a bad argument, named, not a crash.
  PlannerOptions negative;
  negative.threads = -1;
  auto expect_bad_count = [](auto&& make, const std::string& message) {
    try {
      make();
      ADD_FAILURE() << "no error for " << message;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  expect_bad_count([&] { Planner planner(long_samples, negative); },
                   "PlannerOptions::threads must be >= 0 (0: one per hardware thread), got -1");
  const Planner planner(long_samples);
  expect_bad_count([&] { planner.plan_iteration(batches_of(long_samples, 1).front(), -2); },
                   "plan_iteration threads must be >= 0 (0: one per hardware thread), got -2");
}

// Replicated stages through the real planner (every plan verified inside, round robin
// included): each replica holds Σ r programs in rank order, every micro-batch's forward
// runs once per stage, and interleaving is refused, since it cannot be split by micro-batch.
TEST(PlannerTest, ReplicatedStagesPlanOneProgramPerStageReplica) {
  for (int dp : {1, 2}) {
    PlanConfig config = gpt_config("dynapipe", 3, dp, 2048);
    config.stage_replicas = {2, 1, 3};
    const RankLayout ranks = rank_layout_of(config);
    const Planner planner(config, options_with(true));
    for (const GlobalBatch& batch : batches_of(config, 2)) {
      const IterationPlan plan = planner.plan_iteration(batch);
      for (std::size_t r = 0; r < plan.replicas.size(); ++r) {
        const ReplicaPlan& replica = plan.replicas[r];
        ASSERT_EQ(replica.executors.size(), 6u);
        std::map<std::pair<int, int>, int> forwards;  // (mb, stage) -> count
        for (std::size_t i = 0; i < replica.executors.size(); ++i) {
          const ExecutorProgram& p = replica.executors[i];
          EXPECT_EQ(p.rank, ranks.rank_of(static_cast<int>(r), p.device, p.stage_replica));
          EXPECT_EQ(ranks.local_index_of(p.rank), static_cast<int>(i));
          for (const Instruction& in : p.instructions) {
            if (in.op != InstructionOp::Forward) continue;
            EXPECT_EQ(in.mb % config.stage_replicas[p.device], p.stage_replica);
            ++forwards[{in.mb, in.stage}];
          }
        }
        EXPECT_EQ(forwards.size(), replica.microbatches.size() * 3);
        for (const auto& [key, count] : forwards) EXPECT_EQ(count, 1);
      }
      const IterationPlan back = decode_iteration(encode_iteration(plan));  // stage_replica travels
      for (std::size_t r = 0; r < plan.replicas.size(); ++r) {
        EXPECT_EQ(back.replicas[r].executors, plan.replicas[r].executors);
      }
    }
  }
  PlanConfig interleaved = gpt_config("dynapipe", 2, 1, 2048);
  interleaved.stage_replicas = {2, 1};
  interleaved.schedule = ScheduleKind::Interleaved;
  try {
    Planner{interleaved};
    FAIL() << "interleaved with replicas accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find(
                  "--schedule interleaved cannot run replicated stages (--replicas 2,1)"),
              std::string::npos)
        << e.what();
  }
}

// The extra DP under 75% of the activation budget (off by default since the zb1p memory
// rule of the schedule-aware search covers what it was for) can only add a candidate.
TEST(PlannerTest, TighterActivationBudgetsNeverMakeThePlanSlower) {
  for (std::int64_t max_seqlen : {1024, 2048, 4096}) {
    const PlanConfig config = gpt_config("dynapipe", 4, 1, max_seqlen);
    const Planner full_only(config, options_with(false, {}));
    const Planner with_tighter(config, options_with(false));
    for (const GlobalBatch& batch : batches_of(config, 3)) {
      const double a = full_only.plan_iteration(batch).est_iteration_ms;
      const double b = with_tighter.plan_iteration(batch).est_iteration_ms;
      EXPECT_LE(b, a) << "max seqlen " << max_seqlen << ", iteration " << batch.index;
    }
  }
}

// The schedule-aware search adds cuts planned for other schedules to the ranking. Only the
// three best by quick estimate are searched in full, so a 1F1B-rule cut that its full search
// would have made the best can drop out: a heuristic, checked here over 18 iterations. Since
// the organ-pipe order (which gains the 1F1B-rule cuts most) dynapipe at max seqlen 2048
// iterations 1 and 2 are 0.25% and 0.48% slower with it (4672.5 vs 4660.8 ms, 4650.7 vs
// 4628.4); in total it is faster, and it wins 3 iterations by more than 0.1%.
TEST(PlannerTest, ScheduleAwareDpNeverMakesThePlanSlower) {
  double total_plain = 0, total_aware = 0;
  int improved = 0;
  for (const char* strategy : {"dynapipe", "dynapipe-padded"}) {
    for (std::int64_t max_seqlen : {1024, 2048, 4096}) {
      const PlanConfig config = gpt_config(strategy, 4, 1, max_seqlen);
      PlannerOptions one_rule = options_with(false, {});
      one_rule.schedule_aware_dp = false;
      const Planner plain(config, one_rule);
      const Planner aware(config, options_with(false, {}));
      for (const GlobalBatch& batch : batches_of(config, 3)) {
        const double a = plain.plan_iteration(batch).est_iteration_ms;
        const double b = aware.plan_iteration(batch).est_iteration_ms;
        EXPECT_LE(b, a * 1.005) << strategy << " " << max_seqlen << ", iteration " << batch.index;
        if (b < a * 0.999) ++improved;
        total_plain += a;
        total_aware += b;
      }
    }
  }
  EXPECT_LT(total_aware, total_plain);
  EXPECT_GE(improved, 3);
}

// dynapipe-padded's cut run varlen is searched on top of the usual three full searches,
// so it can only make a plan faster; at GPT-6.7B pp 8, max seqlen 4096 it does.
TEST(PlannerTest, PaddedCutNeverMakesThePlanSlower) {
  int improved = 0;
  for (int pp : {4, 8}) {
    for (std::int64_t max_seqlen : {2048, 4096}) {
      const PlanConfig config = gpt_config("dynapipe", pp, 1, max_seqlen);
      PlannerOptions without = options_with(false, {});
      without.padded_cut = false;
      const Planner plain(config, without);
      const Planner with_cut(config, options_with(false, {}));
      for (const GlobalBatch& batch : batches_of(config, 3)) {
        const double a = plain.plan_iteration(batch).est_iteration_ms;
        const double b = with_cut.plan_iteration(batch).est_iteration_ms;
        EXPECT_LE(b, a) << "pp " << pp << ", max seqlen " << max_seqlen << ", iteration " << batch.index;
        if (b < a * 0.99) ++improved;
      }
    }
  }
  EXPECT_GE(improved, 1);
}

// The padded cut comes in the sorted order, the slowest a pipeline can run it (its longest
// micro-batches fill or drain alone), so it is ranked in its organ-pipe order too: gpt-tiny
// pp 2 on the CPU model (2048, 16,384 tokens), first batch, ranked it 2840.1 ms as sorted,
// eighth, and never searched it in full, so dynapipe planned 2654.7 ms against
// dynapipe-padded's 2638.0 for the same cut dense; ranked 2610.2 in its organ-pipe order it
// is searched and kept. Each batch: dynapipe no slower than dynapipe-padded.
TEST(PlannerTest, PaddedCutIsRankedInItsPipelineOrder) {
  PlanConfig config = gpt_config("dynapipe", 2, 1, 2048);
  config.model = load_model_spec("gpt-tiny");
  config.cost_model = "analytic:cpu";
  config.global_batch_tokens = 16384;
  config.memory_limit_gib = 0;
  expect_no_slower_than(config, Strategy::DynaPipePadded, 4);
}

// Where fill and drain rule, dynapipe walks token-based's token budget as token-based's own
// plan walks it, with its micro-batches padded as token-based runs them too: T5-11B pp 8 on
// the H100 preset (40 GiB, 8192, 16,384 tokens), third batch, where token-based's plan walks
// to 12 padded micro-batches in 894.3 ms and dynapipe, walking only varlen cuts and only
// while they beat its plan, ran 915.6. Each batch: dynapipe no slower than token-based.
TEST(PlannerTest, TokenBudgetWalkFollowsTokenBasedsOwnWalk) {
  PlanConfig config = t5_config("analytic:h100-80g", 8, 8192, 512, 40);
  config.global_batch_tokens = 16384;
  expect_no_slower_than(config, Strategy::TokenBased, 3);
}

// The same where the plan idles less than half its device time: T5-11B pp 8 on the A100
// preset (40 GiB, 2048, 16,384 tokens) on balanced's split, third batch, idling 0.45, where
// token-based's walked plan ran 1729.9 ms and dynapipe, not walking it, 1730.1.
TEST(PlannerTest, TokenBudgetIsWalkedWhereThePlanIdlesUnderHalf) {
  PlanConfig config = t5_config("analytic:a100-40g", 8, 2048, 512, 40);
  config.global_batch_tokens = 16384;
  config.stage_layers = assign_layers(config.model, {4, 4, 4, 4, 5, 9, 9, 9});  // balanced's split
  dynapipe_no_slower_than(config, Strategy::TokenBased, batches_of(config, 3).back());
}

// The critical-path schedule wins where unequal micro-batches meet a memory limit that
// 1F1B's and ZB-H1's in-flight counts leave unused: at GPT-6.7B pp 4 (40 GiB, max seqlen
// 4096) every iteration of `auto` runs it, faster than the plan whose schedule is fixed
// to zb1p (what `auto` chose before it: 6134.2 → 5886.4 ms for iteration 0; since the
// organ-pipe order, which zb1p gains from most, 5980.7 → 5870.1), and each plan stays within
// the memory limit.
TEST(PlannerTest, CriticalPathWinsWhereUnequalMicroBatchesMeetMemory) {
  const PlanConfig config = gpt_config("dynapipe", 4, 1, 4096);
  PlanConfig zb1p = config;
  zb1p.schedule = ScheduleKind::Zb1p;
  const Planner planner(config, options_with(false, {}));
  const Planner fixed(zb1p, options_with(false, {}));
  for (const GlobalBatch& batch : batches_of(config, 3)) {
    const IterationPlan plan = planner.plan_iteration(batch);
    const ReplicaPlan& replica = plan.replicas.front();
    EXPECT_EQ(replica.schedule, ScheduleKind::CriticalPath) << "iteration " << batch.index;
    EXPECT_LT(plan.est_iteration_ms, fixed.plan_iteration(batch).est_iteration_ms * 0.99)
        << "iteration " << batch.index;
    for (std::int64_t peak : replica.est_peak_memory_bytes) EXPECT_LE(peak, gib_to_bytes(40));
  }
}

// With dp > 1 many cuts tie on their slowest replica: at T5-11B pp 8 dp 4 (H100 preset,
// 40 GiB, max seqlen 8192) a replica holding the one 8192-token sample alone estimates
// 2127.2 ms in 9 of the ranking's 13 cuts. The ranking breaks such ties by the other
// replicas; taking the first DP's instead, auto searched three cuts that put 88 short
// samples in one micro-batch on another replica and planned iteration 0 at 2016.7 ms,
// where --schedule critical-path (the same DPs, its own ranking) planned 1577.6.
TEST(PlannerTest, AutoBreaksTiesOfTheSlowestReplicaByTheOthers) {
  PlanConfig config = t5_config("analytic:h100-80g", 8, 8192, 512, 40);
  config.dp = 4;
  expect_auto_no_slower_than(config, ScheduleKind::CriticalPath, 2);
}

// Under auto the steps that start from the best ranked cut (the bubble-weight line search,
// the padded cut) and a full search also start from each other schedule rule's best within
// 5% of it: quick estimates favour zb1p over critical-path, whose gain comes from the
// injection orders only the full search permutes. At GPT-6.7B pp 8 (H100 preset, 80 GiB,
// max seqlen 1024, 262,144 tokens) every step from the zb1p rule's best stopped at 3077.7
// ms for iteration 0, while --schedule critical-path line-searched the 1F1B rule's best and
// planned its padded cut at 3051.6.
TEST(PlannerTest, AutoStartsFromEveryRulesBestAsItsFixedScheduleDoes) {
  const PlanConfig config = gpt_h100_config("dynapipe", 8, 1, 1024, 262144);
  expect_auto_no_slower_than(config, ScheduleKind::CriticalPath, 1);
}

// The same at dp 4 where the plan idles 0.14 of its device time (GPT-6.7B pp 4 on the H100
// preset, 80 GiB, max seqlen 2048, 262,144 tokens; bench/random_points.py schedules seed 3):
// with the steps gated at 0.15 auto planned iteration 0 in 1530.5 ms against
// critical-path's 1511.3.
TEST(PlannerTest, AutoStartsFromEveryRulesBestAtAModestIdleShare) {
  const PlanConfig config = gpt_h100_config("dynapipe", 4, 4, 2048, 262144);
  expect_auto_no_slower_than(config, ScheduleKind::CriticalPath, 2);
}

// Where the plan idles too little for those steps (GPT-6.7B pp 4, A100-40 preset, 40 GiB, max
// seqlen 512; bench/random_points.py schedules seeds 12 and 13), the 1F1B rule's best still
// gets the line search and its padded cut where critical-path ran it within 2% of the best:
// the zb1p rule's cut ranked ahead, and auto planned iteration 1 in 4040.2 ms against
// critical-path's 4026.0.
TEST(PlannerTest, AutoLineSearchesTheRuleCriticalPathRanClose) {
  expect_auto_no_slower_than(gpt_config("dynapipe", 4, 1, 512), ScheduleKind::CriticalPath, 2);
}

// And the best lone-sample cut within 2% of the best (GPT-6.7B pp 2, A100-80 preset, 80 GiB,
// max seqlen 2048, 16,384 tokens; bench/random_points.py schedules seed 13): critical-path
// line-searched it to β = 1/2 and planned iteration 1 in 1972.1 ms, where auto ran the zb1p
// rule's best in 1992.0.
TEST(PlannerTest, AutoLineSearchesTheLoneSampleCutRanClose) {
  PlanConfig config = gpt_config("dynapipe", 2, 1, 2048);
  config.cost_model = "analytic:a100-80g";
  config.memory_limit_gib = 80;
  config.global_batch_tokens = 16384;
  expect_auto_no_slower_than(config, ScheduleKind::CriticalPath, 2);
}

// And the plan so far with critical-path where another schedule ran it (GPT-6.7B pp 8 on the
// measured H100 profile, 40 GiB, max seqlen 2048; bench/random_points.py schedules seed 7):
// the zb1p rule's padded cut ran 825.7 ms for iteration 0 under zb1p, and the same cut
// 820.9 under critical-path.
TEST(PlannerTest, AutoRunsTheChosenCutWithCriticalPathToo) {
  PlanConfig config = gpt_config("dynapipe", 8, 1, 2048);
  config.cost_model = DYNAPIPE_SOURCE_DIR "/assets/profiles/gpt-6.7b.h100.measured.json";
  expect_auto_no_slower_than(config, ScheduleKind::CriticalPath, 1);
}

// And a row's next cuts, as its named schedule searches its three best, where the row's
// best came within 1% (GPT-6.7B pp 4 on the measured H100 profile, 40 GiB, max seqlen
// 8192; bench/random_points.py schedules seed 4): only the zb1p rule's third cut gives
// 1839.8 ms in iteration 0, where auto, searching each row's best, stopped at 1861.4.
TEST(PlannerTest, AutoSearchesARowsNextCutsWhereItsBestCameClose) {
  PlanConfig config = gpt_config("dynapipe", 4, 1, 8192);
  config.cost_model = DYNAPIPE_SOURCE_DIR "/assets/profiles/gpt-6.7b.h100.measured.json";
  expect_auto_no_slower_than(config, ScheduleKind::Zb1p, 1);
}

// Two gaps bench/random_points.py schedules found, each closed by one step of choose():
TEST(PlannerTest, AutoLooksAtEachRowsBestAndSearchesCopiesOfACutOnce) {
  struct Case {
    PlanConfig config;
    ScheduleKind named;
    std::int64_t batches;
  };
  // Where the plan idles too little for the steps above, each row's best cut within 2% of
  // the best quick estimate still gets a look in its two first orders (T5-11B pp 4 dp 2 on
  // the measured H100 profile, 80 GiB, max seqlen 1024; seed 25): the three best were
  // interleaved cuts, and the zb1p rule's best, ranked fifth (its slower replica 1474.0 ms by
  // quick estimate), runs 1427.4 in its organ-pipe order: without the look auto planned
  // iteration 0 in 1451.6 ms against zb1p's 1440.4.
  PlanConfig looks = t5_config(DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h100.measured.json", 4, 1024, 512, 80);
  looks.dp = 2;
  // Two rules' copies of one cut, ranked with zb1p and with auto, take one of the three full
  // searches, with auto, not two (GPT-6.7B pp 2 on the H100 preset, 80 GiB, max seqlen 1024,
  // 16,384 tokens; seed 31): the zb1p rule's third cut, fourth, runs 684.4 ms in full for
  // iteration 1, where auto stopped at 703.9.
  const PlanConfig copies = gpt_h100_config("dynapipe", 2, 1, 1024, 16384);
  for (const Case& c : {Case{looks, ScheduleKind::Zb1p, 1}, Case{copies, ScheduleKind::Zb1p, 2}}) {
    SCOPED_TRACE(c.config.model.name);
    expect_auto_no_slower_than(c.config, c.named, c.batches);
  }
}

// With dp > 1 a cut searched in full is dealt again for the bubble weight of the schedule it
// ran, not only of the rule that cut it: under auto the 1F1B rule (β = 1) cut what zb1p ran
// best, and its deal of 5 and 5 micro-batches planned iteration 0 in 334.2 ms where
// `--schedule zb1p` dealt 4 and 6 for its own β and planned 328.7 (T5-11B pp 8 dp 2 on the
// measured H100 profile, 80 GiB, 2048, 16,384 tokens; bench/random_points.py schedules
// seed 44).
TEST(PlannerTest, AutoDealsACutAgainForTheScheduleItRan) {
  PlanConfig config = t5_config(DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h100.measured.json", 8, 2048, 512, 80);
  config.dp = 2;
  config.global_batch_tokens = 16384;
  expect_auto_no_slower_than(config, ScheduleKind::Zb1p, 1);
}

// Where the layer split leaves the devices' work unequal, the interleaved rule's best cut
// gets the line search on its bubble weight whatever its quick estimate: interleaving evens
// the devices out, and its rule's cut ranked 11% behind until its bubble weight was halved
// (T5-11B pp 4, uniform split, the H200 profile, 80 GiB, max seqlen 1024, 262,144 tokens;
// bench/random_points.py schedules --card h200 seed 25: auto planned iteration 0 in 9,213.0
// ms against `--schedule interleaved`'s 9,105.0).
TEST(PlannerTest, AutoLineSearchesTheInterleavedRuleWhereTheSplitIsUneven) {
  PlanConfig config = t5_config(DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h200.measured.json", 4, 1024, 1024, 80);
  config.global_batch_tokens = 262144;
  expect_auto_no_slower_than(config, ScheduleKind::Interleaved, 1);
}

// And where fill and drain dominate the best plan (its makespan 36% past its busiest
// device's work), however even the split: T5-11B pp 8, uniform split, H100 preset, 40 GiB,
// max seqlen 512, 262,144 tokens (bench/random_points.py schedules seed 40), where the
// interleaved rule's best ranked 4% behind at 33 micro-batches and auto planned iteration 0
// in 4,881.5 ms against `--schedule interleaved`'s 4,707.8 (16 larger micro-batches).
TEST(PlannerTest, AutoLineSearchesTheInterleavedRuleWhereFillAndDrainDominate) {
  PlanConfig config = t5_config("analytic:h100-80g", 8, 512, 512, 40);
  config.global_batch_tokens = 262144;
  expect_auto_no_slower_than(config, ScheduleKind::Interleaved, 1);
}

// Where a profile prices varlen rows above the same rows dense (varlen_fixed_ms), dynapipe
// ranks dynapipe-padded's own cut run dense: T5-11B pp 4 dp 4 on the H200 profile, 80 GiB,
// 8192, 32,768 tokens (bench/random_points.py strategies --card h200, seed 8), where each
// replica's few micro-batches paid the decoder's fixed cost, iteration 0 planned 1565.7 ms
// against dynapipe-padded's 1551.6.
TEST(PlannerTest, DynapipeRanksThePaddedCutDenseWhereVarlenRowsCostExtra) {
  PlanConfig config = t5_config(DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h200.measured.json", 4, 8192, 8192, 80);
  config.dp = 4;
  config.global_batch_tokens = 32768;
  expect_no_slower_than(config, Strategy::DynaPipePadded, 1);
}

// And that cut with its bubble weight walked, as dynapipe-padded's own plan walks it: T5-11B
// pp 8 on the H200 profile, 80 GiB, 1024, 16,384 tokens (random_points.py strategies --card
// h200, seed 20), where dynapipe-padded's β = 2 cut planned iteration 1 in 351.4 ms and
// dynapipe, ranking only the β = 1 cut, 359.9.
TEST(PlannerTest, DynapipeWalksThePaddedCutsBubbleWeightWhereVarlenRowsCostExtra) {
  PlanConfig config = t5_config(DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h200.measured.json", 8, 1024, 512, 80);
  config.global_batch_tokens = 16384;
  config.stage_layers = assign_layers(config.model, {4, 4, 5, 5, 5, 8, 8, 9});  // balanced's split
  expect_no_slower_than(config, Strategy::DynaPipePadded, 2);
}

// On a measured profile a lone sample runs as one dense row (CostModel::lone_samples_dense()):
// T5-11B pp 8 dp 4 on the H100 profile, 80 GiB, 8192, 65,536 tokens (random_points.py
// strategies seed 33), where each of iteration 1's two 8192-token samples, with 4- and
// 5-token targets, stood alone on a replica as a varlen row, which the profile prices at
// the same tokens in rows of the mean-square length, dearer than its dense row (last
// stage's forward 40.7 ms against 30.2): dynapipe planned 1424.0 ms against
// dynapipe-padded's 1412.7.
TEST(PlannerTest, DynapipeRunsLoneSamplesDenseOnMeasuredProfiles) {
  PlanConfig config = t5_config(DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h100.measured.json", 8, 8192, 512, 80);
  config.dp = 4;
  config.stage_layers = assign_layers(config.model, {2, 3, 3, 4, 4, 5, 11, 16});  // balanced's split
  expect_no_slower_than(config, Strategy::DynaPipePadded, 2);
}

// packing-varlen's cuts ranked past a size whose quick estimate missed: GPT-6.7B pp 4 on the
// H100 preset, 80 GiB, 1024, 262,144 tokens (random_points.py strategies seed 38), where
// packing-varlen's own walk, by full searches, goes from 8 rows per micro-batch to 10; the
// ranking walk by quick estimates found 9 rows 1.1% worse than 8 and stopped, so dynapipe
// planned iteration 1 in 5,293.7 ms against packing-varlen's 5,238.5.
TEST(PlannerTest, DynapipeRanksPackingVarlensSizesPastOneThatMissed) {
  PlanConfig config = gpt_h100_config("dynapipe", 4, 1, 1024, 262144);
  config.stage_layers = assign_layers(config.model, {8, 9, 8, 7});  // both strategies' balanced split
  PlanConfig packing = config;
  packing.strategy = Strategy::PackingVarlen;
  expect_no_slower(Planner(config, options_with(false, {})), Planner(packing, options_with(false, {})),
                   batches_of(config, 2));
}

// `--recompute per-microbatch`: GPT-6.7B pp 4, 40 GiB, 4096 (bench/issue8_points.sh), where
// one mode per iteration runs every micro-batch in full recompute for the few long ones.
// Each micro-batch now runs in the lightest mode its memory allows: the plan mixes modes,
// every one no heavier than its replica's, and runs faster (`dynapipe plan`, iteration 0:
// 5,870.1 → 5,538.6 ms); token-based's own plan gets the mix too (6,251.2 → 5,646.1) and
// still trails dynapipe's.
TEST(PlannerTest, PerMicroBatchRecomputeMixesModesAndPlansFaster) {
  PlanConfig one_mode = gpt_config("dynapipe", 4, 1, 4096);
  PlanConfig mixed = one_mode;
  mixed.mixed_recompute = true;
  PlanConfig token_based = mixed;
  token_based.strategy = Strategy::TokenBased;
  const GlobalBatch batch = batches_of(one_mode, 1).front();
  const IterationPlan before = Planner(one_mode, options_with(false, {})).plan_iteration(batch);
  const IterationPlan after = Planner(mixed, options_with(false, {})).plan_iteration(batch);
  for (const MicroBatch& mb : before.replicas[0].microbatches) EXPECT_FALSE(mb.recompute);
  std::set<Recompute> modes;
  for (const MicroBatch& mb : after.replicas[0].microbatches) {
    const Recompute mode = recompute_of(mb, after.replicas[0].recompute);
    EXPECT_LE(mode, after.replicas[0].recompute);
    // Set only where it differs from the replica's mode.
    EXPECT_NE(mb.recompute, std::optional<Recompute>(after.replicas[0].recompute));
    modes.insert(mode);
  }
  EXPECT_GE(modes.size(), 2u);
  EXPECT_LT(after.est_iteration_ms, before.est_iteration_ms * 0.97);
  EXPECT_LE(after.est_iteration_ms,
            Planner(token_based, options_with(false, {})).plan_iteration(batch).est_iteration_ms);
}

// A rule's cut that ran only in a heavier recompute mode than it was cut for gets a head and
// a tail too, where its own mode can then fit: T5-11B pp 4 on the A100 80 GiB preset, max
// seqlen 512, 262,144 tokens, where the interleaved rule was not its order's best under auto
// (bench/random_points.py schedules seed 27): auto planned iteration 1 in 23,295.5 ms
// against `--schedule interleaved`'s 19,929.2.
TEST(PlannerTest, AutoTriesTheHeadAndTailOfCutsThatFellBackToAHeavierMode) {
  PlanConfig config = t5_config("analytic:a100-80g", 4, 512, 512, 80);
  config.global_batch_tokens = 262144;
  PlanConfig interleaved = config;
  interleaved.schedule = ScheduleKind::Interleaved;
  const GlobalBatch batch = batches_of(config, 2).back();
  EXPECT_LE(Planner(config, options_with(false, {})).plan_iteration(batch).est_iteration_ms,
            Planner(interleaved, options_with(false, {})).plan_iteration(batch).est_iteration_ms * (1 + 1e-9));
  // Such a form may fit no schedule in any mode; the plan goes on without it (GPT-6.7B pp 8
  // dp 4, A100 80 GiB preset at 40 GiB, 8192, 131,072 tokens: iteration 1 replica 3).
  PlanConfig gpt = gpt_config("dynapipe", 8, 4, 8192);
  gpt.cost_model = "analytic:a100-80g";
  gpt.global_batch_tokens = 131072;
  EXPECT_GT(Planner(gpt, options_with(false, {})).plan_iteration(batches_of(gpt, 2).back()).est_iteration_ms, 0);
}

// Under auto the 1F1B rule's best cut of an order gets a head-and-tail form too where
// critical-path ran it and the order's best idles: at GPT-6.7B pp 4 (A100 40 GiB preset,
// 2048, 32,768 tokens, uniform split) auto planned the first batch in 2230.3 ms without it
// and `--schedule critical-path`, which runs that form, 2216.6.
TEST(PlannerTest, AutoTriesTheHeadAndTailOfTheCutCriticalPathRuns) {
  PlanConfig config = gpt_config("dynapipe", 4, 1, 2048);
  config.global_batch_tokens = 32768;
  expect_auto_no_slower_than(config, ScheduleKind::CriticalPath, 1);
}

// And the zb1p rule's best cut of an order within 2% of the order's best: at GPT-6.7B pp 4
// (H100 preset, 80 GiB, 8192, 131,072 tokens, uniform split), in the second batch the 1F1B rule's
// cuts ranked ~5 ms ahead and auto planned 3145.0 ms, `--schedule zb1p` from its rule's
// head-and-tail form 3124.3.
TEST(PlannerTest, AutoTriesTheHeadAndTailOfTheCutZb1pRuns) {
  expect_auto_no_slower_than(gpt_h100_config("dynapipe", 4, 1, 8192, 131072), ScheduleKind::Zb1p, 2);
}

// Under auto the fastest cut critical-path ran in full gets random orders too where a plan
// of another schedule won narrowly: T5-11B pp 8 on the measured H100 profile (80 GiB, 2048,
// 16,384 tokens, uniform split), second batch, where a zb1p plan (434.2 ms) won over a
// 7-micro-batch cut under critical-path (434.7) whose random orders `--schedule
// critical-path` took to 431.5.
TEST(PlannerTest, AutoGivesRandomOrdersToTheCutCriticalPathRanClose) {
  PlanConfig config = t5_config(DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h100.measured.json", 8, 2048, 512, 80);
  config.global_batch_tokens = 16384;
  expect_auto_no_slower_than(config, ScheduleKind::CriticalPath, 2);
}

// With one replica a baseline cut's search stops at the plan so far; one that found nothing
// below it still gets its random orders against the plan, whatever the idle share of the
// result the bar left unknown (which gates them where a result is known). gpt-tiny pp 2 on
// the CPU model, 2048, 8,192 tokens, third batch: dynapipe tied packing-varlen's own plan at
// 1482.7 ms until that cut's random orders ran ungated, 1471.3.
TEST(PlannerTest, ABaselineCutBarredAtThePlanGetsItsRandomOrders) {
  PlanConfig config = gpt_h100_config("dynapipe", 2, 1, 2048, 8192);
  config.model = load_model_spec("gpt-tiny");
  config.cost_model = "analytic:cpu";
  config.max_target_len = 2048;
  config.memory_limit_gib = 0;
  const GlobalBatch batch = batches_of(config, 3).back();
  const PlannerOptions estimates = options_with(false, {});
  PlanConfig theirs = config;
  theirs.strategy = Strategy::PackingVarlen;
  const double dynapipe = Planner(config, estimates).plan_iteration(batch).est_iteration_ms;
  const double packing_varlen = Planner(theirs, estimates).plan_iteration(batch).est_iteration_ms;
  EXPECT_LT(dynapipe, packing_varlen * (1 - 1e-3)) << dynapipe << " vs " << packing_varlen;
}

// packing-varlen without --micro-batch-size simulates two sizes, the objective's choice and
// the most rows that fit, and keeps the faster: each wins somewhere. GPT-6.7B pp 4 on H100
// 80 GiB at 512 takes the most that fit (the objective's 1F1B bubble favours smaller
// micro-batches than zb1p and critical-path need); gpt-tiny pp 2 on the CPU model, where
// every row fits one micro-batch, takes one row each.
TEST(PlannerTest, RowSizedBaselinesSimulateTheObjectivesSizeAndTheMostThatFit) {
  const PlanConfig h100 = gpt_h100_config("packing-varlen", 4, 1, 512);
  PlanConfig cpu = h100;
  cpu.model = load_model_spec("gpt-tiny");
  cpu.cost_model = "analytic:cpu";
  cpu.pp = 2;
  cpu.max_seqlen = cpu.max_target_len = 2048;
  cpu.global_batch_tokens = 16384;
  cpu.memory_limit_gib = 0;
  // Verified plans: one row per micro-batch at H100 512 runs critical-path at the memory
  // limit, and went 5.4 MB over it in the verifier until that schedule held each forward's
  // sent output with its stored bytes (docs/schedules.md, "critical-path").
  const PlannerOptions estimates = options_with(false, {});
  for (const auto& [config, most_wins] : {std::pair{h100, true}, std::pair{cpu, false}}) {
    const Planner chosen(config, estimates);
    const GlobalBatch batch = batches_of(config, 1).front();
    const IterationPlan plan = chosen.plan_iteration(batch);
    std::int64_t rows = 0;
    for (const MicroBatch& mb : plan.replicas.front().microbatches) rows = std::max(rows, mb.shape.batch);
    // The other size, fixed: the most that fit where the objective's size won, and back.
    PlanConfig fixed = config;
    fixed.micro_batch_size = most_wins ? 1 : 8;
    const double other = Planner(fixed, estimates).plan_iteration(batch).est_iteration_ms;
    EXPECT_LT(plan.est_iteration_ms, other) << config.model.name;
    EXPECT_EQ(rows > 1, most_wins) << config.model.name << ": " << rows << " rows";
  }
}

// The schedules that admit forwards by memory alone (the cyclic ones, critical-path) can
// hold many micro-batches on a device, and the output each forward sent stays until its
// backward: at GPT-6.7B pp 8 on the H100 preset at 40 GiB, max seqlen 2048,
// wait-free-cyclic's plan of iteration 1 went 66 MB over the limit in the plan verifier
// (bench/random_points.py schedules seed 22 found it at 4096, 262,144 tokens) until the
// DP's memory rule, the cyclic schedules and the simulator counted those outputs
// (StageCost::held_bytes()). Every plan here is verified, memory included.
TEST(PlannerTest, MemoryBoundSchedulesKeepTheirSentOutputsWithinTheLimit) {
  PlanConfig config = gpt_h100_config("dynapipe", 8, 1, 2048);
  config.memory_limit_gib = 40;
  config.stage_layers = assign_layers(config.model, {3, 4, 4, 4, 4, 5, 5, 3});  // balanced's split
  const std::vector<GlobalBatch> batches = batches_of(config, 2);
  for (ScheduleKind schedule :
       {ScheduleKind::WaitFreeCyclic, ScheduleKind::Cyclic, ScheduleKind::CriticalPath}) {
    config.schedule = schedule;
    const Planner planner(config, PlannerOptions{});
    for (const GlobalBatch& batch : batches) {
      EXPECT_NO_THROW(planner.plan_iteration(batch))
          << schedule_kind_name(schedule) << " iteration " << batch.index;
    }
  }
}

// Past the objective's size and the most that fit, the row-sized baselines walk the
// micro-batch size while the simulation improves, as a practitioner sweeps it: at GPT-6.7B
// pp 8 on the measured H100 profile, 80 GiB, max seqlen 2048, packing-varlen's objective
// chose one row (883.6 ms over three iterations) and the most that fit was four (931.1),
// where two rows run in 806.1. Its plan is now no slower than any fixed size of 1-4 rows,
// and dynapipe's, which walks packing-varlen's cut the same way, no slower than it.
TEST(PlannerTest, RowSizedBaselinesWalkTheMicroBatchSize) {
  PlanConfig pv = gpt_config("packing-varlen", 8, 1, 2048);
  pv.cost_model = "profile:" DYNAPIPE_SOURCE_DIR "/assets/profiles/gpt-6.7b.h100.measured.json";
  pv.memory_limit_gib = 80;
  pv.stage_layers = assign_layers(pv.model, {4, 4, 4, 4, 4, 4, 5, 3});  // balanced's split
  const PlannerOptions estimates = options_with(false, {});
  const GlobalBatch batch = batches_of(pv, 1).front();
  const double walked = Planner(pv, estimates).plan_iteration(batch).est_iteration_ms;
  double best_fixed = std::numeric_limits<double>::infinity();
  for (std::int64_t rows = 1; rows <= 4; ++rows) {
    PlanConfig fixed = pv;
    fixed.micro_batch_size = rows;
    const double ms = Planner(fixed, estimates).plan_iteration(batch).est_iteration_ms;
    EXPECT_LE(walked, ms * (1 + 1e-9)) << rows << " rows";
    best_fixed = std::min(best_fixed, ms);
  }
  EXPECT_DOUBLE_EQ(walked, best_fixed);  // the walk reaches the best size, not only the ends
  PlanConfig dynapipe = pv;
  dynapipe.strategy = Strategy::DynaPipe;
  EXPECT_LE(Planner(dynapipe, estimates).plan_iteration(batch).est_iteration_ms, walked * (1 + 1e-9));
}

// token-based walks its token budget the same way (doubled or halved from the objective's):
// at the same point its plan is no slower than at any budget of 2,048-16,384 tokens, where
// the objective's alone was 9% slower than the best (939.9 against 855.1 ms over three
// iterations).
TEST(PlannerTest, TokenBasedWalksItsTokenBudget) {
  PlanConfig tb = gpt_config("token-based", 8, 1, 2048);
  tb.cost_model = "profile:" DYNAPIPE_SOURCE_DIR "/assets/profiles/gpt-6.7b.h100.measured.json";
  tb.memory_limit_gib = 80;
  tb.stage_layers = assign_layers(tb.model, {4, 4, 4, 4, 4, 4, 5, 3});
  const PlannerOptions estimates = options_with(false, {});
  const GlobalBatch batch = batches_of(tb, 1).front();
  const double walked = Planner(tb, estimates).plan_iteration(batch).est_iteration_ms;
  double best_fixed = std::numeric_limits<double>::infinity();
  for (std::int64_t budget = 2048; budget <= 16384; budget *= 2) {
    PlanConfig fixed = tb;
    fixed.token_budget = budget;
    const double ms = Planner(fixed, estimates).plan_iteration(batch).est_iteration_ms;
    EXPECT_LE(walked, ms * (1 + 1e-9)) << budget << " tokens";
    best_fixed = std::min(best_fixed, ms);
  }
  EXPECT_DOUBLE_EQ(walked, best_fixed);
}

// packing-varlen's and token-based's cuts run varlen are searched on top of the usual
// three, so they can only make a plan faster; and with them dynapipe plans every iteration
// no slower than those two baselines plan it themselves (same split, schedule auto).
TEST(PlannerTest, BaselineCutsKeepDynapipeAheadOfPackingVarlenAndTokenBased) {
  for (int pp : {4, 8}) {
    for (std::int64_t max_seqlen : {2048, 4096}) {
      const PlanConfig config = gpt_config("dynapipe", pp, 1, max_seqlen);
      PlannerOptions without = options_with(false, {});
      without.baseline_cuts = false;
      const Planner plain(config, without);
      const Planner with_cuts(config, options_with(false, {}));
      std::vector<std::unique_ptr<Planner>> baselines;
      for (const char* baseline : {"packing-varlen", "token-based"}) {
        baselines.push_back(std::make_unique<Planner>(gpt_config(baseline, pp, 1, max_seqlen),
                                                      options_with(false, {})));
      }
      for (const GlobalBatch& batch : batches_of(config, 3)) {
        const double b = with_cuts.plan_iteration(batch).est_iteration_ms;
        EXPECT_LE(b, plain.plan_iteration(batch).est_iteration_ms)
            << "pp " << pp << ", max seqlen " << max_seqlen << ", iteration " << batch.index;
        for (const auto& baseline : baselines) {
          EXPECT_LE(b, baseline->plan_iteration(batch).est_iteration_ms * (1 + 1e-9))
              << strategy_name(baseline->config().strategy) << " pp " << pp << ", max seqlen "
              << max_seqlen << ", iteration " << batch.index;
        }
      }
    }
  }
}

// Where the 1F1B rule forces recomputation because a few long samples cannot keep p − s
// copies in flight, the DP runs again without it, those samples alone (lone_samples_alone),
// for critical-path: GPT-6.7B pp 2 on the H100 preset, 80 GiB, 8192, 65,536 tokens
// (bench/random_points.py strategies seed 26). Every cut before ran full recompute, 3655.8
// ms for iteration 0, while token-based, walking its budget, ran 19 micro-batches without
// recomputation under critical-path in 3425.0.
TEST(PlannerTest, LoneSampleCutKeepsDynapipeAheadWhereLongSamplesForceRecomputation) {
  const PlanConfig config = gpt_h100_config("dynapipe", 2, 1, 8192);
  const GlobalBatch batch = batches_of(config, 1).front();
  const double dynapipe = Planner(config, options_with(false, {})).plan_iteration(batch).est_iteration_ms;
  const double token_based =
      Planner(gpt_h100_config("token-based", 2, 1, 8192), options_with(false, {})).plan_iteration(batch).est_iteration_ms;
  EXPECT_LT(dynapipe, token_based);
}

// Where fill and drain rule, token-based's budget is walked by full searches, as its own
// plan walks it (walk_token_budget()): GPT-6.7B pp 8 at 40 GiB, max seqlen 8192, 16,384
// tokens (bench/random_points.py strategies seed 7), whose second batch holds one
// 8192-token sample. dynapipe's 7 micro-batches there planned 3872.4 ms; token-based's
// budget walked down to 512 runs 17 (the long sample alone, the rest short) in 3816.3.
TEST(PlannerTest, DynapipeWalksTokenBasedsBudgetWhereFillAndDrainRule) {
  PlanConfig config = gpt_config("dynapipe", 8, 1, 8192);
  config.global_batch_tokens = 16384;
  PlanConfig token_based = config;
  token_based.strategy = Strategy::TokenBased;
  const GlobalBatch batch = batches_of(config, 2).back();
  const IterationPlan plan = Planner(config, options_with(false, {})).plan_iteration(batch);
  EXPECT_LE(plan.est_iteration_ms,
            Planner(token_based, options_with(false, {})).plan_iteration(batch).est_iteration_ms);
  EXPECT_LT(plan.est_iteration_ms, 3816.3);
  EXPECT_GT(plan.replicas.front().microbatches.size(), 7u);
}

// With dp > 1 token-based's budget is walked among the baseline cuts too: GPT-6.7B pp 4 dp 4
// at 40 GiB, 4096, on joint's split 7,8,9,8 (bench/random_points.py strategies --seed 9
// --partition joint). dynapipe's 5 to 6 micro-batches per replica planned the first batch
// in 1855.2 ms, token-based's walked budget, 8 to 9, in 1736.1.
TEST(PlannerTest, WithDataParallelismDynapipeWalksTokenBasedsBudget) {
  PlanConfig config = gpt_config("dynapipe", 4, 4, 4096);
  config.stage_layers = assign_layers(config.model, {7, 8, 9, 8});
  EXPECT_LT(dynapipe_no_slower_than(config, Strategy::TokenBased, batches_of(config, 1).front()), 1736.1);
}

// With dp > 1 a cut's micro-batches are dealt to the replicas again for the pipeline's
// Σ t + β(p − 1)·max t, not only Σ t (Planner::Impl::redeal()): GPT-6.7B pp 4 dp 4
// on the H100 preset, 80 GiB, max seqlen 8192, 32,768 tokens (bench/random_points.py
// strategies seed 11). In the second batch Karmarkar–Karp had left replicas of 271 to 397
// ms, and dynapipe-padded's own deal planned 400.7 ms against dynapipe's 412.5.
TEST(PlannerTest, DynapipeDealsItsMicroBatchesForThePipelineWithDataParallelism) {
  const PlanConfig config = gpt_h100_config("dynapipe", 4, 4, 8192, 32768);
  EXPECT_LT(dynapipe_no_slower_than(config, Strategy::DynaPipePadded, batches_of(config, 2).back()), 412.5);
}

// The re-dealt replicas each pick their recompute mode: T5-11B pp 8 dp 2 (A100 80 GiB,
// 4096, 32,768 tokens) deals the 4096-token sample a replica alone, whose micro-batch runs
// in 1784.7 ms storing every activation against 2248.2 ms under the plan's selective mode.
TEST(PlannerTest, ReDealtReplicasEachChooseTheirRecomputeMode) {
  PlanConfig config = t5_config("analytic:a100-80g", 8, 4096, 512, 80);
  config.dp = 2;
  config.global_batch_tokens = 32768;
  config.stage_layers = assign_layers(config.model, {3, 4, 4, 4, 4, 4, 11, 14});
  const IterationPlan plan =
      Planner(config, options_with(false, {})).plan_iteration(batches_of(config, 1).front());
  EXPECT_LT(plan.est_iteration_ms, 1900.0);
  ASSERT_EQ(plan.replicas.size(), 2u);
  std::set<Recompute> modes;
  for (const ReplicaPlan& replica : plan.replicas) modes.insert(replica.recompute);
  EXPECT_TRUE(modes.contains(Recompute::None));
}

// A cut the DP made for full recomputation can run in selective mode: under auto the
// interleaved rule's cuts at T5-11B pp 8 dp 4 (A100-80 preset at 40 GiB, 1024, 32k) ranked
// ~20% behind the best by quick searches in full mode, none was searched in full, and
// `--schedule interleaved` planned 619.3 ms against auto's 628.3 (iteration 1).
TEST(PlannerTest, AutoSearchesAFullRecomputeCutThatRunsInSelectiveMode) {
  PlanConfig config = t5_config("analytic:a100-80g", 8, 1024, 512, 40);
  config.dp = 4;
  config.global_batch_tokens = 32768;
  const GlobalBatch batch = batches_of(config, 2).back();
  EXPECT_LT(Planner(config, options_with(false, {})).plan_iteration(batch).est_iteration_ms, 625.0);
}

// With dp > 1 the DP's objective only estimates the deal and the schedule, so the recompute
// mode it ranks best can lose: T5-11B pp 8 dp 2 on the measured H100 profile, 40 GiB, 1024,
// 65,536 tokens (bench/random_points.py strategies seed 48), where from the DP's pick (no
// recomputation) dynapipe planned 794.5 ms per iteration over two and `--recompute full`
// 764.0; dynapipe-padded 924.8 against 835.2 (on dynapipe's split). The first rule's cuts
// in the other modes are now searched too: 765.4 and 838.0.
TEST(PlannerTest, AutoRecomputeSearchesEveryModesCutWithDataParallelism) {
  PlanConfig config = t5_config("profile:" DYNAPIPE_SOURCE_DIR "/assets/profiles/t5-11b.h100.measured.json", 8, 1024,
                                512, 40);
  config.dp = 2;
  config.stage_layers = assign_layers(config.model, {4, 4, 4, 5, 5, 8, 9, 9});  // balanced's split
  for (const auto& [strategy, before_ms] :
       {std::pair{Strategy::DynaPipe, 794.5}, std::pair{Strategy::DynaPipePadded, 924.8}}) {
    config.strategy = strategy;
    PlanConfig full = config;
    full.recompute = Recompute::Full;
    const Planner planner(config, options_with(false, {})), full_planner(full, options_with(false, {}));
    double auto_ms = 0, full_ms = 0;
    for (const GlobalBatch& batch : batches_of(config, 2)) {
      auto_ms += planner.plan_iteration(batch).est_iteration_ms / 2;
      full_ms += full_planner.plan_iteration(batch).est_iteration_ms / 2;
    }
    EXPECT_LT(auto_ms, 0.98 * before_ms) << strategy_name(strategy);
    EXPECT_LE(auto_ms, full_ms * 1.005) << strategy_name(strategy) << ": --recompute full " << full_ms;
  }
}

// dynapipe-padded tries the other modes' cuts at dp = 1 too (dynapipe does not: its DPs
// there cost more than they gain): T5-11B pp 4 on the A100-80G preset, 80 GiB, 1024
// (bench/issue8_points.sh), on this split 5713.0 ms per iteration over two before (no
// recomputation, as the DP ranked it), 5588.7 now.
TEST(PlannerTest, DynapipePaddedSearchesEveryModesCutAtOneReplica) {
  PlanConfig config = t5_config("analytic:a100-80g", 4, 1024, 512, 80);
  config.strategy = Strategy::DynaPipePadded;
  config.stage_layers = assign_layers(config.model, {9, 9, 14, 16});  // balanced's split
  const Planner planner(config, options_with(false, {}));
  double ms = 0;
  for (const GlobalBatch& batch : batches_of(config, 2)) {
    ms += planner.plan_iteration(batch).est_iteration_ms / 2;
  }
  EXPECT_LT(ms, 0.99 * 5713.0);
}

// packing-varlen's cuts are also tried in its own block-diagonal rows, not only as one
// varlen row each: on the flash H100 preset one row of the same samples costs T5-11B's
// decoder stages ~1.7% more, and packing-varlen's plan was 1.1% ahead (pp 8, 80 GiB,
// max seqlen 2048, the 5,5,5,5,5,8,8,7 split both choose: 1160.8 against 1173.2 ms).
TEST(PlannerTest, PackingVarlenCutsInTheirOwnRowsKeepDynapipeAhead) {
  PlanConfig t5 = t5_config("analytic:h100-80g", 8, 2048, 512, 80);
  t5.stage_layers = assign_layers(t5.model, {5, 5, 5, 5, 5, 8, 8, 7});
  PlanConfig pv = t5;
  pv.strategy = Strategy::PackingVarlen;
  expect_no_slower(Planner(t5, options_with(false, {})), Planner(pv, options_with(false, {})),
                   batches_of(t5, 3));
}

// Where the best plan idles more than a fifth of its device time, its cut is searched again
// with random micro-batch orders (every strategy's): never slower. At T5-11B pp 8 (40 GiB,
// max seqlen 1024, targets 512, the 4,5,4,5,5,8,8,9 split `--partition balanced` chooses)
// they took dynapipe from 3558.3 to 3485.1 ms before the critical-path schedule; that
// schedule reaches 3440.8 ms in the given orders (3432.8 with the organ-pipe order; 3439.7
// since it also holds each forward's sent output), and the random orders now move only
// baselines: token-based at max seqlen 4096 (the uniform
// split), 7902.2 → 7900.6 ms. (They moved packing-varlen at 1024 until its micro-batch size
// was chosen by the objective: 3841.3 → 3835.1, now 3737.8 without them.) GPT-6.7B pp 4
// plans idle ~9%: unchanged.
TEST(PlannerTest, RandomOrdersWhereDevicesIdleNeverMakeThePlanSlower) {
  PlanConfig t5 = t5_config("analytic:a100-40g", 8, 1024, 512, 40);
  t5.stage_layers = assign_layers(t5.model, {4, 5, 4, 5, 5, 8, 8, 9});
  PlannerOptions without = options_with(false, {});
  without.random_orders = 0;
  // Mean estimated ms of 3 iterations without and with the random orders, each iteration
  // no slower with them.
  auto means = [&](const PlanConfig& config) {
    const Planner plain(config, without);
    const Planner with_orders(config, options_with(false, {}));
    std::pair<double, double> mean{0, 0};
    for (const GlobalBatch& batch : batches_of(config, 3)) {
      const double a = plain.plan_iteration(batch).est_iteration_ms;
      const double b = with_orders.plan_iteration(batch).est_iteration_ms;
      EXPECT_LE(b, a) << strategy_name(config.strategy) << " iteration " << batch.index;
      mean.first += a / 3;
      mean.second += b / 3;
    }
    return mean;
  };
  const auto [before, after] = means(t5);
  EXPECT_NEAR(before, 3439.7, 0.1);
  EXPECT_NEAR(after, 3439.7, 0.1);
  // A baseline gets the same search (its plans idle as much): here token-based gains.
  PlanConfig token_based = t5_config("analytic:a100-40g", 8, 4096, 512, 40);
  token_based.strategy = Strategy::TokenBased;
  const auto [token_before, token_after] = means(token_based);
  EXPECT_NEAR(token_before, 7902.2, 0.1);
  EXPECT_NEAR(token_after, 7900.6, 0.1);

  const PlanConfig gpt = gpt_config("dynapipe", 4, 1, 2048);
  PlannerOptions gpt_without = options_with(false, {});
  gpt_without.random_orders = 0;
  const Planner gpt_plain(gpt, gpt_without);
  const Planner gpt_with(gpt, options_with(false, {}));
  for (const GlobalBatch& batch : batches_of(gpt, 2)) {
    EXPECT_EQ(gpt_with.plan_iteration(batch).est_iteration_ms,
              gpt_plain.plan_iteration(batch).est_iteration_ms)
        << "gpt-6.7b iteration " << batch.index;
  }
}

TEST(PlannerTest, RandomOrdersMustNotBeNegative) {
  PlannerOptions options = options_with(false, {});
  options.random_orders = -1;
  try {
    const Planner planner(gpt_config("dynapipe", 4, 1, 2048), options);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_STREQ(e.what(), "random orders must be >= 0, got -1");
  }
}

TEST(PlannerTest, CalibrationScalesTheEstimates) {
  const PlanConfig config = gpt_config("dynapipe", 4, 1, 2048);
  auto calibration = std::make_shared<CostCalibration>(4);
  const Planner base(config, options_with(true));
  const Planner calibrated(config, options_with(true, {0.75}, calibration));
  const GlobalBatch batch = batches_of(config, 1).at(0);
  const double before = calibrated.plan_iteration(batch).est_iteration_ms;
  EXPECT_DOUBLE_EQ(before, base.plan_iteration(batch).est_iteration_ms);
  for (int s = 0; s < 4; ++s) calibration->observe(s, {.measured_ms = 3, .base_ms = 1}, {.measured_ms = 3, .base_ms = 1});
  const double after = calibrated.plan_iteration(batch).est_iteration_ms;
  // Compute is 3x, communication is not: a little under 3x.
  EXPECT_GT(after, 2.5 * before);
  EXPECT_LT(after, 3.0 * before);
  EXPECT_EQ(&calibrated.base_cost_model() == &calibrated.cost_model(), false);
  EXPECT_EQ(&base.base_cost_model(), &base.cost_model());
}

// A fake feed of measured peaks (1.5x the model's activations on every stage) moves the
// plan's peak estimate to static + 1.5 x activations. The memory limit is far away, so the
// cuts and the schedule stay the same and the two estimates can be compared device by device.
TEST(PlannerTest, CalibrationScalesThePeakMemoryEstimate) {
  PlanConfig config = gpt_config("dynapipe", 4, 1, 2048);
  config.memory_limit_gib = 4096;
  auto calibration = std::make_shared<CostCalibration>(4);
  const Planner planner(config, options_with(true, {0.75}, calibration));
  const GlobalBatch batch = batches_of(config, 1).at(0);
  const ReplicaPlan before = planner.plan_iteration(batch).replicas.at(0);
  for (int s = 0; s < 4; ++s) {
    const double static_bytes = static_cast<double>(planner.base_cost_model().static_bytes(s));
    const double activations = static_cast<double>(before.est_peak_memory_bytes.at(s)) - static_bytes;
    calibration->observe_memory(s, {.measured_bytes = static_bytes + 1.5 * activations,
                                    .static_bytes = static_bytes,
                                    .activation_bytes = activations});
  }
  const ReplicaPlan after = planner.plan_iteration(batch).replicas.at(0);
  auto shapes = [](const ReplicaPlan& r) {
    std::vector<MicroBatchShape> out;
    for (const MicroBatch& mb : r.microbatches) out.push_back(mb.shape);
    return out;
  };
  ASSERT_EQ(shapes(after), shapes(before));
  ASSERT_EQ(after.schedule, before.schedule);
  for (int s = 0; s < 4; ++s) {
    const double static_bytes = static_cast<double>(planner.base_cost_model().static_bytes(s));
    const double scaled =
        static_bytes + 1.5 * (static_cast<double>(before.est_peak_memory_bytes[s]) - static_bytes);
    const double got = static_cast<double>(after.est_peak_memory_bytes[s]);
    if (s == 3) {
      // Each micro-batch's bytes are rounded to whole bytes after scaling.
      EXPECT_NEAR(got, scaled, 64.0) << "device " << s;
    } else {
      // The stored and peak bytes scale; the outputs sent on (exact tensor sizes) do not,
      // and the last stage sends none.
      EXPECT_GT(got, static_cast<double>(before.est_peak_memory_bytes[s])) << "device " << s;
      EXPECT_LT(got, scaled) << "device " << s;
    }
  }
}

TEST(PlannerTest, BadBudgetSharesAreRejected) {
  const PlanConfig config = gpt_config("dynapipe", 4, 1, 2048);
  for (double share : {0.0, 1.5, -0.2}) {
    try {
      Planner planner(config, options_with(false, {share}));
      ADD_FAILURE() << "accepted share " << share;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("activation budget share"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dynapipe

namespace dynapipe {
namespace {

// A stage over tp devices holds 1/tp of the parameters: GPT-6.7B on one device does not
// fit 40 GiB (~107 GB of training state), over tp 4 it does.
TEST(PlannerTensorParallelTest, TpShardsTheStaticMemory) {
  PlanConfig config;
  config.model = load_model_spec("gpt-6.7b");
  config.cost_model = "a100-measured";
  config.strategy = Strategy::DynaPipe;
  config.max_seqlen = 2048;
  config.max_target_len = 2048;
  config.global_batch_tokens = 16384;
  config.memory_limit_gib = 40;
  try {
    const Planner planner(config);
    FAIL() << "tp 1 should not fit";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Infeasible);
  }
  config.tp = 4;
  const Planner planner(config);
  EXPECT_LT(planner.cost_model().static_bytes(0), gib_to_bytes(40));
  GlobalBatch batch;
  for (int k = 0; k < 40; ++k) batch.samples.push_back({.id = k, .input_len = 100 + 37 * k, .target_len = 8});
  const IterationPlan plan = planner.plan_iteration(batch);
  for (std::int64_t bytes : plan.replicas[0].est_peak_memory_bytes) EXPECT_LE(bytes, gib_to_bytes(40));
  config.tp = 3;
  EXPECT_THROW(Planner{config}, Error);  // 32 heads
}

// The paper regime's T5-11B point at max seqlen 2048 (docs/RESULTS.md), its best layout
// for packing-varlen: tp 8, pp 1. On the measured tables one micro-batch of every sample
// lies far past the measured lengths (~4x the true Σ t), so it must not serve as a lower
// bound (CostModel::subadditive()): it ruled out selective recompute, and dynapipe's plan
// took 5286.5 ms against packing-varlen's 4350.1.
TEST(PlannerTensorParallelTest, MeasuredTablesDoNotPruneTheBestRecomputeMode) {
  SynthOptions synth;
  synth.mixture = "flan-zsopt";
  synth.num_samples = 20000;
  std::vector<Sample> samples = generate_synthetic_samples(synth).samples;
  for (Sample& s : samples) {  // --max-seqlen 2048 for the encoder and the decoder
    s.input_len = std::min<std::int32_t>(s.input_len, 2048);
    s.target_len = std::min<std::int32_t>(s.target_len, 2048);
  }
  const GlobalBatch batch = form_global_batches(samples, {}, 65536, 1).front();
  PlanConfig config = t5_config("a100-measured", 1, 2048, 2048, 35.16);
  config.tp = 8;
  double ms[2] = {};
  for (int k = 0; k < 2; ++k) {
    config.strategy = k == 0 ? Strategy::DynaPipe : Strategy::PackingVarlen;
    ms[k] = Planner(config).plan_iteration(batch).est_iteration_ms;
  }
  EXPECT_LE(ms[0], ms[1]);
  EXPECT_LT(ms[0], 0.95 * 5286.5);  // the pruned plan
}

// --recompute is one mode for every micro-batch, whatever the search tries: the baseline
// cuts' lighter-mode search (critical-path) once planned recompute none under a given
// selective or full (GPT-6.7B pp 8 on the measured H100 profile, 80 GiB, iteration 0).
TEST(PlannerTest, FixedRecomputeModeHoldsForEveryStrategy) {
  PlanConfig config = gpt_config("dynapipe", 8, 1, 2048);
  config.cost_model = "profile:" DYNAPIPE_SOURCE_DIR "/assets/profiles/gpt-6.7b.h100.measured.json";
  config.memory_limit_gib = 80;
  const GlobalBatch batch = batches_of(config, 1).front();
  for (const char* strategy : {"dynapipe", "packing-varlen"}) {
    for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      config.strategy = *parse_strategy(strategy);
      config.recompute = mode;
      const IterationPlan plan = Planner(config, options_with(true)).plan_iteration(batch);
      for (const ReplicaPlan& replica : plan.replicas) {
        EXPECT_EQ(replica.recompute, mode) << strategy << " --recompute " << recompute_name(mode);
      }
    }
  }
}

// packing-megatron runs one recompute mode, fixed rows per micro-batch, full-length rows
// and 1F1B.
TEST(PlannerTensorParallelTest, PackingMegatronKeepsItsFixedChoices) {
  PlanConfig config = gpt_config("packing-megatron", 4, 2, 2048);
  config.cost_model = "a100-measured";
  config.memory_limit_gib = 35.16;
  config.micro_batch_size = 2;
  config.recompute = Recompute::Full;
  const Planner planner(config, options_with(true));
  for (const GlobalBatch& batch : batches_of(config, 2)) {
    const IterationPlan plan = planner.plan_iteration(batch);
    for (const ReplicaPlan& replica : plan.replicas) {
      EXPECT_EQ(replica.schedule, ScheduleKind::OneFOneB);
      EXPECT_EQ(replica.recompute, Recompute::Full);
      for (const MicroBatch& mb : replica.microbatches) {
        EXPECT_LE(mb.shape.batch, 2);
        EXPECT_EQ(mb.shape.seqlen, 2048);
      }
    }
  }
}

}  // namespace
}  // namespace dynapipe
