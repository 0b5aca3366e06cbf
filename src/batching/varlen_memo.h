// Private to batching/: costs of varlen segments, kept across DP runs. A segment's time
// and per-stage memory (the most micro-batches in flight each stage holds of it) depend on
// its samples, the recompute mode and the memory limit only, not on the memory rule or the
// bubble weight, so the planner's several DPs over one batch (memory rules of different
// schedules, a line search on the bubble weight) share them (BatchingCache).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <memory_resource>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "dynapipe/core/error.h"
#include "dynapipe/core/model_kind.h"
#include "dynapipe/core/strategy.h"
#include "costing.h"
#include "dynapipe/batching/ordering.h"

namespace dynapipe::detail {

// A growable array of trivially copyable T in a monotonic arena, which frees all of it at
// once: appends copy whole ranges (a std::pmr::vector constructs each element through its
// allocator, which made the rows' appends ~4% of a GPT-6.7B pp 4 short256 plan). A block
// it outgrows stays in the arena until the plan ends, as a pmr vector's did.
template <typename T>
class ArenaArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  explicit ArenaArray(std::pmr::monotonic_buffer_resource* arena) : arena_(arena) {}
  ArenaArray(ArenaArray&& other) noexcept
      : arena_(other.arena_), data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)), capacity_(std::exchange(other.capacity_, 0)) {}
  ArenaArray(const ArenaArray&) = delete;
  ArenaArray& operator=(const ArenaArray&) = delete;
  ArenaArray& operator=(ArenaArray&&) = delete;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const T* data() const { return data_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  const T& back() const { return data_[size_ - 1]; }

  void reserve(std::size_t capacity) {
    if (capacity <= capacity_) return;
    T* grown = static_cast<T*>(arena_->allocate(capacity * sizeof(T), alignof(T)));
    if (size_ > 0) std::memcpy(grown, data_, size_ * sizeof(T));
    data_ = grown;
    capacity_ = capacity;
  }
  void append(std::span<const T> values) {
    if (size_ + values.size() > capacity_) reserve(std::max(2 * capacity_, size_ + values.size()));
    if (!values.empty()) std::memcpy(data_ + size_, values.data(), values.size() * sizeof(T));
    size_ += values.size();
  }

 private:
  std::pmr::monotonic_buffer_resource* arena_;
  T* data_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
};

// Rows of one ordered sequence under one recompute mode. Row i holds the segments
// [i, i + 1), [i, i + 2), ... as far as some scan needed them.
struct VarlenRows {
  struct Row {
    explicit Row(std::pmr::monotonic_buffer_resource* arena)
        : time_ms(arena), most_in_flight(arena) {}
    ArenaArray<double> time_ms;  // per segment: max over stages of fwd + bwd
    // Per segment, per stage: ShapeCosts::most_in_flight(), what every memory rule checks.
    // A quarter of the held and peak bytes it is made from: the rows are the plan's
    // largest writes (GPT-6.7B pp 4 short256: ~56,000 segment-modes per plan).
    ArenaArray<std::uint32_t> most_in_flight;
    std::int64_t enc = 0, dec = 0;   // running sums of the last segment costed
    double enc_squares = 0, dec_squares = 0;
    // time_ms is non-decreasing so far: a scan's stop by time is a binary search.
    bool sorted = true;

    // Adds the next sample to the running sums (the segment one longer).
    void grow(std::int64_t enc_len, std::int64_t dec_len, std::size_t stride) {
      if (time_ms.empty()) {  // rows grow one segment at a time: skip the small regrowths
        constexpr std::size_t kFirstSegments = 32;
        time_ms.reserve(kFirstSegments);
        most_in_flight.reserve(kFirstSegments * stride);
      }
      enc += enc_len;
      dec += dec_len;
      enc_squares += static_cast<double>(enc_len) * static_cast<double>(enc_len);
      dec_squares += static_cast<double>(dec_len) * static_cast<double>(dec_len);
    }
    // Appends the costs of the next segments (the sums, grown that far, describe the
    // last): their times and, for each, its `most.size() / times.size()` stages' most in
    // flight.
    void append(std::span<const double> times, std::span<const std::uint32_t> most) {
      double last = time_ms.empty() ? -std::numeric_limits<double>::infinity() : time_ms.back();
      for (const double t : times) {
        if (!(last <= t)) sorted = false;
        last = t;
      }
      time_ms.append(times);
      most_in_flight.append(most);
    }
  };
  std::vector<std::size_t> sequence;    // the samples, in order (identifies the rows)
  Recompute recompute = Recompute::None;
  std::int64_t memory_limit_bytes = 0;  // what most_in_flight counts against
  // The rows of the same sequence under each mode (this one included), indexed by
  // Recompute: a scan costs a segment for none and selective together (VarlenScanner).
  std::array<VarlenRows*, 3> by_mode{};
  // A sample alone did not fit under this mode (some memory rule): its DPs end before
  // scanning, so the other modes stop costing its segments along (a speed hint only).
  bool sample_too_large = false;
  // Where the rows' storage comes from: their store's arena, kept alive by every VarlenRows
  // that uses it (VarlenMemoStore::absorb() moves rows to another store). Declared before
  // `rows`, so that it outlives them.
  std::shared_ptr<std::pmr::monotonic_buffer_resource> arena;
  std::vector<Row> rows;
  // The cuts (micro-batch starts) earlier DPs chose on this sequence: under another
  // rule or weight each is still a partition whose objective bounds the optimum.
  std::vector<std::vector<int>> cuts;
  // Per memory rule (ShapeCosts::rule_key()), per row: how far the row's segments fit.
  struct Fit {
    std::size_t known = 0;  // this many leading segments of the row fit under the rule
    bool closed = false;    // and the next one does not
  };
  std::deque<std::pair<std::vector<std::int64_t>, std::vector<Fit>>> fits;  // stable references

  std::vector<Fit>& fits_for(const std::vector<std::int64_t>& rule_key) {
    for (auto& [key, per_row] : fits) {
      if (key == rule_key) return per_row;
    }
    fits.emplace_back(rule_key, std::vector<Fit>(rows.size()));
    return fits.back().second;
  }
};

// Every VarlenRows of one batch and cost model; found by sequence and recompute mode.
struct VarlenMemoStore {
  const void* batch = nullptr;        // identity checks: a store serves one batch and
  const void* cost_model = nullptr;   // one cost model
  // The rows' storage, freed all at once with the store's rows: they are thousands of
  // arrays that grow by doubling (~2,700 rows of up to ~100 segments for ~540 samples)
  // and are all dropped together at the end of a plan. From the process allocator they
  // cost ~1,100 instructions per allocation and ~500 per free: ~7% of a GPT-6.7B pp 4
  // short256 plan and ~6% of a T5-11B pp 8 one; from an arena, a pointer bump. The
  // space an array gives up as it grows stays in the arena until the plan ends (at most
  // about as much again as the rows hold).
  std::shared_ptr<std::pmr::monotonic_buffer_resource> arena;
  std::vector<std::unique_ptr<VarlenRows>> entries;
  // Best-fit decreasing packings (pack_best_fit_decreasing()) by members and capacities:
  // packing-varlen's DP under every rule and mode and dynapipe's packed-rows order pack the
  // same samples the same way (GPT-6.7B pp 4 short256: 16 packings per plan, one distinct).
  struct Packing {
    std::vector<std::size_t> members;
    ModelKind kind = ModelKind::Gpt;
    std::int64_t enc_capacity = 0, dec_capacity = 0;
    std::vector<PackedRow> rows;
    bool packs(std::span<const std::size_t> m, ModelKind k, std::int64_t enc, std::int64_t dec) const {
      return kind == k && enc_capacity == enc && dec_capacity == dec && std::ranges::equal(members, m);
    }
  };
  std::deque<Packing> packings;  // stable references
  // The sorted orders (order_samples()) by model kind and bucket: every make_microbatches()
  // call of a plan sorts the same samples.
  struct SortedOrder {
    ModelKind kind = ModelKind::Gpt;
    std::int64_t bucket_tokens = 0;
    std::vector<std::size_t> order;
    bool sorts(ModelKind k, std::int64_t bucket) const { return kind == k && bucket_tokens == bucket; }
  };
  std::deque<SortedOrder> sorted_orders;  // stable references
  // Per recompute mode: the parts of the recompute lower bound (batching.cpp).
  struct Bound {
    bool valid = false;      // merged_ms and the token sums
    double merged_ms = 0;    // every sample in one varlen micro-batch
    TokenTotals tokens;      // over the samples (for the affine bound)
    bool has_slowest = false;
    double slowest_ms = 0;   // the slowest sample alone
  };
  std::array<Bound, 3> bounds{};
  // The (memory limit, strategy) whose "every sample fits alone" check passed.
  std::pair<std::int64_t, Strategy> alone_checked{-1, Strategy::DynaPipe};
  // The length limits under which the samples passed check_samples() (batching.cpp).
  struct SampleLimits {
    ModelKind kind = ModelKind::Gpt;
    std::int64_t max_seqlen = -1, max_target_len = -1;
    friend bool operator==(const SampleLimits&, const SampleLimits&) = default;
  };
  SampleLimits samples_checked;

  VarlenRows& rows_for(std::span<const std::size_t> sequence, Recompute recompute,
                       std::int64_t memory_limit_bytes) {
    for (const auto& e : entries) {
      if (e->recompute == recompute && e->memory_limit_bytes == memory_limit_bytes &&
          std::equal(e->sequence.begin(), e->sequence.end(), sequence.begin(), sequence.end())) {
        return *e;
      }
    }
    // Every mode's rows at once, linked (VarlenRows::by_mode).
    if (arena == nullptr) {
      constexpr std::size_t kFirstBlockBytes = std::size_t{1} << 18;  // doubling from there
      arena = std::make_shared<std::pmr::monotonic_buffer_resource>(kFirstBlockBytes);
    }
    std::array<VarlenRows*, 3> created{};
    for (std::size_t m = 0; m < created.size(); ++m) {
      auto e = std::make_unique<VarlenRows>();
      e->sequence.assign(sequence.begin(), sequence.end());
      e->recompute = static_cast<Recompute>(m);
      e->memory_limit_bytes = memory_limit_bytes;
      e->arena = arena;
      e->rows.reserve(sequence.size());
      for (std::size_t i = 0; i < sequence.size(); ++i) e->rows.emplace_back(arena.get());
      created[m] = e.get();
      entries.push_back(std::move(e));
    }
    for (VarlenRows* e : created) e->by_mode = created;
    return *created[static_cast<std::size_t>(recompute)];
  }

  // pack_best_fit_decreasing(samples, members, kind, enc_capacity, dec_capacity), packed once
  // per store.
  const std::vector<PackedRow>& best_fit_rows(std::span<const Sample> samples,
                                              std::span<const std::size_t> members, ModelKind kind,
                                              std::int64_t enc_capacity, std::int64_t dec_capacity) {
    for (const Packing& p : packings) {
      if (p.packs(members, kind, enc_capacity, dec_capacity)) return p.rows;
    }
    packings.push_back({.members = {members.begin(), members.end()},
                        .kind = kind,
                        .enc_capacity = enc_capacity,
                        .dec_capacity = dec_capacity,
                        .rows = pack_best_fit_decreasing(samples, members, kind, enc_capacity, dec_capacity)});
    return packings.back().rows;
  }

  // order_samples(samples, kind, bucket_tokens), sorted once per store.
  const std::vector<std::size_t>& sorted_order(std::span<const Sample> samples, ModelKind kind,
                                               std::int64_t bucket_tokens) {
    for (const SortedOrder& o : sorted_orders) {
      if (o.sorts(kind, bucket_tokens)) return o.order;
    }
    sorted_orders.push_back(
        {.kind = kind, .bucket_tokens = bucket_tokens, .order = order_samples(samples, kind, bucket_tokens)});
    return sorted_orders.back().order;
  }

  // Takes `other`'s rows of the sequences this store has none of (each sequence's modes
  // together, as rows_for() made them), its packings and sorted orders likewise, and its
  // bounds and check where this store has none.
  // REQUIRES: both serve the same batch and cost model, or one serves none yet.
  void absorb(VarlenMemoStore&& other) {
    DYNAPIPE_CHECK(batch == nullptr || other.batch == nullptr ||
                       (batch == other.batch && cost_model == other.cost_model),
                   "absorb: the stores serve different batches or cost models");
    if (batch == nullptr) {
      batch = other.batch;
      cost_model = other.cost_model;
    }
    auto has = [&](const VarlenRows& rows) {
      return std::ranges::any_of(entries, [&](const auto& e) {
        return e->memory_limit_bytes == rows.memory_limit_bytes && e->sequence == rows.sequence;
      });
    };
    std::vector<std::unique_ptr<VarlenRows>> taken;  // added after: has() must not see a
    for (auto& e : other.entries) {                  // sequence's first mode and drop the rest
      if (!has(*e)) taken.push_back(std::move(e));
    }
    for (auto& e : taken) entries.push_back(std::move(e));
    for (Packing& p : other.packings) {
      if (std::ranges::none_of(packings, [&](const Packing& mine) {
            return mine.packs(p.members, p.kind, p.enc_capacity, p.dec_capacity);
          })) {
        packings.push_back(std::move(p));
      }
    }
    for (SortedOrder& o : other.sorted_orders) {
      if (std::ranges::none_of(sorted_orders,
                               [&](const SortedOrder& mine) { return mine.sorts(o.kind, o.bucket_tokens); })) {
        sorted_orders.push_back(std::move(o));
      }
    }
    for (std::size_t m = 0; m < bounds.size(); ++m) {
      Bound& mine = bounds[m];
      const Bound& theirs = other.bounds[m];
      if (!mine.valid && theirs.valid) {
        mine.valid = true;
        mine.merged_ms = theirs.merged_ms;
        mine.tokens = theirs.tokens;
      }
      if (!mine.has_slowest && theirs.has_slowest) {
        mine.has_slowest = true;
        mine.slowest_ms = theirs.slowest_ms;
      }
    }
    if (alone_checked.first < 0) alone_checked = other.alone_checked;
    if (samples_checked.max_seqlen < 0) samples_checked = other.samples_checked;
  }
};

}  // namespace dynapipe::detail
