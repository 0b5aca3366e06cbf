// KeyValue over Redis (hiredis). Torch-free. Every C handle is owned by a unique_ptr at
// first contact (H15).
#include <hiredis/hiredis.h>

#include <memory>
#include <mutex>

#include "dynapipe/core/error.h"
#include "dynapipe/runtime/plan_store.h"

namespace dynapipe::runtime {

namespace {

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

timeval to_timeval(Millis t) {
  return timeval{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
}

class RedisKeyValue : public KeyValue {
 public:
  RedisKeyValue(std::string host, int port, const std::string& password, Millis timeout)
      : where_(cat("redis ", host, ":", port)) {
    context_.reset(redisConnectWithTimeout(host.c_str(), port, to_timeval(timeout)));
    if (!context_ || context_->err) {
      throw Error(ErrorKind::PeerFailure,
                  cat(where_, ": cannot connect: ", context_ ? context_->errstr : "out of memory"));
    }
    redisSetTimeout(context_.get(), to_timeval(timeout));
    if (!password.empty()) {
      auto reply = command({"AUTH", password});
      if (reply->type == REDIS_REPLY_ERROR)
        throw Error(ErrorKind::PeerFailure, cat(where_, ": AUTH failed: ", reply->str));
    }
  }

  void set(const std::string& key, const std::string& value) override {
    check(command({"SET", key, value}), "SET");
  }
  std::optional<std::string> get(const std::string& key) override {
    auto reply = check(command({"GET", key}), "GET");
    if (reply->type == REDIS_REPLY_NIL) return std::nullopt;
    return std::string(reply->str, reply->len);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    auto reply = check(command({"INCRBY", key, std::to_string(delta)}), "INCRBY");
    return reply->integer;
  }
  bool erase(const std::string& key) override {
    return check(command({"DEL", key}), "DEL")->integer > 0;
  }

 private:
  // Binary-safe: every argument goes with its length (plans are bytes, not text).
  ReplyPtr command(std::initializer_list<std::string> args) {
    std::lock_guard lock(mutex_);
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    ReplyPtr reply(static_cast<redisReply*>(
        redisCommandArgv(context_.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!reply) {
      bool timed_out = context_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
      throw Error(timed_out ? ErrorKind::Timeout : ErrorKind::PeerFailure,
                  cat(where_, ": ", *args.begin(), " failed: ", context_->errstr));
    }
    return reply;
  }
  ReplyPtr check(ReplyPtr reply, const char* what) {
    if (reply->type == REDIS_REPLY_ERROR)
      throw Error(ErrorKind::PeerFailure, cat(where_, ": ", what, ": ", reply->str));
    return reply;
  }

  std::string where_;
  std::mutex mutex_;
  ContextPtr context_;
};

}  // namespace

std::unique_ptr<KeyValue> make_redis_key_value(const std::string& host, int port,
                                               const std::string& password, Millis timeout) {
  return std::make_unique<RedisKeyValue>(host, port, password, timeout);
}

}  // namespace dynapipe::runtime
