// Launcher: environment of the ranks, and failures (a killed rank, a rank that exits with
// an error) end the whole job with an error naming the rank, within bounded time.
#include "dynapipe/runtime/launcher.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / cat("dynapipe_", name, "_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(LauncherTest, StartsRanksWithTorchrunEnvironment) {
  auto dir = temp_dir("launch_env");
  launch_local({.command = {"sh", "-c", cat("echo $RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $EXTRA > ",
                                          dir.string(), "/rank-$RANK")},
                .world_size = 3,
                .master_port = 29123,
                .env = {{"EXTRA", "x"}}});
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(dir / cat("rank-", r));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, cat(r, " 3 127.0.0.1 29123 x"));
  }
  fs::remove_all(dir);
}

TEST(LauncherTest, KilledRankEndsJobNamingItWithinBoundedTime) {
  auto start = std::chrono::steady_clock::now();
  try {
    // Rank 1 is killed; the others would run for a long time and ignore nothing.
    launch_local({.command = {"sh", "-c", "if [ $RANK = 1 ]; then sleep 0.3; kill -9 $$; fi; exec sleep 60"},
                  .world_size = 3,
                  .kill_grace = 2000ms});
    FAIL() << "the job succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PeerFailure);
    EXPECT_NE(std::string(e.what()).find("rank 1 failed (killed by signal 9"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(LauncherTest, FailingRankReportsExitStatusAndLastMessage) {
  try {
    launch_local({.command = {"sh", "-c",
                              "if [ $RANK = 2 ]; then echo 'starting' >&2; echo 'error: boom at step 3' >&2; "
                              "exit 3; fi; exec sleep 60"},
                  .world_size = 3});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PeerFailure);
    EXPECT_NE(std::string(e.what()).find("rank 2 failed (exit status 3): error: boom at step 3"),
              std::string::npos)
        << e.what();
  }
}

TEST(LauncherTest, RankIgnoringSigtermIsKilledAfterGrace) {
  auto start = std::chrono::steady_clock::now();
  try {
    launch_local({.command = {"sh", "-c", "if [ $RANK = 0 ]; then exit 1; fi; trap '' TERM; while true; do sleep 0.1; done"},
                  .world_size = 2,
                  .kill_grace = 500ms});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 failed (exit status 1)"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(LauncherTest, DeadlineStopsAHangingJob) {
  try {
    launch_local({.command = {"sleep", "60"}, .world_size = 2, .deadline = 300ms});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
  }
}

TEST(LauncherTest, DistributedEnvironmentIsValidated) {
  ::unsetenv("RANK");
  EXPECT_FALSE(distributed_env_from_environment().has_value());
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  auto env = distributed_env_from_environment();
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  ::setenv("RANK", "2", 1);
  try {
    distributed_env_from_environment();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("RANK must be an integer in [0, 1], got \"2\""), std::string::npos);
  }
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"}) ::unsetenv(v);
}

}  // namespace
}  // namespace dynapipe::runtime
