// libFuzzer target: the model file reader (parse_model_spec) on arbitrary bytes.
// Properties: only dynapipe::Error escapes; an accepted model validates and
// round-trips (write, read again: the same spec).
#include <cstddef>
#include <cstdint>
#include <string>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/model_spec.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dynapipe;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ModelSpec spec = parse_model_spec(text, "fuzz");
    spec.validate();
    if (!(parse_model_spec(model_spec_to_json(spec), "fuzz (again)") == spec)) {
      fuzz::finding("model spec does not round-trip");
    }
  } catch (const Error&) {
  }
  return 0;
}
