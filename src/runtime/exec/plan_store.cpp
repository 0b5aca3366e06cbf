// PlanStore protocol over KeyValue, the in-memory KeyValue, and plan-store URLs.
#include "dynapipe/runtime/plan_store.h"

#include <map>
#include <mutex>
#include <thread>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {

namespace {

class InMemoryKeyValue : public KeyValue {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mutex_);
    map_[key] = value;
  }
  std::optional<std::string> get(const std::string& key) override {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::lock_guard lock(mutex_);
    auto& value = map_[key];
    auto n = (value.empty() ? 0 : std::stoll(value)) + delta;
    value = std::to_string(n);
    return n;
  }
  bool erase(const std::string& key) override {
    std::lock_guard lock(mutex_);
    return map_.erase(key) > 0;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::string> map_;
};

}  // namespace

std::unique_ptr<KeyValue> make_in_memory_key_value() { return std::make_unique<InMemoryKeyValue>(); }

PlanStore::PlanStore(std::shared_ptr<KeyValue> kv, std::string run_id)
    : kv_(std::move(kv)), run_id_(std::move(run_id)) {
  DYNAPIPE_CHECK(kv_ != nullptr, "PlanStore needs a key-value store");
}
PlanStore::~PlanStore() = default;

std::string PlanStore::key(const char* kind, std::int64_t iteration) const {
  return cat("dynapipe/", run_id_, "/", kind, "/", iteration);
}

void PlanStore::put(std::int64_t iteration, const std::string& bytes) {
  kv_->set(key("plan", iteration), bytes);
}

std::string PlanStore::get(std::int64_t iteration, int rank, Millis timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto interval = std::chrono::milliseconds(1);
  auto plan_key = key("plan", iteration);
  while (true) {
    if (auto bytes = kv_->get(plan_key)) return *std::move(bytes);
    if (auto message = failure())
      throw Error(ErrorKind::PeerFailure,
                  cat("plan store: rank ", rank, " waiting for the plan of iteration ", iteration,
                      ": ", *message));
    if (std::chrono::steady_clock::now() >= deadline)
      throw Error(ErrorKind::Timeout, cat("plan store: rank ", rank, " waited ", timeout.count(),
                                          " ms for the plan of iteration ", iteration));
    std::this_thread::sleep_for(interval);
    interval = std::min(interval * 2, std::chrono::milliseconds(50));
  }
}

bool PlanStore::contains(std::int64_t iteration) { return kv_->get(key("plan", iteration)).has_value(); }

void PlanStore::release(std::int64_t iteration, int readers) {
  auto count_key = key("readers", iteration);
  if (kv_->add(count_key, 1) >= readers) {
    kv_->erase(key("plan", iteration));
    kv_->erase(count_key);
  }
}

void PlanStore::report_failure(const std::string& message) {
  kv_->set(cat("dynapipe/", run_id_, "/failure"), message);
}

std::optional<std::string> PlanStore::failure() { return kv_->get(cat("dynapipe/", run_id_, "/failure")); }

void PlanStore::clear_failure() { kv_->erase(cat("dynapipe/", run_id_, "/failure")); }

PlanStoreAddress parse_plan_store_url(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorKind::InvalidArgument,
                 cat("--plan-store must be tcp://host:port, redis://host:port, memory "
                     "or empty, got \"", url, "\" (", why, ")"));
  };
  if (url.empty() || url == "tcp") return {.kind = "embedded", .host = "", .port = 0};
  if (url == "memory") return {.kind = "memory", .host = "", .port = 0};
  auto scheme_end = url.find("://");
  if (scheme_end == std::string::npos) throw bad("no scheme");
  std::string scheme = url.substr(0, scheme_end);
  std::string rest = url.substr(scheme_end + 3);
  // A secret in the URL would be on a command line, in `ps` and in logs.
  if (rest.find('@') != std::string::npos) {
    throw Error(ErrorKind::InvalidArgument,
                "--plan-store must not carry a password (it would show in ps and logs); "
                "set DYNAPIPE_PLAN_STORE_PASSWORD or --plan-store-password-file instead");
  }
  auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) throw bad("expected host:port");
  int port = 0;
  try {
    std::size_t used = 0;
    port = std::stoi(rest.substr(colon + 1), &used);
    if (used != rest.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw bad("port is not a number");
  }
  if (port <= 0 || port > 65535) throw bad("port must be in [1, 65535]");
  if (scheme != "tcp" && scheme != "redis") throw bad(cat("unknown scheme \"", scheme, "\""));
  return {.kind = scheme, .host = rest.substr(0, colon), .port = port};
}

std::unique_ptr<PlanStore> open_plan_store(const PlanStoreOptions& options) {
  const PlanStoreAddress address = parse_plan_store_url(options.url);
  if (address.kind == "embedded") {
    if (!options.embedded) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("--plan-store \"", options.url, "\" needs the job's own store, and this "
                      "process has none"));
    }
    return std::make_unique<PlanStore>(options.embedded, options.run_id);
  }
  if (address.kind == "memory") {
    return std::make_unique<PlanStore>(make_in_memory_key_value(), options.run_id);
  }
  if (address.kind == "tcp") {
    return std::make_unique<PlanStore>(
        make_tcp_key_value(address.host, address.port, false, options.timeout), options.run_id);
  }
  return std::make_unique<PlanStore>(
      make_redis_key_value(address.host, address.port, options.password, options.timeout),
      options.run_id);
}

}  // namespace dynapipe::runtime
