// Helpers shared by the data tests: temporary files and error expectations.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "dynapipe/core/error.h"

namespace dynapipe::testing_data {

// A directory unique to the running test, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            cat("dynapipe_data_", ::getpid(), "_", info->test_suite_name(), "_", info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

  std::string write(const std::string& name, const std::string& content) const {
    const std::string p = file(name);
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }

  std::string write_gz(const std::string& name, const std::string& content) const {
    const std::string p = file(name);
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, content.data(), static_cast<unsigned>(content.size()));
    gzclose(f);
    return p;
  }

 private:
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs `fn`, expects an Error of `kind` whose message matches `matcher`.
template <typename Fn, typename Matcher>
void expect_error(Fn&& fn, ErrorKind kind, Matcher matcher) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error of kind " << error_kind_name(kind) << ", none thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_THAT(std::string(e.what()), matcher);
  }
}

}  // namespace dynapipe::testing_data
