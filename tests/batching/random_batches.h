// Random global batches for batching tests: FLAN-like mixtures of tasks with log-normal
// input and target lengths, truncated to the limits. Deterministic per seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "dynapipe/core/rng.h"
#include "dynapipe/core/sample.h"

namespace dynapipe::testing {

inline GlobalBatch random_t5_batch(std::uint64_t seed, int count, std::int64_t max_seqlen,
                                   std::int64_t max_target_len) {
  static constexpr double kInputMedians[] = {40, 120, 300, 600, 900, 1500};
  static constexpr double kTargetMedians[] = {4, 60, 10, 200, 30, 120};
  Rng rng(seed);
  GlobalBatch batch;
  for (int k = 0; k < count; ++k) {
    const double input_median = kInputMedians[rng.uniform_int(0, 5)];
    const double target_median = kTargetMedians[rng.uniform_int(0, 5)];
    const auto draw = [&](double median, double sigma, std::int64_t limit) {
      const double x = std::exp(rng.normal(std::log(median), sigma));
      return static_cast<std::int32_t>(std::clamp<double>(std::floor(x), 1, static_cast<double>(limit)));
    };
    batch.samples.push_back({.id = k,
                             .input_len = draw(input_median, 0.6, max_seqlen),
                             .target_len = draw(target_median, 0.8, max_target_len)});
  }
  return batch;
}

// GPT: the same mixture, input + target truncated to max_seqlen (target first).
inline GlobalBatch random_gpt_batch(std::uint64_t seed, int count, std::int64_t max_seqlen) {
  GlobalBatch batch = random_t5_batch(seed, count, max_seqlen, max_seqlen);
  for (Sample& s : batch.samples) {
    s.target_len = std::min<std::int32_t>(s.target_len, static_cast<std::int32_t>(max_seqlen - 1));
    s.input_len = std::min<std::int32_t>(s.input_len,
                                         static_cast<std::int32_t>(max_seqlen) - s.target_len);
  }
  return batch;
}

}  // namespace dynapipe::testing
