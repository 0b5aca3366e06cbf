// libFuzzer target: the samples reader (Dataset::load) on arbitrary bytes, plain or gzip.
// Properties: only dynapipe::Error escapes; an accepted file yields unique ids and
// lengths within the truncation limits, with truncated samples listed.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "dynapipe/core/error.h"
#include "dynapipe/data/dataset.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dynapipe;
  // The reader takes a path (it sniffs gzip by content): hand it an in-memory file.
  const int fd = memfd_create("samples", 0);
  if (fd < 0) return 0;
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const TruncationLimits limits{.kind = ModelKind::Gpt, .max_seqlen = 64, .max_target_len = 64};
  try {
    const Dataset dataset = Dataset::load(path, limits);
    std::set<SampleId> ids;
    for (const Sample& s : dataset.samples()) {
      if (!ids.insert(s.id).second) fuzz::finding("duplicate id accepted");
      if (s.input_len < 0 || s.target_len < 0 || s.input_len + s.target_len > 64) {
        fuzz::finding("sample outside the truncation limits");
      }
    }
  } catch (const Error&) {
  }
  close(fd);
  return 0;
}
