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
  std::snprintf(buffer, sizeof buffer, "%.1f GiB", bytes_to_gib(bytes));
  return buffer;
}

}  // namespace dynapipe
