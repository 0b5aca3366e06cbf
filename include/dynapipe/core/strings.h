// Small string helpers shared by every module: cat() builds messages, join() lists.
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dynapipe {

// Concatenates the stream forms of its arguments: cat("got ", 3, " of ", 4.5).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// Joins the stream forms of a range with a separator: join(v, ", ").
template <typename Range>
std::string join(const Range& items, std::string_view separator) {
  std::ostringstream out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out << separator;
    out << item;
    first = false;
  }
  return out.str();
}

// Splits on a single character; empty fields are kept.
std::vector<std::string> split(std::string_view text, char separator);

}  // namespace dynapipe
