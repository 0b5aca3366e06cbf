// The varlen rows' memory counts (ShapeCosts::most_in_flight()) against their definition.
#include "batching/costing.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dynapipe/core/rng.h"

namespace dynapipe::detail {
namespace {

// The largest k in [1, kManyInFlight] with k·held <= room (products in 128 bits), 0 for
// none: a binary search over k, no division.
std::uint32_t largest_k(std::int64_t held, std::int64_t room) {
  auto fits = [&](std::int64_t k) { return static_cast<__int128>(k) * held <= room; };
  if (!fits(1)) return 0;
  std::int64_t lo = 1, hi = kManyInFlight;  // fits(lo); the answer lies in [lo, hi]
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return static_cast<std::uint32_t>(lo);
}

// Held and peak bytes of `shapes` shapes of p stages: mostly the GiB range of the issue-8
// models, and every edge: held 0 or negative, room below held, quotients that sit exactly on
// an integer, one short of it, and past 2^32.
std::vector<std::int64_t> random_bytes(Rng& rng, std::size_t shapes, std::size_t p,
                                       const std::vector<std::int64_t>& room_base) {
  std::vector<std::int64_t> bytes(2 * p * shapes);
  for (std::size_t k = 0; k < shapes; ++k) {
    for (std::size_t s = 0; s < p; ++s) {
      std::int64_t& held = bytes[2 * p * k + s];
      std::int64_t& peak = bytes[2 * p * k + p + s];
      peak = rng.uniform_int(0, 4'000'000'000);
      held = rng.uniform_int(1, 8'000'000'000);
      const std::int64_t room = room_base[s] - peak;
      switch (rng.uniform_int(0, 7)) {
        case 0:
          held = 0;
          break;
        case 1:
          held = -rng.uniform_int(1, 1000);
          break;
        case 2:  // not even one
          held = room + rng.uniform_int(1, 1000);
          break;
        case 3:  // a quotient on an integer, or just past one
          if (room > 64) held = room / rng.uniform_int(1, 64);
          break;
        case 4:  // a quotient past 2^32
          held = rng.uniform_int(1, 3);
          break;
        case 5:  // a quotient just below 7
          if (room > 7) held = room / 7 + 1;
          break;
        default:
          break;
      }
    }
  }
  return bytes;
}

TEST(MostInFlightTest, EachCountIsTheLargestKThatFits) {
  Rng rng(11);
  const std::vector<std::int64_t> room_base = {40'000'000'000, 25'000'000'000, 7, -5};
  const std::size_t p = room_base.size(), shapes = 2000;
  const std::vector<std::int64_t> bytes = random_bytes(rng, shapes, p, room_base);
  std::vector<std::uint32_t> most(p * shapes);
  most_in_flight_counts(bytes, room_base, most);
  for (std::size_t k = 0; k < shapes; ++k) {
    for (std::size_t s = 0; s < p; ++s) {
      const std::int64_t held = bytes[2 * p * k + s];
      const std::int64_t room = room_base[s] - bytes[2 * p * k + p + s];
      ASSERT_EQ(most[p * k + s], largest_k(held, room)) << "held " << held << ", room " << room;
    }
  }
}

}  // namespace
}  // namespace dynapipe::detail
