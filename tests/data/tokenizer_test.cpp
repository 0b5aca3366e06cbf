#include "dynapipe/data/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using testing_data::expect_error;

TEST(TokenizerTest, BytesShiftPastReservedIds) {
  EXPECT_EQ(byte_tokenize("Hi"), (std::vector<Token>{'H' + 3, 'i' + 3}));
  EXPECT_EQ(byte_tokenize(std::string("\0\xff", 2)), (std::vector<Token>{3, 258}));
  EXPECT_TRUE(byte_tokenize("").empty());
}

TEST(TokenizerTest, RoundTripsEveryByteAndUtf8) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  all += "größe · 東京";
  const std::vector<Token> tokens = byte_tokenize(all);
  for (const Token t : tokens) {
    EXPECT_GE(t, kByteTokenOffset);
    EXPECT_LT(t, kByteVocabSize);
  }
  EXPECT_EQ(byte_detokenize(tokens), all);
}

TEST(TokenizerTest, DetokenizeRejectsReservedTokens) {
  const std::vector<Token> tokens = {'a' + 3, kEosToken};
  expect_error([&] { byte_detokenize(tokens); }, ErrorKind::InvalidArgument,
               HasSubstr("token 1 must be a byte token in [3, 259), got 2"));
}

}  // namespace
}  // namespace dynapipe
