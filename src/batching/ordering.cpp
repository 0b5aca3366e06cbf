#include "dynapipe/batching/ordering.h"

#include <algorithm>
#include <numeric>

#include "costing.h"
#include "dynapipe/core/error.h"

namespace dynapipe {

std::vector<std::size_t> order_samples(std::span<const Sample> samples, ModelKind kind,
                                       std::int64_t bucket_tokens) {
  std::vector<std::size_t> order(samples.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (kind == ModelKind::Gpt) {
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const std::int64_t la = std::int64_t{samples[a].input_len} + samples[a].target_len;
      const std::int64_t lb = std::int64_t{samples[b].input_len} + samples[b].target_len;
      if (la != lb) return la > lb;
      return samples[a].id < samples[b].id;
    });
    return order;
  }

  DYNAPIPE_CHECK(bucket_tokens >= 1, cat("bucket_tokens ", bucket_tokens, " < 1"));
  auto bucket = [&](std::size_t k) {
    return (std::int64_t{samples[k].input_len} + bucket_tokens - 1) / bucket_tokens;
  };
  // Descending bucket, then target descending; odd buckets are reversed afterwards, which
  // turns every other bucket into target-ascending (the "snake").
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const std::int64_t ba = bucket(a), bb = bucket(b);
    if (ba != bb) return ba > bb;
    if (samples[a].target_len != samples[b].target_len) {
      return samples[a].target_len > samples[b].target_len;
    }
    if (samples[a].input_len != samples[b].input_len) {
      return samples[a].input_len > samples[b].input_len;
    }
    return samples[a].id < samples[b].id;
  });
  bool reverse = false;
  for (std::size_t begin = 0; begin < order.size();) {
    std::size_t end = begin + 1;
    while (end < order.size() && bucket(order[end]) == bucket(order[begin])) ++end;
    if (reverse) std::reverse(order.begin() + begin, order.begin() + end);
    reverse = !reverse;
    begin = end;
  }
  return order;
}

std::vector<std::size_t> order_packed_rows(std::span<const Sample> samples, ModelKind kind,
                                           std::int64_t enc_capacity, std::int64_t dec_capacity) {
  std::vector<std::size_t> all(samples.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  return detail::rows_in_sequence(
      detail::pack_best_fit_decreasing(samples, all, kind, enc_capacity, dec_capacity));
}

std::vector<std::size_t> order_lexicographic(std::span<const Sample> samples) {
  std::vector<std::size_t> order(samples.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (samples[a].input_len != samples[b].input_len) {
      return samples[a].input_len > samples[b].input_len;
    }
    if (samples[a].target_len != samples[b].target_len) {
      return samples[a].target_len > samples[b].target_len;
    }
    return samples[a].id < samples[b].id;
  });
  return order;
}

}  // namespace dynapipe
