// The process allocator's cache of freed memory, when that allocator is jemalloc (the
// dynapipe executable links it, docs/runtime.md "Host memory"). Tensors of a varlen plan
// change shape every micro-batch; an allocator that hands freed pages back to the OS
// makes every new tensor fault its pages in again, and on the development VM that was
// 43% of a training run's CPU time. Training keeps freed pages instead (like a GPU
// caching allocator) and releases them when a rank nears its memory limit. Without
// jemalloc these calls do nothing.
#pragma once

#include <cstdint>

namespace dynapipe::runtime {

// True when jemalloc serves this process.
bool host_allocator_is_jemalloc();

// keep: freed pages stay with the allocator for the next tensors (no decay, in every
// arena now and later), as a GPU caching allocator keeps freed blocks; !keep: jemalloc's
// own decay hands them back to the OS within seconds. Returns false without jemalloc.
bool keep_freed_host_memory(bool keep);

// Bytes the allocator holds in pages it has mapped and touched (jemalloc's
// stats.resident: live allocations, its metadata and its cache of freed pages); 0
// without jemalloc.
std::int64_t host_allocator_resident_bytes();

// Hands every cached freed page of every arena back to the OS.
void release_host_allocator_cache();

}  // namespace dynapipe::runtime
