#include "dynapipe/data/truncation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using testing_data::expect_error;

TruncationLimits gpt(std::int64_t max_seqlen, std::int64_t max_target_len = 0) {
  return {ModelKind::Gpt, max_seqlen, max_target_len};
}
TruncationLimits t5(std::int64_t max_seqlen, std::int64_t max_target_len = 0) {
  return {ModelKind::T5, max_seqlen, max_target_len};
}

TEST(TruncationTest, GptBoundsInputPlusTarget) {
  EXPECT_EQ(truncate_lengths(100, 10, gpt(512)), (TruncatedLengths{100, 10, false}));
  EXPECT_EQ(truncate_lengths(502, 10, gpt(512)), (TruncatedLengths{502, 10, false}));
  EXPECT_EQ(truncate_lengths(600, 10, gpt(512)), (TruncatedLengths{502, 10, true}));
  // The target is capped by max_target_len first, then the input fills the rest.
  EXPECT_EQ(truncate_lengths(600, 300, gpt(512, 64)), (TruncatedLengths{448, 64, true}));
  EXPECT_EQ(truncate_lengths(100, 300, gpt(512, 64)), (TruncatedLengths{100, 64, true}));
}

TEST(TruncationTest, GptKeepsOneInputToken) {
  // target_len <= max_seqlen - 1, so an overlong target leaves one input token.
  EXPECT_EQ(truncate_lengths(50, 1000, gpt(512)), (TruncatedLengths{1, 511, true}));
  EXPECT_EQ(truncate_lengths(1, 1, gpt(2)), (TruncatedLengths{1, 1, false}));
  EXPECT_EQ(truncate_lengths(5, 5, gpt(2)), (TruncatedLengths{1, 1, true}));
}

TEST(TruncationTest, T5BoundsEncoderAndDecoderSeparately) {
  EXPECT_EQ(truncate_lengths(1024, 512, t5(1024)), (TruncatedLengths{1024, 512, false}));
  EXPECT_EQ(truncate_lengths(2000, 100, t5(1024, 64)), (TruncatedLengths{1024, 64, true}));
  EXPECT_EQ(truncate_lengths(10, 100, t5(1024, 64)), (TruncatedLengths{10, 64, true}));
  // max_target_len 0 means max_seqlen.
  EXPECT_EQ(truncate_lengths(10, 2000, t5(1024)), (TruncatedLengths{10, 1024, true}));
}

TEST(TruncationTest, ValidateNamesTheField) {
  expect_error([] { gpt(1).validate(); }, ErrorKind::InvalidArgument,
               HasSubstr("max_seqlen must be in [2, 2147483647] for gpt"));
  EXPECT_NO_THROW(t5(1).validate());
  expect_error([] { t5(0).validate(); }, ErrorKind::InvalidArgument,
               HasSubstr("max_seqlen must be in [1, 2147483647] for t5"));
  expect_error([] { t5(16, -1).validate(); }, ErrorKind::InvalidArgument,
               HasSubstr("max_target_len must be 0 (same as max_seqlen) or in [1, 2147483647], got -1"));
  expect_error([] { gpt(std::int64_t{1} << 32).validate(); }, ErrorKind::InvalidArgument,
               HasSubstr("got 4294967296"));
}

}  // namespace
}  // namespace dynapipe
