#include "runtime/exec/c10d_key_value.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dynapipe/core/error.h"
#include "runtime/exec/store_client.h"
#include "runtime/exec/store_server.h"

namespace dynapipe::runtime {

namespace {

[[noreturn]] void rethrow(const std::exception& e, const std::string& what) {
  std::string message = e.what();
  if (auto newline = message.find('\n'); newline != std::string::npos) message.resize(newline);
  bool timed_out = message.find("imeout") != std::string::npos ||
                   message.find("imed out") != std::string::npos;
  throw Error(timed_out ? ErrorKind::Timeout : ErrorKind::PeerFailure, cat(what, ": ", message));
}

class C10dKeyValue : public KeyValue {
 public:
  explicit C10dKeyValue(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      rethrow(e, cat("store: set ", key));
    }
  }
  std::optional<std::string> get(const std::string& key) override {
    try {
      // c10d's get() blocks until the key exists; check() first keeps this non-blocking.
      if (!store_->check({key})) return std::nullopt;
      auto bytes = store_->get(key);
      return std::string(bytes.begin(), bytes.end());
    } catch (const std::exception& e) {
      rethrow(e, cat("store: get ", key));
    }
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    try {
      return store_->add(key, delta);
    } catch (const std::exception& e) {
      rethrow(e, cat("store: add ", key));
    }
  }
  bool erase(const std::string& key) override {
    try {
      return store_->deleteKey(key);
    } catch (const std::exception& e) {
      rethrow(e, cat("store: delete ", key));
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

// c10d's Store over our rendezvous store; the server lives as long as rank 0's store.
class RendezvousStore : public c10d::Store {
 public:
  RendezvousStore(std::unique_ptr<StoreServer> server, std::unique_ptr<StoreClient> client, Millis timeout)
      : c10d::Store(timeout), server_(std::move(server)), client_(std::move(client)) {}

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    client_->set(key, string_of(value));
  }
  std::vector<std::uint8_t> compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                       const std::vector<std::uint8_t>& desired) override {
    return bytes_of(client_->compare_set(key, string_of(expected), string_of(desired)));
  }
  std::vector<std::uint8_t> get(const std::string& key) override { return bytes_of(client_->get(key, timeout_)); }
  int64_t add(const std::string& key, int64_t delta) override { return client_->add(key, delta); }
  bool deleteKey(const std::string& key) override { return client_->erase(key); }
  bool check(const std::vector<std::string>& keys) override { return client_->check(keys); }
  int64_t getNumKeys() override { return client_->num_keys(); }
  void wait(const std::vector<std::string>& keys) override { client_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    client_->wait(keys, timeout);
  }

 private:
  std::unique_ptr<StoreServer> server_;  // rank 0 only; declared first, destroyed last
  std::unique_ptr<StoreClient> client_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> make_rendezvous_store(const std::string& host, int port, bool is_server,
                                                     const std::string& bind_host, Millis timeout) {
  std::unique_ptr<StoreServer> server;
  if (is_server) {
    try {
      server = std::make_unique<StoreServer>(bind_host, port);
    } catch (const Error& e) {
      throw Error(e.kind(), cat("rendezvous store: ", e.what(), "; MASTER_ADDR (or DYNAPIPE_STORE_BIND_ADDR) ",
                                "must be an address of rank 0's machine and MASTER_PORT free there"));
    }
  }
  auto client = std::make_unique<StoreClient>(host, server ? server->port() : port, timeout);
  return c10::make_intrusive<RendezvousStore>(std::move(server), std::move(client), timeout);
}

std::unique_ptr<KeyValue> key_value_over(c10::intrusive_ptr<c10d::Store> store) {
  return std::make_unique<C10dKeyValue>(std::move(store));
}

c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                              Millis timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = is_server;
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    rethrow(e, cat("store: ", is_server ? "hosting" : "connecting to", " TCPStore at ", host, ":", port));
  }
}

int tcp_store_port(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
  DYNAPIPE_CHECK(tcp != nullptr, "not a TCPStore");
  return tcp->getPort();
}

std::unique_ptr<KeyValue> make_tcp_key_value(const std::string& host, int port, bool is_server,
                                             Millis timeout) {
  return key_value_over(make_tcp_store(host, port, is_server, timeout));
}

}  // namespace dynapipe::runtime
