// Shared by the plan fuzz targets: verify every replica of a decoded iteration with
// options derived from the data (bounded, so garbage cannot make the verifier allocate
// much), swallowing dynapipe::Error. Anything else escaping is a finding.
#pragma once

#include <algorithm>
#include <cstdlib>

#include "dynapipe/core/error.h"
#include "dynapipe/plan/execution_plan.h"
#include "dynapipe/plan/verifier.h"

namespace dynapipe::fuzz {

inline void verify_iteration(const IterationPlan& it, int pp_hint, int chunks_hint) {
  for (const ReplicaPlan& r : it.replicas) {
    int devices = std::max(1, pp_hint), max_stage = 0;
    for (const ExecutorProgram& p : r.executors) {
      devices = std::max(devices, p.device + 1);
      for (const Instruction& in : p.instructions) max_stage = std::max(max_stage, in.stage);
    }
    int chunks = std::max(std::max(1, chunks_hint), max_stage / std::max(devices, 1) + 1);
    long long cells = 1LL * devices * chunks * std::max<std::size_t>(r.microbatches.size(), 1) *
                      std::max<std::size_t>(r.executors.size(), 1);
    if (devices > 64 || chunks > 64 || cells > 1000000) continue;
    VerifyOptions options;
    options.layout = {.num_devices = devices, .chunks = chunks};
    options.num_microbatches = static_cast<int>(std::max<std::size_t>(r.microbatches.size(), 1));
    options.error_kind = ErrorKind::InvalidArgument;
    try {
      verify_programs(r.executors, options);
    } catch (const Error&) {
    }
  }
}

[[noreturn]] inline void finding(const char* what) {
  __builtin_printf("FUZZ FINDING: %s\n", what);
  std::abort();
}

}  // namespace dynapipe::fuzz
