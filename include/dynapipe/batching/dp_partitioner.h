// The DynaPipe DP: cut an ordered sequence of n items into consecutive micro-batches
// minimising the pipeline objective
//
//     w · Σ_i t(M_i)  +  (p − 1) · max_i t(M_i)
//
// where p is the number of pipeline stages, w the weight of the sum (1, or 1/dp when the
// micro-batches are later spread over dp replicas) and t(M) the time of micro-batch M on
// its bottleneck stage. The caller supplies t for every memory-feasible segment in a
// SegmentTable; the solver knows nothing about samples, shapes or memory.
//
//   SegmentTable table(n);
//   for (int i = 0; i < n; ++i) { for (...) table.push(i, t_ms(i, i + count)); }
//   Partition best = solve_partition(table, {.num_stages = 4});
//   // best.starts = {0, 1, 2, 3, 5}: micro-batches [0,1) [1,2) [2,3) [3,5) [5,n)
//
// Exactness: for a fixed threshold T let f_T = min Σ t over partitions whose every t <= T.
// The optimum is min over the distinct segment times T of w·f_T + (p − 1)·T: the optimal
// partition P* is feasible for T* = max t(P*), so that term is <= obj(P*), and every
// term is >= the objective of the partition that attains it. See solve_partition() for
// how the thresholds are searched without evaluating all of them.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

namespace dynapipe {

// Times of the candidate segments of an ordered sequence of `size` items. Row i holds
// t([i, i+1)), t([i, i+2)), ..., t([i, i+window(i))): the segments starting at i, by
// item count. A segment missing from a row (count > window(i)) is not allowed, e.g.
// because it does not fit in memory. Rows are filled in order of i.
class SegmentTable {
 public:
  explicit SegmentTable(int size = 0);

  int size() const { return size_; }
  // Capacity for `segments` times in all, to fill without reallocating.
  void reserve(std::int64_t segments) { time_ms_.reserve(static_cast<std::size_t>(segments)); }
  // Appends t([start, start + window(start) + 1)). REQUIRES: rows are filled in order of
  // start (a row may be left empty); start + window(start) < size; time_ms is not NaN.
  void push(int start, double time_ms);
  // push(start, t) for every t of `times`, in order, checked once per row.
  void push_row(int start, std::span<const double> times);
  int window(int start) const { return count_[start]; }
  // t([start, start + count)), 1 <= count <= window(start).
  double time_ms(int start, int count) const { return time_ms_[begin_[start] + count - 1]; }
  std::span<const double> row(int start) const {
    return {time_ms_.data() + begin_[start], static_cast<std::size_t>(count_[start])};
  }

 private:
  int size_ = 0;
  int current_row_ = -1;              // the row push() appends to
  std::vector<std::int64_t> begin_;   // per row: offset of its first time in time_ms_
  std::vector<int> count_;            // per row: window
  std::vector<double> time_ms_;
};

struct PartitionOptions {
  int num_stages = 1;      // p >= 1
  double sum_weight = 1.0; // w > 0: 1 for one replica; 1/dp for the reference's dp objective
  // > 0: scales the bubble term, objective w·Σt + bubble_weight·(p−1)·max t (a schedule
  // with a shorter fill/drain than 1F1B's, docs/batching.md "Schedule-aware DP").
  double bubble_weight = 1.0;
  // 0 (default): exact. > 0 reproduces the reference's thinning of the max-time
  // thresholds (keep a sorted candidate only if it exceeds the last kept one by more
  // than this); the objective is then the reference's threshold-based w·f_T + (p−1)·T.
  // One deviation: the largest segment time is always a candidate, so thinning can never
  // make a feasible table look infeasible (the reference can).
  double min_tmax_interval_ms = 0;
  // Only partitions with an objective strictly below this are of interest (e.g. the best
  // found under another recompute mode); lets the search prune. Default: +inf.
  double incumbent_ms = std::numeric_limits<double>::infinity();
  // The caller guarantees that a segment takes no less time than any single item it
  // holds (true when time grows with a segment's items, as the batching's cost models
  // do): no threshold below the slowest item is feasible, and the search skips the DP
  // pass that would prove it (step 2 below).
  bool items_bound_segments = false;
  // Optional: bound(T, enough), a lower bound of f_T (min Σ t over the table's partitions
  // whose every segment takes at most T; +inf where there is none), non-increasing in T.
  // It may return any bound >= `enough` as soon as it has one (a cheap bound first). The
  // exact search then runs no DP at a threshold T where w·bound(T) + (p−1)·T cannot beat
  // the incumbent, and looks next below (incumbent − w·bound(T))/(p−1), since no smaller
  // threshold has a smaller bound (step 3 below). The batching's varlen DPs pass the cost
  // model's affine bound.
  std::function<double(double, double)> sum_lower_bound_ms = nullptr;
};

struct Partition {
  bool found = false;        // false: infeasible, or nothing beats options.incumbent_ms
  std::vector<int> starts;   // first item of each micro-batch; starts[0] = 0, ascending
  double objective_ms = std::numeric_limits<double>::infinity();
  double sum_ms = 0;         // Σ t of the chosen micro-batches
  double max_ms = 0;         // max t of the chosen micro-batches
  int dp_passes = 0;         // threshold DPs run (diagnostics)
};

// Exact minimiser of w·Σt + (p−1)·max t over consecutive partitions whose segments are
// all in `table` (ties: the first found by the deterministic search below). Never
// throws for a valid table; an item no row can cover makes the result !found.
//
// Search (exact mode):
//   1. One DP with no threshold gives f_∞ = min Σt, a partition P∞ and its objective,
//      the first incumbent. p = 1 stops here (the objective is Σt).
//   2. Only thresholds T <= (incumbent − w·f_∞)/(p−1) can improve (f_T >= f_∞), and
//      none above max t(P∞) (f is already f_∞ there). Below T_lo = max_i t([i,i+1))
//      nothing is feasible when times grow with the segment; one DP at the largest time
//      below T_lo certifies that (if it is feasible after all, every time is kept),
//      unless the caller sets items_bound_segments.
//   3. A descending chain over the segment times left, as values (no sorted list). The
//      smallest threshold is run first (its f bounds f from above: the chain stops once
//      f reaches it). Then, from the top, each DP runs at the largest threshold T below
//      the last partition's max that could still improve: w·f_hi + (p−1)·T < incumbent,
//      f_hi the last pass's f (f >= f_hi below it). Its partition's max T' <= T proves f
//      constant on [T', T]; each pass either improves the incumbent or raises f_hi.
//      Nothing above T can improve later (the test failed there with a larger incumbent
//      and a smaller f_hi), so the thresholds that pass only shrink along the chain and
//      each row's scan resumes where the last stopped. With a caller's lower bound of f
//      (sum_lower_bound_ms), a threshold whose bound cannot improve takes no DP, and the
//      chain goes on below the largest threshold that the bound leaves open. (Thinned
//      mode bisects its sorted candidate list instead.)
// Invariants: f_T is non-increasing in T; every candidate T is some segment time; the
//   incumbent is always the objective of an actual partition.
// Complexity: one DP pass is O(Σ_i min(window(i), #segments from i with t <= T)) when
//   rows are non-decreasing (checked once; else O(Σ window)); choosing the thresholds
//   and finding each row's segments within them O(n) per pass plus O(Σ window) for the
//   whole chain (else O(Σ window) per pass).
//   Passes: 1 for p = 1, in practice a few to a few tens.
Partition solve_partition(const SegmentTable& table, const PartitionOptions& options);

}  // namespace dynapipe
