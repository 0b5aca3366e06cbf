#include "dynapipe/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "dynapipe/data/global_batch.h"
#include "test_util.h"

namespace dynapipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_data::expect_error;
using testing_data::TempDir;

const TruncationLimits kNoTruncation{ModelKind::Gpt, 1 << 20, 0};

bool same_sample(const Sample& a, const Sample& b) {
  return a.id == b.id && a.input_len == b.input_len && a.target_len == b.target_len &&
         a.task == b.task;
}

TEST(DatasetTest, ReadsLengthsWithTaskTableInFirstAppearanceOrder) {
  TempDir dir;
  const std::string path = dir.write("a.jsonl",
                                     "{\"id\":17,\"task\":\"nli\",\"input_len\":312,\"target_len\":4}\n"
                                     "{\"id\":3,\"task\":\"qa\",\"input_len\":20,\"target_len\":7}\n"
                                     "{\"id\":5,\"input_len\":9,\"target_len\":1,\"extra\":[1]}\n"
                                     "{\"id\":8,\"task\":\"nli\",\"input_len\":1,\"target_len\":2}\n");
  const Dataset data = Dataset::load(path, kNoTruncation);
  ASSERT_EQ(data.samples().size(), 4u);
  EXPECT_THAT(data.task_names(), ElementsAre("nli", "qa"));
  EXPECT_TRUE(same_sample(data.samples()[0], {17, 312, 4, 0}));
  EXPECT_TRUE(same_sample(data.samples()[1], {3, 20, 7, 1}));
  EXPECT_TRUE(same_sample(data.samples()[2], {5, 9, 1, -1}));
  EXPECT_TRUE(same_sample(data.samples()[3], {8, 1, 2, 0}));
  EXPECT_EQ(data.num_truncated(), 0);
  EXPECT_EQ(data.sample(3).target_len, 7);
  EXPECT_EQ(data.task_name(data.sample(8).task), "nli");
  EXPECT_EQ(data.task_name(-1), "");
  EXPECT_FALSE(data.contains(4));
  expect_error([&] { data.sample(4); }, ErrorKind::NotFound,
               HasSubstr("sample id must be in the dataset, got 4"));
}

TEST(DatasetTest, DefaultIdIsZeroBasedLineNumberAndBlankLinesAreSkipped) {
  TempDir dir;
  const std::string path = dir.write("a.jsonl",
                                     "\n"
                                     "{\"input_len\":3,\"target_len\":1}\r\n"
                                     "   \n"
                                     "{\"id\":0,\"input_len\":4,\"target_len\":2}\n"
                                     "{\"input_len\":5,\"target_len\":3}");  // no final newline
  const Dataset data = Dataset::load(path, kNoTruncation);
  ASSERT_EQ(data.samples().size(), 3u);
  EXPECT_EQ(data.samples()[0].id, 1);
  EXPECT_EQ(data.samples()[1].id, 0);
  EXPECT_EQ(data.samples()[2].id, 4);
  EXPECT_EQ(data.samples()[2].input_len, 5);
}

TEST(DatasetTest, GzipIsDetectedByContentAndReadsLikePlain) {
  TempDir dir;
  std::string content;
  for (int i = 0; i < 5000; ++i) {  // larger than one read chunk
    content += cat("{\"task\":\"t", i % 7, "\",\"input_len\":", 1 + i % 300,
                   ",\"target_len\":", 1 + i % 11, "}\n");
  }
  const Dataset plain = Dataset::load(dir.write("a.jsonl", content), kNoTruncation);
  // Names lie on purpose: the content decides.
  const Dataset gz = Dataset::load(dir.write_gz("b.jsonl", content), kNoTruncation);
  const Dataset plain_named_gz = Dataset::load(dir.write("c.jsonl.gz", content), kNoTruncation);
  ASSERT_EQ(plain.samples().size(), 5000u);
  for (const Dataset* other : {&gz, &plain_named_gz}) {
    ASSERT_EQ(other->samples().size(), plain.samples().size());
    for (std::size_t i = 0; i < plain.samples().size(); ++i) {
      EXPECT_TRUE(same_sample(plain.samples()[i], other->samples()[i])) << i;
    }
    EXPECT_EQ(other->task_names(), plain.task_names());
  }
}

TEST(DatasetTest, TruncationIsRecordedInFileOrder) {
  TempDir dir;
  const std::string path = dir.write("a.jsonl",
                                     "{\"id\":10,\"input_len\":100,\"target_len\":10}\n"
                                     "{\"id\":11,\"input_len\":10,\"target_len\":10}\n"
                                     "{\"id\":12,\"input_len\":5,\"target_len\":60}\n");
  const Dataset gpt = Dataset::load(path, {ModelKind::Gpt, 32, 0});
  EXPECT_TRUE(same_sample(gpt.sample(10), {10, 22, 10, -1}));
  EXPECT_TRUE(same_sample(gpt.sample(11), {11, 10, 10, -1}));
  EXPECT_TRUE(same_sample(gpt.sample(12), {12, 1, 31, -1}));
  EXPECT_THAT(gpt.truncated_ids(), ElementsAre(10, 12));
  EXPECT_EQ(gpt.num_truncated(), 2);

  const Dataset t5 = Dataset::load(path, {ModelKind::T5, 32, 8});
  EXPECT_TRUE(same_sample(t5.sample(10), {10, 32, 8, -1}));
  EXPECT_TRUE(same_sample(t5.sample(11), {11, 10, 8, -1}));
  EXPECT_TRUE(same_sample(t5.sample(12), {12, 5, 8, -1}));
  EXPECT_EQ(t5.num_truncated(), 3);
}

TEST(DatasetTest, TextIsByteTokenizedAndTruncationKeepsTheBeginning) {
  TempDir dir;
  const std::string path = dir.write(
      "t.jsonl",
      "{\"id\":1,\"task\":\"qa\",\"input\":\"What is 2+2?\",\"target\":\"4\"}\n"
      "{\"id\":2,\"task\":\"qa\",\"input\":\"caf\\u00e9 \\\"quoted\\\"\",\"target\":\"yes\"}\n"
      "{\"id\":3,\"input\":\"abcdefghijklmnopqrstuvwxyz\",\"target\":\"0123456789\"}\n"
      "{\"id\":4,\"input_len\":3,\"target_len\":2}\n");
  const Dataset data = Dataset::load(path, {ModelKind::T5, 8, 4});
  EXPECT_TRUE(same_sample(data.sample(1), {1, 8, 1, 0}));
  const SampleTokens t1 = data.tokens(1);
  EXPECT_EQ(byte_detokenize(t1.input), "What is ");  // 12 bytes cut to 8
  EXPECT_EQ(byte_detokenize(t1.target), "4");
  EXPECT_THAT(data.truncated_ids(), ElementsAre(1, 2, 3));

  // Lengths count UTF-8 bytes: "café \"quoted\"" is 14 bytes.
  const Dataset untruncated = Dataset::load(path, kNoTruncation);
  EXPECT_EQ(untruncated.sample(2).input_len, 14);
  EXPECT_EQ(byte_detokenize(untruncated.tokens(2).input), "caf\xc3\xa9 \"quoted\"");
  const SampleTokens t3 = data.tokens(3);
  EXPECT_EQ(byte_detokenize(t3.input), "abcdefgh");
  EXPECT_EQ(byte_detokenize(t3.target), "0123");
  EXPECT_TRUE(data.is_text(3));
  EXPECT_FALSE(data.is_text(4));
  EXPECT_EQ(data.tokens(4).input.size(), 3u);  // synthetic
}

TEST(DatasetTest, SyntheticTokensAreOneProgressionPerSample) {
  const Sample sample{42, 5, 3, 2};  // task 2: step 5
  const SampleTokens t = synthetic_tokens(sample);
  ASSERT_EQ(t.input.size(), 5u);
  ASSERT_EQ(t.target.size(), 3u);
  std::vector<Token> all = t.input;
  all.insert(all.end(), t.target.begin(), t.target.end());
  for (std::size_t p = 1; p < all.size(); ++p) {
    EXPECT_EQ((all[p] - all[p - 1] + 256) % 256, 5) << p;
  }
  for (const Token token : all) {
    EXPECT_GE(token, kByteTokenOffset);
    EXPECT_LT(token, kByteVocabSize);
  }
  // Deterministic, and the start depends on the id.
  EXPECT_EQ(synthetic_tokens(sample).input, t.input);
  EXPECT_NE(synthetic_tokens({43, 5, 3, 2}).input, t.input);
  // No task: step 1.
  const SampleTokens none = synthetic_tokens({7, 2, 1, -1});
  EXPECT_EQ((none.input[1] - none.input[0] + 256) % 256, 1);
  EXPECT_EQ((none.target[0] - none.input[1] + 256) % 256, 1);
}

TEST(DatasetTest, FromLengthsTruncatesAndChecksIds) {
  const Dataset data = Dataset::from_lengths({{0, 50, 4, 0}, {1, 5, 30, 1}}, {"a", "b"},
                                             {ModelKind::Gpt, 16, 8});
  EXPECT_TRUE(same_sample(data.sample(0), {0, 12, 4, 0}));
  EXPECT_TRUE(same_sample(data.sample(1), {1, 5, 8, 1}));
  EXPECT_THAT(data.truncated_ids(), ElementsAre(0, 1));
  expect_error([] { Dataset::from_lengths({{3, 1, 1, -1}, {3, 2, 2, -1}}, {}, kNoTruncation); },
               ErrorKind::InvalidArgument,
               HasSubstr("sample 1: id must be unique, got 3, already the id of sample 0"));
  expect_error([] { Dataset::from_lengths({{0, 1, 1, 2}}, {"a"}, kNoTruncation); },
               ErrorKind::InvalidArgument, HasSubstr("sample 0: task must be -1 or in [0, 1), got 2"));
  expect_error([] { Dataset::from_lengths({{0, 0, 1, -1}}, {}, kNoTruncation); },
               ErrorKind::InvalidArgument, HasSubstr("must be >= 1, got 0 and 1"));
}

// Each malformed line: the message names file, 1-based line and the problem.
struct BadLine {
  const char* line;
  const char* message;
};

class DatasetBadLineTest : public ::testing::TestWithParam<BadLine> {};

TEST_P(DatasetBadLineTest, ThrowsParseErrorNamingFileAndLine) {
  TempDir dir;
  const std::string path =
      dir.write("bad.jsonl", cat("{\"id\":100,\"input_len\":3,\"target_len\":1}\n\n", GetParam().line, "\n"));
  expect_error([&] { Dataset::load(path, kNoTruncation); }, ErrorKind::ParseError,
               HasSubstr(cat(path, ":3: ", GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Lines, DatasetBadLineTest,
    ::testing::Values(
        BadLine{"{\"input_len\":3,", "line must be valid JSON, got parse error at line 1, column 16"},
        BadLine{"not json", "line must be valid JSON, got parse error"},
        BadLine{"[1, 2]", "line must be an object, got [1,2]"},
        BadLine{"17", "line must be an object, got 17"},
        BadLine{"{\"input_len\":25769E803776,\"target_len\":1}", "input_len must be a number a double can hold, got 25769E803776"},
        BadLine{"{\"id\":1}", "sample must have \"input_len\" and \"target_len\" (lengths) or \"input\" and \"target\" (text), got neither"},
        BadLine{"{\"input_len\":4}", "target_len must be present with input_len, got nothing"},
        BadLine{"{\"target\":\"x\"}", "input must be present with target, got nothing"},
        BadLine{"{\"input\":\"x\",\"target_len\":3}", "sample must have either lengths (\"input_len\", \"target_len\") or text (\"input\", \"target\"), got both"},
        BadLine{"{\"input_len\":\"12\",\"target_len\":1}", "input_len must be an integer >= 1, got \"12\""},
        BadLine{"{\"input_len\":0,\"target_len\":1}", "input_len must be an integer >= 1, got 0"},
        BadLine{"{\"input_len\":3,\"target_len\":-2}", "target_len must be an integer >= 1, got -2"},
        BadLine{"{\"input_len\":2.5,\"target_len\":1}", "input_len must be an integer >= 1, got 2.5"},
        BadLine{"{\"input_len\":3,\"target_len\":null}", "target_len must be an integer >= 1, got null"},
        BadLine{"{\"input\":\"\",\"target\":\"y\"}", "input must be a non-empty string, got \"\""},
        BadLine{"{\"input\":\"x\",\"target\":5}", "target must be a non-empty string, got 5"},
        BadLine{"{\"id\":\"7\",\"input_len\":3,\"target_len\":1}", "id must be an integer >= 0, got \"7\""},
        BadLine{"{\"id\":-1,\"input_len\":3,\"target_len\":1}", "id must be an integer >= 0, got -1"},
        BadLine{"{\"id\":18446744073709551615,\"input_len\":3,\"target_len\":1}",
                "id must be an integer >= 0, got 18446744073709551615"},
        BadLine{"{\"task\":3,\"input_len\":3,\"target_len\":1}", "task must be a string, got 3"},
        BadLine{"{\"id\":100,\"input_len\":3,\"target_len\":1}",
                "id must be unique, got 100, already the id of line 1"}));

TEST(DatasetTest, DuplicateOfADefaultIdNamesBothLines) {
  TempDir dir;
  const std::string path = dir.write("a.jsonl",
                                     "{\"id\":1,\"input_len\":3,\"target_len\":1}\n"
                                     "{\"input_len\":3,\"target_len\":1}\n");
  expect_error([&] { Dataset::load(path, kNoTruncation); }, ErrorKind::ParseError,
               HasSubstr(cat(path, ":2: id must be unique, got 1 (the default id: 0-based line "
                                   "number), already the id of line 1")));
  // Mixing explicit and default ids is fine while they differ.
  const std::string ok = dir.write("b.jsonl",
                                   "{\"id\":5,\"input_len\":3,\"target_len\":1}\n"
                                   "{\"input_len\":3,\"target_len\":1}\n");
  EXPECT_EQ(Dataset::load(ok, kNoTruncation).samples()[1].id, 1);
}

TEST(DatasetTest, LargeLengthsSaturateAndTruncate) {
  TempDir dir;
  const std::string path =
      dir.write("a.jsonl", "{\"input_len\":18446744073709551615,\"target_len\":1}\n");
  const Dataset data = Dataset::load(path, {ModelKind::Gpt, 64, 0});
  EXPECT_TRUE(same_sample(data.samples()[0], {0, 63, 1, -1}));
  EXPECT_EQ(data.num_truncated(), 1);
}

TEST(DatasetTest, FileErrors) {
  TempDir dir;
  const std::string missing = dir.file("missing.jsonl");
  expect_error([&] { Dataset::load(missing, kNoTruncation); }, ErrorKind::NotFound,
               HasSubstr(cat(missing, ": file must exist, got no such file")));
  expect_error([&] { Dataset::load(dir.file(""), kNoTruncation); }, ErrorKind::NotFound,
               HasSubstr("path must be a file, got a directory"));
  for (const char* content : {"", "\n  \n\n"}) {
    const std::string empty = dir.write("empty.jsonl", content);
    expect_error([&] { Dataset::load(empty, kNoTruncation); }, ErrorKind::ParseError,
                 HasSubstr(cat(empty, ": file must contain at least one sample, got none")));
  }
  const std::string empty_gz = dir.write_gz("empty.jsonl.gz", "");
  expect_error([&] { Dataset::load(empty_gz, kNoTruncation); }, ErrorKind::ParseError,
               HasSubstr("file must contain at least one sample, got none"));
  expect_error([&] { Dataset::load(dir.write("a.jsonl", "{\"input_len\":1,\"target_len\":1}"),
                                   {ModelKind::Gpt, 1, 0}); },
               ErrorKind::InvalidArgument, HasSubstr("max_seqlen must be in [2,"));
}

TEST(DatasetTest, UnreadableFileIsNotFound) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempDir dir;
  const std::string path = dir.write("locked.jsonl", "{\"input_len\":1,\"target_len\":1}\n");
  ::chmod(path.c_str(), 0);
  expect_error([&] { Dataset::load(path, kNoTruncation); }, ErrorKind::NotFound,
               HasSubstr(cat(path, ": file must be readable, got Permission denied")));
}

TEST(DatasetTest, TruncatedGzipIsAParseError) {
  TempDir dir;
  std::string content;
  for (int i = 0; i < 20000; ++i) content += cat("{\"input_len\":", 1 + i * 7919 % 1000, ",\"target_len\":3}\n");
  const std::string gz = dir.write_gz("whole.jsonl.gz", content);
  const std::string bytes = testing_data::read_bytes(gz);
  const std::string cut = dir.write("cut.jsonl.gz", bytes.substr(0, bytes.size() / 2));
  expect_error([&] { Dataset::load(cut, kNoTruncation); }, ErrorKind::ParseError,
               HasSubstr(cat(cut, ": gzip stream must be complete, got unexpected end of file")));
}

TEST(BundledAssetsTest, FlanLikeMixLoads) {
  const Dataset data =
      Dataset::load(DYNAPIPE_SOURCE_DIR "/assets/flan_like_mix.jsonl.gz", {ModelKind::T5, 1 << 20, 0});
  EXPECT_EQ(data.samples().size(), 20000u);
  EXPECT_EQ(data.task_names().size(), 19u);
  EXPECT_EQ(data.num_truncated(), 0);
  for (std::size_t i = 0; i < data.samples().size(); ++i) {
    ASSERT_EQ(data.samples()[i].id, static_cast<SampleId>(i));
  }
  const auto batches = form_global_batches(data, 65536);
  EXPECT_GT(batches.size(), 100u);
}

TEST(BundledAssetsTest, TinyTextLoads) {
  const Dataset data = Dataset::load(DYNAPIPE_SOURCE_DIR "/assets/tiny_text.jsonl", {ModelKind::Gpt, 2048, 0});
  EXPECT_GE(data.samples().size(), 40u);
  EXPECT_GE(data.task_names().size(), 3u);
  for (const Sample& s : data.samples()) {
    EXPECT_TRUE(data.is_text(s.id));
    const SampleTokens t = data.tokens(s.id);
    EXPECT_EQ(static_cast<std::int64_t>(t.input.size()), s.input_len);
    EXPECT_EQ(static_cast<std::int64_t>(t.target.size()), s.target_len);
  }
}

}  // namespace
}  // namespace dynapipe
