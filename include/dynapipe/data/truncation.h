// TruncationLimits and truncate_lengths(): how a sample that is too long is shortened.
// Samples are truncated, never dropped (docs/data.md), and the reader counts them.
//
//   GPT (decoder-only) trains on input ++ target, bounded together by max_seqlen:
//     target_len' = min(target_len, max_target_len, max_seqlen - 1)
//     input_len'  = min(input_len, max_seqlen - target_len')
//   T5 (encoder-decoder):
//     input_len'  = min(input_len, max_seqlen)
//     target_len' = min(target_len, max_target_len)
// GPT keeps at least one input token so that the first target token has a context;
// the target is cut first because it is the shorter side in multi-task data.
//
// Thread-safety: value types and pure functions.
//
//   TruncationLimits limits{.kind = ModelKind::Gpt, .max_seqlen = 512};
//   limits.validate();
//   TruncatedLengths t = truncate_lengths(600, 10, limits);  // {502, 10, truncated}
#pragma once

#include <cstdint>

#include "dynapipe/core/model_kind.h"

namespace dynapipe {

struct TruncationLimits {
  // Which model the samples feed. Default: Gpt.
  ModelKind kind = ModelKind::Gpt;
  // GPT: bound on input_len + target_len; T5: bound on input_len (encoder).
  // Default 2048 (the CLI's --max-seqlen). Range: GPT [2, 2^31), T5 [1, 2^31).
  std::int64_t max_seqlen = 2048;
  // Bound on target_len (T5: decoder). 0 means "same as max_seqlen" (the CLI's default).
  // Range: 0 or [1, 2^31).
  std::int64_t max_target_len = 0;

  // max_target_len with 0 resolved to max_seqlen.
  std::int64_t effective_max_target_len() const {
    return max_target_len > 0 ? max_target_len : max_seqlen;
  }
  // Throws Error(InvalidArgument) naming the field when a value is out of range.
  void validate() const;
};

struct TruncatedLengths {
  std::int64_t input_len = 0;
  std::int64_t target_len = 0;
  bool truncated = false;  // either length was shortened
  friend bool operator==(const TruncatedLengths&, const TruncatedLengths&) = default;
};

// Applies the rules above. REQUIRES: input_len >= 1, target_len >= 1, limits valid
// (checked with DYNAPIPE_CHECK: callers validate user input first).
TruncatedLengths truncate_lengths(std::int64_t input_len, std::int64_t target_len,
                                  const TruncationLimits& limits);

}  // namespace dynapipe
