// libFuzzer target: decode_iteration on arbitrary bytes.
// Properties: only dynapipe::Error escapes; the encoding is canonical, so an accepted
// input re-encodes to exactly the same bytes; the verifier never crashes on it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dynapipe/plan/plan_binary.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dynapipe;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    IterationPlan it = decode_iteration(bytes);
    if (encode_iteration(it) != bytes) fuzz::finding("binary encoding is not canonical");
    fuzz::verify_iteration(it, 1, 1);
  } catch (const Error&) {
  }
  return 0;
}
