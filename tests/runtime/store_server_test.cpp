// The job's rendezvous store: server and client over real sockets on loopback.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <chrono>
#include <functional>
#include <thread>

#include "dynapipe/core/error.h"
#include "runtime/exec/store_client.h"
#include "runtime/exec/store_server.h"

namespace dynapipe::runtime {
namespace {

using namespace std::chrono_literals;

ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no Error thrown";
  return ErrorKind::Internal;
}

TEST(StoreServerTest, KeysRoundTripBetweenClients) {
  StoreServer server("127.0.0.1", 0);
  StoreClient a("127.0.0.1", server.port(), 2s), b("127.0.0.1", server.port(), 2s);
  a.set("k", std::string("v\0w", 3));
  EXPECT_EQ(b.get("k", 1s), std::string("v\0w", 3));
  EXPECT_TRUE(b.check({"k"}));
  EXPECT_FALSE(b.check({"k", "missing"}));
  EXPECT_EQ(a.num_keys(), 1);
  EXPECT_TRUE(b.erase("k"));
  EXPECT_FALSE(b.erase("k"));
  EXPECT_EQ(a.num_keys(), 0);
}

TEST(StoreServerTest, GetWaitsForTheKeyAndWaitTimesOut) {
  StoreServer server("127.0.0.1", 0);
  StoreClient reader("127.0.0.1", server.port(), 2s), writer("127.0.0.1", server.port(), 2s);
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    writer.set("late", "here");
  });
  EXPECT_EQ(reader.get("late", 5s), "here");
  later.join();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(kind_of([&] { reader.wait({"late", "never"}, 100ms); }), ErrorKind::Timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  // The connection stays in step after a timeout.
  reader.wait({"late"}, 100ms);
  EXPECT_EQ(reader.get("late", 1s), "here");
}

TEST(StoreServerTest, AddIsAtomicAcrossClientsAndStoredAsText) {
  StoreServer server("127.0.0.1", 0);
  StoreClient a("127.0.0.1", server.port(), 2s), b("127.0.0.1", server.port(), 2s);
  std::thread other([&] {
    for (int i = 0; i < 500; ++i) b.add("n", 1);
  });
  for (int i = 0; i < 500; ++i) a.add("n", 2);
  other.join();
  EXPECT_EQ(a.add("n", 0), 1500);
  EXPECT_EQ(a.get("n", 1s), "1500");
}

TEST(StoreServerTest, CompareSetFollowsC10d) {
  StoreServer server("127.0.0.1", 0);
  StoreClient c("127.0.0.1", server.port(), 2s);
  EXPECT_EQ(c.compare_set("k", "x", "y"), "x");  // missing, expected non-empty: unchanged
  EXPECT_FALSE(c.check({"k"}));
  EXPECT_EQ(c.compare_set("k", "", "first"), "first");
  EXPECT_EQ(c.compare_set("k", "wrong", "second"), "first");
  EXPECT_EQ(c.compare_set("k", "first", "second"), "second");
}

TEST(StoreServerTest, ListensOnlyOnTheAddressAsked) {
  StoreServer server("127.0.0.1", 0);
  EXPECT_EQ(server.address(), "127.0.0.1");
  // 127.0.0.2 is this machine too (all of 127/8 is loopback), but not the bound address.
  EXPECT_EQ(kind_of([&] { StoreClient("127.0.0.2", server.port(), 200ms); }), ErrorKind::Timeout);
  StoreClient ok("127.0.0.1", server.port(), 2s);
  EXPECT_EQ(ok.num_keys(), 0);
}

TEST(StoreServerTest, AnAddressOfAnotherMachineIsOneLineNamingIt) {
  try {
    StoreServer server("192.0.2.1", 0);  // TEST-NET-1: never this machine's
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("192.0.2.1:0"), std::string::npos) << e.what();
  }
}

TEST(StoreServerTest, ClientsSeeTheServerStop) {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0);
  StoreClient c("127.0.0.1", server->port(), 2s);
  c.set("k", "v");
  server.reset();
  EXPECT_EQ(kind_of([&] { c.get("k", 1s); }), ErrorKind::PeerFailure);
  EXPECT_EQ(kind_of([&] { c.set("k", "v"); }), ErrorKind::PeerFailure);
}

TEST(StoreServerTest, AGarbledFrameClosesOnlyItsConnection) {
  StoreServer server("127.0.0.1", 0);
  StoreClient good("127.0.0.1", server.port(), 2s);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const char garbage[] = {5, 0, 0, 0, 42, 1, 2, 3, 4};  // op 42 does not exist
  ASSERT_EQ(::send(fd, garbage, sizeof garbage, 0), static_cast<ssize_t>(sizeof garbage));
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);  // the server hung up on it
  ::close(fd);
  good.set("still", "served");
  EXPECT_EQ(good.get("still", 1s), "served");
}

}  // namespace
}  // namespace dynapipe::runtime
