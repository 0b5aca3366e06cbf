// DYNAPIPE_ALSO_AVX2: a function attribute that builds the function twice, for AVX2 and
// for the baseline x86-64 (SSE2), the loader picking the one the CPU runs (GCC's
// target_clones). For the planner's hottest numeric loops: wider vectors, and rounding
// (std::ceil) inlined instead of a libm call. AVX2 without FMA contracts no product
// into a sum, so both builds round every step alike and give the same values bit for
// bit. Elsewhere (other compilers or CPUs) it is empty, and under GCC's thread and
// address sanitizers too: their instrumented ifunc resolvers run before the sanitizer's
// runtime is set up and crash the process at load.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define DYNAPIPE_ALSO_AVX2 __attribute__((target_clones("avx2", "default")))
#else
#define DYNAPIPE_ALSO_AVX2
#endif
