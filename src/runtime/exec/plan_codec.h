// How the runtime puts an IterationPlan on the wire of the plan store (plan/'s binary
// encoding), and validates what it reads back. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dynapipe/plan/execution_plan.h"

namespace dynapipe::runtime {

std::string encode_plan(const IterationPlan& plan);

// Throws Error{ParseError} "plan store: iteration I, rank R: <what>" when the bytes do
// not decode, or decode to another iteration.
IterationPlan decode_plan(std::string_view bytes, std::int64_t iteration, int rank);

}  // namespace dynapipe::runtime
