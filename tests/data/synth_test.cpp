#include "dynapipe/data/synth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "dynapipe/data/dataset.h"
#include "dynapipe/data/length_stats.h"
#include "test_util.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using testing_data::expect_error;
using testing_data::read_bytes;
using testing_data::TempDir;

const TruncationLimits kNoTruncation{ModelKind::T5, 1 << 20, 0};

TEST(SynthTest, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir dir;
  SynthOptions options;
  options.num_samples = 3000;
  options.seed = 7;
  write_synthetic_samples(dir.file("a.jsonl.gz"), generate_synthetic_samples(options));
  write_synthetic_samples(dir.file("b.jsonl.gz"), generate_synthetic_samples(options));
  write_synthetic_samples(dir.file("a.jsonl"), generate_synthetic_samples(options));
  options.seed = 8;
  write_synthetic_samples(dir.file("c.jsonl.gz"), generate_synthetic_samples(options));
  const std::string a = read_bytes(dir.file("a.jsonl.gz"));
  EXPECT_EQ(a.substr(0, 2), "\x1f\x8b");
  EXPECT_EQ(a, read_bytes(dir.file("b.jsonl.gz")));
  EXPECT_NE(a, read_bytes(dir.file("c.jsonl.gz")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.jsonl.gz.tmp")));
  // The gzip and plain files hold the same samples.
  const Dataset gz = Dataset::load(dir.file("a.jsonl.gz"), kNoTruncation);
  const Dataset plain = Dataset::load(dir.file("a.jsonl"), kNoTruncation);
  ASSERT_EQ(gz.samples().size(), 3000u);
  for (std::size_t i = 0; i < 3000; ++i) {
    EXPECT_EQ(gz.samples()[i].input_len, plain.samples()[i].input_len);
    EXPECT_EQ(gz.samples()[i].target_len, plain.samples()[i].target_len);
  }
}

TEST(SynthTest, WritesTheDocumentedLineFormat) {
  TempDir dir;
  SynthSamples samples{{"nli", "qa \"x\""}, {{0, 97, 2, 0}, {1, 5, 3, 1}, {2, 4, 1, -1}}};
  write_synthetic_samples(dir.file("s.jsonl"), samples);
  EXPECT_EQ(read_bytes(dir.file("s.jsonl")),
            "{\"id\":0,\"task\":\"nli\",\"input_len\":97,\"target_len\":2}\n"
            "{\"id\":1,\"task\":\"qa \\\"x\\\"\",\"input_len\":5,\"target_len\":3}\n"
            "{\"id\":2,\"input_len\":4,\"target_len\":1}\n");
  const Dataset back = Dataset::load(dir.file("s.jsonl"), kNoTruncation);
  EXPECT_EQ(back.task_names(), samples.task_names);
}

TEST(SynthTest, WriteToMissingDirectoryIsNotFound) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/a.jsonl");
  expect_error([&] { write_synthetic_samples(path, {{}, {{0, 1, 1, -1}}}); }, ErrorKind::NotFound,
               HasSubstr(cat(path, ": file must be writable, got ")));
}

TEST(SynthTest, TaskCountsFollowWeightsAndTasksInterleave) {
  SynthOptions options;
  options.num_samples = 10;
  options.tasks = {{.name = "a", .weight = 3, .input_sigma = 0},
                   {.name = "b", .weight = 1, .input_median = 7, .input_sigma = 0,
                    .target_median = 2, .target_sigma = 0}};
  const SynthSamples out = generate_synthetic_samples(options);
  ASSERT_EQ(out.samples.size(), 10u);
  int count_a = 0;
  for (std::size_t i = 0; i < out.samples.size(); ++i) {
    const Sample& s = out.samples[i];
    EXPECT_EQ(s.id, static_cast<SampleId>(i));
    if (s.task == 0) {
      ++count_a;
      EXPECT_EQ(s.input_len, 100);  // sigma 0: the median
    } else {
      EXPECT_EQ(s.input_len, 7);
      EXPECT_EQ(s.target_len, 2);
    }
  }
  EXPECT_EQ(count_a, 8);  // 7.5 -> 7, remainder tie goes to the earlier task
  // Shuffled: not all of task a first.
  bool interleaved = false;
  for (std::size_t i = 0; i < 8; ++i) interleaved |= out.samples[i].task == 1;
  EXPECT_TRUE(interleaved);
}

TEST(SynthTest, FlanLikeDistributionIsShapedAsDocumented) {
  SynthOptions options;
  options.num_samples = 20000;
  const SynthSamples out = generate_synthetic_samples(options);
  const std::vector<SynthTask> tasks = synth_mixture("flan-like");
  ASSERT_EQ(out.task_names.size(), tasks.size());
  std::int64_t long_inputs = 0;
  std::int64_t over_4k = 0;
  std::int64_t short_targets = 0;
  for (const Sample& s : out.samples) {
    const SynthTask& t = tasks[static_cast<std::size_t>(s.task)];
    ASSERT_GE(s.input_len, t.input_min);
    ASSERT_LE(s.input_len, t.input_max);
    ASSERT_GE(s.target_len, t.target_min);
    ASSERT_LE(s.target_len, t.target_max);
    long_inputs += s.input_len > 1024;
    over_4k += s.input_len > 4096;
    short_targets += s.target_len <= 8;
  }
  const double n = static_cast<double>(out.samples.size());
  EXPECT_GT(long_inputs / n, 0.12);
  EXPECT_LT(long_inputs / n, 0.20);
  EXPECT_GT(over_4k / n, 0.01);
  EXPECT_LT(over_4k / n, 0.05);
  EXPECT_GT(short_targets / n, 0.70);

  const LengthStats stats = compute_length_stats(out.samples, out.task_names);
  ASSERT_EQ(stats.tasks.size(), tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    SCOPED_TRACE(tasks[i].name);
    // Medians land near the table's (clamps move some, sampling noise little).
    EXPECT_NEAR(stats.tasks[i].input.p50, tasks[i].input_median, 0.15 * tasks[i].input_median);
    EXPECT_NEAR(static_cast<double>(stats.tasks[i].count) / n, tasks[i].weight, 0.001);
  }
  EXPECT_EQ(stats.all.input.max, 16384);
}

// Zero-shot FLAN: inputs cut at 4096, short targets, few long samples that still carry a
// third of the tokens (docs/data.md's share table).
TEST(SynthTest, FlanZsoptIsShortWithATokenHeavyTail) {
  SynthOptions options;
  options.mixture = "flan-zsopt";
  const SynthSamples out = generate_synthetic_samples(options);
  std::int64_t tokens = 0, long_tokens = 0, long_samples = 0, short_targets = 0, max_input = 0;
  for (const Sample& s : out.samples) {
    ASSERT_LE(s.input_len, 4096);
    ASSERT_LE(s.target_len, 512);
    const std::int64_t n = std::int64_t{s.input_len} + s.target_len;
    tokens += n;
    if (n > 1024) {
      long_tokens += n;
      ++long_samples;
    }
    short_targets += s.target_len <= 8;
    max_input = std::max<std::int64_t>(max_input, s.input_len);
  }
  const double samples = static_cast<double>(out.samples.size());
  EXPECT_EQ(max_input, 4096);  // the long-summarisation tail reaches the export's cut
  EXPECT_GT(long_samples / samples, 0.03);
  EXPECT_LT(long_samples / samples, 0.08);
  EXPECT_GT(static_cast<double>(long_tokens) / static_cast<double>(tokens), 0.25);
  EXPECT_LT(static_cast<double>(long_tokens) / static_cast<double>(tokens), 0.40);
  EXPECT_GT(short_targets / samples, 0.60);
  EXPECT_NEAR(static_cast<double>(tokens) / samples, 277, 15);
}

TEST(SynthTest, OptionsAreValidated) {
  SynthOptions options;
  options.num_samples = 0;
  expect_error([&] { options.validate(); }, ErrorKind::InvalidArgument,
               HasSubstr("num_samples must be >= 1, got 0"));
  options.num_samples = 5;
  options.mixture = "pile";
  expect_error([&] { options.validate(); }, ErrorKind::NotFound,
               HasSubstr("mixture must be one of flan-like, flan-zsopt, got \"pile\""));
  options.tasks = {{.name = "a", .target_min = 5, .target_max = 3}};
  expect_error([&] { generate_synthetic_samples(options); }, ErrorKind::InvalidArgument,
               HasSubstr("synth task 0 (\"a\"): target_max must be in [target_min, 2^31), got 3"));
  options.tasks = {{.name = "a", .weight = 0}};
  expect_error([&] { options.validate(); }, ErrorKind::InvalidArgument,
               HasSubstr("weight must be > 0, got 0"));
}

TEST(LengthStatsTest, NearestRankPercentilesPerTask) {
  std::vector<Sample> samples;
  for (int i = 1; i <= 100; ++i) samples.push_back({i, i, i % 2 == 0 ? 2 : 1, 0});
  samples.push_back({1000, 7, 3, -1});
  const LengthStats stats = compute_length_stats(samples, {"a", "unused"});
  ASSERT_EQ(stats.tasks.size(), 2u);
  const TaskLengthStats& a = stats.tasks[0];
  EXPECT_EQ(a.task, "a");
  EXPECT_EQ(a.count, 100);
  EXPECT_DOUBLE_EQ(a.input.mean, 50.5);
  EXPECT_EQ(a.input.min, 1);
  EXPECT_EQ(a.input.p50, 50);
  EXPECT_EQ(a.input.p90, 90);
  EXPECT_EQ(a.input.p99, 99);
  EXPECT_EQ(a.input.max, 100);
  EXPECT_EQ(a.target.p50, 1);
  EXPECT_EQ(a.target.p90, 2);
  EXPECT_EQ(stats.tasks[1].task, "(none)");
  EXPECT_EQ(stats.tasks[1].input.p99, 7);
  EXPECT_EQ(stats.all.count, 101);
  EXPECT_EQ(stats.all.target.max, 3);
  const std::string table = format_length_stats(stats);
  EXPECT_THAT(table, HasSubstr("(none)"));
  EXPECT_THAT(table, HasSubstr("all"));
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4);
}

}  // namespace
}  // namespace dynapipe
