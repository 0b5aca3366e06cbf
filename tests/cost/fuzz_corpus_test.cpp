// Replays the profile and model-file fuzz corpora (tests/fuzz/corpus/{profile,model_json},
// seeds and every finding once fixed): each input parses or throws dynapipe::Error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/cost/profile.h"

namespace dynapipe {
namespace {

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

template <typename Parse>
std::pair<int, int> replay(const char* corpus, Parse parse) {
  int parsed = 0, refused = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(DYNAPIPE_SOURCE_DIR "/tests/fuzz/corpus") / corpus)) {
    SCOPED_TRACE(entry.path().filename().string());
    try {
      parse(read_all(entry.path()), entry.path().string());
      ++parsed;
    } catch (const Error&) {
      ++refused;
    }
  }
  return {parsed, refused};
}

TEST(FuzzCorpusTest, ProfilesParseOrThrowError) {
  const auto [parsed, refused] = replay("profile", [](const std::string& text, const std::string& where) {
    parse_profile(text, where);
  });
  EXPECT_GE(parsed, 1);
  EXPECT_GE(refused, 1);
}

TEST(FuzzCorpusTest, ModelFilesParseOrThrowError) {
  const auto [parsed, refused] = replay("model_json", [](const std::string& text, const std::string& where) {
    parse_model_spec(text, where);
  });
  EXPECT_GE(parsed, 2);
  EXPECT_GE(refused, 1);
}

}  // namespace
}  // namespace dynapipe
