// Units used across the project. Times are double milliseconds (suffix _ms), memory is
// std::int64_t bytes (suffix _bytes), token counts are std::int64_t.
#pragma once

#include <cstdint>
#include <string>

namespace dynapipe {

inline constexpr std::int64_t kKiB = 1024;
inline constexpr std::int64_t kMiB = 1024 * kKiB;
inline constexpr std::int64_t kGiB = 1024 * kMiB;

inline double bytes_to_gib(std::int64_t bytes) { return static_cast<double>(bytes) / kGiB; }
inline std::int64_t gib_to_bytes(double gib) { return static_cast<std::int64_t>(gib * kGiB); }

// "40.0 GiB", for messages; below 0.1 GiB "8.3 MiB", below 0.1 MiB "5000 bytes".
std::string format_gib(std::int64_t bytes);

// Rounds n up to a multiple of `multiple` (multiple >= 1); 0 stays 0.
inline std::int64_t round_up(std::int64_t n, std::int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace dynapipe
