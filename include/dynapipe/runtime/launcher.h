// Launcher: starts the ranks of a local job as processes and supervises them; and the
// torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) a rank joins by.
// Torch-free.
//
// Supervision: every rank's stderr is a pipe the launcher forwards (rank 0 verbatim, so a
// progress line keeps working; others line by line as "[rank R] ..."), remembering each
// rank's last line. When a rank exits non-zero or is killed, the launcher sends SIGTERM to
// the other ranks' process groups, SIGKILL after `kill_grace`, reaps them all and throws
// Error{PeerFailure} "rank R failed (exit status S): <its last stderr line>". A rank that
// only hangs is ended by its peers' communication timeouts (they fail and exit), or by
// `deadline`. The launcher never waits without a bound once a rank has failed.
//
//   launch_local({.command = {"/proc/self/exe", "train", ...}, .world_size = 4});
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dynapipe::runtime {

using Millis = std::chrono::milliseconds;

struct LaunchOptions {
  std::vector<std::string> command;  // argv of every rank; argv[0] searched in PATH
  int world_size = 1;                // ranks to start, >= 1
  std::string master_addr = "127.0.0.1";
  int master_port = 0;               // 0: pick a free port on master_addr
  std::vector<std::pair<std::string, std::string>> env;  // extra variables for every rank
  Millis kill_grace{5000};  // SIGTERM -> SIGKILL delay after a failure. Default 5 s.
  Millis deadline{0};       // bound on the whole job; 0 = none. Default none.
};

// Runs the job; returns when every rank exited 0. Throws PeerFailure (a rank failed),
// Timeout (deadline passed), InvalidArgument (empty command, world_size < 1).
void launch_local(const LaunchOptions& options);

// A free TCP port on 127.0.0.1 (bind to port 0 and release; racy only in theory).
int pick_free_port();

// The job a process belongs to, torchrun style.
struct DistributedEnv {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // Where rank 0's rendezvous store listens: DYNAPIPE_STORE_BIND_ADDR, else MASTER_ADDR
  // (never every interface unless asked for with 0.0.0.0 or ::).
  std::string store_bind_addr = "127.0.0.1";
};

// std::nullopt when RANK is not set (then `dynapipe train` launches the job itself).
// Throws InvalidArgument naming the variable when one is set but malformed or missing
// (RANK and WORLD_SIZE and MASTER_PORT must all be given; MASTER_ADDR defaults to
// 127.0.0.1; DYNAPIPE_STORE_BIND_ADDR to MASTER_ADDR).
std::optional<DistributedEnv> distributed_env_from_environment();

}  // namespace dynapipe::runtime
