#include "dynapipe/batching/dp_partitioner.h"

#include <algorithm>
#include <cmath>

#include "dynapipe/core/cpu_dispatch.h"
#include "dynapipe/core/error.h"

namespace dynapipe {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Thresholds the caller's bound may rule out in a row before the chain runs a pass.
constexpr int kMaxSkips = 16;

// Per row, its window: where a descending chain's per-row counts start.
// Per row of a table, a count of its leading segments that only falls (from the row's
// window), and the time of the last segment counted (-inf at none). The scans that test
// that time for every row read it from one array, where the rows' own lie a cache line or
// more apart (GPT-6.7B pp 4 short256: those reads were ~a quarter of the plan's L1 misses).
class RowCursors {
 public:
  RowCursors() = default;
  explicit RowCursors(const SegmentTable& table)
      : count_(static_cast<std::size_t>(table.size())), last_(count_.size()) {
    for (int i = 0; i < table.size(); ++i) {
      count_[static_cast<std::size_t>(i)] = table.window(i);
      const std::span<const double> row = table.row(i);
      last_[static_cast<std::size_t>(i)] = row.empty() ? -kInf : row.back();
    }
  }
  int count(int i) const { return count_[static_cast<std::size_t>(i)]; }
  double last(int i) const { return last_[static_cast<std::size_t>(i)]; }
  // Moves row i's count down past the trailing times `drop` accepts (`row`: its times).
  template <typename Drop>
  void step_down(int i, std::span<const double> row, Drop&& drop) {
    int& c = count_[static_cast<std::size_t>(i)];
    while (c > 0 && drop(row[static_cast<std::size_t>(c) - 1])) --c;
    last_[static_cast<std::size_t>(i)] = c > 0 ? row[static_cast<std::size_t>(c) - 1] : -kInf;
  }

 private:
  std::vector<int> count_;
  std::vector<double> last_;
};

// f(j) = min Σ t over partitions of items [0, j) using only segments with t <= threshold,
// filled forward ("push"): when row i is read, f(i) is final because every segment
// ending at i starts before it.
class ThresholdDp {
 public:
  ThresholdDp(const SegmentTable& table, bool rows_monotone)
      : table_(table), rows_monotone_(rows_monotone),
        f_(static_cast<std::size_t>(table.size()) + 1),
        reach_(static_cast<std::size_t>(table.size())),
        reach_max_(static_cast<std::size_t>(table.size())) {}

  // Returns f(n); +inf when no partition has every segment time <= threshold.
  // Built for AVX2 too, chosen at load time where the CPU has it: the update loop below is
  // a third of the search (4 doubles a step instead of SSE2's 2; adds and mins round the
  // same either way).
  DYNAPIPE_ALSO_AVX2 double run(double threshold) {
    const int n = table_.size();
    DYNAPIPE_CHECK(!descending_ || threshold <= threshold_,
                   cat("descending threshold DP at ", threshold, " after ", threshold_));
    threshold_ = threshold;
    // Along a descending chain, a run redoes only what the lower threshold changes: up to
    // the first row that loses a segment, the rows and f are as the last run left them,
    // and only the rows reaching past that row push into the part of f that may change
    // (the chain's steps lose their largest segments, which in sorted orders are the long
    // samples of a row's far end: GPT-6.7B pp 4 short256, a third of the rows' updates).
    int from = 0;
    if (chain_run_) {
      int first = n;
      for (int i = 0; i < n; ++i) {
        // (A row no partition reaches pushes nothing, whatever its segments.)
        if (within_.last(i) > threshold && f_[i] != kInf) {
          first = i;
          break;
        }
      }
      if (first == n) return f_[n];  // no row loses a segment: the last run's result
      from = first;
      for (int i = 0; i < first; ++i) {
        if (reach_[i] > first) {
          from = i;
          break;
        }
      }
      std::fill(f_.begin() + first + 1, f_.end(), kInf);
    } else {
      std::fill(f_.begin(), f_.end(), kInf);
      f_[0] = 0;
    }
    chain_run_ = descending_;
    for (int i = from; i < n; ++i) {
      const double f_i = f_[i];
      reach_[i] = i;
      if (f_i == kInf) continue;
      const std::span<const double> row = table_.row(i);
      double* f = f_.data() + i + 1;  // f[c]: the prefix ending after segment c of row i
      if (rows_monotone_) {
        // The segments within the threshold lead the row. Only f is kept (reconstruct()
        // finds the cuts), so the update is a plain min the compiler can vectorise.
        std::size_t len;
        if (descending_) {  // from the last run's count: the threshold only fell since
          if (within_.last(i) > threshold) {
            within_.step_down(i, row, [threshold](double t) { return t > threshold; });
          }
          len = static_cast<std::size_t>(within_.count(i));
        } else {
          len = row.empty() || row.back() <= threshold
                    ? row.size()
                    : static_cast<std::size_t>(std::upper_bound(row.begin(), row.end(), threshold) - row.begin());
        }
        for (std::size_t c = 0; c < len; ++c) f[c] = std::min(f[c], f_i + row[c]);
        reach_[i] = i + static_cast<int>(len);
        continue;
      }
      reach_[i] = i + static_cast<int>(row.size());
      for (std::size_t c = 0; c < row.size(); ++c) {
        if (row[c] <= threshold) f[c] = std::min(f[c], f_i + row[c]);
      }
    }
    return f_[n];
  }

  // The runs from here on come with thresholds that never rise (sweep_down()'s chain):
  // each finds a monotone row's segments within its threshold by stepping back from the
  // last run's count, O(Σ window) for the whole chain, not a binary search per row and run.
  void start_descending() {
    if (!rows_monotone_) return;
    descending_ = true;
    // The chain goes on from the last run where that one kept every segment (no threshold:
    // its counts are the rows' windows); else its first run is whole.
    chain_run_ = threshold_ == kInf;
    threshold_ = kInf;
    within_ = RowCursors(table_);
  }

  // The partition of the last run(). REQUIRES: it returned a finite value. Back from the
  // end, each micro-batch starts at the earliest i whose segment within the threshold
  // gives f exactly: the start a forward pass keeping strict improvements would record
  // (ties: the earliest start wins, so results are deterministic).
  void reconstruct(Partition* out) {
    out->starts.clear();
    out->sum_ms = 0;
    out->max_ms = 0;
    // reach_max_[i]: how far rows 0..i reach within the threshold. The first i it puts at
    // or past j is the first row that reaches j, so each end scans only starts that could
    // end there (found for the ends the walk visits, a few tens, not every j).
    for (int i = 0, reach = 0; i < table_.size(); ++i) {
      reach = std::max(reach, reach_[i]);
      reach_max_[i] = reach;
    }
    for (int j = table_.size(); j > 0;) {
      int from = -1;
      const int first = static_cast<int>(
          std::lower_bound(reach_max_.begin(), reach_max_.begin() + j, j) - reach_max_.begin());
      for (int i = first; i < j && from < 0; ++i) {
        const int count = j - i;
        if (f_[i] == kInf || count > table_.window(i)) continue;
        const double t = table_.time_ms(i, count);
        if (t <= threshold_ && f_[i] + t == f_[j]) from = i;
      }
      DYNAPIPE_CHECK(from >= 0, cat("no segment ends the optimum at ", j));
      out->starts.push_back(from);
      out->max_ms = std::max(out->max_ms, table_.time_ms(from, j - from));
      j = from;
    }
    std::reverse(out->starts.begin(), out->starts.end());
    for (std::size_t k = 0; k < out->starts.size(); ++k) {
      const int end = k + 1 < out->starts.size() ? out->starts[k + 1] : table_.size();
      out->sum_ms += table_.time_ms(out->starts[k], end - out->starts[k]);
    }
  }

 private:
  const SegmentTable& table_;
  bool rows_monotone_;
  std::vector<double> f_;
  double threshold_ = kInf;  // of the last run()
  bool descending_ = false;       // start_descending() was called
  bool chain_run_ = false;        // the last run() was one of the descending chain's
  RowCursors within_;             // descending: per row, its segments within the last threshold
  std::vector<int> reach_;        // per row, in the last run(): i + its segments within it
  std::vector<int> reach_max_;    // reconstruct()'s scratch
};

bool rows_non_decreasing(const SegmentTable& table) {
  for (int i = 0; i < table.size(); ++i) {
    const std::span<const double> row = table.row(i);
    if (!std::is_sorted(row.begin(), row.end())) return false;
  }
  return true;
}

// The threshold searches: the exact descending chain, and the thinned mode's branch and
// bound over sorted thresholds (see solve_partition() in the header).
class ThresholdSearch {
 public:
  ThresholdSearch(const SegmentTable& table, const PartitionOptions& options)
      : table_(table), rows_monotone_(rows_non_decreasing(table)), dp_(table, rows_monotone_),
        weight_(options.sum_weight), slope_(options.bubble_weight * (options.num_stages - 1)),
        items_bound_segments_(options.items_bound_segments), sum_bound_(options.sum_lower_bound_ms) {
    best_.objective_ms = options.incumbent_ms;
  }

  Partition exact() {
    const double f_all = run(kInf);
    if (f_all == kInf) return finish();
    Partition unconstrained;
    dp_.reconstruct(&unconstrained);
    offer(f_all, unconstrained.max_ms, unconstrained);
    if (slope_ == 0) return finish();

    // Thresholds above T_up cannot beat the incumbent (f_T >= f_all), nor can those above
    // max t of the unconstrained partition (f is already f_all there).
    const double t_up =
        std::min(unconstrained.max_ms, (best_.objective_ms - weight_ * f_all) / slope_);
    double t_lo = 0;  // max over singletons: every smaller threshold is (usually) infeasible
    for (int i = 0; i < table_.size(); ++i) {
      if (table_.window(i) > 0) t_lo = std::max(t_lo, table_.time_ms(i, 1));
    }
    double floor = t_lo;
    if (!items_bound_segments_) {
      double below = -kInf;
      for (int i = 0; i < table_.size(); ++i) {
        for (double t : table_.row(i)) {
          if (t < t_lo && t <= t_up) below = std::max(below, t);
        }
      }
      if (below > -kInf && run(below) < kInf) floor = -kInf;  // non-monotone costs: keep all
    }

    sweep_down(floor, t_up, f_all);
    return finish();
  }

  // The reference's candidate list: every segment time, sorted, thinned to values more
  // than `interval_ms` above the last kept one; objective uses the threshold itself.
  Partition thinned(double interval_ms) {
    const double f_all = run(kInf);
    if (f_all == kInf) return finish();
    std::vector<double> all;
    for (int i = 0; i < table_.size(); ++i) {
      for (double t : table_.row(i)) {
        if (std::isfinite(t)) all.push_back(t);
      }
    }
    sort_unique(&all);
    std::vector<double> candidates;
    for (double t : all) {
      if (candidates.empty() || t > candidates.back() + interval_ms) candidates.push_back(t);
    }
    // Deviation from the reference: it can drop every threshold >= the largest singleton
    // and then report "infeasible"; the largest time keeps the search feasible.
    if (candidates.back() < all.back()) candidates.push_back(all.back());
    branch_and_bound(candidates, f_all);
    return finish();
  }

 private:
  struct Interval {
    int lo, hi;         // exclusive; f known at lo (if lo >= 0) and at hi (if hi < m)
    double f_lo, f_hi;  // f_hi at hi == m is f_all, a lower bound for every threshold
  };

  // Thresholds as values: the open interval (lo, hi), f known at lo (+inf below every
  // threshold) and f_hi a lower bound of f inside (f at hi, or f_all).
  struct Range {
    double lo, hi;
    double f_lo, f_hi;
  };

  static void sort_unique(std::vector<double>* values) {
    std::sort(values->begin(), values->end());
    values->erase(std::unique(values->begin(), values->end()), values->end());
  }

  double run(double threshold) {
    ++passes_;
    return dp_.run(threshold);
  }

  // Records `built` (the last run's partition, reconstructed) if w·f + (p−1)·threshold
  // beats the incumbent.
  void offer(double f, double threshold, const Partition& built) {
    const double objective = weight_ * f + slope_ * threshold;
    if (objective < best_.objective_ms) {
      best_.starts = built.starts;
      best_.sum_ms = built.sum_ms;
      best_.max_ms = built.max_ms;
      best_.objective_ms = objective;
      best_.found = true;
    }
  }

  // The exact search over every segment time in [floor, t_up] as a threshold, without
  // sorting them. The smallest threshold is run first: f there bounds f from above, so
  // the search can stop where f cannot change. Then, going down from the top, each step
  // runs the DP at the largest threshold T below the last partition's max that could
  // still beat the incumbent (w·f_hi + (p−1)·T < incumbent, as f_T >= f_hi, the f of the
  // last step), found by a scan of the rows. A pass either improves the incumbent, which
  // lowers that largest threshold, or raises f_hi; its partition's max t' <= T proves f
  // constant on [t', T], so the next step searches below t'. Nothing above T can improve
  // later either (the same test failed there with a larger incumbent and a smaller f_hi),
  // so the steps form one descending chain, and the set of thresholds that pass the test
  // only shrinks along it: each row's scan resumes where the last one stopped
  // (cursor_). In practice this needs 2–4x fewer DP passes than bisecting the sorted
  // thresholds, and no sort.
  void sweep_down(double floor, double t_up, double f_all) {
    const double t_small = smallest_threshold(floor, t_up);
    // No threshold in [floor, t_up], or none that could improve.
    if (!(t_small > -kInf) || !(weight_ * f_all + slope_ * t_small < best_.objective_ms)) return;
    Range range{t_small, kInf, kInf, f_all};
    Partition scratch;
    // A smallest threshold the bound rules out is left at f_lo = +inf: the chain stops
    // above it all the same, as nothing at or below it can improve.
    double below = kInf;
    if (!bounded_out(t_small, &below)) {
      const double f_small = run(t_small);
      if (f_small < kInf) {
        dp_.reconstruct(&scratch);
        offer(f_small, scratch.max_ms, scratch);
        range.f_lo = f_small;
      }
    }
    // (Below t_small no threshold is left.)
    if (rows_monotone_) cursor_ = RowCursors(table_);
    dp_.start_descending();
    int skipped = 0;  // thresholds the bound ruled out since the last pass
    while (range.f_lo != range.f_hi) {  // f constant on the range: lo was the best
      const double t = largest_threshold(range, floor, t_up);
      // No threshold left in the range that could improve.
      if (!(t > range.lo) || !(weight_ * range.f_hi + slope_ * t < best_.objective_ms)) return;
      // The bound's jumps can be small where it runs close to the incumbent: after a few,
      // a pass, which raises f_hi, moves the chain on at least as fast.
      if (skipped < kMaxSkips && bounded_out(t, &below)) {
        range.hi = std::min(t, below);
        ++skipped;
        continue;
      }
      skipped = 0;
      const double f = run(t);
      if (f == kInf) return;  // so is every smaller threshold
      dp_.reconstruct(&scratch);
      offer(f, scratch.max_ms, scratch);
      range.hi = scratch.max_ms;
      range.f_hi = f;
    }
  }

  // Whether the caller's lower bound of f rules threshold t out: w·bound(t) + (p−1)·t at or
  // above the incumbent (by a relative 1e-9, as the bound and the table's sums round
  // differently). Then *below is where a threshold must lie under to improve: every T < t
  // has bound(T) >= bound(t).
  bool bounded_out(double t, double* below) const {
    if (!sum_bound_) return false;
    const double open = best_.objective_ms * (1 + 1e-9);  // +inf: nothing is ruled out
    const double bound = sum_bound_(t, (open - slope_ * t) / weight_);
    if (bound == kInf) {  // no partition within t, nor within any smaller threshold
      *below = -kInf;
      return true;
    }
    if (!(weight_ * bound + slope_ * t >= open)) return false;
    *below = (open - weight_ * bound) / slope_;
    return true;
  }

  // The smallest segment time in [floor, t_up] (NaN if none).
  double smallest_threshold(double floor, double t_up) const {
    double best = kInf;
    for (int i = 0; i < table_.size(); ++i) {
      const std::span<const double> row = table_.row(i);
      if (rows_monotone_) {
        const auto it = std::lower_bound(row.begin(), row.end(), floor);
        if (it != row.end()) best = std::min(best, *it);
      } else {
        for (double t : row) {
          if (t >= floor) best = std::min(best, t);
        }
      }
    }
    return best <= t_up ? best : std::numeric_limits<double>::quiet_NaN();
  }

  // The largest segment time T in [floor, t_up] below range.hi that could still improve
  // (w·f_hi + (p−1)·T < incumbent); -inf if none. REQUIRES: each call's test passes on no
  // more times than the last one's since sweep_down() set cursor_ (its chain).
  double largest_threshold(const Range& range, double floor, double t_up) {
    // Loop invariants in locals: the rows are doubles too, so the compiler would reload
    // the members after every row read.
    const double hi = range.hi, sum_part = weight_ * range.f_hi, slope = slope_,
                 best = best_.objective_ms;
    auto could_improve = [=](double t) { return t < hi && t <= t_up && sum_part + slope * t < best; };
    double largest = -kInf;
    if (!rows_monotone_) {
      for (int i = 0; i < table_.size(); ++i) {
        for (double t : table_.row(i)) {
          if (t >= floor && could_improve(t)) largest = std::max(largest, t);
        }
      }
      return largest;
    }
    // Per row, the times from cursor_.count(i) on failed an earlier call's test, so they fail
    // this one's: the cursor only moves down. A row whose time below it is no larger than
    // the largest found adds nothing and keeps its cursor (it moves on a later call).
    for (int i = 0; i < table_.size(); ++i) {
      if (!(cursor_.last(i) > largest)) continue;
      cursor_.step_down(i, table_.row(i), [&](double t) { return !could_improve(t); });
      const double last = cursor_.last(i);
      if (last >= floor) largest = std::max(largest, last);
    }
    return largest;
  }

  // Bisection over sorted thresholds `c` (the thinned search).
  void branch_and_bound(const std::vector<double>& c, double f_all) {
    const int m = static_cast<int>(c.size());
    std::vector<Interval> stack{{-1, m, kInf, f_all}};
    Partition scratch;
    while (!stack.empty()) {
      const Interval node = stack.back();
      stack.pop_back();
      if (node.hi - node.lo <= 1) continue;
      if (node.f_lo == node.f_hi) continue;  // f constant on [lo, hi]: lo was the best
      if (weight_ * node.f_hi + slope_ * c[node.lo + 1] >= best_.objective_ms) continue;
      const int mid = node.lo + (node.hi - node.lo) / 2;
      const double f = run(c[mid]);
      if (f == kInf) {  // so is every smaller threshold
        stack.push_back({mid, node.hi, kInf, node.f_hi});
        continue;
      }
      // The partition's max t' <= c[mid] proves f constant on [t', c[mid]].
      dp_.reconstruct(&scratch);
      const int k_act = static_cast<int>(
          std::lower_bound(c.begin(), c.begin() + mid + 1, scratch.max_ms) - c.begin());
      offer(f, c[k_act], scratch);
      stack.push_back({mid, node.hi, f, node.f_hi});
      stack.push_back({node.lo, k_act, node.f_lo, f});  // smaller thresholds first
    }
  }

  Partition finish() {
    best_.dp_passes = passes_;
    if (!best_.found) best_.starts.clear();
    return best_;
  }

  const SegmentTable& table_;
  bool rows_monotone_;
  ThresholdDp dp_;
  double weight_;
  double slope_;
  bool items_bound_segments_;
  const std::function<double(double, double)>& sum_bound_;  // options.sum_lower_bound_ms
  Partition best_;
  int passes_ = 0;
  RowCursors cursor_;  // largest_threshold()'s per-row scan positions
};

}  // namespace

SegmentTable::SegmentTable(int size)
    : size_(size),
      begin_(static_cast<std::size_t>(std::max(size, 0)), 0),
      count_(static_cast<std::size_t>(std::max(size, 0)), 0) {
  DYNAPIPE_CHECK(size >= 0, cat("segment table size ", size, " < 0"));
}

void SegmentTable::push(int start, double time_ms) {
  DYNAPIPE_CHECK(start >= current_row_ && start < size_,
                 cat("segment row ", start, " pushed after row ", current_row_, " (size ",
                     size_, ")"));
  DYNAPIPE_CHECK(!std::isnan(time_ms), cat("NaN time for a segment starting at ", start));
  if (start != current_row_) {
    begin_[start] = static_cast<std::int64_t>(time_ms_.size());
    current_row_ = start;
  }
  DYNAPIPE_CHECK(start + count_[start] < size_,
                 cat("segment from ", start, " past the end ", size_));
  time_ms_.push_back(time_ms);
  ++count_[start];
}

void SegmentTable::push_row(int start, std::span<const double> times) {
  if (times.empty()) return;
  DYNAPIPE_CHECK(start >= current_row_ && start < size_,
                 cat("segment row ", start, " pushed after row ", current_row_, " (size ",
                     size_, ")"));
  DYNAPIPE_CHECK(std::none_of(times.begin(), times.end(), [](double t) { return std::isnan(t); }),
                 cat("NaN time for a segment starting at ", start));
  DYNAPIPE_CHECK(start + count_[start] + static_cast<std::int64_t>(times.size()) <= size_,
                 cat("segment from ", start, " past the end ", size_));
  if (start != current_row_) {
    begin_[start] = static_cast<std::int64_t>(time_ms_.size());
    current_row_ = start;
  }
  time_ms_.insert(time_ms_.end(), times.begin(), times.end());
  count_[start] += static_cast<int>(times.size());
}

Partition solve_partition(const SegmentTable& table, const PartitionOptions& options) {
  DYNAPIPE_CHECK(options.num_stages >= 1, cat("num_stages ", options.num_stages, " < 1"));
  DYNAPIPE_CHECK(options.sum_weight > 0, cat("sum_weight ", options.sum_weight, " <= 0"));
  DYNAPIPE_CHECK(options.bubble_weight > 0,
                 cat("bubble_weight ", options.bubble_weight, " <= 0"));
  DYNAPIPE_CHECK(options.min_tmax_interval_ms >= 0,
                 cat("min_tmax_interval_ms ", options.min_tmax_interval_ms, " < 0"));
  if (table.size() == 0) {
    Partition empty;
    empty.found = 0 < options.incumbent_ms;
    empty.objective_ms = empty.found ? 0 : options.incumbent_ms;
    return empty;
  }
  ThresholdSearch search(table, options);
  return options.min_tmax_interval_ms > 0 ? search.thinned(options.min_tmax_interval_ms)
                                          : search.exact();
}

}  // namespace dynapipe
