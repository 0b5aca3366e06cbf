// The job's rendezvous store server: a key-value store over TCP that rank 0 hosts and every
// rank (the process groups' rendezvous and the embedded plan store) talks to through
// StoreClient. It exists because LibTorch 1.13's TCPStore listens on every interface of
// the machine; this one listens only on the address it is given (wire format: store_wire.h).
// Private to runtime/; no LibTorch.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

namespace dynapipe::runtime {

class StoreServer {
 public:
  // Listens on `host`'s address (an IPv4/IPv6 literal or a name that resolves to an address
  // of this machine) at `port` (0: a free one) and serves on a background thread.
  // Throws Error(InvalidArgument) naming host:port when it cannot listen there.
  StoreServer(const std::string& host, int port);
  ~StoreServer();  // stops serving; clients then see the connection closed
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // The numeric address it listens on, e.g. "127.0.0.1".
  const std::string& address() const { return address_; }

 private:
  struct State;
  void serve();

  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: writing to [1] ends serve()
  int port_ = 0;
  std::string address_;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace dynapipe::runtime
