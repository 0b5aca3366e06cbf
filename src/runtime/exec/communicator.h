// Communicator: the seam between the executor and the wire. One instance is one
// process group: `rank()` of `size()`; peers are ranks in that group.
//
// Three implementations (habit H3):
//   - make_gloo_communicator(): c10d ProcessGroupGloo over a c10d Store (TCPStore /
//     FileStore), the real one. make_nccl_communicator() exists behind the same
//     interface and throws Unsupported unless LibTorch was built with USE_C10D_NCCL.
//   - make_local_communicators(): N in-process ranks (threads + queues) for unit tests.
//   - FaultyCommunicator: wraps one and injects delay or death (fault tests).
//
// Matching rule (what a plan may rely on): between a pair of ranks, messages in one
// direction are matched in posting order, whatever their kind. Gloo matches by
// (source, tag); we post every point-to-point message with the same tag (kPointToPointTag),
// so Gloo's per-(source, tag) FIFO is exactly that rule, as with NCCL. A receive whose
// shape disagrees with the matched send fails (Gloo: size mismatch; local: shape check).
//
// Errors (H7): send/recv/allreduce post and return a Work; Work::wait(timeout) blocks at
// most `timeout` and throws dynapipe::Error Timeout (the peer did not answer) or
// PeerFailure (the connection broke, or the peer reported an error), naming this rank
// and the peer. Thread-safety: one thread posts and waits per communicator.
//
//   auto comm = make_gloo_communicator(store, "pipe", rank, world, 30s);
//   auto work = comm->send(tensor, /*peer=*/1);
//   ...
//   work->wait(std::chrono::seconds(30));
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dynapipe::runtime {

using Millis = std::chrono::milliseconds;

inline constexpr int kPointToPointTag = 0;

// A posted operation. wait() may be called once; it rethrows the operation's error.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done or `timeout` passed. Throws Error{Timeout} / Error{PeerFailure}.
  virtual void wait(Millis timeout) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends `tensor` (contiguous; kept alive by the Work) to `peer`.
  virtual std::unique_ptr<Work> send(const at::Tensor& tensor, int peer) = 0;
  // Receives into `tensor` (preallocated with the expected shape and dtype) from `peer`.
  virtual std::unique_ptr<Work> recv(at::Tensor& tensor, int peer) = 0;
  // Sums the tensors elementwise over all ranks, in place.
  virtual std::unique_ptr<Work> allreduce(std::vector<at::Tensor>& tensors) = 0;
  // Returns when every rank has called barrier(), or throws after `timeout`.
  virtual void barrier(Millis timeout) = 0;
};

// Where Gloo listens and connects from: a network interface by name (e.g. "eth1"),
// else the address a hostname or IP resolves to, else (both empty) the machine's
// default, the address of its own hostname.
struct GlooDevice {
  std::string interface;
  std::string hostname;
};

// Gloo over `store` (keys namespaced by `prefix`, so several groups share one store).
// `timeout` bounds connection setup and every collective inside Gloo.
std::unique_ptr<Communicator> make_gloo_communicator(c10::intrusive_ptr<c10d::Store> store,
                                                     const std::string& prefix, int rank,
                                                     int size, Millis timeout,
                                                     const GlooDevice& device = {.interface = "",
                                                                                 .hostname = "127.0.0.1"});

// NCCL (CUDA); throws Error{Unsupported} in builds without USE_C10D_NCCL (this one).
std::unique_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store> store,
                                                     const std::string& prefix, int rank,
                                                     int size, Millis timeout);

// `size` in-process ranks sharing queues; communicator i is rank i. Sends are buffered
// (complete at once); receives wait for the matching message.
std::vector<std::unique_ptr<Communicator>> make_local_communicators(int size);

// Fault injection around a real communicator.
struct FaultOptions {
  Millis delay{0};          // sleep before posting every operation. Default: none.
  int die_after_ops = -1;   // after this many posted operations, every further operation
                            // throws PeerFailure ("rank R died (injected)"). -1: never.
};
class FaultyCommunicator : public Communicator {
 public:
  FaultyCommunicator(std::unique_ptr<Communicator> inner, FaultOptions options);
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<Work> send(const at::Tensor& tensor, int peer) override;
  std::unique_ptr<Work> recv(at::Tensor& tensor, int peer) override;
  std::unique_ptr<Work> allreduce(std::vector<at::Tensor>& tensors) override;
  void barrier(Millis timeout) override;

 private:
  void before_op(const char* what);
  std::unique_ptr<Communicator> inner_;
  FaultOptions options_;
  int ops_ = 0;
};

}  // namespace dynapipe::runtime
