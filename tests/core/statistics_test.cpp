#include "dynapipe/core/statistics.h"

#include <gtest/gtest.h>

namespace dynapipe {
namespace {

TEST(MedianTest, OddCountIsTheMiddleValue) { EXPECT_DOUBLE_EQ(median({7.0, 1.0, 3.0}), 3.0); }

TEST(MedianTest, EvenCountIsTheMeanOfTheTwoMiddleValues) {
  EXPECT_DOUBLE_EQ(median({4.0, 10.0, 1.0, 2.0}), 3.0);
  EXPECT_DOUBLE_EQ(median({5.0, 5.0}), 5.0);
}

TEST(MedianTest, RepeatedValuesAndOneValue) {
  EXPECT_DOUBLE_EQ(median({2.0, 9.0, 2.0, 2.0, 9.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({-1.5}), -1.5);
}

TEST(MedianTest, NoValuesIsZero) { EXPECT_DOUBLE_EQ(median({}), 0.0); }

}  // namespace
}  // namespace dynapipe
