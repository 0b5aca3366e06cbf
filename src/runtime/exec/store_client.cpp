#include "runtime/exec/store_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "dynapipe/core/error.h"
#include "runtime/exec/store_wire.h"

namespace dynapipe::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using store_wire::Op;
using store_wire::Status;

// One connect attempt to any address of host:port; -1 when none accepts.
int try_connect(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    error = ::gai_strerror(rc);
    return -1;
  }
  int connected = -1;
  for (addrinfo* a = found; a != nullptr && connected < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      connected = fd;
    } else {
      error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  return connected;
}

}  // namespace

StoreClient::StoreClient(const std::string& host, int port, Millis connect_timeout)
    : where_(cat(host, ":", port)) {
  const auto deadline = Clock::now() + connect_timeout;
  std::string error = "no answer";
  while ((fd_ = try_connect(host, port, error)) < 0) {
    if (Clock::now() >= deadline)
      throw Error(ErrorKind::Timeout, cat("store at ", where_, " did not accept a connection within ",
                                          connect_timeout.count(), " ms (last error: ", error, ")"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string StoreClient::call(const std::string& frame) {
  std::lock_guard lock(mutex_);
  if (fd_ < 0) throw Error(ErrorKind::PeerFailure, cat("store at ", where_, ": connection lost earlier"));
  auto lost = [&](const std::string& why) -> Error {
    ::close(fd_);
    fd_ = -1;
    return Error(ErrorKind::PeerFailure, cat("store at ", where_, " ", why));
  };
  for (std::string_view rest = frame; !rest.empty();) {
    const ssize_t n = ::send(fd_, rest.data(), rest.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw lost(cat("refused the request: ", std::strerror(errno)));
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  // The server answers every request, waits included (it times them out itself), so the
  // response is read without a deadline of our own; a dead server closes the socket.
  std::string in;
  std::optional<std::size_t> length;
  char chunk[65536];
  while (!(length = store_wire::complete_frame(in))) {
    if (in.size() >= 4 && store_wire::frame_length(in) > store_wire::kMaxFrameBytes)
      throw lost("sent a malformed response");
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw lost("closed the connection (its host, rank 0, has stopped)");
    in.append(chunk, static_cast<std::size_t>(n));
  }
  if (*length != in.size()) throw lost("sent a malformed response");
  return in.substr(4);
}

namespace {

// The response's fields after an Ok status; Error(Timeout) for a Timeout status.
store_wire::Reader ok_fields(std::string&&, const std::string&) = delete;  // the Reader views the body
store_wire::Reader ok_fields(const std::string& body, const std::string& what) {
  store_wire::Reader in(body);
  auto status = in.u8();
  if (status == static_cast<std::uint8_t>(Status::Timeout))
    throw Error(ErrorKind::Timeout, cat("store: timed out waiting for ", what));
  if (status != static_cast<std::uint8_t>(Status::Ok))
    throw Error(ErrorKind::Internal, cat("store: unexpected status for ", what));
  return in;
}

template <typename T>
T field(std::optional<T> value, const std::string& what) {
  if (!value) throw Error(ErrorKind::Internal, cat("store: short response for ", what));
  return std::move(*value);
}

store_wire::Writer request(Op op) {
  store_wire::Writer w;
  w.u8(static_cast<std::uint8_t>(op));
  return w;
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace

void StoreClient::set(const std::string& key, const std::string& value) {
  const std::string body = call(request(Op::Set).str(key).str(value).frame());
  ok_fields(body, key);
}

std::string StoreClient::get(const std::string& key, Millis timeout) {
  const std::string body = call(request(Op::Get).str(key).i64(timeout.count()).frame());
  auto in = ok_fields(body, cat(key, " (", timeout.count(), " ms)"));
  return field(in.str(), key);
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t delta) {
  const std::string body = call(request(Op::Add).str(key).i64(delta).frame());
  auto in = ok_fields(body, key);
  return field(in.i64(), key);
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  auto w = request(Op::Check);
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const std::string body = call(w.frame());
  auto in = ok_fields(body, key_list(keys));
  return field(in.u8(), key_list(keys)) != 0;
}

bool StoreClient::erase(const std::string& key) {
  const std::string body = call(request(Op::Erase).str(key).frame());
  auto in = ok_fields(body, key);
  return field(in.u8(), key) != 0;
}

std::int64_t StoreClient::num_keys() {
  const std::string body = call(request(Op::NumKeys).frame());
  auto in = ok_fields(body, "the key count");
  return field(in.i64(), "the key count");
}

void StoreClient::wait(const std::vector<std::string>& keys, Millis timeout) {
  auto w = request(Op::Wait);
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.i64(timeout.count());
  const std::string body = call(w.frame());
  ok_fields(body, cat(key_list(keys), " (", timeout.count(), " ms)"));
}

std::string StoreClient::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  const std::string body = call(request(Op::CompareSet).str(key).str(expected).str(desired).frame());
  auto in = ok_fields(body, key);
  return field(in.str(), key);
}

}  // namespace dynapipe::runtime
