// libFuzzer target: the profile reader (parse_profile) on arbitrary bytes.
// Properties: only dynapipe::Error escapes; an accepted profile round-trips exactly
// (write, read again, write: the same text).
#include <cstddef>
#include <cstdint>
#include <string>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/profile.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dynapipe;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Profile profile = parse_profile(text, "fuzz");
    const std::string once = profile_to_json(profile);
    if (profile_to_json(parse_profile(once, "fuzz (again)")) != once) {
      fuzz::finding("profile does not round-trip");
    }
  } catch (const Error&) {
  }
  return 0;
}
