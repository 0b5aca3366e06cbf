// The decoder corpus (tests/plan/corpus/{json,binary}): valid plans, truncated and
// mutated ones, and every crasher the fuzzers found (fixed). Each file must decode or
// throw dynapipe::Error; never crash, never throw anything else.
//
// Regenerate the seed files with
//   build/tests/plan/dynapipe_plan_tests --gtest_also_run_disabled_tests
//       --gtest_filter='CorpusTest.DISABLED_WriteSeeds'
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dynapipe/core/error.h"
#include "dynapipe/plan/lowering.h"
#include "dynapipe/plan/plan_binary.h"
#include "dynapipe/plan/plan_json.h"
#include "dynapipe/plan/verifier.h"
#include "plan/test_pipelines.h"

namespace dynapipe {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(DYNAPIPE_SOURCE_DIR) / "tests/plan/corpus";

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::vector<fs::path> files(const char* folder) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(kCorpus / folder)) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CorpusTest, JsonFilesDecodeOrThrowError) {
  int decoded = 0, rejected = 0;
  for (const fs::path& path : files("json")) {
    SCOPED_TRACE(path.filename().string());
    std::string text = read(path);
    try {
      ExecutionPlan plan = plan_from_json(text, path.filename().string());
      std::string once = plan_to_json(plan, -1);
      EXPECT_EQ(plan_to_json(plan_from_json(once, "again"), -1), once);
      ++decoded;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ParseError) << e.what();
      ++rejected;
    }
    for (ModelKind model : {ModelKind::Gpt, ModelKind::T5}) {
      try {
        iteration_from_json(text, model, "iteration");
      } catch (const Error&) {
      }
    }
  }
  EXPECT_GT(decoded, 0);
  EXPECT_GT(rejected, 0);
}

TEST(CorpusTest, BinaryFilesDecodeOrThrowError) {
  int decoded = 0, rejected = 0;
  for (const fs::path& path : files("binary")) {
    SCOPED_TRACE(path.filename().string());
    std::string bytes = read(path);
    try {
      IterationPlan it = decode_iteration(bytes);
      EXPECT_EQ(encode_iteration(it), bytes);
      ++decoded;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ParseError) << e.what();
      ++rejected;
    }
  }
  EXPECT_GT(decoded, 0);
  EXPECT_GT(rejected, 0);
}

TEST(CorpusTest, DISABLED_WriteSeeds) {
  fs::create_directories(kCorpus / "json");
  fs::create_directories(kCorpus / "binary");
  ExecutionPlan gpt = testing::sample_plan(ModelKind::Gpt, 2, 1, 1, 2);
  ExecutionPlan t5 = testing::sample_plan(ModelKind::T5, 2, 2, 1, 2);
  t5.iterations[0].replicas[1].microbatches[0].recompute = Recompute::Selective;
  ExecutionPlan zb = testing::sample_plan(ModelKind::Gpt, 3, 1, 1, 3);
  {
    testing::Lowered l = testing::lower(testing::one_f_one_b(3, 3, true), {.num_devices = 3}, 3);
    zb.iterations[0].replicas[0].timeline = l.sim.timeline;
    zb.iterations[0].replicas[0].executors = l.programs;
    zb.iterations[0].replicas[0].schedule = ScheduleKind::Zb1p;
  }
  ExecutionPlan pipedream = testing::sample_plan(ModelKind::Gpt, 3, 1, 1, 4);
  {
    ScheduleOrder order = testing::one_f_one_b(3, 4);
    order.weight_update = WeightUpdate::VerticalSync;
    testing::Lowered l = testing::lower(order, {.num_devices = 3}, 4);
    add_weight_versions(l.programs, l.order);
    pipedream.config.schedule = ScheduleKind::PipeDream;
    pipedream.config.vertical_sync = true;
    pipedream.iterations[0].replicas[0].timeline = l.sim.timeline;
    pipedream.iterations[0].replicas[0].executors = l.programs;
    pipedream.iterations[0].replicas[0].schedule = ScheduleKind::PipeDream;
  }
  write(kCorpus / "json/gpt_pipedream.json", plan_to_json(pipedream, -1));
  write(kCorpus / "binary/gpt_pipedream.dppl", encode_iteration(pipedream.iterations[0]));
  std::string gpt_json = plan_to_json(gpt, 1);
  write(kCorpus / "json/gpt_1f1b.json", gpt_json);
  write(kCorpus / "json/t5_dp2.json", plan_to_json(t5, -1));
  write(kCorpus / "json/gpt_zb1p.json", plan_to_json(zb, -1));
  write(kCorpus / "json/iteration_t5.json", iteration_to_json(t5.iterations[0], ModelKind::T5, -1));
  write(kCorpus / "json/truncated.json", gpt_json.substr(0, gpt_json.size() / 2));
  std::string mutated = gpt_json;
  mutated.replace(mutated.find("\"Forward\""), 9, "\"Fwd\"    ");
  write(kCorpus / "json/mutated_op.json", mutated);
  write(kCorpus / "json/deep_nesting.json", std::string(20000, '[') + std::string(20000, ']'));
  write(kCorpus / "json/empty.json", "");
  write(kCorpus / "json/huge_number.json", "{\"format\":\"dynapipe-plan\",\"version\":1e999}");

  std::string gpt_bin = encode_iteration(gpt.iterations[0]);
  write(kCorpus / "binary/gpt_1f1b.dppl", gpt_bin);
  write(kCorpus / "binary/t5_dp2.dppl", encode_iteration(t5.iterations[0]));
  write(kCorpus / "binary/gpt_zb1p.dppl", encode_iteration(zb.iterations[0]));
  write(kCorpus / "binary/empty_iteration.dppl", encode_iteration(IterationPlan{}));
  write(kCorpus / "binary/truncated.dppl", gpt_bin.substr(0, gpt_bin.size() - 7));
  std::string flipped = gpt_bin;
  flipped[flipped.size() / 2] ^= 0x5a;
  write(kCorpus / "binary/mutated.dppl", flipped);
  write(kCorpus / "binary/trailing.dppl", gpt_bin + "x");
  write(kCorpus / "binary/bad_magic.dppl", "DPPX" + gpt_bin.substr(4));
  write(kCorpus / "binary/empty.dppl", "");
}

}  // namespace
}  // namespace dynapipe
