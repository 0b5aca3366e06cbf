#include "runtime/exec/c10d_key_value.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dynapipe/core/error.h"

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

}  // namespace

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
