#include "runtime/exec/store_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include "dynapipe/core/error.h"
#include "runtime/exec/store_wire.h"

namespace dynapipe::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using store_wire::Op;
using store_wire::Status;

struct Connection {
  int fd = -1;
  std::string in;  // bytes received, not yet a whole frame
};

// A Get or Wait whose keys do not exist yet; answered when they do or at the deadline.
struct Parked {
  int fd = -1;
  Op op = Op::Wait;
  std::vector<std::string> keys;
  std::optional<Clock::time_point> deadline;  // none: wait as long as the client does
};

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

std::string reply(Status status) { return store_wire::Writer().u8(static_cast<std::uint8_t>(status)).frame(); }

std::optional<Clock::time_point> deadline_after(std::int64_t timeout_ms) {
  if (timeout_ms <= 0) return std::nullopt;  // c10d's kNoTimeout
  return Clock::now() + std::chrono::milliseconds(timeout_ms);
}

}  // namespace

struct StoreServer::State {
  std::map<std::string, std::string> data;
  std::vector<Connection> connections;
  std::vector<Parked> parked;

  bool has_all(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.contains(k); });
  }

  std::string ready_reply(const Parked& p) const {
    store_wire::Writer w;
    w.u8(static_cast<std::uint8_t>(Status::Ok));
    if (p.op == Op::Get) w.str(data.at(p.keys.front()));
    return w.frame();
  }

  // Answers the parked requests whose keys now exist. Returns the fds whose send failed.
  void wake(std::vector<int>& broken) {
    std::erase_if(parked, [&](const Parked& p) {
      if (!has_all(p.keys)) return false;
      if (!send_all(p.fd, ready_reply(p))) broken.push_back(p.fd);
      return true;
    });
  }

  void expire(Clock::time_point now, std::vector<int>& broken) {
    std::erase_if(parked, [&](const Parked& p) {
      if (!p.deadline || *p.deadline > now) return false;
      if (!send_all(p.fd, reply(Status::Timeout))) broken.push_back(p.fd);
      return true;
    });
  }

  // Handles one request frame body from `fd`. Returns false for a malformed request (the
  // connection is then closed: a client of ours never sends one).
  bool handle(int fd, std::string_view body, std::vector<int>& broken) {
    store_wire::Reader in(body);
    auto op_byte = in.u8();
    if (!op_byte || *op_byte > store_wire::kLastOp) return false;
    const Op op = static_cast<Op>(*op_byte);
    store_wire::Writer out;
    out.u8(static_cast<std::uint8_t>(Status::Ok));
    bool changed = false;
    switch (op) {
      case Op::Set: {
        auto key = in.str(), value = in.str();
        if (!key || !value || !in.done()) return false;
        data[*key] = std::move(*value);
        changed = true;
        break;
      }
      case Op::Get:
      case Op::Wait: {
        std::vector<std::string> keys;
        if (op == Op::Get) {
          auto key = in.str();
          if (!key) return false;
          keys.push_back(std::move(*key));
        } else {
          auto n = in.u32();
          if (!n) return false;
          for (std::uint32_t i = 0; i < *n; ++i) {
            auto key = in.str();
            if (!key) return false;
            keys.push_back(std::move(*key));
          }
        }
        auto timeout_ms = in.i64();
        if (!timeout_ms || !in.done()) return false;
        Parked p{.fd = fd, .op = op, .keys = std::move(keys), .deadline = deadline_after(*timeout_ms)};
        if (!has_all(p.keys)) {
          parked.push_back(std::move(p));
          return true;
        }
        if (!send_all(fd, ready_reply(p))) broken.push_back(fd);
        return true;
      }
      case Op::Add: {
        auto key = in.str();
        auto delta = in.i64();
        if (!key || !delta || !in.done()) return false;
        std::int64_t value = 0;
        if (auto it = data.find(*key); it != data.end()) {
          const std::string& text = it->second;
          auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
          if (ec != std::errc() || end != text.data() + text.size()) return false;
        }
        value += *delta;
        data[*key] = std::to_string(value);
        out.i64(value);
        changed = true;
        break;
      }
      case Op::Check: {
        auto n = in.u32();
        if (!n) return false;
        bool all = true;
        for (std::uint32_t i = 0; i < *n; ++i) {
          auto key = in.str();
          if (!key) return false;
          all = all && data.contains(*key);
        }
        if (!in.done()) return false;
        out.u8(all ? 1 : 0);
        break;
      }
      case Op::Erase: {
        auto key = in.str();
        if (!key || !in.done()) return false;
        out.u8(data.erase(*key) > 0 ? 1 : 0);
        break;
      }
      case Op::NumKeys:
        if (!in.done()) return false;
        out.i64(static_cast<std::int64_t>(data.size()));
        break;
      case Op::CompareSet: {
        auto key = in.str(), expected = in.str(), desired = in.str();
        if (!key || !expected || !desired || !in.done()) return false;
        auto it = data.find(*key);
        if (it == data.end()) {
          // c10d: a missing key is set only when the expected value is empty.
          if (expected->empty()) {
            data[*key] = *desired;
            changed = true;
            out.str(*desired);
          } else {
            out.str(*expected);
          }
        } else {
          if (it->second == *expected) {
            it->second = *desired;
            changed = true;
          }
          out.str(it->second);
        }
        break;
      }
    }
    if (!send_all(fd, out.frame())) broken.push_back(fd);
    if (changed) wake(broken);
    return true;
  }

  // Reads what `c` has sent and handles each whole frame. False: close the connection.
  bool receive(Connection& c, std::vector<int>& broken) {
    char chunk[65536];
    const ssize_t n = ::recv(c.fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) return true;
    if (n <= 0) return false;
    c.in.append(chunk, static_cast<std::size_t>(n));
    while (true) {
      if (c.in.size() >= 4 && store_wire::frame_length(c.in) > store_wire::kMaxFrameBytes) return false;
      auto length = store_wire::complete_frame(c.in);
      if (!length) return true;
      if (!handle(c.fd, std::string_view(c.in).substr(4, *length - 4), broken)) return false;
      c.in.erase(0, *length);
    }
  }

  void close_connection(int fd) {
    std::erase_if(parked, [&](const Parked& p) { return p.fd == fd; });
    std::erase_if(connections, [&](const Connection& c) { return c.fd == fd; });
    ::close(fd);
  }

  // Milliseconds until the earliest deadline of a parked request, -1 when none.
  int poll_timeout_ms() const {
    std::optional<Clock::time_point> first;
    for (const Parked& p : parked)
      if (p.deadline && (!first || *p.deadline < *first)) first = p.deadline;
    if (!first) return -1;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(*first - Clock::now()).count();
    return static_cast<int>(std::clamp<std::int64_t>(ms, 0, 60'000));
  }
};

StoreServer::StoreServer(const std::string& host, int port) : state_(std::make_unique<State>()) {
  const std::string where = cat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    throw Error(ErrorKind::InvalidArgument, cat("cannot listen on ", where, ": ", ::gai_strerror(rc)));
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      listen_fd_ = fd;
    } else {
      last_error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0)
    throw Error(ErrorKind::InvalidArgument, cat("cannot listen on ", where, ": ", last_error));

  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  char name[NI_MAXHOST], service[NI_MAXSERV];
  ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), length, name, sizeof name, service, sizeof service,
                NI_NUMERICHOST | NI_NUMERICSERV);
  address_ = name;
  port_ = std::stoi(service);
  if (::pipe2(wake_fds_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    throw Error(ErrorKind::Internal, cat("store: pipe(): ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { serve(); });
}

StoreServer::~StoreServer() {
  const char stop = 1;
  [[maybe_unused]] auto ignored = ::write(wake_fds_[1], &stop, 1);
  if (thread_.joinable()) thread_.join();
  for (const Connection& c : state_->connections) ::close(c.fd);
  ::close(listen_fd_);
  ::close(wake_fds_[0]);
  ::close(wake_fds_[1]);
}

void StoreServer::serve() {
  State& s = *state_;
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({.fd = wake_fds_[0], .events = POLLIN, .revents = 0});
    fds.push_back({.fd = listen_fd_, .events = POLLIN, .revents = 0});
    for (const Connection& c : s.connections) fds.push_back({.fd = c.fd, .events = POLLIN, .revents = 0});
    if (::poll(fds.data(), fds.size(), s.poll_timeout_ms()) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    std::vector<int> broken;
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = std::find_if(s.connections.begin(), s.connections.end(),
                             [&](const Connection& c) { return c.fd == fds[i].fd; });
      if (it != s.connections.end() && !s.receive(*it, broken)) broken.push_back(fds[i].fd);
    }
    s.expire(Clock::now(), broken);
    std::sort(broken.begin(), broken.end());
    broken.erase(std::unique(broken.begin(), broken.end()), broken.end());
    for (int fd : broken) s.close_connection(fd);
    if (fds[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        s.connections.push_back({.fd = fd, .in = {}});
      }
    }
  }
}

}  // namespace dynapipe::runtime
