#include "dynapipe/data/truncation.h"

#include <algorithm>
#include <limits>

#include "dynapipe/core/error.h"

namespace dynapipe {

namespace {
// Sample stores lengths as int32; every bound must fit so truncated lengths do.
constexpr std::int64_t kMaxLimit = std::numeric_limits<std::int32_t>::max();
}  // namespace

void TruncationLimits::validate() const {
  const std::int64_t min_seqlen = kind == ModelKind::Gpt ? 2 : 1;
  if (max_seqlen < min_seqlen || max_seqlen > kMaxLimit) {
    throw Error(ErrorKind::InvalidArgument,
                cat("max_seqlen must be in [", min_seqlen, ", ", kMaxLimit, "] for ",
                    model_kind_name(kind), " (one input and one target token), got ",
                    max_seqlen));
  }
  if (max_target_len < 0 || max_target_len > kMaxLimit) {
    throw Error(ErrorKind::InvalidArgument,
                cat("max_target_len must be 0 (same as max_seqlen) or in [1, ", kMaxLimit,
                    "], got ", max_target_len));
  }
}

TruncatedLengths truncate_lengths(std::int64_t input_len, std::int64_t target_len,
                                  const TruncationLimits& limits) {
  DYNAPIPE_CHECK(input_len >= 1 && target_len >= 1,
                 cat("lengths must be >= 1, got ", input_len, " and ", target_len));
  TruncatedLengths out;
  const std::int64_t max_target = limits.effective_max_target_len();
  if (limits.kind == ModelKind::Gpt) {
    DYNAPIPE_CHECK(limits.max_seqlen >= 2, cat("GPT max_seqlen ", limits.max_seqlen));
    out.target_len = std::min({target_len, max_target, limits.max_seqlen - 1});
    out.input_len = std::min(input_len, limits.max_seqlen - out.target_len);
  } else {
    DYNAPIPE_CHECK(limits.max_seqlen >= 1, cat("T5 max_seqlen ", limits.max_seqlen));
    out.input_len = std::min(input_len, limits.max_seqlen);
    out.target_len = std::min(target_len, max_target);
  }
  out.truncated = out.input_len != input_len || out.target_len != target_len;
  return out;
}

}  // namespace dynapipe
