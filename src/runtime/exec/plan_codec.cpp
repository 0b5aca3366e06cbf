// The plan store carries plan/'s binary encoding (docs/plan-format.md, "Binary format"):
// compact, lossless, and validated on decode. Here it only gains the store's context.
#include "runtime/exec/plan_codec.h"

#include "dynapipe/core/error.h"
#include "dynapipe/plan/plan_binary.h"

namespace dynapipe::runtime {

std::string encode_plan(const IterationPlan& plan) { return encode_iteration(plan); }

IterationPlan decode_plan(std::string_view bytes, std::int64_t iteration, int rank) {
  IterationPlan plan;
  try {
    plan = decode_iteration(bytes);
  } catch (const Error& e) {
    throw Error(ErrorKind::ParseError, cat("plan store: iteration ", iteration, ", rank ", rank, ": ", e.what()));
  }
  if (plan.index != iteration)
    throw Error(ErrorKind::ParseError, cat("plan store: iteration ", iteration, ", rank ", rank,
                                           ": plan index must be ", iteration, ", got ", plan.index));
  return plan;
}

}  // namespace dynapipe::runtime
