// runtime/exec/host_allocator.h against jemalloc, linked into this binary as the dynapipe
// executable links it (its own binary: the runtime tests run on the C library's malloc).
#include <jemalloc/jemalloc.h>
#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "runtime/exec/host_allocator.h"

namespace dynapipe::runtime {
namespace {

ssize_t decay_ms(const std::string& name) {
  ssize_t ms = 0;
  std::size_t size = sizeof(ms);
  EXPECT_EQ(mallctl(name.c_str(), &ms, &size, nullptr, 0), 0) << name;
  return ms;
}

TEST(HostAllocatorTest, FindsJemalloc) { EXPECT_TRUE(host_allocator_is_jemalloc()); }

TEST(HostAllocatorTest, KeepTurnsDecayOffInEveryArenaAndReleaseRestoresIt) {
  ASSERT_TRUE(keep_freed_host_memory(true));
  EXPECT_EQ(decay_ms("arena.0.dirty_decay_ms"), -1);
  EXPECT_EQ(decay_ms("arena.0.muzzy_decay_ms"), -1);
  EXPECT_EQ(decay_ms("arenas.dirty_decay_ms"), -1);  // arenas made later
  ASSERT_TRUE(keep_freed_host_memory(false));
  EXPECT_EQ(decay_ms("arena.0.dirty_decay_ms"), 10000);
  EXPECT_EQ(decay_ms("arena.0.muzzy_decay_ms"), 0);
  EXPECT_EQ(decay_ms("arenas.dirty_decay_ms"), 10000);
}

// What the cache is for: freed pages stay resident for the next tensors until released.
TEST(HostAllocatorTest, FreedPagesStayResidentUntilReleased) {
  ASSERT_TRUE(keep_freed_host_memory(true));
  release_host_allocator_cache();
  const std::int64_t before = host_allocator_resident_bytes();
  ASSERT_GT(before, 0);
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  void* block = malloc(kBytes);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);  // touch every page
  free(block);
  EXPECT_GE(host_allocator_resident_bytes(), before + static_cast<std::int64_t>(kBytes) * 9 / 10);
  release_host_allocator_cache();
  EXPECT_LT(host_allocator_resident_bytes(), before + static_cast<std::int64_t>(kBytes) / 10);
  keep_freed_host_memory(false);
}

}  // namespace
}  // namespace dynapipe::runtime
