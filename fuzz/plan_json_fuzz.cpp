// libFuzzer target: plan_from_json / iteration_from_json on arbitrary bytes.
// Properties: only dynapipe::Error escapes; a decoded plan re-encodes to a fixed point
// (to_json(from_json(to_json(p))) == to_json(p)); the verifier never crashes on it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dynapipe/plan/plan_json.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dynapipe;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    ExecutionPlan plan = plan_from_json(text, "fuzz");
    std::string once = plan_to_json(plan, -1);
    if (plan_to_json(plan_from_json(once, "fuzz"), -1) != once) fuzz::finding("plan JSON is not a fixed point");
    for (const IterationPlan& it : plan.iterations) fuzz::verify_iteration(it, plan.config.pp, plan.config.chunks);
  } catch (const Error&) {
  }
  for (ModelKind model : {ModelKind::Gpt, ModelKind::T5}) {
    try {
      IterationPlan it = iteration_from_json(text, model, "fuzz");
      std::string once = iteration_to_json(it, model, -1);
      if (iteration_to_json(iteration_from_json(once, model, "fuzz"), model, -1) != once) {
        fuzz::finding("iteration JSON is not a fixed point");
      }
    } catch (const Error&) {
    }
  }
  return 0;
}
