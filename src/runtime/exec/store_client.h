// A client of the job's rendezvous store (store_server.h): one connection, one request at
// a time (calls from several threads are serialised). Private to runtime/; no LibTorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace dynapipe::runtime {

class StoreClient {
 public:
  using Millis = std::chrono::milliseconds;
  // Connects to host:port, retrying until `connect_timeout` (rank 0 may not listen yet).
  // Throws Error(Timeout) naming host:port when nothing answers in time.
  StoreClient(const std::string& host, int port, Millis connect_timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits until `key` exists; Error(Timeout) after `timeout` (zero: no limit).
  std::string get(const std::string& key, Millis timeout);
  std::int64_t add(const std::string& key, std::int64_t delta);
  bool check(const std::vector<std::string>& keys);
  bool erase(const std::string& key);
  std::int64_t num_keys();
  // Waits until every key exists; Error(Timeout) after `timeout` (zero: no limit).
  void wait(const std::vector<std::string>& keys, Millis timeout);
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);

 private:
  // Sends one request frame and returns the response body (status byte first).
  std::string call(const std::string& frame);

  std::string where_;  // "host:port", for messages
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace dynapipe::runtime
