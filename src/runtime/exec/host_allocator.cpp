#include "runtime/exec/host_allocator.h"

#include <dlfcn.h>

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <utility>

namespace dynapipe::runtime {

namespace {

// jemalloc's control interface, looked up at run time: the runtime library does not
// link jemalloc (tests and Python load it with the C library's malloc).
using Mallctl = int (*)(const char*, void*, std::size_t*, void*, std::size_t);

Mallctl mallctl_fn() {
  static const Mallctl fn = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
  return fn;
}

// jemalloc's MALLCTL_ARENAS_ALL: "every arena" in arena.<i>.* names.
constexpr unsigned kAllArenas = 4096;

}  // namespace

bool host_allocator_is_jemalloc() { return mallctl_fn() != nullptr; }

bool keep_freed_host_memory(bool keep) {
  const Mallctl mallctl = mallctl_fn();
  if (mallctl == nullptr) return false;
  // jemalloc's defaults: dirty pages decay over 10 s, muzzy ones at once.
  const std::pair<const char*, ssize_t> decays[] = {{"dirty_decay_ms", keep ? -1 : 10000},
                                                    {"muzzy_decay_ms", keep ? -1 : 0}};
  unsigned narenas = 0;
  std::size_t size = sizeof(narenas);
  if (mallctl("arenas.narenas", &narenas, &size, nullptr, 0) != 0) return false;
  for (auto [name, ms] : decays) {
    // Arenas made from now on, then each existing one (an index not yet in use fails:
    // it will be made with the new default).
    mallctl((std::string("arenas.") + name).c_str(), nullptr, nullptr, &ms, sizeof(ms));
    for (unsigned i = 0; i < narenas; ++i) {
      const std::string arena = "arena." + std::to_string(i) + "." + name;
      mallctl(arena.c_str(), nullptr, nullptr, &ms, sizeof(ms));
    }
  }
  return true;
}

std::int64_t host_allocator_resident_bytes() {
  const Mallctl mallctl = mallctl_fn();
  if (mallctl == nullptr) return 0;
  // Statistics are snapshots, refreshed by writing the epoch.
  std::uint64_t epoch = 1;
  std::size_t epoch_size = sizeof(epoch);
  if (mallctl("epoch", &epoch, &epoch_size, &epoch, epoch_size) != 0) return 0;
  std::size_t resident = 0;
  std::size_t size = sizeof(resident);
  if (mallctl("stats.resident", &resident, &size, nullptr, 0) != 0) return 0;
  return static_cast<std::int64_t>(resident);
}

void release_host_allocator_cache() {
  const Mallctl mallctl = mallctl_fn();
  if (mallctl == nullptr) return;
  const std::string name = "arena." + std::to_string(kAllArenas) + ".purge";
  mallctl(name.c_str(), nullptr, nullptr, nullptr, 0);
}

}  // namespace dynapipe::runtime
