#include "dynapipe/core/error.h"

#include <gtest/gtest.h>

#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/units.h"

namespace dynapipe {
namespace {

TEST(ErrorTest, BadInputKindsExitTwoOthersExitOne) {
  EXPECT_EQ(exit_code(ErrorKind::InvalidArgument), 2);
  EXPECT_EQ(exit_code(ErrorKind::ParseError), 2);
  EXPECT_EQ(exit_code(ErrorKind::Infeasible), 2);
  EXPECT_EQ(exit_code(ErrorKind::Timeout), 1);
  EXPECT_EQ(exit_code(ErrorKind::Internal), 1);
}

TEST(ErrorTest, CheckThrowsInternalWithMessage) {
  try {
    DYNAPIPE_CHECK(1 + 1 == 3, cat("arithmetic is off by ", 1));
    FAIL() << "DYNAPIPE_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(std::string(e.what()).find("arithmetic is off by 1"), std::string::npos);
  }
}

TEST(StringsTest, SplitKeepsEmptyFields) {
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(join(std::vector<int>{1, 2, 3}, "-"), "1-2-3");
}

TEST(UnitsTest, FormatGibKeepsSmallSizesReadable) {
  EXPECT_EQ(format_gib(40 * kGiB), "40.0 GiB");
  EXPECT_EQ(format_gib(kGiB / 10), "0.1 GiB");
  EXPECT_EQ(format_gib(kGiB / 10 - 1), "102.4 MiB");
  EXPECT_EQ(format_gib(8 * kMiB + 300 * kKiB), "8.3 MiB");
  EXPECT_EQ(format_gib(5000), "5000 bytes");
  EXPECT_EQ(format_gib(0), "0.0 GiB");
}

TEST(UnitsTest, RoundUp) {
  EXPECT_EQ(round_up(0, 8), 0);
  EXPECT_EQ(round_up(1, 8), 8);
  EXPECT_EQ(round_up(16, 8), 16);
}

TEST(ModelKindTest, RecomputeNamesRoundTrip) {
  for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  }
  EXPECT_FALSE(parse_recompute("sometimes").has_value());
}

TEST(ModelKindTest, ModelKindNamesRoundTrip) {
  EXPECT_EQ(parse_model_kind("gpt"), ModelKind::Gpt);
  EXPECT_EQ(parse_model_kind("t5"), ModelKind::T5);
  EXPECT_EQ(parse_model_kind(model_kind_name(ModelKind::T5)), ModelKind::T5);
  EXPECT_FALSE(parse_model_kind("bert").has_value());
  EXPECT_FALSE(parse_model_kind("GPT").has_value());
}

}  // namespace
}  // namespace dynapipe
