// PlanStore: where rank 0's planning workers publish each iteration's encoded plan and
// every executor fetches it (docs/runtime.md, "Plan store").
//
// A PlanStore is a small protocol over a KeyValue seam (H3, H5):
//   dynapipe/<run>/plan/<iteration>     the encoded IterationPlan (plan/plan_binary.h)
//   dynapipe/<run>/readers/<iteration>  how many ranks have consumed it
//   dynapipe/<run>/failure              a fatal error any rank reported
// put() writes a plan; get() polls for it (and for the failure key) until a deadline;
// release() counts readers and the last of them deletes both keys, so finished
// iterations are garbage-collected without a separate pass.
//
// KeyValue implementations: in-memory (tests, one process), c10d Store (default: the
// job's own rendezvous store hosted by rank 0; or a TCPStore at tcp://host:port), Redis
// via hiredis (redis://host:port). This header is torch-free.
//
// Thread-safety: a PlanStore may be used from several threads if its KeyValue may; the
// in-memory and Redis ones are internally locked, the store clients are.
//
//   auto store = open_plan_store({.url = "redis://127.0.0.1:6379", .run_id = "run1"});
//   store->put(3, bytes);                        // rank 0, planning worker
//   std::string b = store->get(3, rank, 30s);    // every rank
//   store->release(3, world_size);               // every rank, after decoding
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dynapipe::runtime {

using Millis = std::chrono::milliseconds;

// Minimal key-value store. get() does not block. Throws Error{Timeout} / {PeerFailure}
// when the backing store cannot be reached.
class KeyValue {
 public:
  virtual ~KeyValue() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> get(const std::string& key) = 0;
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;  // returns new value
  virtual bool erase(const std::string& key) = 0;  // true if it existed
};

std::unique_ptr<KeyValue> make_in_memory_key_value();
// A c10d TCPStore client (or server when `is_server`) at host:port.
std::unique_ptr<KeyValue> make_tcp_key_value(const std::string& host, int port, bool is_server,
                                             Millis timeout);
// A Redis server; `password` empty for none. Throws PeerFailure naming host:port when
// the connection or AUTH fails.
std::unique_ptr<KeyValue> make_redis_key_value(const std::string& host, int port,
                                               const std::string& password, Millis timeout);

class PlanStore {
 public:
  PlanStore(std::shared_ptr<KeyValue> kv, std::string run_id);
  ~PlanStore();
  PlanStore(const PlanStore&) = delete;
  PlanStore& operator=(const PlanStore&) = delete;

  void put(std::int64_t iteration, const std::string& bytes);
  // Waits up to `timeout` for the plan of `iteration`. Throws Error{Timeout} "plan store:
  // rank R waited T ms for the plan of iteration I", or Error{PeerFailure} with the
  // reported failure if one was reported meanwhile.
  std::string get(std::int64_t iteration, int rank, Millis timeout);
  // True if the plan of `iteration` is present (not yet collected).
  bool contains(std::int64_t iteration);
  // One more reader is done with `iteration`; the `readers`-th deletes it.
  void release(std::int64_t iteration, int readers);
  // Publishes a fatal error so that ranks blocked in get() fail within one poll.
  void report_failure(const std::string& message);
  std::optional<std::string> failure();
  void clear_failure();  // rank 0, before the job starts (a store may outlive runs)

  KeyValue& key_value() { return *kv_; }
  const std::string& run_id() const { return run_id_; }

 private:
  std::string key(const char* kind, std::int64_t iteration) const;
  std::shared_ptr<KeyValue> kv_;
  std::string run_id_;
};

struct PlanStoreOptions {
  // "" or "tcp": the job's own rendezvous store (needs `embedded`); "tcp://host:port";
  // "redis://host:port" (no password in the URL: InvalidArgument); "memory" (one process
  // only). Default "".
  std::string url;
  std::string password;  // Redis AUTH. Default none.
  std::string run_id = "run";  // namespaces keys, so runs can share a store
  Millis timeout{30000};       // connect / operation timeout. Default 30 s.
  std::shared_ptr<KeyValue> embedded;  // the job's own store, for url "" / "tcp"
};

// Where a `--plan-store` URL points. kind: "embedded" ("" or "tcp"), "memory", "tcp" or
// "redis"; host and port for the last two.
struct PlanStoreAddress {
  std::string kind;
  std::string host;
  int port = 0;
};

// Parses without connecting (the launcher checks the URL before starting ranks). Throws
// InvalidArgument naming --plan-store for a malformed URL or one carrying a password.
PlanStoreAddress parse_plan_store_url(const std::string& url);

// Throws InvalidArgument naming --plan-store for a malformed URL.
std::unique_ptr<PlanStore> open_plan_store(const PlanStoreOptions& options);

}  // namespace dynapipe::runtime
