#include "dynapipe/data/samples_cache.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "test_util.h"

namespace dynapipe {
namespace {

using testing_data::expect_error;
using testing_data::TempDir;

const TruncationLimits kGpt{ModelKind::Gpt, 2048, 0};
const std::string kTwoSamples =
    "{\"input_len\":300,\"target_len\":4}\n{\"input_len\":20,\"target_len\":7}\n";

TEST(SamplesCacheTest, ReadsAFileOnceAndServesTheSameSamplesAfter) {
  TempDir dir;
  const std::string path = dir.write("a.jsonl", kTwoSamples);
  SamplesCache cache;
  const auto first = cache.load(path, kGpt);
  // Rewritten on disk: a cached load does not read it again.
  dir.write("a.jsonl", "{\"input_len\":5,\"target_len\":5}\n");
  const auto second = cache.load(path, kGpt);
  EXPECT_EQ(second.get(), first.get());
  EXPECT_EQ(second->samples().size(), 2u);
  // max_target_len 0 means max_seqlen: the same limits.
  EXPECT_EQ(cache.load(path, {ModelKind::Gpt, 2048, 2048}).get(), first.get());
  EXPECT_EQ(cache.reads(), 1u);
}

TEST(SamplesCacheTest, OtherLimitsOrAnotherPathReadAgain) {
  TempDir dir;
  const std::string path = dir.write("a.jsonl", kTwoSamples);
  SamplesCache cache;
  const auto long_limit = cache.load(path, kGpt);
  const auto short_limit = cache.load(path, {ModelKind::Gpt, 100, 0});
  EXPECT_NE(short_limit.get(), long_limit.get());
  EXPECT_EQ(short_limit->samples().front().input_len, 96);  // truncated by its own limits
  EXPECT_EQ(long_limit->samples().front().input_len, 300);
  EXPECT_NE(cache.load(path, {ModelKind::T5, 2048, 0}).get(), long_limit.get());
  EXPECT_NE(cache.load(dir.write("b.jsonl", kTwoSamples), kGpt).get(), long_limit.get());
  EXPECT_EQ(cache.reads(), 4u);
}

TEST(SamplesCacheTest, AFailedReadIsNotKept) {
  TempDir dir;
  const std::string path = dir.file("late.jsonl");
  SamplesCache cache;
  expect_error([&] { cache.load(path, kGpt); }, ErrorKind::NotFound, ::testing::HasSubstr(path));
  EXPECT_EQ(cache.reads(), 0u);
  dir.write("late.jsonl", kTwoSamples);
  EXPECT_EQ(cache.load(path, kGpt)->samples().size(), 2u);
}

TEST(SamplesCacheTest, ConcurrentLoadsShareOneRead) {
  TempDir dir;
  const std::string path = dir.write("a.jsonl", kTwoSamples);
  SamplesCache cache;
  std::vector<const Dataset*> seen(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] { seen[t] = cache.load(path, kGpt).get(); });
  }
  for (std::thread& t : threads) t.join();
  for (const Dataset* d : seen) EXPECT_EQ(d, seen.front());
  EXPECT_EQ(cache.reads(), 1u);
}

TEST(SamplesCacheTest, WithoutACacheEachLoadReads) {
  TempDir dir;
  const std::string path = dir.write("a.jsonl", kTwoSamples);
  const auto first = load_samples(nullptr, path, kGpt);
  dir.write("a.jsonl", "{\"input_len\":5,\"target_len\":5}\n");
  EXPECT_EQ(load_samples(nullptr, path, kGpt)->samples().size(), 1u);
  SamplesCache cache;
  EXPECT_EQ(load_samples(&cache, path, kGpt)->samples().size(), 1u);
  EXPECT_EQ(cache.reads(), 1u);
  EXPECT_EQ(first->samples().size(), 2u);
}

}  // namespace
}  // namespace dynapipe
