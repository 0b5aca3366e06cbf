// A fixed-size set of small integers as a bit vector: the predecessor, successor and
// down-set sets of the antichain enumeration, where intersections dominate the cost.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

namespace dynapipe::partition_detail {

class NodeSet {
 public:
  NodeSet() = default;
  explicit NodeSet(int size) : words_((size + 63) / 64, 0) {}

  void insert(int i) { words_[i >> 6] |= std::uint64_t{1} << (i & 63); }
  bool contains(int i) const { return (words_[i >> 6] >> (i & 63)) & 1; }
  void unite(const NodeSet& other) {
    for (std::size_t w = 0; w < words_.size(); ++w) words_[w] |= other.words_[w];
  }
  bool intersects(const NodeSet& other) const {
    for (std::size_t w = 0; w < words_.size(); ++w) {
      if (words_[w] & other.words_[w]) return true;
    }
    return false;
  }
  // Members in ascending order.
  std::vector<int> members() const {
    std::vector<int> out;
    for (std::size_t w = 0; w < words_.size(); ++w) {
      for (std::uint64_t bits = words_[w]; bits != 0; bits &= bits - 1) {
        out.push_back(static_cast<int>(w * 64 + std::countr_zero(bits)));
      }
    }
    return out;
  }

 private:
  std::vector<std::uint64_t> words_;
};

}  // namespace dynapipe::partition_detail
