#include "dynapipe/plan/plan_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dynapipe/core/error.h"
#include "dynapipe/plan/plan_binary.h"
#include "dynapipe/plan/verifier.h"
#include "plan/test_pipelines.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// Expects text to be rejected with a ParseError whose message contains `needle`.
void expect_parse_error(const std::string& text, const std::string& needle) {
  try {
    plan_from_json(text, "plan.json");
    ADD_FAILURE() << "accepted: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ParseError);
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

TEST(PlanJsonTest, RoundTripsExactlyForGptAndT5) {
  for (ModelKind model : {ModelKind::Gpt, ModelKind::T5}) {
    ExecutionPlan plan = testing::sample_plan(model);
    plan.iterations[1].replicas[0].microbatches[0].recompute = Recompute::Selective;
    std::string text = plan_to_json(plan, 2);
    ExecutionPlan back = plan_from_json(text, "plan.json");
    EXPECT_EQ(plan_to_json(back, 2), text);
    EXPECT_EQ(back.iterations[1].replicas[0].microbatches, plan.iterations[1].replicas[0].microbatches);
    EXPECT_FALSE(back.iterations[0].replicas[0].microbatches[0].recompute);  // the replica's mode
    EXPECT_EQ(back.iterations[0].replicas[1].executors, plan.iterations[0].replicas[1].executors);
    EXPECT_EQ(back.iterations[1].padding_efficiency, 0.1 + 0.2);  // doubles round-trip bit-exactly
    EXPECT_EQ(back.iterations[1].planning_ms, 1e-7);
    EXPECT_EQ(plan_to_json(back, -1), plan_to_json(plan, -1));
  }
}

TEST(PlanJsonTest, StageLayersTravelAsLayerCounts) {
  ExecutionPlan plan = testing::sample_plan(ModelKind::T5, 2, 1, 1, 2);
  ASSERT_EQ(plan.config.pp, 2);
  const int total = plan.config.model.total_layers();
  plan.config.stage_layers = assign_layers(plan.config.model, {total - 1, 1});
  const std::string text = plan_to_json(plan);
  EXPECT_EQ(Json::parse(text)["config"]["layers_per_stage"], Json::array({total - 1, 1}));
  EXPECT_EQ(plan_from_json(text, "plan.json").config, plan.config);
  Json j = Json::parse(text);
  j["config"]["layers_per_stage"] = Json::array({total, 1});
  expect_parse_error(j.dump(), "config.layers_per_stage must be layer counts summing to the model's");
  j["config"]["layers_per_stage"] = Json::array({total});
  expect_parse_error(j.dump(), "config.layers_per_stage must be pp (2) layer counts");
  // A uniform split is written as no field at all.
  plan.config.stage_layers.clear();
  EXPECT_FALSE(Json::parse(plan_to_json(plan))["config"].contains("layers_per_stage"));
}

TEST(PlanJsonTest, LayoutFollowsTheContract) {
  ExecutionPlan plan = testing::sample_plan(ModelKind::T5, 2, 1, 1, 2);
  Json j = Json::parse(plan_to_json(plan));
  EXPECT_EQ(j["format"], "dynapipe-plan");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["config"]["model"]["kind"], "t5");
  EXPECT_EQ(j["config"]["seed"].get<std::uint64_t>(), 18446744073709551557ull);
  const Json& replica = j["iterations"][0]["replicas"][0];
  const Json& mb = replica["microbatches"][0];
  EXPECT_EQ(mb["shape"], (Json{{"batch", 1}, {"enc_seqlen", 8}, {"dec_seqlen", 8}}));
  EXPECT_EQ(mb["est_fwd_ms"].size(), 2u);
  EXPECT_FALSE(mb.contains("rows"));
  EXPECT_TRUE(replica["microbatches"][1].contains("rows"));
  EXPECT_EQ(replica["recompute"], "none");
  EXPECT_EQ(replica["timeline"][0], (Json{{"stage", 0}, {"op", "F"}, {"mb", 0}, {"start_ms", 0.0}, {"end_ms", 1.0},
                                          {"device", 0}}));
  const Json& executor = replica["executors"][1];
  EXPECT_EQ(executor["rank"], 1);
  EXPECT_EQ(executor["stage"], 1);
  // Fields that do not apply are omitted.
  EXPECT_EQ(executor["instructions"][0],
            (Json{{"op", "RecvActivationStart"}, {"mb", 0}, {"stage", 1}, {"peer", 0}, {"shape", {1, 8, 16}},
                  {"buffer", 0}}));
  EXPECT_EQ(executor["instructions"].back(), (Json{{"op", "OptimizerStep"}}));
  EXPECT_EQ(j["summary"]["iterations"], 1);

  Json gpt = Json::parse(plan_to_json(testing::sample_plan(ModelKind::Gpt, 2, 1, 1, 2)));
  EXPECT_EQ(gpt["iterations"][0]["replicas"][0]["microbatches"][0]["shape"], (Json{{"batch", 1}, {"seqlen", 8}}));
}

TEST(PlanJsonTest, DeterministicBytes) {
  EXPECT_EQ(plan_to_json(testing::sample_plan(ModelKind::Gpt)), plan_to_json(testing::sample_plan(ModelKind::Gpt)));
}

TEST(PlanJsonTest, ErrorsNameTheJsonPath) {
  ExecutionPlan plan = testing::sample_plan(ModelKind::Gpt, 2, 1, 3, 2);
  Json j = Json::parse(plan_to_json(plan));
  auto with = [&](auto edit) {
    Json copy = j;
    edit(copy);
    return copy.dump();
  };
  expect_parse_error(with([](Json& c) { c["iterations"][2]["replicas"][0]["executors"][1]["instructions"][7]["op"] = "Fwd"; }),
                     "plan.json: iterations[2].replicas[0].executors[1].instructions[7].op must be an instruction op "
                     "(LoadInput, Forward, Backward, ..., OptimizerStep), got \"Fwd\"");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["executors"][0]["instructions"][1]["mb"] = "x"; }),
                     "iterations[0].replicas[0].executors[0].instructions[1].mb must be an integer in [0, 2147483647], got \"x\"");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["executors"][1]["instructions"][5]["shape"] = "x"; }),
                     "plan.json: iterations[0].replicas[0].executors[1].instructions[5].shape must be an array of integers >= 1, "
                     "got \"x\"");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["executors"][1]["instructions"][5]["shape"] = {4, 0}; }),
                     "iterations[0].replicas[0].executors[1].instructions[5].shape[1] must be an integer >= 1, got 0");
  expect_parse_error(with([](Json& c) { c["iterations"][1]["replicas"][0]["microbatches"][1]["shape"].erase("seqlen"); }),
                     "iterations[1].replicas[0].microbatches[1].shape.seqlen must be present, got nothing");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["timeline"][3]["op"] = "X"; }),
                     "iterations[0].replicas[0].timeline[3].op must be one of \"F\", \"B\", \"I\", \"W\", got \"X\"");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["recompute"] = "some"; }),
                     "iterations[0].replicas[0].recompute must be one of");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["microbatches"][1]["recompute"] = "half"; }),
                     "iterations[0].replicas[0].microbatches[1].recompute must be one of \"none\", \"selective\", \"full\", "
                     "got \"half\"");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["microbatches"][0]["est_fwd_ms"][0] = nullptr; }),
                     "microbatches[0].est_fwd_ms[0] must be a finite number, got null");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["microbatches"][1].erase("est_fwd_ms"); }),
                     "microbatches[1].est_fwd_ms must be present on every micro-batch or on none, got nothing");
  expect_parse_error(with([](Json& c) { c["iterations"][0]["replicas"][0]["microbatches"][1]["id"] = 0; }),
                     "microbatches[1].id must be 1, got 0");
  expect_parse_error(with([](Json& c) { c["version"] = 2; }), "plan.json: version must be 1, got 2");
  expect_parse_error(with([](Json& c) { c["config"]["pp"] = 0; }), "config.pp must be an integer in [1, 2147483647], got 0");
  expect_parse_error(with([](Json& c) { c["config"]["model"]["kind"] = "bert"; }), "config.model.kind must be \"gpt\" or \"t5\"");
  expect_parse_error(with([](Json& c) { c["iterations"] = Json::object(); }), "iterations must be an array, got {}");
  expect_parse_error(with([](Json& c) { c["config"]["zero"] = 2; }), "plan.json: config.zero must be an integer in [0, 1], got 2");
  expect_parse_error(with([](Json& c) { c["config"].erase("seed"); }), "plan.json: config.seed must be present, got nothing");
  expect_parse_error("[1, 2", "plan.json: [2] must be valid JSON, got parse error at line 1");
  expect_parse_error("{\"format\": \"dynapipe-plan\", \"version\": 1, \"config\": {\"pp\": 25769E803776}}",
                     "plan.json: config.pp must be a number a double can hold, got 25769E803776");
  expect_parse_error("42", "plan.json: the document must be an object, got 42");
  // Unknown keys are ignored.
  EXPECT_NO_THROW(plan_from_json(with([](Json& c) { c["config"]["future_field"] = 1; }), "plan.json"));
}

TEST(PlanJsonTest, IterationAndSummaryCodecs) {
  ExecutionPlan plan = testing::sample_plan(ModelKind::T5);
  const IterationPlan& it = plan.iterations[1];
  std::string text = iteration_to_json(it, ModelKind::T5, -1);
  IterationPlan back = iteration_from_json(text, ModelKind::T5, "store[1]");
  EXPECT_EQ(iteration_to_json(back, ModelKind::T5, -1), text);
  try {
    iteration_from_json(text, ModelKind::Gpt, "store[1]");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("store[1]: replicas[0].microbatches[0].shape.seqlen must be present"));
  }
  std::string summary = summary_to_json(plan.summary);
  EXPECT_EQ(summary,
            "{\"iterations\":2,\"mean_est_iteration_ms\":13.0,\"est_tokens_per_s\":1500000.0,\"padding_efficiency\":0.3,"
            "\"mean_planning_ms\":2.25,\"p99_planning_ms\":4.5}");
  EXPECT_EQ(summary_to_json(summary_from_json(summary, "stdout")), summary);
}

TEST(PlanJsonTest, WriterRejectsNonFiniteNumbers) {
  ExecutionPlan plan = testing::sample_plan(ModelKind::Gpt, 2, 1, 1, 2);
  plan.iterations[0].est_iteration_ms = std::numeric_limits<double>::infinity();
  EXPECT_THROW(plan_to_json(plan), Error);
}

TEST(PlanJsonTest, JsonBinaryJsonRoundTrip) {
  for (ModelKind model : {ModelKind::Gpt, ModelKind::T5}) {
    ExecutionPlan plan = testing::sample_plan(model, 3, 2, 2, 4);
    std::string json = plan_to_json(plan);
    ExecutionPlan parsed = plan_from_json(json, "plan.json");
    for (IterationPlan& it : parsed.iterations) it = decode_iteration(encode_iteration(it));
    EXPECT_EQ(plan_to_json(parsed), json);
    // And every decoded replica still verifies.
    for (const IterationPlan& it : parsed.iterations) {
      std::vector<ExecutorProgram> all;
      for (const ReplicaPlan& r : it.replicas) all.insert(all.end(), r.executors.begin(), r.executors.end());
      VerifyOptions options;
      options.layout = {.num_devices = 3};
      options.num_microbatches = 4;
      options.error_kind = ErrorKind::InvalidArgument;
      EXPECT_NO_THROW(verify_programs(all, options));
    }
  }
}

}  // namespace
}  // namespace dynapipe

namespace dynapipe {
namespace {

// tp, micro_batch_size, token_budget and recompute are written only when set, so plans without them
// keep their bytes, and they round-trip when set.
TEST(PlanJsonConfigTest, TensorParallelAndFixedBatchingRoundTrip) {
  ExecutionPlan plan = testing::sample_plan(ModelKind::Gpt);
  const std::string plain = plan_to_json(plan);
  EXPECT_EQ(plain.find("\"tp\""), std::string::npos);
  EXPECT_EQ(plain.find("micro_batch_size"), std::string::npos);
  EXPECT_EQ(plain.find("token_budget"), std::string::npos);
  EXPECT_EQ(plan_from_json(plain, "p.json").config.tp, 1);
  plan.config.tp = 4;
  plan.config.micro_batch_size = 2;
  plan.config.token_budget = 4096;
  plan.config.recompute = Recompute::Selective;
  const ExecutionPlan back = plan_from_json(plan_to_json(plan), "p.json");
  EXPECT_EQ(back.config, plan.config);
  EXPECT_EQ(plain.find("mixed_recompute"), std::string::npos);
  plan.config.recompute.reset();
  plan.config.mixed_recompute = true;  // --recompute per-microbatch
  EXPECT_EQ(plan_from_json(plan_to_json(plan), "p.json").config, plan.config);
  Json j = Json::parse(plan_to_json(plan));
  j["config"]["recompute"] = "most";
  try {
    plan_from_json(j.dump(), "p.json");
    ADD_FAILURE() << "accepted a bad recompute";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("config.recompute must be one of"));
  }
}

}  // namespace
}  // namespace dynapipe
