// Local launcher and supervisor (torch-free): fork + exec, stderr forwarding, failure
// propagation with bounded shutdown.
#include "dynapipe/runtime/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dynapipe/core/error.h"

extern char** environ;

namespace dynapipe::runtime {

namespace {

using Clock = std::chrono::steady_clock;

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int err_fd = -1;        // read end of its stderr pipe (-1 once closed)
  std::string partial;    // stderr bytes after the last newline
  std::string last_line;  // last complete non-empty stderr line
  bool running = true;
  int status = 0;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return cat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return cat("killed by signal ", sig, " (", ::strsignal(sig), ")");
  }
  return cat("status ", status);
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

void write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    auto w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Reads what is available; forwards it; keeps the last line. Returns false at EOF.
bool pump(Rank& r) {
  char buffer[4096];
  auto n = ::read(r.err_fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!r.partial.empty()) {
      if (r.rank != 0) {
        auto line = cat("[rank ", r.rank, "] ", r.partial, "\n");
        write_all(2, line.data(), line.size());
      }
      r.last_line = r.partial;
      r.partial.clear();
    }
    return false;
  }
  if (r.rank == 0) write_all(2, buffer, static_cast<std::size_t>(n));
  r.partial.append(buffer, static_cast<std::size_t>(n));
  std::size_t newline;
  while ((newline = r.partial.find_first_of("\n\r")) != std::string::npos) {
    std::string line = r.partial.substr(0, newline);
    r.partial.erase(0, newline + 1);
    if (line.empty()) continue;
    if (r.rank != 0) {
      auto out = cat("[rank ", r.rank, "] ", line, "\n");
      write_all(2, out.data(), out.size());
    }
    r.last_line = line;
  }
  return true;
}

void signal_group(const Rank& r, int sig) {
  if (r.running && r.pid > 0) {
    ::kill(-r.pid, sig);  // its process group: the rank and anything it started
    ::kill(r.pid, sig);
  }
}

}  // namespace

int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(ErrorKind::Internal, cat("socket(): ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw Error(ErrorKind::Internal, cat("cannot pick a free port: ", std::strerror(errno)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// The ranks' environment without RANK / LOCAL_RANK: this process's, minus what the launch
// sets, plus options.env and the rendezvous variables.
std::vector<std::string> child_environment(const LaunchOptions& options, int port) {
  std::vector<std::string> env;
  auto overridden = [&](const std::string& name) {
    for (const char* n : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="})
      if (name.starts_with(n)) return true;
    for (const auto& [k, v] : options.env)
      if (name.starts_with(k + "=")) return true;
    return false;
  };
  for (char** e = environ; *e; ++e)
    if (!overridden(*e)) env.emplace_back(*e);
  for (const auto& [k, v] : options.env) env.push_back(k + "=" + v);
  env.push_back(cat("WORLD_SIZE=", options.world_size));
  env.push_back(cat("LOCAL_WORLD_SIZE=", options.world_size));
  env.push_back("MASTER_ADDR=" + options.master_addr);
  env.push_back(cat("MASTER_PORT=", port));
  return env;
}

// Forks and execs rank `rank` in its own process group, its stderr on a pipe we read.
// Everything exec needs is built before fork: the child may only call async-signal-safe
// functions (this process has threads). Throws Internal (the caller kills the others).
Rank spawn_rank(int rank, const std::vector<char*>& argv, std::vector<std::string> env) {
  env.push_back(cat("RANK=", rank));
  env.push_back(cat("LOCAL_RANK=", rank));
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(ErrorKind::Internal, cat("launcher: pipe(): ", std::strerror(errno)));
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw Error(ErrorKind::Internal, cat("launcher: fork(): ", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher died: do not outlive it
    if (::getppid() != parent) ::_exit(128 + SIGTERM);
    ::dup2(fds[1], 2);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char msg[] = "launcher: exec failed\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so a signal cannot race the child's call
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  return Rank{.rank = rank, .pid = pid, .err_fd = fds[0]};
}

// Forwards every rank's stderr for ~20 ms; closes the pipes that reached their end.
void pump_stderr(std::vector<Rank>& ranks) {
  std::vector<pollfd> fds;
  std::vector<Rank*> owners;
  for (auto& r : ranks)
    if (r.err_fd >= 0) {
      fds.push_back({r.err_fd, POLLIN, 0});
      owners.push_back(&r);
    }
  if (fds.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return;
  }
  ::poll(fds.data(), fds.size(), 20);
  for (std::size_t k = 0; k < fds.size(); ++k) {
    if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) && !pump(*owners[k])) {
      ::close(owners[k]->err_fd);
      owners[k]->err_fd = -1;
    }
  }
}

// Reaps the ranks that exited; returns those that failed on their own (not stopped by
// us after a failure), a killed rank before one that exited with an error because its
// peer vanished: within one poll round signals are the likelier root cause.
std::vector<int> reap_failures(std::vector<Rank>& ranks, bool stopping) {
  std::vector<int> exited_now;
  for (auto& r : ranks) {
    if (!r.running) continue;
    int status = 0;
    if (::waitpid(r.pid, &status, WNOHANG) == r.pid) {
      r.running = false;
      r.status = status;
      bool stopped_by_us = stopping && WIFSIGNALED(status) &&
                           (WTERMSIG(status) == SIGTERM || WTERMSIG(status) == SIGKILL);
      if (failed(status) && !stopped_by_us) exited_now.push_back(r.rank);
    }
  }
  std::stable_sort(exited_now.begin(), exited_now.end(), [&](int a, int b) {
    return WIFSIGNALED(ranks[a].status) && !WIFSIGNALED(ranks[b].status);
  });
  return exited_now;
}

// Whatever is left in the pipes once every rank is gone (bounded: a grandchild may hold
// a pipe open, so give up after a moment).
void drain_stderr(std::vector<Rank>& ranks) {
  auto drain_until = Clock::now() + std::chrono::milliseconds(200);
  for (auto& r : ranks) {
    while (r.err_fd >= 0 && Clock::now() < drain_until) {
      pollfd p{r.err_fd, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) break;
      if (!pump(r)) break;
    }
    if (r.err_fd >= 0) ::close(r.err_fd);
    r.err_fd = -1;
  }
}

// "rank 1 failed (killed by signal 9): <its last line>; then rank 0 (exit 1)".
std::string failure_message(const std::vector<Rank>& ranks, const std::vector<int>& failure_order) {
  auto describe = [&](int i) {
    const auto& r = ranks[i];
    auto s = cat("rank ", r.rank, " failed (", describe_status(r.status), ")");
    if (!r.last_line.empty()) s += ": " + r.last_line;
    return s;
  };
  std::string message = describe(failure_order[0]);
  std::vector<std::string> others;
  for (std::size_t k = 1; k < failure_order.size(); ++k) {
    // Ranks we terminated ourselves are consequences, not news.
    const auto& r = ranks[failure_order[k]];
    if (WIFSIGNALED(r.status) && (WTERMSIG(r.status) == SIGTERM || WTERMSIG(r.status) == SIGKILL)) continue;
    others.push_back(cat("rank ", r.rank, " (", describe_status(r.status), ")"));
  }
  if (!others.empty()) message += cat("; then ", join(others, ", "));
  return message;
}

}  // namespace

void launch_local(const LaunchOptions& options) {
  if (options.command.empty()) throw Error(ErrorKind::InvalidArgument, "launcher: command must not be empty");
  if (options.world_size < 1)
    throw Error(ErrorKind::InvalidArgument, cat("launcher: world size must be >= 1, got ", options.world_size));
  const int port = options.master_port > 0 ? options.master_port : pick_free_port();
  const std::vector<std::string> env = child_environment(options, port);
  std::vector<char*> argv;
  for (const auto& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  std::vector<Rank> ranks(options.world_size);
  auto kill_all = [&](int sig) {
    for (auto& r : ranks) signal_group(r, sig);
  };
  const auto start = Clock::now();
  for (int i = 0; i < options.world_size; ++i) {
    try {
      ranks[i] = spawn_rank(i, argv, env);
    } catch (const Error&) {
      kill_all(SIGKILL);
      throw;
    }
  }

  // Supervise: forward stderr; on the first failure (or the deadline) SIGTERM every
  // rank, then SIGKILL what is still running after the grace period.
  std::optional<Clock::time_point> failed_at;
  std::vector<int> failure_order;  // ranks in the order their failure was seen
  bool deadline_passed = false;
  while (true) {
    pump_stderr(ranks);
    for (int r : reap_failures(ranks, failed_at.has_value())) failure_order.push_back(r);
    bool any_running = false;
    for (auto& r : ranks) any_running |= r.running;
    if (!failure_order.empty() && !failed_at) {
      failed_at = Clock::now();
      kill_all(SIGTERM);
    }
    if (!failed_at && options.deadline.count() > 0 && Clock::now() - start > options.deadline) {
      deadline_passed = true;
      failed_at = Clock::now();
      kill_all(SIGTERM);
    }
    if (failed_at && any_running && Clock::now() - *failed_at > options.kill_grace) kill_all(SIGKILL);
    if (!any_running) break;
  }
  drain_stderr(ranks);

  if (deadline_passed && failure_order.empty())
    throw Error(ErrorKind::Timeout, cat("launcher: the job did not finish within ", options.deadline.count(),
                                        " ms; all ranks were stopped"));
  if (failure_order.empty()) return;
  throw Error(ErrorKind::PeerFailure, failure_message(ranks, failure_order));
}


std::optional<DistributedEnv> distributed_env_from_environment() {
  const char* rank = std::getenv("RANK");
  if (rank == nullptr) return std::nullopt;
  auto integer = [](const char* name, int lo, int hi) {
    const char* value = std::getenv(name);
    if (value == nullptr)
      throw Error(ErrorKind::InvalidArgument, cat(name, " must be set when RANK is set (torchrun-style launch)"));
    char* end = nullptr;
    long n = std::strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || n < lo || n > hi)
      throw Error(ErrorKind::InvalidArgument,
                  cat(name, " must be an integer in [", lo, ", ", hi, "], got \"", value, "\""));
    return static_cast<int>(n);
  };
  DistributedEnv env;
  env.world_size = integer("WORLD_SIZE", 1, 1 << 20);
  env.rank = integer("RANK", 0, env.world_size - 1);
  env.master_port = integer("MASTER_PORT", 1, 65535);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) env.master_addr = addr;
  env.store_bind_addr = env.master_addr;
  if (const char* bind = std::getenv("DYNAPIPE_STORE_BIND_ADDR"); bind && *bind) env.store_bind_addr = bind;
  return env;
}

}  // namespace dynapipe::runtime
