#include "dynapipe/core/strings.h"

#include <cstdio>

#include "dynapipe/core/units.h"

namespace dynapipe {

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(separator, start);
    if (end == std::string_view::npos) {
      parts.emplace_back(text.substr(start));
      return parts;
    }
    parts.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
}

std::string format_gib(std::int64_t bytes) {
  char buffer[48];
  // Below 0.1 GiB one decimal of GiB reads "0.0" (tiny models, a mistyped limit): MiB then.
  const std::int64_t magnitude = bytes < 0 ? -bytes : bytes;
  if (magnitude >= kGiB / 10 || bytes == 0) {
    std::snprintf(buffer, sizeof buffer, "%.1f GiB", bytes_to_gib(bytes));
  } else if (magnitude >= kMiB / 10) {
    std::snprintf(buffer, sizeof buffer, "%.1f MiB", static_cast<double>(bytes) / kMiB);
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld bytes", static_cast<long long>(bytes));
  }
  return buffer;
}

}  // namespace dynapipe
