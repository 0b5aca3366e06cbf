// Communicator implementations: c10d ProcessGroupGloo, in-process queues, fault injection.
#include "runtime/exec/communicator.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {

namespace {

// Timeouts and broken connections both surface as exceptions from Gloo/c10d; sort them
// into the two distributed kinds by message.
// c10::Error messages carry a backtrace after the first line; keep the first line.
std::string first_line(std::string message) {
  if (auto newline = message.find('\n'); newline != std::string::npos) message.resize(newline);
  return message;
}

[[noreturn]] void rethrow_comm_error(const std::exception& e, const std::string& what) {
  const std::string message = first_line(e.what());
  bool timed_out = message.find("imed out") != std::string::npos ||
                   message.find("imeout") != std::string::npos;
  throw Error(timed_out ? ErrorKind::Timeout : ErrorKind::PeerFailure, cat(what, ": ", message));
}

std::string shape_string(at::IntArrayRef sizes) { return cat("[", join(sizes, ", "), "]"); }

// ---------------------------------------------------------------- Gloo

class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::string what)
      : work_(std::move(work)), what_(std::move(what)) {}
  ~GlooWork() override {
    // A work that was never waited for (the executor is unwinding) must not keep Gloo
    // blocked on a buffer we are about to free.
    if (work_ && !waited_) {
      try {
        work_->abort();
      } catch (...) {
      }
    }
  }
  void wait(Millis timeout) override {
    waited_ = true;
    try {
      work_->wait(timeout);
    } catch (const std::exception& e) {
      try {
        work_->abort();
      } catch (...) {
      }
      rethrow_comm_error(e, cat(what_, " (waited up to ", timeout.count(), " ms)"));
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  bool waited_ = false;
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::Store> store, const std::string& prefix, int rank,
                   int size, Millis timeout, const GlooDevice& device)
      : rank_(rank), size_(size), prefix_(prefix) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    try {
      options->devices.push_back(
          !device.interface.empty()  ? c10d::ProcessGroupGloo::createDeviceForInterface(device.interface)
          : !device.hostname.empty() ? c10d::ProcessGroupGloo::createDeviceForHostname(device.hostname)
                                     : c10d::ProcessGroupGloo::createDefaultDevice());
    } catch (const std::exception& e) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("Gloo device: ", device.interface.empty() ? "hostname \"" : "interface \"",
                      device.interface.empty() ? device.hostname : device.interface,
                      "\" is not usable on this machine (GLOO_SOCKET_IFNAME picks the interface): ",
                      first_line(e.what())));
    }
    options->threads = 2;
    try {
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store)), rank, size, options);
    } catch (const std::exception& e) {
      rethrow_comm_error(e, cat("rank ", rank, ": connecting process group '", prefix, "' of ",
                                size, " ranks"));
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Work> send(const at::Tensor& tensor, int peer) override {
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    auto what = cat("rank ", rank_, ": send ", shape_string(tensor.sizes()), " to rank ", peer);
    try {
      return std::make_unique<GlooWork>(group_->send(tensors, peer, kPointToPointTag), what);
    } catch (const std::exception& e) {
      rethrow_comm_error(e, what);
    }
  }
  std::unique_ptr<Work> recv(at::Tensor& tensor, int peer) override {
    DYNAPIPE_CHECK(tensor.is_contiguous(), "recv needs a contiguous tensor");
    std::vector<at::Tensor> tensors{tensor};
    auto what = cat("rank ", rank_, ": recv ", shape_string(tensor.sizes()), " from rank ", peer);
    try {
      return std::make_unique<GlooWork>(group_->recv(tensors, peer, kPointToPointTag), what);
    } catch (const std::exception& e) {
      rethrow_comm_error(e, what);
    }
  }
  std::unique_ptr<Work> allreduce(std::vector<at::Tensor>& tensors) override {
    auto what = cat("rank ", rank_, ": all-reduce of ", tensors.size(), " tensors in group '",
                    prefix_, "'");
    if (tensors.empty()) return std::make_unique<DoneWork>();
    try {
      // Gloo all-reduces a list of same-shaped tensors only; flatten into one buffer.
      auto flat = std::make_shared<std::vector<at::Tensor>>();
      flat->push_back(at::cat(flatten(tensors)));
      auto work = group_->allreduce(*flat);
      return std::make_unique<UnflattenWork>(std::make_unique<GlooWork>(work, what), flat,
                                             tensors);
    } catch (const std::exception& e) {
      rethrow_comm_error(e, what);
    }
  }
  void barrier(Millis timeout) override {
    auto what = cat("rank ", rank_, ": barrier in group '", prefix_, "'");
    try {
      GlooWork(group_->barrier(), what).wait(timeout);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      rethrow_comm_error(e, what);
    }
  }

 private:
  struct DoneWork : Work {
    void wait(Millis) override {}
  };
  // Waits for the flat all-reduce, then copies the slices back into the caller's tensors.
  struct UnflattenWork : Work {
    UnflattenWork(std::unique_ptr<Work> inner, std::shared_ptr<std::vector<at::Tensor>> flat,
                  std::vector<at::Tensor> targets)
        : inner(std::move(inner)), flat(std::move(flat)), targets(std::move(targets)) {}
    void wait(Millis timeout) override {
      inner->wait(timeout);
      std::int64_t offset = 0;
      for (auto& t : targets) {
        auto n = t.numel();
        t.view(-1).copy_((*flat)[0].narrow(0, offset, n));
        offset += n;
      }
    }
    std::unique_ptr<Work> inner;
    std::shared_ptr<std::vector<at::Tensor>> flat;
    std::vector<at::Tensor> targets;
  };
  static std::vector<at::Tensor> flatten(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> flat;
    flat.reserve(tensors.size());
    for (const auto& t : tensors) flat.push_back(t.detach().reshape(-1));
    return flat;
  }

  int rank_;
  int size_;
  std::string prefix_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

// ---------------------------------------------------------------- in-process

// Shared state of N local ranks. Point-to-point messages are numbered per ordered pair
// at posting time, so the k-th recv from a peer matches that peer's k-th send whatever
// order the waits happen in (the posting-order rule of the header).
struct LocalHub {
  explicit LocalHub(int size) : size(size), arrived_rounds(size, 0) {}
  int size;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::pair<int, int>, std::int64_t> sent, posted_recvs;  // (src, dst) -> count
  std::map<std::tuple<int, int, std::int64_t>, at::Tensor> messages;
  struct Round {
    std::vector<at::Tensor> sum;
    int arrived = 0;
    int read = 0;
  };
  std::map<std::int64_t, Round> rounds;
  std::vector<std::int64_t> arrived_rounds;  // per rank: all-reduces posted
};

class LocalRecvWork : public Work {
 public:
  LocalRecvWork(std::shared_ptr<LocalHub> hub, int src, int dst, std::int64_t seq,
                at::Tensor target)
      : hub_(std::move(hub)), src_(src), dst_(dst), seq_(seq), target_(std::move(target)) {}
  void wait(Millis timeout) override {
    std::unique_lock lock(hub_->mutex);
    auto key = std::make_tuple(src_, dst_, seq_);
    if (!hub_->changed.wait_for(lock, timeout, [&] { return hub_->messages.count(key) > 0; })) {
      throw Error(ErrorKind::Timeout,
                  cat("rank ", dst_, ": recv ", shape_string(target_.sizes()), " from rank ",
                      src_, " did not complete within ", timeout.count(), " ms"));
    }
    at::Tensor message = hub_->messages[key];
    hub_->messages.erase(key);
    lock.unlock();
    if (message.sizes() != target_.sizes() || message.scalar_type() != target_.scalar_type()) {
      throw Error(ErrorKind::PeerFailure,
                  cat("rank ", dst_, ": recv from rank ", src_, " expected shape ",
                      shape_string(target_.sizes()), ", got ", shape_string(message.sizes())));
    }
    target_.copy_(message);
  }

 private:
  std::shared_ptr<LocalHub> hub_;
  int src_, dst_;
  std::int64_t seq_;
  at::Tensor target_;
};

class LocalAllreduceWork : public Work {
 public:
  LocalAllreduceWork(std::shared_ptr<LocalHub> hub, int rank, std::int64_t round,
                     std::vector<at::Tensor> targets)
      : hub_(std::move(hub)), rank_(rank), round_(round), targets_(std::move(targets)) {}
  void wait(Millis timeout) override {
    std::unique_lock lock(hub_->mutex);
    auto& round = hub_->rounds[round_];
    if (!hub_->changed.wait_for(lock, timeout, [&] { return round.arrived == hub_->size; })) {
      throw Error(ErrorKind::Timeout,
                  cat("rank ", rank_, ": all-reduce #", round_, " did not complete within ",
                      timeout.count(), " ms (", round.arrived, " of ", hub_->size,
                      " ranks arrived)"));
    }
    for (std::size_t i = 0; i < targets_.size(); ++i) targets_[i].copy_(round.sum[i]);
    if (++round.read == hub_->size) hub_->rounds.erase(round_);
  }

 private:
  std::shared_ptr<LocalHub> hub_;
  int rank_;
  std::int64_t round_;
  std::vector<at::Tensor> targets_;
};

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size; }

  std::unique_ptr<Work> send(const at::Tensor& tensor, int peer) override {
    check_peer(peer);
    at::Tensor copy = tensor.detach().clone();
    {
      std::lock_guard lock(hub_->mutex);
      auto seq = hub_->sent[{rank_, peer}]++;
      hub_->messages[{rank_, peer, seq}] = std::move(copy);
    }
    hub_->changed.notify_all();
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> recv(at::Tensor& tensor, int peer) override {
    check_peer(peer);
    std::lock_guard lock(hub_->mutex);
    auto seq = hub_->posted_recvs[{peer, rank_}]++;
    return std::make_unique<LocalRecvWork>(hub_, peer, rank_, seq, tensor);
  }
  std::unique_ptr<Work> allreduce(std::vector<at::Tensor>& tensors) override {
    std::int64_t round_index;
    {
      std::lock_guard lock(hub_->mutex);
      round_index = hub_->arrived_rounds[rank_]++;
      auto& round = hub_->rounds[round_index];
      if (round.sum.empty()) {
        for (const auto& t : tensors) round.sum.push_back(t.detach().clone());
      } else {
        if (round.sum.size() != tensors.size())
          throw Error(ErrorKind::PeerFailure,
                      cat("rank ", rank_, ": all-reduce #", round_index, " of ", tensors.size(),
                          " tensors, other ranks gave ", round.sum.size()));
        for (std::size_t i = 0; i < tensors.size(); ++i) round.sum[i].add_(tensors[i]);
      }
      ++round.arrived;
    }
    hub_->changed.notify_all();
    return std::make_unique<LocalAllreduceWork>(hub_, rank_, round_index, tensors);
  }
  void barrier(Millis timeout) override {
    std::vector<at::Tensor> token{at::zeros({1})};
    allreduce(token)->wait(timeout);
  }

 private:
  struct DoneWork : Work {
    void wait(Millis) override {}
  };
  void check_peer(int peer) const {
    DYNAPIPE_CHECK(peer >= 0 && peer < hub_->size && peer != rank_,
                   cat("rank ", rank_, ": peer ", peer, " out of range [0, ", hub_->size, ")"));
  }
  std::shared_ptr<LocalHub> hub_;
  int rank_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(c10::intrusive_ptr<c10d::Store> store,
                                                     const std::string& prefix, int rank,
                                                     int size, Millis timeout,
                                                     const GlooDevice& device) {
  return std::make_unique<GlooCommunicator>(std::move(store), prefix, rank, size, timeout,
                                            device);
}

std::unique_ptr<Communicator> make_nccl_communicator(c10::intrusive_ptr<c10d::Store> store,
                                                     const std::string& prefix, int rank,
                                                     int size, Millis timeout) {
#ifdef USE_C10D_NCCL
  // TODO(#runtime-nccl): a ProcessGroupNCCL-backed Communicator (same matching rule).
  (void)store, (void)prefix, (void)rank, (void)size, (void)timeout;
  throw Error(ErrorKind::Unsupported, "the NCCL communicator is not implemented yet");
#else
  (void)store, (void)prefix, (void)rank, (void)size, (void)timeout;
  throw Error(ErrorKind::Unsupported,
              "NCCL: this LibTorch build has no CUDA/NCCL (USE_C10D_NCCL is off); use Gloo");
#endif
}

std::vector<std::unique_ptr<Communicator>> make_local_communicators(int size) {
  DYNAPIPE_CHECK(size >= 1, cat("local communicator size must be >= 1, got ", size));
  auto hub = std::make_shared<LocalHub>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<LocalCommunicator>(hub, r));
  return comms;
}

// ---------------------------------------------------------------- faulty

FaultyCommunicator::FaultyCommunicator(std::unique_ptr<Communicator> inner, FaultOptions options)
    : inner_(std::move(inner)), options_(options) {}

void FaultyCommunicator::before_op(const char* what) {
  if (options_.delay.count() > 0) std::this_thread::sleep_for(options_.delay);
  if (options_.die_after_ops >= 0 && ops_ >= options_.die_after_ops) {
    throw Error(ErrorKind::PeerFailure,
                cat("rank ", inner_->rank(), " died (injected) before ", what));
  }
  ++ops_;
}

std::unique_ptr<Work> FaultyCommunicator::send(const at::Tensor& tensor, int peer) {
  before_op("send");
  return inner_->send(tensor, peer);
}
std::unique_ptr<Work> FaultyCommunicator::recv(at::Tensor& tensor, int peer) {
  before_op("recv");
  return inner_->recv(tensor, peer);
}
std::unique_ptr<Work> FaultyCommunicator::allreduce(std::vector<at::Tensor>& tensors) {
  before_op("all-reduce");
  return inner_->allreduce(tensors);
}
void FaultyCommunicator::barrier(Millis timeout) {
  before_op("barrier");
  inner_->barrier(timeout);
}

}  // namespace dynapipe::runtime
