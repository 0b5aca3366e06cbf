// Replays the samples reader's fuzz corpus (tests/fuzz/corpus/samples, seeds and every
// finding once fixed): each file either loads or throws dynapipe::Error, never anything
// else, and the well-formed seeds load.
#include <gtest/gtest.h>

#include <filesystem>

#include "dynapipe/core/error.h"
#include "dynapipe/data/dataset.h"

namespace dynapipe {
namespace {

TEST(FuzzCorpusTest, SamplesFilesLoadOrThrowError) {
  const std::filesystem::path dir = DYNAPIPE_SOURCE_DIR "/tests/fuzz/corpus/samples";
  int loaded = 0, refused = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(entry.path().filename().string());
    try {
      Dataset::load(entry.path().string(), {ModelKind::Gpt, 64, 64});
      ++loaded;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GE(loaded, 3);   // small.jsonl, text_and_lengths.jsonl, lengths.jsonl.gz
  EXPECT_GE(refused, 5);  // the malformed ones
}

}  // namespace
}  // namespace dynapipe
