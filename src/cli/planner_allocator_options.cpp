// jemalloc's options for the planning executables (`dynapipe`, the planner benches), read
// at start-up where jemalloc is the process allocator (src/cli/CMakeLists.txt); MALLOC_CONF
// still overrides them. The planner's segment tables are many vectors that grow by doubling
// and are freed together at the end of a plan. jemalloc reuses a freed extent only for
// requests at least 1/64 of its size by default, so the next plan's small vectors mapped
// fresh pages beside the large freed ones: T5-11B pp 8 short256 plans with
// `--recompute per-microbatch` faulted ~5,000 pages each and ran 2x the C library's
// malloc's time (docs/RESULTS.md, "Planning on the executables' allocator"). Any fit
// ratio lets a freed extent serve them. Training (`dynapipe-torch`) keeps jemalloc's
// default, under which its tensors' memory was measured.
extern "C" {
// NOLINTNEXTLINE: the name and type are jemalloc's interface.
const char* malloc_conf = "lg_extent_max_active_fit:63";
}
