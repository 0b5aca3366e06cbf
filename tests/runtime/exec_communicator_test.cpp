// Communicator: Gloo over a TCPStore / FileStore with ranks as threads (c10d CollectiveTest
// style, short timeouts), the in-process double, and fault injection.
#include "runtime/exec/communicator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <filesystem>
#include <functional>
#include <thread>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {
namespace {

using namespace std::chrono_literals;
constexpr Millis kShort = 3000ms;

// Runs body(rank, comm) on `size` threads over Gloo; rethrows the first failure.
void run_gloo_ranks(int size, const std::function<void(int, Communicator&)>& body,
                    bool file_store = false) {
  c10d::TCPStoreOptions server_options;
  server_options.port = 0;
  server_options.isServer = true;
  server_options.waitWorkers = false;
  server_options.timeout = kShort;
  c10::intrusive_ptr<c10d::Store> server;
  std::string file;
  if (file_store) {
    file = (std::filesystem::temp_directory_path() /
            ("dynapipe_filestore_" + std::to_string(::getpid()) + "_" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count())))
               .string();
  } else {
    server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_options);
  }
  int port = file_store ? 0 : static_cast<c10d::TCPStore&>(*server).getPort();
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        c10::intrusive_ptr<c10d::Store> store;
        if (file_store) {
          store = c10::make_intrusive<c10d::FileStore>(file, size);
        } else {
          c10d::TCPStoreOptions o;
          o.port = static_cast<std::uint16_t>(port);
          o.timeout = kShort;
          store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
        }
        auto comm = make_gloo_communicator(store, "test", r, size, kShort);
        body(r, *comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (file_store) std::filesystem::remove(file);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(CommunicatorTest, GlooSendRecvRing) {
  for (int size : {2, 4}) {
    run_gloo_ranks(size, [size](int rank, Communicator& comm) {
      int next = (rank + 1) % size, prev = (rank + size - 1) % size;
      auto out = at::full({2, 3}, static_cast<float>(rank));
      auto in = at::empty({2, 3});
      auto send = comm.send(out, next);
      auto recv = comm.recv(in, prev);
      recv->wait(kShort);
      send->wait(kShort);
      EXPECT_TRUE(at::equal(in, at::full({2, 3}, static_cast<float>(prev))));
    });
  }
}

TEST(CommunicatorTest, GlooMatchesInPostingOrderPerPair) {
  run_gloo_ranks(2, [](int rank, Communicator& comm) {
    if (rank == 0) {
      auto a = at::full({4}, 1.0f), b = at::full({2, 2}, 2.0f);
      auto wa = comm.send(a, 1);
      auto wb = comm.send(b, 1);
      wb->wait(kShort);
      wa->wait(kShort);
    } else {
      auto a = at::empty({4}), b = at::empty({2, 2});
      auto wa = comm.recv(a, 0);
      auto wb = comm.recv(b, 0);
      wb->wait(kShort);  // waiting out of order still matches by posting order
      wa->wait(kShort);
      EXPECT_TRUE(at::equal(a, at::full({4}, 1.0f)));
      EXPECT_TRUE(at::equal(b, at::full({2, 2}, 2.0f)));
    }
  });
}

TEST(CommunicatorTest, GlooAllreduceSumsMixedShapes) {
  run_gloo_ranks(3, [](int rank, Communicator& comm) {
    std::vector<at::Tensor> ts{at::full({2}, static_cast<float>(rank + 1)),
                               at::full({1, 3}, 10.0f * (rank + 1))};
    comm.allreduce(ts)->wait(kShort);
    EXPECT_TRUE(at::equal(ts[0], at::full({2}, 6.0f)));
    EXPECT_TRUE(at::equal(ts[1], at::full({1, 3}, 60.0f)));
    comm.barrier(kShort);
  });
}

TEST(CommunicatorTest, GlooOverFileStore) {
  run_gloo_ranks(
      2,
      [](int rank, Communicator& comm) {
        std::vector<at::Tensor> ts{at::full({3}, static_cast<float>(rank))};
        comm.allreduce(ts)->wait(kShort);
        EXPECT_TRUE(at::equal(ts[0], at::full({3}, 1.0f)));
      },
      /*file_store=*/true);
}

TEST(CommunicatorTest, GlooRecvWithoutSendTimesOutNamingRanks) {
  auto start = std::chrono::steady_clock::now();
  run_gloo_ranks(2, [](int rank, Communicator& comm) {
    if (rank == 1) {
      auto t = at::empty({4});
      try {
        comm.recv(t, 0)->wait(500ms);
        ADD_FAILURE() << "recv without a send completed";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Timeout) << e.what();
        EXPECT_NE(std::string(e.what()).find("rank 1: recv [4] from rank 0"), std::string::npos)
            << e.what();
      }
    } else {
      // Gloo closes the pair after a timeout: the peer's next operation fails too, fast.
      try {
        comm.barrier(kShort);
        ADD_FAILURE() << "barrier with a failed peer completed";
      } catch (const Error& e) {
        EXPECT_TRUE(e.kind() == ErrorKind::PeerFailure || e.kind() == ErrorKind::Timeout);
      }
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(CommunicatorTest, LocalSendRecvAndAllreduce) {
  auto comms = make_local_communicators(3);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto& comm = *comms[r];
        auto out = at::full({2}, static_cast<float>(r));
        auto in = at::empty({2});
        auto s = comm.send(out, (r + 1) % 3);
        auto w = comm.recv(in, (r + 2) % 3);
        w->wait(kShort);
        s->wait(kShort);
        EXPECT_TRUE(at::equal(in, at::full({2}, static_cast<float>((r + 2) % 3))));
        std::vector<at::Tensor> ts{at::ones({2})};
        comm.allreduce(ts)->wait(kShort);
        EXPECT_TRUE(at::equal(ts[0], at::full({2}, 3.0f)));
        comm.barrier(kShort);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(CommunicatorTest, LocalShapeMismatchIsAnError) {
  auto comms = make_local_communicators(2);
  comms[0]->send(at::ones({3}), 1)->wait(kShort);
  auto in = at::empty({4});
  try {
    comms[1]->recv(in, 0)->wait(kShort);
    FAIL() << "mismatched shapes matched";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PeerFailure);
    EXPECT_NE(std::string(e.what()).find("expected shape [4], got [3]"), std::string::npos);
  }
}

TEST(CommunicatorTest, FaultyDiesAfterNOpsAndPeerTimesOut) {
  auto comms = make_local_communicators(2);
  FaultyCommunicator faulty(std::move(comms[0]), FaultOptions{.delay = 1ms, .die_after_ops = 1});
  faulty.send(at::ones({1}), 1)->wait(kShort);
  EXPECT_THROW(faulty.send(at::ones({1}), 1), Error);
  auto in = at::empty({1});
  comms[1]->recv(in, 0)->wait(kShort);  // the first message arrived
  try {
    comms[1]->recv(in, 0)->wait(200ms);
    FAIL() << "recv from a dead rank completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
  }
}

TEST(CommunicatorTest, NcclIsUnsupportedWithoutCuda) {
#ifndef USE_C10D_NCCL
  try {
    make_nccl_communicator({}, "x", 0, 1, kShort);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
  }
#endif
}

}  // namespace
}  // namespace dynapipe::runtime
