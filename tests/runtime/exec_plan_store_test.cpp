// Plan store round trips over in-memory, TCPStore and a real redis-server; the codec
// rejects garbage with a ParseError naming iteration and rank.
#include "dynapipe/runtime/plan_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "dynapipe/core/error.h"
#include "runtime/exec/c10d_key_value.h"
#include "runtime/exec/plan_ahead.h"
#include "runtime/exec/plan_codec.h"

namespace dynapipe::runtime {
namespace {

using namespace std::chrono_literals;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

IterationPlan sample_plan(std::int64_t index) {
  IterationPlan plan;
  plan.index = index;
  plan.sample_ids = {4, 5, 6};
  plan.est_iteration_ms = 12.5;
  ReplicaPlan r;
  MicroBatch mb;
  mb.id = 0;
  mb.sample_ids = {4, 5, 6};
  mb.shape = {3, 16, 0};
  mb.real_tokens = 40;
  mb.target_tokens = 9;
  r.microbatches.push_back(mb);
  ExecutorProgram p;
  Instruction in;
  in.op = InstructionOp::SendActivationStart;
  in.mb = 0;
  in.stage = 0;
  in.peer = 1;
  in.shape = {3, 16, 8};
  in.buffer = 2;
  p.instructions = {in};
  r.executors = {p};
  r.est_peak_memory_bytes = {100, 200};
  plan.replicas = {r};
  return plan;
}

// Every byte value survives (plans are binary).
std::string binary_blob() {
  std::string s;
  for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  return s + s;
}

void round_trip(PlanStore& store) {
  store.put(3, binary_blob());
  EXPECT_TRUE(store.contains(3));
  EXPECT_EQ(store.get(3, 0, 1000ms), binary_blob());
  store.release(3, 2);
  EXPECT_TRUE(store.contains(3));  // one of two readers left
  store.release(3, 2);
  EXPECT_FALSE(store.contains(3)) << "the last reader collects the iteration";

  auto start = std::chrono::steady_clock::now();
  try {
    store.get(4, 1, 100ms);
    FAIL() << "got a plan that was never put";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    EXPECT_NE(std::string(e.what()).find("rank 1 waited 100 ms for the plan of iteration 4"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  // A plan put while a reader waits is picked up.
  std::thread writer([&] {
    std::this_thread::sleep_for(30ms);
    store.put(5, "late");
  });
  EXPECT_EQ(store.get(5, 0, 2000ms), "late");
  writer.join();

  store.report_failure("rank 0: planning iteration 6 failed: boom");
  try {
    store.get(6, 2, 5000ms);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PeerFailure);
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos);
  }
}

TEST(PlanStoreTest, InMemoryRoundTrip) {
  auto store = open_plan_store({.url = "memory", .run_id = "t1"});
  round_trip(*store);
}

// Iteration 1 fails at once while iteration 0 is still being planned: the failure must not
// reach the store before plan 0 does, or a rank finding it in step 0 would quit while its
// peers train step 0 and wait for it until the communication timeout (seen in CI).
TEST(PlanAheadTest, FailureIsPublishedAfterEveryEarlierPlan) {
  PlanStore store(make_in_memory_key_value(), "t3");
  PlanAhead ahead(store, [](std::int64_t i) -> std::string {
    if (i == 1) throw Error(ErrorKind::Infeasible, "iteration 1: no plan fits");
    std::this_thread::sleep_for(300ms);
    return "plan 0";
  }, /*first=*/0, /*end=*/4, /*ahead=*/2, /*threads=*/2);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!store.failure() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(store.failure().has_value());
  EXPECT_TRUE(store.contains(0));
  EXPECT_NE(store.failure()->find("planning iteration 1 failed"), std::string::npos);
  EXPECT_NO_THROW(ahead.check(0));
  try {
    ahead.check(1);
    FAIL() << "check(1) passed after iteration 1 failed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Infeasible);
  }
}

TEST(PlanStoreTest, TcpStoreRoundTripBetweenServerAndClient) {
  auto server = make_tcp_store("127.0.0.1", 0, /*is_server=*/true, 2000ms);
  int port = tcp_store_port(server);
  PlanStore writer(key_value_over(server), "t2");
  auto reader = open_plan_store({.url = cat("tcp://127.0.0.1:", port), .run_id = "t2", .timeout = 2000ms});
  writer.put(1, binary_blob());
  EXPECT_EQ(reader->get(1, 1, 1000ms), binary_blob());
  round_trip(*reader);
}

TEST(PlanStoreTest, RedisRoundTripAgainstRealServer) {
  if (::system("command -v redis-server > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "redis-server is not installed; skipping the Redis plan store test";
  int port = free_port();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto p = std::to_string(port);
    ::execlp("redis-server", "redis-server", "--bind", "127.0.0.1", "--port", p.c_str(), "--save", "",
             "--appendonly", "no", "--requirepass", "sekret", "--loglevel", "warning", nullptr);
    ::_exit(127);
  }
  struct Stop {
    pid_t pid;
    ~Stop() {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
  } stop{pid};
  std::unique_ptr<PlanStore> store;
  for (int attempt = 0; attempt < 100 && !store; ++attempt) {
    try {
      store = open_plan_store({.url = cat("redis://127.0.0.1:", port), .password = "sekret", .run_id = "t3", .timeout = 1000ms});
    } catch (const Error&) {
      std::this_thread::sleep_for(50ms);
    }
  }
  ASSERT_TRUE(store) << "redis-server did not come up on port " << port;
  round_trip(*store);
  try {
    open_plan_store({.url = cat("redis://127.0.0.1:", port), .password = "wrong", .run_id = "t3"});
    FAIL() << "a wrong password was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PeerFailure);
    EXPECT_NE(std::string(e.what()).find("AUTH failed"), std::string::npos) << e.what();
  }
}

TEST(PlanStoreTest, BadUrlsAreInvalidArguments) {
  for (std::string url : {"redis://nohost", "tcp://host:notaport", "ftp://h:1", "garbage", "tcp://h:70000",
                          "redis://:sekret@127.0.0.1:6379"}) {
    try {
      open_plan_store({.url = url});
      ADD_FAILURE() << "accepted " << url;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << url;
      EXPECT_NE(std::string(e.what()).find("--plan-store"), std::string::npos);
    }
  }
}

TEST(PlanCodecTest, RoundTripsAndRejectsGarbageNamingIterationAndRank) {
  auto plan = sample_plan(7);
  auto back = decode_plan(encode_plan(plan), 7, 1);
  EXPECT_EQ(back.replicas[0].executors, plan.replicas[0].executors);
  EXPECT_EQ(back.replicas[0].microbatches[0].shape, plan.replicas[0].microbatches[0].shape);
  for (std::string bytes : {std::string("\x01\x02garbage"), encode_plan(sample_plan(8))}) {
    try {
      decode_plan(bytes, 7, 1);
      ADD_FAILURE() << "decoded garbage";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ParseError);
      EXPECT_NE(std::string(e.what()).find("iteration 7, rank 1"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dynapipe::runtime
