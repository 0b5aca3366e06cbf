// Binary codec of one IterationPlan: the unit executors fetch through the plan store.
// Compact little-endian, magic "DPPL", a version, length-prefixed sections and LEB128
// varints (docs/plan-format.md, "Binary format").
//
//   std::string bytes = encode_iteration(iteration);
//   IterationPlan back = decode_iteration(bytes);   // lossless: same struct
//
// decode_iteration validates everything (magic, version, section lengths, enum values,
// counts against the bytes left, int ranges) and throws Error(ParseError) naming the
// section and byte offset; it never reads out of bounds, never allocates more than the
// input can describe, and trailing bytes are an error.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "dynapipe/plan/execution_plan.h"

namespace dynapipe {

inline constexpr char kPlanBinaryMagic[4] = {'D', 'P', 'P', 'L'};
inline constexpr int kPlanBinaryVersion = 2;  // 2: a recompute byte per micro-batch

std::string encode_iteration(const IterationPlan& iteration);
IterationPlan decode_iteration(std::string_view bytes);

}  // namespace dynapipe
