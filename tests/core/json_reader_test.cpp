#include "dynapipe/core/json_reader.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

// The message of the ParseError `read` throws on the document `text` ("f.json").
std::string message_of(const std::string& text, const std::function<void(const JsonValue&)>& read) {
  try {
    const JsonDocument document(text, "f.json");
    read(document.root());
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ParseError);
    return e.what();
  }
  return "no error";
}

TEST(JsonReaderTest, ReadsTypedFieldsAtNestedPaths) {
  const JsonDocument document(R"({"a": {"b": [1, 2, 3], "s": "x", "d": 2.5}, "n": 18446744073709551615})", "f.json");
  const JsonValue root = document.root();
  EXPECT_EQ(root["a"]["b"].integers(1), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(root["a"]["b"][2].path(), "a.b[2]");
  EXPECT_EQ(root["a"]["s"].string(), "x");
  EXPECT_EQ(root["a"]["d"].number(0), 2.5);
  EXPECT_EQ(root["a"]["b"][0].number(), 1.0);  // an integer is a number
  EXPECT_EQ(root["n"].uint64(), 18446744073709551615ULL);
  EXPECT_TRUE(root.has("a"));
  EXPECT_FALSE(root.has("z"));
  EXPECT_FALSE(root["n"].has("a"));  // not an object: has nothing
}

TEST(JsonReaderTest, WrongTypeNamesTheNestedPathAndTheValue) {
  EXPECT_EQ(message_of(R"({"a": {"b": [1, "x"]}})", [](const JsonValue& r) { r["a"]["b"].integers(1); }),
            "f.json: a.b[1] must be an integer >= 1, got \"x\"");
  EXPECT_EQ(message_of(R"({"r": [{"shape": "x"}]})", [](const JsonValue& r) { r["r"][0]["shape"].integers(1); }),
            "f.json: r[0].shape must be an array of integers >= 1, got \"x\"");
  EXPECT_EQ(message_of(R"({"a": 1})", [](const JsonValue& r) { r["a"].string(); }),
            "f.json: a must be a string, got 1");
  EXPECT_EQ(message_of(R"({"a": [null]})", [](const JsonValue& r) { r["a"].numbers(0); }),
            "f.json: a[0] must be a finite number >= 0, got null");
  EXPECT_EQ(message_of("42", [](const JsonValue& r) { r["a"]; }), "f.json: the document must be an object, got 42");
  EXPECT_EQ(message_of(R"({"a": {}})", [](const JsonValue& r) { r["a"].size(); }),
            "f.json: a must be an array, got {}");
}

TEST(JsonReaderTest, MissingFieldOrElementIsPresentGotNothing) {
  EXPECT_EQ(message_of(R"({"a": {"b": 1}})", [](const JsonValue& r) { r["a"]["c"]; }),
            "f.json: a.c must be present, got nothing");
  EXPECT_EQ(message_of("[1]", [](const JsonValue& r) { r[std::size_t{3}]; }),
            "f.json: [3] must be present, got nothing");
  EXPECT_EQ(message_of(R"({"a": {"b": 1}})", [](const JsonValue& r) { r["a"].fail_field("c", "there"); }),
            "f.json: a.c must be there, got nothing");
  EXPECT_EQ(message_of(R"({"a": {"b": 1}})", [](const JsonValue& r) { r["a"].fail_field("b", "2"); }),
            "f.json: a.b must be 2, got 1");
}

TEST(JsonReaderTest, OutOfRangeStatesTheRange) {
  EXPECT_EQ(message_of(R"({"n": 9})", [](const JsonValue& r) { r["n"].integer(1, 8); }),
            "f.json: n must be an integer in [1, 8], got 9");
  EXPECT_EQ(message_of(R"({"n": 2})", [](const JsonValue& r) { r["n"].integer(1, 1); }), "f.json: n must be 1, got 2");
  EXPECT_EQ(message_of(R"({"n": 2})", [](const JsonValue& r) { r["n"].integer(JsonValue::kMinInt, 1); }),
            "f.json: n must be an integer <= 1, got 2");
  EXPECT_EQ(message_of(R"({"n": -1})", [](const JsonValue& r) { r["n"].int32(); }),
            "f.json: n must be an integer in [0, 2147483647], got -1");
  EXPECT_EQ(message_of(R"({"n": 2147483648})", [](const JsonValue& r) { r["n"].int32(); }),
            "f.json: n must be an integer in [0, 2147483647], got 2147483648");
  EXPECT_EQ(message_of(R"({"n": 9223372036854775808})", [](const JsonValue& r) { r["n"].integer(); }),
            "f.json: n must be an integer, got 9223372036854775808");
  EXPECT_EQ(message_of(R"({"n": 0})", [](const JsonValue& r) { r["n"].uint64(1); }),
            "f.json: n must be an integer >= 1, got 0");
  EXPECT_EQ(message_of(R"({"n": 2.5})", [](const JsonValue& r) { r["n"].integer(); }),
            "f.json: n must be an integer, got 2.5");
  EXPECT_EQ(message_of(R"({"x": -0.5})", [](const JsonValue& r) { r["x"].number(0); }),
            "f.json: x must be a finite number >= 0, got -0.5");
}

TEST(JsonReaderTest, IntegerRangeCheckOnRandomValues) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::int64_t> any(-1000, 1000);
  for (int trial = 0; trial < 500; ++trial) {
    const std::int64_t v = any(rng), a = any(rng), b = any(rng);
    const std::int64_t lo = std::min(a, b), hi = std::max(a, b);
    const JsonDocument document(cat("{\"v\": ", v, "}"), "f.json");
    if (lo <= v && v <= hi) {
      EXPECT_EQ(document.root()["v"].integer(lo, hi), v);
    } else {
      EXPECT_THROW(document.root()["v"].integer(lo, hi), Error) << v << " in [" << lo << ", " << hi << "]";
    }
  }
}

TEST(JsonReaderTest, NumbersNoDoubleHoldsAreReportedAtTheirPath) {
  EXPECT_EQ(message_of("25769E803776", [](const JsonValue&) {}),
            "f.json: the document must be a number a double can hold, got 25769E803776");
  EXPECT_EQ(message_of(R"({"a": [1, 2, -1e999]})", [](const JsonValue&) {}),
            "f.json: a[2] must be a number a double can hold, got -1e999");
  // Past 2^64 an integer literal is read as a double: a number, not an integer.
  EXPECT_EQ(message_of(R"({"n": 18446744073709551616})", [](const JsonValue& r) { r["n"].uint64(); }),
            "f.json: n must be an integer >= 0, got 1.8446744073709552e+19");
}

TEST(JsonReaderTest, SyntaxErrorsNameWhereTheParserStopped) {
  EXPECT_EQ(message_of(R"({"a": {"b": [1, x]}})", [](const JsonValue&) {}).substr(0, 60),
            "f.json: a.b[1] must be valid JSON, got parse error at line 1");
  EXPECT_EQ(message_of("", [](const JsonValue&) {}).substr(0, 66),
            "f.json: the document must be valid JSON, got parse error at line 1");
  EXPECT_EQ(message_of("{\"a\": \"\xff\"}", [](const JsonValue&) {}).substr(0, 34), "f.json: a must be valid JSON, got ");
}

TEST(JsonReaderTest, RootNameAndShortenedValues) {
  try {
    const JsonDocument document("[1, 2]", "s.jsonl:3", "line");
    document.root().expect_object();
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "s.jsonl:3: line must be an object, got [1,2]");
  }
  EXPECT_EQ(message_of(cat("{\"s\": \"", std::string(60, 'y'), "\"}"), [](const JsonValue& r) { r["s"].integer(); }),
            cat("f.json: s must be an integer, got \"", std::string(39, 'y'), "..."));
}

// The value shown is rendered only as far as it is shown: a whole dump() of a value nested
// a million deep overflowed the stack (`--model` with such a name crashed `plan`).
TEST(JsonReaderTest, ShownValuesStopAtTheirLengthHoweverDeepOrLarge) {
  const std::size_t depth = 1'000'000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  EXPECT_EQ(message_of(cat("{\"name\": ", deep, "}"), [](const JsonValue& r) { r["name"].string(); }),
            cat("f.json: name must be a string, got ", std::string(40, '['), "..."));
  EXPECT_EQ(message_of(R"({"a": {"k": [1, {"x": "y"}], "e": {}}})", [](const JsonValue& r) { r["a"].integer(); }),
            R"(f.json: a must be an integer, got {"e":{},"k":[1,{"x":"y"}]})");
  std::string wide = "[0", shown = "[0";
  for (int i = 1; i < 200'000; ++i) wide += ",1";
  for (int i = 1; i < 20; ++i) shown += ",1";  // 40 characters
  EXPECT_EQ(message_of(cat("{\"a\": ", wide, "]}"), [](const JsonValue& r) { r["a"].string(); }),
            cat("f.json: a must be a string, got ", shown, "..."));
}

TEST(JsonReaderTest, OnlyFieldsRejectsUnknownKeysAndListsTheKnownOnes) {
  const JsonDocument document(R"({"a": 1, "b": 2})", "f.json");
  EXPECT_NO_THROW(document.root().only_fields({"a", "b", "c"}));
  EXPECT_EQ(message_of(R"({"a": {"colour": "red"}})", [](const JsonValue& r) { r["a"].only_fields({"size", "color"}); }),
            "f.json: a.colour must be absent (not a field here; the fields are size, color), got \"red\"");
}

}  // namespace
}  // namespace dynapipe
