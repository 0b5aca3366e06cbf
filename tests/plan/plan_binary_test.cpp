#include "dynapipe/plan/plan_binary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dynapipe/core/error.h"
#include "dynapipe/plan/plan_json.h"
#include "plan/test_pipelines.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;

std::string parse_error(std::string_view bytes) {
  try {
    decode_iteration(bytes);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ParseError);
    return e.what();
  }
  ADD_FAILURE() << "decoded garbage";
  return "";
}

TEST(PlanBinaryTest, RoundTripIsLosslessAndCanonical) {
  for (ModelKind model : {ModelKind::Gpt, ModelKind::T5}) {
    ExecutionPlan plan = testing::sample_plan(model);
    plan.iterations[0].replicas[0].microbatches[1].recompute = Recompute::Full;
    for (const IterationPlan& it : plan.iterations) {
      std::string bytes = encode_iteration(it);
      IterationPlan back = decode_iteration(bytes);
      EXPECT_EQ(encode_iteration(back), bytes);
      EXPECT_EQ(iteration_to_json(back, model), iteration_to_json(it, model));
      EXPECT_EQ(back.replicas[0].microbatches, it.replicas[0].microbatches);
    }
  }
}

TEST(PlanBinaryTest, IsCompact) {
  ExecutionPlan plan = testing::sample_plan(ModelKind::Gpt, 4, 1, 1, 8);
  std::string bytes = encode_iteration(plan.iterations[0]);
  std::string json = iteration_to_json(plan.iterations[0], ModelKind::Gpt, -1);
  EXPECT_LT(bytes.size() * 4, json.size()) << bytes.size() << " vs " << json.size();
  EXPECT_EQ(bytes.substr(0, 4), "DPPL");
  EXPECT_EQ(bytes[4], kPlanBinaryVersion);
  EXPECT_EQ(bytes[5], 0);
}

TEST(PlanBinaryTest, EveryTruncationIsAParseError) {
  std::string bytes = encode_iteration(testing::sample_plan(ModelKind::T5, 2, 2, 1, 2).iterations[0]);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(parse_error(std::string_view(bytes).substr(0, n)).empty()) << n;
  }
}

TEST(PlanBinaryTest, RejectsTrailingBytesAndBadHeaders) {
  std::string bytes = encode_iteration(testing::sample_plan(ModelKind::Gpt, 2, 1, 1, 2).iterations[0]);
  EXPECT_THAT(parse_error(bytes + '\0'), HasSubstr("must end here, got 1 trailing bytes"));
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_THAT(parse_error(bad_magic), HasSubstr("must start with the magic \"DPPL\""));
  std::string version = bytes;
  version[4] = 1;  // before per-micro-batch recompute
  EXPECT_THAT(parse_error(version), HasSubstr("file header section at byte 6: version must be 2, got 1"));
  std::string flags = bytes;
  flags[6] = 1;
  EXPECT_THAT(parse_error(flags), HasSubstr("flags must be 0, got 1"));
  std::string tag = bytes;
  tag[8] = 9;
  EXPECT_THAT(parse_error(tag), HasSubstr("the next section must be iteration (tag 1), got tag 9"));
}

TEST(PlanBinaryTest, RejectsOutOfRangeValues) {
  IterationPlan it = testing::sample_plan(ModelKind::Gpt, 2, 1, 1, 2).iterations[0];
  std::string bytes = encode_iteration(it);
  // Flip every byte in turn: nothing crashes, and everything accepted re-encodes the same.
  int accepted = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (int delta : {1, 0x40, 0x80}) {
      std::string mutated = bytes;
      mutated[i] = static_cast<char>(mutated[i] + delta);
      try {
        IterationPlan back = decode_iteration(mutated);
        EXPECT_EQ(encode_iteration(back), mutated);
        ++accepted;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::ParseError);
      }
    }
  }
  EXPECT_GT(accepted, 0);  // e.g. doubles and ids take any value
}

// stage_replica is an optional trailing field of an executor, written only when non-zero;
// a zero written out would decode to the default and re-encode shorter (found by
// plan_binary_fuzz), so it is refused.
TEST(PlanBinaryTest, StageReplicaWrittenAsZeroIsRefused) {
  IterationPlan it = testing::sample_plan(ModelKind::Gpt, 2, 1, 1, 2).iterations[0];
  it.replicas.back().executors.back().stage_replica = 1;
  std::string bytes = encode_iteration(it);
  EXPECT_EQ(decode_iteration(bytes).replicas.back().executors.back().stage_replica, 1);
  // The last executor's last byte is its stage_replica, zigzag 1 = 0x02.
  ASSERT_EQ(bytes.back(), '\x02');
  bytes.back() = '\x00';
  EXPECT_THAT(parse_error(bytes), HasSubstr("stage_replica, when present, must be >= 1, got 0"));
}

TEST(PlanBinaryTest, HugeCountsDoNotAllocate) {
  // Header with a sample_ids count of 2^62 and nothing behind it.
  std::string bytes = "DPPL";
  bytes += std::string("\x02\x00\x00\x00", 4);
  bytes += '\x01';        // iteration tag
  bytes += '\x23';        // length 35
  bytes += '\x00';        // index 0
  bytes += std::string(24, '\0');  // three doubles
  bytes += "\x80\x80\x80\x80\x80\x80\x80\x80\x40";  // count 2^62
  bytes += '\x00';
  EXPECT_THAT(parse_error(bytes), HasSubstr("sample_ids count must fit in the 1 bytes left"));
}

}  // namespace
}  // namespace dynapipe
