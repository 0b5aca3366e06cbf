// The "dynapipe" and "dynapipe-padded" strategies: ordered samples, the exact DP of
// dp_partitioner.h over varlen (block-diagonal) or padded micro-batches, and the
// split over data-parallel replicas.
#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include "costing.h"
#include "varlen_memo.h"
#include "dynapipe/batching/dp_partitioner.h"
#include "dynapipe/batching/replica_balancer.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"

namespace dynapipe::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kSlack = 1 + 1e-9;  // the time caps' rounding: a segment exactly at a bound stays in

// Shared by both scanners: the table and the min-sum DP over scan_row().
template <typename Scanner>
class ScannerBase {
 public:
  SegmentTable table(int max_count = std::numeric_limits<int>::max(), double cap_ms = kInf) {
    Scanner& self = static_cast<Scanner&>(*this);
    SegmentTable out(self.size());
    // Counted first: growing the table costs more (page faults).
    std::vector<int> counts(static_cast<std::size_t>(self.size()));
    std::int64_t segments = 0;
    for (int i = 0; i < self.size(); ++i) {
      counts[i] = self.qualifying(i, max_count, cap_ms);
      segments += counts[i];
    }
    out.reserve(segments);
    for (int i = 0; i < self.size(); ++i) {
      if constexpr (requires { self.leading_times(i, 0); }) {
        out.push_row(i, self.leading_times(i, counts[i]));  // kept times: no second scan
      } else {
        self.scan_row(i, max_count, cap_ms, [&](int, double t) { out.push(i, t); });
      }
    }
    return out;
  }

  // min Σ t over partitions into qualifying segments (+inf if none), without storing
  // the table: a forward DP that consumes each row as it is scanned.
  double min_sum(double cap_ms) {
    Scanner& self = static_cast<Scanner&>(*this);
    std::vector<double> f(static_cast<std::size_t>(self.size()) + 1, kInf);
    f[0] = 0;
    for (int i = 0; i < self.size(); ++i) {
      if (f[i] == kInf) continue;
      if constexpr (requires { self.leading_times(i, 0); }) {
        // The qualifying segments are a prefix of the cached row: no per-segment checks.
        const int count = self.qualifying(i, std::numeric_limits<int>::max(), cap_ms);
        const std::span<const double> times = self.leading_times(i, count);
        const double f_i = f[i];
        double* out = f.data() + i + 1;
        for (int c = 0; c < count; ++c) out[c] = std::min(out[c], f_i + times[c]);
      } else {
        self.scan_row(i, std::numeric_limits<int>::max(), cap_ms, [&](int count, double t) {
          f[i + count] = std::min(f[i + count], f[i] + t);
        });
      }
    }
    return f.back();
  }

  // How many segments scan_row(i, max_count, cap_ms) emits (the scanner may know faster).
  int qualifying(int i, int max_count, double cap_ms) {
    int count = 0;
    static_cast<Scanner&>(*this).scan_row(i, max_count, cap_ms, [&](int c, double) { count = c; });
    return count;
  }

  // A partition filled greedily: each micro-batch takes samples while its time stays
  // within limit_ms and it fits (a sample slower than the limit stands alone), with its
  // objective weight·Σt + slope·max t. REQUIRES: every sample fits alone.
  Partition greedy(double limit_ms, double weight, double slope) {
    Scanner& self = static_cast<Scanner&>(*this);
    Partition out;
    for (int i = 0; i < self.size();) {
      const auto [count, t] = greedy_microbatch(i, limit_ms);
      out.starts.push_back(i);
      out.sum_ms += t;
      out.max_ms = std::max(out.max_ms, t);
      i += count;
    }
    out.found = true;
    out.objective_ms = weight * out.sum_ms + slope * out.max_ms;
    return out;
  }

  // greedy()'s micro-batch from item i: its item count and time.
  std::pair<int, double> greedy_microbatch(int i, double limit_ms) {
    Scanner& self = static_cast<Scanner&>(*this);
    int count = 0;
    double t = 0;
    auto take = [&](int c, double time) {
      count = c;
      t = time;
    };
    if constexpr (requires { self.leading_times(i, 0); }) {
      count = self.qualifying(i, std::numeric_limits<int>::max(), limit_ms);
      if (count > 0) t = self.leading_times(i, count).back();
    } else {
      self.scan_row(i, std::numeric_limits<int>::max(), limit_ms, take);
    }
    if (count == 0) self.scan_row(i, 1, kInf, take);
    return {count, t};
  }

  // The fewest micro-batches of any partition whose every segment fits and takes at most
  // cap_ms: the greedy one's, each micro-batch as long as it can be (a part of a segment
  // that qualifies qualifies too, as time and memory grow with a segment, so at each cut
  // the greedy partition is at least as far on as any other). It costs only the rows its
  // micro-batches start at. 1 where time may fall as a segment grows (the argument fails).
  // REQUIRES: the scanner has monotone().
  int fewest_microbatches(double cap_ms) {
    Scanner& self = static_cast<Scanner&>(*this);
    if (!self.monotone()) return 1;
    int microbatches = 0;
    for (int i = 0; i < self.size(); ++microbatches) i += greedy_microbatch(i, cap_ms).first;
    return microbatches;
  }

  // An upper bound on the optimum, cheap next to the exact search: the best greedy
  // partition over time limits from the slowest sample up in steps of 10%, until the
  // objective has not improved for a few steps, a larger limit changes nothing (every
  // micro-batch stopped by memory or the end) or the limit passes `cap_ms`.
  Partition greedy_bound(double weight, double slope, double cap_ms) {
    Scanner& self = static_cast<Scanner&>(*this);
    constexpr double kStep = 1.1;
    constexpr int kPatience = 4;
    double limit = 0;
    for (int i = 0; i < self.size(); ++i) {
      self.scan_row(i, 1, kInf, [&](int, double t) { limit = std::max(limit, t); });
    }
    Partition best;
    for (int since_best = 0; since_best < kPatience && limit <= cap_ms;
         limit *= kStep) {
      Partition p = greedy(limit, weight, slope);
      const bool saturated = p.max_ms * kStep < limit;
      ++since_best;
      if (p.objective_ms < best.objective_ms) {
        best = std::move(p);
        since_best = 0;
      }
      if (saturated) break;
    }
    return best;
  }
};

// Padded segments (dynapipe-padded): [i, j) is one micro-batch of j − i rows padded to
// its longest sample. A row stops at the first segment that does not fit, exceeds the
// time cap or the item cap: time and memory are assumed non-decreasing in batch and
// lengths (true of the analytic and profiled models), and [i, j+1) is never smaller
// than [i, j). Complexity: O(window(i)) cache lookups per row; cost-model calls only
// for new shapes.
class PaddedScanner : public ScannerBase<PaddedScanner> {
 public:
  PaddedScanner(std::span<const Sample> samples, std::span<const std::size_t> seq,
                ModelKind kind, std::int64_t seqlen_multiple, ShapeCosts& costs, MemoryRule rule)
      : costs_(costs), rule_(rule), enc_(seq.size()), dec_(seq.size()) {
    for (std::size_t k = 0; k < seq.size(); ++k) {
      const ModelLengths lengths = model_lengths(samples[seq[k]], kind);
      enc_[k] = round_up(lengths.enc, seqlen_multiple);
      dec_[k] = round_up(lengths.dec, seqlen_multiple);
    }
  }

  int size() const { return static_cast<int>(enc_.size()); }
  // A lower bound of Σ t over any partition: none known (padding is not subadditive).
  double merged_time_ms() const { return 0; }

  // Calls emit(count, time_ms) for count = 1, 2, ... while the segment qualifies. Where
  // time may fall as a segment grows (CostModel::monotone() false: measured tables), a
  // later segment can come back under the cap: the row runs on to its memory limit and
  // emits the prefix up to its last segment within the cap.
  template <typename Emit>
  void scan_row(int i, int max_count, double cap_ms, Emit&& emit) {
    const int end = static_cast<int>(std::min<std::int64_t>(size(), std::int64_t{i} + max_count));
    std::int64_t max_enc = enc_[i], max_dec = dec_[i];
    ShapeCosts::Row* row = costs_.row(max_enc, max_dec);
    prefix_.clear();
    std::size_t within = 0;
    for (int j = i; j < end; ++j) {
      if (enc_[j] > max_enc || dec_[j] > max_dec) {
        max_enc = std::max(max_enc, enc_[j]);
        max_dec = std::max(max_dec, dec_[j]);
        row = costs_.row(max_enc, max_dec);
      }
      const ShapeCost& cost = costs_.get(row, max_enc, max_dec, j - i + 1);
      if (!cost.fits(rule_for(rule_, static_cast<std::size_t>(j - i + 1)))) break;
      if (monotone_) {
        if (cost.time_ms > cap_ms) break;
        emit(j - i + 1, cost.time_ms);
        continue;
      }
      prefix_.push_back(cost.time_ms);
      if (cost.time_ms <= cap_ms) within = prefix_.size();
    }
    for (std::size_t c = 0; c < within; ++c) emit(static_cast<int>(c) + 1, prefix_[c]);
  }

 private:
  ShapeCosts& costs_;
  MemoryRule rule_;
  std::vector<std::int64_t> enc_, dec_;  // rounded model lengths in sequence order
  bool monotone_ = costs_.cost_model().monotone();
  std::vector<double> prefix_;           // scan_row()'s segments, where not monotone
};

// Varlen segments (dynapipe): [i, j) is one row of Σ L tokens with block-diagonal
// attention (make_varlen_microbatch). Its cost depends on the prefix sums of tokens and
// squared lengths, so the shape cache does not apply; instead each row's segment costs
// (time and per-stage most in flight, rule-free) are kept in VarlenRows as far as some scan
// needed them, shared by the search's repeated scans with falling caps and, through a
// BatchingCache, by later DPs under other memory rules and bubble weights.
// Time and memory are assumed non-decreasing as a segment grows (more tokens and more
// Σ L²), so a row stops at the first segment that does not fit or exceeds the cap.
// Complexity: one cost evaluation (num_stages stage_cost() calls) per new segment.
class VarlenScanner : public ScannerBase<VarlenScanner> {
 public:
  // enc_cap / dec_cap > 0: segments of at most that many model tokens only.
  // partner: the same sequence's rows under another mode, costed together with these
  // where both rows have reached the same segment (nullptr: none).
  VarlenScanner(std::span<const Sample> samples, std::span<const std::size_t> seq,
                ModelKind kind, std::int64_t seqlen_multiple, ShapeCosts& costs, MemoryRule rule,
                VarlenRows& rows, VarlenRows* partner, std::int64_t enc_cap, std::int64_t dec_cap)
      : costs_(costs), rule_(rule), kind_(kind), multiple_(seqlen_multiple),
        stride_(static_cast<std::size_t>(costs.num_stages())), rows_(rows), partner_(partner),
        enc_cap_(enc_cap), dec_cap_(dec_cap) {
    modes_ = {rows_.recompute, partner_ != nullptr ? partner_->recompute : rows_.recompute};
    lengths_.reserve(seq.size());
    for (std::size_t k : seq) tokens_.add(lengths_.emplace_back(model_lengths(samples[k], kind)), kind);
    if (tokens_.every_sample_has_tokens && costs_.affine_bound()) affine_ = &*costs_.affine_bound();
    fit_ = &rows_.fits_for(costs_.rule_key(rule_));
    if (enc_cap_ > 0) {  // per row: how many samples fit the capacities
      cap_count_.resize(seq.size());
      for (std::size_t i = 0, j = 0; i < lengths_.size(); ++i) {
        j = std::max(j, i);
        std::int64_t enc = 0, dec = 0;
        for (std::size_t k = i; k < j; ++k) {
          enc += lengths_[k].enc;
          dec += lengths_[k].dec;
        }
        while (j < lengths_.size() && enc + lengths_[j].enc <= enc_cap_ &&
               (dec_cap_ == 0 || dec + lengths_[j].dec <= dec_cap_)) {
          enc += lengths_[j].enc;
          dec += lengths_[j].dec;
          ++j;
        }
        cap_count_[i] = static_cast<int>(std::max<std::size_t>(j - i, 1));
      }
    }
  }

  int size() const { return static_cast<int>(lengths_.size()); }

  // The best of the cuts earlier DPs chose on this sequence (VarlenRows::cuts) whose
  // micro-batches all fit this scanner's rule and capacities, with its objective
  // weight·Σt + slope·max t (summed in order, as the DP sums); !found if none.
  Partition best_known_cut(double weight, double slope) {
    Partition best;
    for (const std::vector<int>& starts : rows_.cuts) {
      double sum = 0, max = 0;
      bool qualifies = true;
      for (std::size_t k = 0; k < starts.size() && qualifies; ++k) {
        const int begin = starts[k];
        const int end = k + 1 < starts.size() ? starts[k + 1] : size();
        const std::size_t count = static_cast<std::size_t>(end - begin);
        if (!cap_count_.empty() && count > static_cast<std::size_t>(cap_count_[begin])) {
          qualifies = false;
          break;
        }
        VarlenRows::Row& row = rows_.rows[static_cast<std::size_t>(begin)];
        while (row.time_ms.size() < count) extend(begin, &row);
        qualifies = segment_memory_fits(row, count - 1);
        sum += row.time_ms[count - 1];
        max = std::max(max, row.time_ms[count - 1]);
      }
      const double objective = weight * sum + slope * max;
      if (qualifies && objective < best.objective_ms) {
        best = {.found = true,
                .starts = starts,
                .objective_ms = objective,
                .sum_ms = sum,
                .max_ms = max};
      }
    }
    return best;
  }

  // Every sample in one varlen micro-batch (memory ignored): a lower bound of Σ t over
  // any partition where the cost model is subadditive (CostModel::subadditive()); 0, no
  // bound, where it is not.
  double merged_time_ms() const {
    if (!costs_.cost_model().subadditive()) return 0;
    std::int64_t enc = 0, dec = 0;
    double enc_squares = 0, dec_squares = 0;
    for (const ModelLengths& l : lengths_) {
      enc += l.enc;
      dec += l.dec;
      enc_squares += static_cast<double>(l.enc) * static_cast<double>(l.enc);
      dec_squares += static_cast<double>(l.dec) * static_cast<double>(l.dec);
    }
    const MicroBatchShape shape{
        .batch = 1, .seqlen = round_up(enc, multiple_), .dec_seqlen = round_up(dec, multiple_)};
    std::vector<std::int64_t> bytes(2 * stride_);
    return costs_.evaluate_stages(shape, varlen_density(enc_squares, dec_squares, 1, shape, kind_),
                                  bytes);
  }

  // A lower bound of Σ t over the partitions whose every micro-batch takes at most
  // cap_ms, from the cost model's affine bound: on stage s, K such micro-batches need
  // K·(cap − fixed) >= W = enc·E + dec·D + the attention within the samples (E, D: all
  // tokens; the attention is the same whatever the partition), and Σ t >= W + K·fixed.
  // Where micro-batches are many, the fixed part (op overheads, the matmuls'
  // efficiency) is what "all samples in one micro-batch" misses: it bounds heavier
  // recompute modes out before their segments are costed (T5-11B pp 8 short256: full
  // recompute). +inf: no such partition; 0: no bound known.
  // `fewest` > 1: the partitions are known to hold at least that many micro-batches.
  double capped_sum_bound(double cap_ms, int fewest = 1) const {
    if (affine_ == nullptr) return 0;
    const double n = static_cast<double>(size());
    double best = 0;
    for (std::size_t s = 0; s < affine_->fixed_ms.size(); ++s) {
      const double work = tokens_.work_ms(*affine_, s);
      const double fixed = affine_->fixed_ms[s];
      double count = std::max(1, fewest);  // micro-batches, at least
      if (work > 0) {
        if (!(cap_ms > fixed)) return kInf;  // a micro-batch alone is slower than the cap
        // Shaved so that rounding never rounds a whole count up.
        count = std::max(count, std::ceil(work / (cap_ms - fixed) * (1 - 1e-9)));
      }
      if (count > n) return kInf;  // more micro-batches than samples
      best = std::max(best, work + count * fixed);
    }
    return best;
  }

  // The times of the first `count` segments of row i. REQUIRES: a scan reached them.
  std::span<const double> leading_times(int i, int count) const {
    return std::span<const double>(rows_.rows[static_cast<std::size_t>(i)].time_ms)
        .first(static_cast<std::size_t>(count));
  }

  void mark_sample_too_large() { rows_.sample_too_large = true; }

  // Whether every row's costed times are non-decreasing (VarlenRows::Row::sorted), and
  // the cost model monotone: a row's segments within a cap are then its leading times
  // up to it (qualifying()'s binary search).
  bool rows_sorted() const {
    return monotone_ && std::ranges::all_of(rows_.rows, [](const VarlenRows::Row& r) { return r.sorted; });
  }

  void remember_cut(const std::vector<int>& starts) {
    if (std::find(rows_.cuts.begin(), rows_.cuts.end(), starts) == rows_.cuts.end()) {
      rows_.cuts.push_back(starts);
    }
  }

  // How many segments scan_row(i, max_count, cap_ms) emits. Where the row is costed
  // past the cap and its times so far are non-decreasing, the first segment over the cap
  // is a binary search and memory is already known: O(log window) instead of a scan
  // (the greedy bounds and min-sum DPs ask this of every row many times per DP).
  int qualifying(int i, int max_count, double cap_ms) {
    if (!cap_count_.empty()) max_count = std::min(max_count, cap_count_[static_cast<std::size_t>(i)]);
    const std::size_t limit =
        static_cast<std::size_t>(std::min<std::int64_t>(size() - i, max_count));
    const VarlenRows::Row& row = rows_.rows[static_cast<std::size_t>(i)];
    VarlenRows::Fit& fit = (*fit_)[static_cast<std::size_t>(i)];
    if (monotone_ && row.sorted) {
      const std::size_t costed = std::min(row.time_ms.size(), limit);
      const std::size_t within = static_cast<std::size_t>(
          std::upper_bound(row.time_ms.begin(), row.time_ms.begin() + costed, cap_ms) -
          row.time_ms.begin());
      if (within > fit.known) advance_fit(row, fit, within);
      if (within <= fit.known) {
        // Stopped by the cap or the end, every segment before known to fit.
        if (within < costed || costed == limit) return static_cast<int>(within);
      } else if (fit.closed) {
        return static_cast<int>(fit.known);  // segment `known` is within the cap, too heavy
      }
    }
    int count = 0;
    scan_row(i, max_count, cap_ms, [&](int c, double) { count = c; });
    return count;
  }

  template <typename Emit>
  void scan_row(int i, int max_count, double cap_ms, Emit&& emit) {
    if (!cap_count_.empty()) max_count = std::min(max_count, cap_count_[static_cast<std::size_t>(i)]);
    const int end = static_cast<int>(std::min<std::int64_t>(size(), std::int64_t{i} + max_count));
    VarlenRows::Row& row = rows_.rows[static_cast<std::size_t>(i)];
    VarlenRows::Fit& fit = (*fit_)[static_cast<std::size_t>(i)];
    std::size_t within = 0;  // not monotone: the prefix up to the last segment within the cap
    for (int j = i; j < end; ++j) {
      const std::size_t c = static_cast<std::size_t>(j - i);
      if (c == row.time_ms.size()) extend(i, &row);
      const double t = row.time_ms[c];
      if (t > cap_ms && monotone_) break;
      // Memory is checked once per segment and rule; where the row is costed past c, its
      // frontier by bisection (advance_fit()).
      if (c >= fit.known && monotone_ && c + 1 < row.time_ms.size()) {
        advance_fit(row, fit, row.time_ms.size());
      }
      if (c >= fit.known) {
        if (fit.closed) break;
        if (!segment_memory_fits(row, c)) {
          fit.closed = true;
          break;
        }
        fit.known = c + 1;
      }
      if (monotone_) {
        emit(j - i + 1, t);
      } else if (t <= cap_ms) {
        within = c + 1;
      }
    }
    for (std::size_t c = 0; c < within; ++c) emit(static_cast<int>(c) + 1, row.time_ms[c]);
  }

  // Whether segment c of `row` (costed) fits this scanner's rule.
  bool segment_memory_fits(const VarlenRows::Row& row, std::size_t c) const {
    const auto most =
        std::span<const std::uint32_t>(row.most_in_flight).subspan(c * stride_, stride_);
    return costs_.fits_in_flight(most, rule_for(rule_, c + 1));
  }

  // Moves a row's fit frontier under this rule over its costed segments up to `upto` by
  // bisection: where time is monotone (the analytic model) memory grows along a row too
  // (each sample adds more to what a stage holds than it can take off a transient
  // peak), so the segments that fit are a prefix, as a scan that stops at the first too
  // heavy one takes them. O(log) checks where the scan makes one per segment; a later
  // rule's first scan of a row costed by earlier DPs checks most of its segments. The
  // last segment is checked first: a row that memory does not stop before its end (most,
  // where the time cap binds first) takes one check (GPT-6.7B pp 4 short256: 40% fewer
  // checks in a plan's first DP, each a likely cache miss).
  void advance_fit(const VarlenRows::Row& row, VarlenRows::Fit& fit, std::size_t upto) const {
    if (fit.closed || upto <= fit.known) return;
    std::size_t lo = fit.known, hi = upto;  // [known, lo) fit, [hi, upto) do not
    if (segment_memory_fits(row, hi - 1)) {
      lo = hi;
    } else {
      --hi;
    }
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (segment_memory_fits(row, mid)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    fit.known = lo;
    fit.closed = lo < upto;
  }

  // Whether segment c of row i ([i, i + c + 1)) exists and fits this scanner's rule and
  // capacities, costing the row up to it. Memory grows with a segment, so a segment that
  // fits shows that the shorter ones do (MixedScanner asks from where a lighter mode
  // stopped fitting).
  bool segment_fits(int i, std::size_t c) {
    if (static_cast<std::size_t>(i) + c >= lengths_.size()) return false;
    const auto row_index = static_cast<std::size_t>(i);
    if (!cap_count_.empty() && c >= static_cast<std::size_t>(cap_count_[row_index])) return false;
    VarlenRows::Fit& fit = (*fit_)[row_index];
    if (c < fit.known) return true;
    if (fit.closed) return false;  // segment `known` <= c does not fit
    VarlenRows::Row& row = rows_.rows[row_index];
    while (row.time_ms.size() <= c) extend(i, &row);
    if (segment_memory_fits(row, c)) {
      fit.known = c + 1;
      return true;
    }
    if (c == fit.known) fit.closed = true;
    return false;
  }
  // The time of segment c of row i. REQUIRES: segment_fits(i, c) said so.
  double segment_time(int i, std::size_t c) const {
    return rows_.rows[static_cast<std::size_t>(i)].time_ms[c];
  }
  // The merged and affine lower bounds hold for any mix of heavier modes (time grows with
  // recomputation): MixedScanner takes its lightest mode's.
  bool monotone() const { return monotone_; }

 private:
  // Costs the next segments of row i (REQUIRES: one is left): as many as the cost model
  // costs for the price of one (ShapeCosts::costing_lanes(); the analytic model four)
  // while the row has samples, and the partner's row i with them when that row stands at
  // the same segment: one cost-model call for all, the same numbers as one call per
  // segment and mode. Segments past what this scan reads stay for later scans.
  void extend(int i, VarlenRows::Row* row) {
    const std::size_t c = row->time_ms.size();
    const auto row_index = static_cast<std::size_t>(i);
    std::size_t ahead = std::min(lanes_, lengths_.size() - row_index - c);
    if (!cap_count_.empty()) {  // no segment past the capacities (c is below them)
      ahead = std::min(ahead, static_cast<std::size_t>(cap_count_[row_index]) - c);
    }
    VarlenRows::Row* partner = partner_ != nullptr ? &partner_->rows[row_index] : nullptr;
    const bool joint = partner != nullptr && partner->time_ms.size() == c && !partner_->sample_too_large;
    shapes_.clear();
    densities_.clear();
    for (std::size_t a = 0; a < ahead; ++a) {
      const ModelLengths& l = lengths_[row_index + c + a];
      row->grow(l.enc, l.dec, stride_);
      if (joint) partner->grow(l.enc, l.dec, stride_);  // the same sums: the same segment
      const MicroBatchShape& shape = shapes_.emplace_back(MicroBatchShape{
          .batch = 1, .seqlen = round_up(row->enc, multiple_), .dec_seqlen = round_up(row->dec, multiple_)});
      // In the form its micro-batch takes (a lone sample dense where the model says so).
      densities_.push_back(
          varlen_row_density(c + a + 1, lone_, row->enc_squares, row->dec_squares, shape, kind_));
    }
    const std::size_t modes = joint ? 2 : 1;
    times_.resize(ahead * modes);
    many_bytes_.resize(ahead * modes * 2 * stride_);
    many_most_.resize(ahead * modes * stride_);
    costs_.evaluate_stages_many(shapes_, densities_, std::span<const Recompute>(modes_).first(modes),
                                times_, many_bytes_);
    costs_.most_in_flight(many_bytes_, many_most_);
    // By mode: this row's, then the partner's.
    const std::span<const double> times(times_);
    const std::span<const std::uint32_t> most(many_most_);
    row->append(times.first(ahead), most.first(ahead * stride_));
    if (joint) partner->append(times.subspan(ahead), most.subspan(ahead * stride_));
  }

  ShapeCosts& costs_;
  MemoryRule rule_;
  ModelKind kind_;
  std::int64_t multiple_;
  std::size_t stride_;                 // stages: most-in-flight counts per segment
  VarlenRows& rows_;
  VarlenRows* partner_;                // costed along (constructor), or nullptr
  std::array<Recompute, 2> modes_{};   // this scanner's mode, the partner's
  std::size_t lanes_ = static_cast<std::size_t>(costs_.costing_lanes());  // segments per extend()
  std::vector<MicroBatchShape> shapes_;       // extend()'s segments
  std::vector<AttentionDensity> densities_;
  std::vector<double> times_;                 // their times, per segment and mode
  std::vector<std::int64_t> many_bytes_;      // their held and peak bytes, per segment and mode
  std::vector<std::uint32_t> many_most_;      // their most in flight (the same order)
  std::vector<ModelLengths> lengths_;  // model lengths in sequence order
  TokenTotals tokens_;                 // over the sequence
  const AffineTimeBound* affine_ = nullptr;  // costs_'s, where it applies (constructor)
  std::vector<VarlenRows::Fit>* fit_;  // per row, under rule_ (kept in rows_ for later DPs)
  std::int64_t enc_cap_ = 0, dec_cap_ = 0;
  std::vector<int> cap_count_;         // per row, with capacities: samples that fit them
  bool monotone_ = costs_.cost_model().monotone();  // scan_row()'s early stop by time
  LoneSample lone_ = lone_sample_form(costs_.cost_model());  // one-sample segments' form
};

// Varlen segments in mixed recompute (BatchingOptions::mixed_recompute): each segment
// costs its time in the lightest mode, up to the DP's, whose memory rule it fits. A
// lighter mode stores more, so as a segment grows it fits the lighter modes first: a row
// runs in the lightest mode until that stops fitting, then in the next, and so on. The
// times stay non-decreasing along a row where each mode's do, as a heavier mode adds
// recomputation (CostModel: more work never runs faster). One VarlenScanner per mode,
// lightest first, holds the rows and fits.
class MixedScanner : public ScannerBase<MixedScanner> {
 public:
  explicit MixedScanner(std::vector<VarlenScanner> modes) : modes_(std::move(modes)) {}

  int size() const { return modes_.front().size(); }
  double merged_time_ms() const { return modes_.front().merged_time_ms(); }
  double capped_sum_bound(double cap_ms, int fewest = 1) const {
    return modes_.front().capped_sum_bound(cap_ms, fewest);
  }
  // A part of a segment fits the mode the segment runs in, or a lighter one, and runs no
  // slower (ScannerBase::fewest_microbatches()).
  bool monotone() const { return modes_.front().monotone(); }

  template <typename Emit>
  void scan_row(int i, int max_count, double cap_ms, Emit&& emit) {
    const std::size_t end =
        static_cast<std::size_t>(std::min<std::int64_t>(size() - i, max_count));
    const bool monotone = modes_.front().monotone();
    std::size_t mode = 0, within = 0;
    prefix_.clear();
    for (std::size_t c = 0; c < end; ++c) {
      while (mode < modes_.size() && !modes_[mode].segment_fits(i, c)) ++mode;
      if (mode == modes_.size()) break;  // too heavy for every mode
      const double t = modes_[mode].segment_time(i, c);
      if (monotone) {
        if (t > cap_ms) break;
        emit(static_cast<int>(c) + 1, t);
        continue;
      }
      prefix_.push_back(t);  // not monotone: the prefix up to the last segment within the cap
      if (t <= cap_ms) within = prefix_.size();
    }
    for (std::size_t c = 0; c < within; ++c) emit(static_cast<int>(c) + 1, prefix_[c]);
  }

 private:
  std::vector<VarlenScanner> modes_;
  std::vector<double> prefix_;
};

template <typename Scanner>
Scanner make_scanner(const StrategyInput& input, std::span<const std::size_t> seq,
                     ShapeCosts& costs, MemoryRule rule) {
  const BatchingOptions& o = input.options;
  if constexpr (std::is_same_v<Scanner, VarlenScanner>) {
    const bool capped = o.varlen_row_capacity;
    VarlenRows& rows = input.memos->rows_for(seq, costs.recompute(), costs.memory_limit_bytes());
    // None and selective cost the same segments (their memory frontiers are close, and
    // selective is almost always searched after none); full, usually pruned by the
    // recompute bound, costs its own. A fixed mode costs only itself.
    VarlenRows* partner = nullptr;
    if (!o.recompute && costs.recompute() != Recompute::Full) {
      partner = rows.by_mode[static_cast<std::size_t>(
          costs.recompute() == Recompute::None ? Recompute::Selective : Recompute::None)];
    }
    return VarlenScanner(input.samples, seq, o.kind, o.seqlen_multiple, costs, rule, rows,
                         partner, capped ? o.max_seqlen : 0,
                         capped && o.kind == ModelKind::T5 ? o.max_target_len + 1 : 0);
  } else if constexpr (std::is_same_v<Scanner, MixedScanner>) {
    std::vector<ShapeCosts*> chain;  // costs' mode, then lighter ones
    for (ShapeCosts* c = &costs; c != nullptr; c = c->lighter()) chain.push_back(c);
    std::vector<VarlenScanner> modes;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      modes.push_back(make_scanner<VarlenScanner>(input, seq, **it, rule));
    }
    return MixedScanner(std::move(modes));
  } else {
    return PaddedScanner(input.samples, seq, o.kind, o.seqlen_multiple, costs, rule);
  }
}

std::vector<MicroBatch> cut(std::span<const Sample> samples, std::span<const std::size_t> seq,
                            const std::vector<int>& starts, const BatchingOptions& options,
                            LoneSample lone) {
  std::vector<MicroBatch> microbatches;
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const std::size_t begin = static_cast<std::size_t>(starts[k]);
    const std::size_t end = k + 1 < starts.size() ? static_cast<std::size_t>(starts[k + 1])
                                                  : seq.size();
    microbatches.push_back(make_microbatch(samples, seq.subspan(begin, end - begin), options, lone));
  }
  return microbatches;
}

PartitionOptions partition_options(const BatchingOptions& options, double sum_weight,
                                   double incumbent_ms, bool monotone) {
  return {.num_stages = options.num_stages,
          .sum_weight = sum_weight,
          .bubble_weight = options.bubble_weight,
          .min_tmax_interval_ms = options.min_tmax_interval_ms,
          // The thinned search reports threshold objectives: not comparable, no pruning.
          .incumbent_ms = options.min_tmax_interval_ms > 0 ? kInf : incumbent_ms,
          // Time grows with a segment's samples, where the cost model promises it.
          .items_bound_segments = monotone};
}

// The time cap of solve_sequence() by a bound U on the objective and a lower bound of Σ t
// that grows as the cap falls (sum_at(cap): a smaller cap means more micro-batches, a
// larger Σ bound, a smaller cap again): a few rounds until it settles (each keeps every
// partition that could beat U, so the fixed point does too). False if no partition can
// beat U. Out of line: inside solve_sequence() its two uses kept the mixed scanner's
// segment_fits() from being inlined (+2% plan instructions under per-micro-batch recompute).
template <typename SumAt>
[[gnu::noinline]] bool settle_cap_ms(double* cap_ms, double bound_ms, double weight, double slope,
                                     SumAt&& sum_at) {
  for (int round = 0; round < 16; ++round) {
    const double sum_ms = sum_at(*cap_ms);
    if (sum_ms == kInf) return false;
    const double next = (bound_ms - weight * sum_ms + (kSlack - 1) * bound_ms) / slope;
    if (!(next < *cap_ms)) break;
    const bool settled = next > *cap_ms * (1 - 1e-3);
    *cap_ms = next;
    if (settled) break;
  }
  return true;
}

// ScannerBase::fewest_microbatches(cap_ms) of a scanner whose rows are non-decreasing, read
// off its table within a cap at or above cap_ms (each row the segments that fit and are
// within that cap): a greedy micro-batch from i takes the row's times up to cap_ms, or
// its sample alone (which fits) if none.
int fewest_microbatches_in(const SegmentTable& table, double cap_ms) {
  int microbatches = 0;
  for (int i = 0; i < table.size(); ++microbatches) {
    const std::span<const double> row = table.row(i);
    const auto within = std::upper_bound(row.begin(), row.end(), cap_ms) - row.begin();
    i += std::max(static_cast<int>(within), 1);
  }
  return microbatches;
}

// The exact DP over one ordered sequence, on a segment table pruned by time. With an
// upper bound U on the optimum (the incumbent, a cut an earlier DP chose, or the best
// greedy partition, which are cheap), a segment of time t can only be in a partition P
// of objective <= U if
//   (w + p − 1)·t <= U                         (t <= max(P) and t <= Σ(P)), and
//   t <= (U − w·F) / (p − 1)                   (t <= max(P), Σ(P) >= F),
// where F = min Σ over the segments passing the first test, found by a DP that does not
// store the table. Only segments passing both are stored and searched, so the result is
// the exact optimum. p = 1: F is the optimum itself but its partition is needed, so the
// first test alone prunes. The thinned (reference) search needs every segment time.
template <typename Scanner>
Partition solve_sequence(const StrategyInput& input, std::span<const std::size_t> seq,
                         ShapeCosts& costs, MemoryRule rule, double weight,
                         double incumbent_ms) {
  const BatchingOptions& options = input.options;
  const PartitionOptions partition =
      partition_options(options, weight, incumbent_ms, costs.cost_model().monotone());
  Scanner scanner = make_scanner<Scanner>(input, seq, costs, rule);
  if (options.min_tmax_interval_ms > 0) return solve_partition(scanner.table(), partition);

  const double slope = options.bubble_weight * (options.num_stages - 1);
  // Caps the segment time by a bound U on the objective: (w + p − 1)·t <= U, then
  // t <= (U − w·F)/(p − 1) with F a lower bound of Σ t that costs no segment: every
  // sample in one varlen micro-batch, then the affine bound over the micro-batches the
  // cap leaves room for (it scans far shorter rows than the first test alone when there
  // are many micro-batches). Returns false if no partition can beat U.
  double cap_ms = kInf;
  auto cap_without_segments = [&](double bound_ms) {
    cap_ms = std::min(cap_ms, bound_ms * kSlack / (weight + slope));
    if (slope == 0 || bound_ms == kInf) return true;
    const double merged_ms = scanner.merged_time_ms();
    if (std::isfinite(merged_ms)) {
      cap_ms = std::min(cap_ms, (bound_ms - weight * merged_ms + (kSlack - 1) * bound_ms) / slope);
    }
    if constexpr (requires { scanner.capped_sum_bound(0.0); }) {
      return settle_cap_ms(&cap_ms, bound_ms, weight, slope,
                           [&](double cap) { return scanner.capped_sum_bound(cap); });
    }
    return true;
  };
  // Then with F = min Σ t over the segments left.
  auto cap_by = [&](double bound_ms) {
    if (!cap_without_segments(bound_ms)) return false;
    if (slope == 0 || bound_ms == kInf) return true;
    if constexpr (requires { scanner.capped_sum_bound(0.0, 1); }) {
      // The affine bound again, with the fewest micro-batches that fit within the cap:
      // memory, which it does not see, usually needs more than the cap alone (GPT-6.7B pp 4
      // at 40 GiB, short256: ~30 of ~2,200 tokens where the cap alone allowed 11), and a
      // smaller cap costs shorter rows for min_sum() below.
      const bool any = settle_cap_ms(&cap_ms, bound_ms, weight, slope, [&](double cap) {
        return scanner.capped_sum_bound(cap, scanner.fewest_microbatches(cap));
      });
      if (!any) return false;
    }
    const double min_sum = scanner.min_sum(cap_ms);
    if (min_sum == kInf) return false;
    cap_ms = std::min(cap_ms, (bound_ms - weight * min_sum + (kSlack - 1) * bound_ms) / slope);
    return true;
  };
  // An incumbent no partition can beat costs no segment (T5-11B pp 8 short256: full
  // recompute, whose samples alone were ~500 evaluations per DP).
  if (!cap_without_segments(incumbent_ms)) return Partition{};

  // A sample that does not fit alone is in no segment that fits (monotone memory).
  for (int i = 0; i < scanner.size(); ++i) {
    bool alone_fits = false;
    scanner.scan_row(i, 1, kInf, [&](int, double) { alone_fits = true; });
    if (!alone_fits) {
      if constexpr (std::is_same_v<Scanner, VarlenScanner>) scanner.mark_sample_too_large();
      return Partition{};
    }
  }
  Partition probe;
  double bound = incumbent_ms;
  if constexpr (std::is_same_v<Scanner, VarlenScanner>) {
    // A cut another DP chose on this sequence is the first bound when it beats the
    // incumbent: cheaper than the greedy bound below and, as the rules differ little,
    // tighter.
    Partition known = scanner.best_known_cut(weight, slope);
    if (known.found && known.objective_ms < bound) {
      probe = std::move(known);
      bound = probe.objective_ms;
    }
  }
  // Nothing fits, or nothing beats the incumbent.
  if (!cap_by(bound)) return probe;
  if (!probe.found) {
    // Greedy partitions within the cap, whose segments the table holds anyway.
    Partition greedy = scanner.greedy_bound(weight, slope, cap_ms);
    if (greedy.found && greedy.objective_ms < bound) {
      probe = std::move(greedy);
      bound = probe.objective_ms;
      if (!cap_by(bound)) return probe;
    }
  }
  // The threshold search skips the thresholds the affine bound rules out (with the fewest
  // micro-batches within each, as cap_by() takes it, where the cap alone does not): the
  // lower end of its chain, where small thresholds force many micro-batches (GPT-6.7B pp 4
  // short256: a third of the chain's passes).
  const SegmentTable table = scanner.table(std::numeric_limits<int>::max(), cap_ms);
  PartitionOptions bounded = partition;
  if constexpr (requires { scanner.capped_sum_bound(0.0, 1); }) {
    if (slope > 0) {
      // The thresholds are the table's times, within its cap: where its rows are sorted,
      // the greedy walk reads them there (they are compact and warm; the scanner's rows
      // lie apart, one cache miss or more each).
      bool sorted_rows = false;
      if constexpr (requires { scanner.rows_sorted(); }) sorted_rows = scanner.rows_sorted();
      bounded.sum_lower_bound_ms = [&scanner, &table, sorted_rows, cap_ms](double cap, double enough) {
        const double quick = scanner.capped_sum_bound(cap);
        if (quick >= enough) return quick;
        const int fewest = sorted_rows && cap <= cap_ms ? fewest_microbatches_in(table, cap)
                                                        : scanner.fewest_microbatches(cap);
        return scanner.capped_sum_bound(cap, fewest);
      };
    }
  }
  // The search itself starts from the caller's incumbent, not the bound: among equally
  // good cuts it then picks the one it would pick without a known cut.
  Partition best = solve_partition(table, bounded);
  // The pruned table holds the probe's segments when costs are monotone; if they are
  // not, keep the better of the two.
  if (probe.found && (!best.found || probe.objective_ms < best.objective_ms)) {
    best = std::move(probe);
  }
  if constexpr (std::is_same_v<Scanner, VarlenScanner>) {
    if (best.found) scanner.remember_cut(best.starts);
  }
  return best;
}

// The exact DP for the strategy's micro-batch form.
Partition solve(const StrategyInput& input, std::span<const std::size_t> seq, ShapeCosts& costs,
                MemoryRule rule, double weight, double incumbent_ms) {
  if (input.options.strategy == Strategy::DynaPipe) {
    if (!input.options.varlen_padded_cut) {
      if (costs.lighter() != nullptr) {
        return solve_sequence<MixedScanner>(input, seq, costs, rule, weight, incumbent_ms);
      }
      return solve_sequence<VarlenScanner>(input, seq, costs, rule, weight, incumbent_ms);
    }
    // A padded cut of varlen micro-batches: a cut's padded objective is only an upper
    // bound of its varlen one, so the incumbent (a varlen objective) cannot prune.
    incumbent_ms = kInf;
  }
  return solve_sequence<PaddedScanner>(input, seq, costs, rule, weight, incumbent_ms);
}

// One DP over all samples with objective Σt/dp + (p−1)·max t, then Karmarkar–Karp.
std::optional<Candidate> split_microbatches(const StrategyInput& input, ShapeCosts& costs,
                                            MemoryRule rule, double incumbent_ms) {
  const BatchingOptions& options = input.options;
  // With dp > 1 the DP objective only estimates the replicas' objective (it can be above
  // or below it), so another mode's result cannot prune this search.
  const double weight = 1.0 / options.dp;
  const Partition partition = solve(input, input.order, costs, rule, weight,
                                             options.dp == 1 ? incumbent_ms : kInf);
  if (!partition.found) return std::nullopt;
  std::vector<MicroBatch> microbatches = cut(input.samples, input.order, partition.starts, options,
                                                 lone_sample_form(costs.cost_model()));
  // Fewer micro-batches than replicas: leave it to the split by samples.
  if (microbatches.size() < static_cast<std::size_t>(options.dp)) return std::nullopt;

  Candidate candidate;
  candidate.replicas.resize(static_cast<std::size_t>(options.dp));
  // Karmarkar–Karp on the micro-batches' times; one replica takes all, uncosted
  // (replicas_objective() below costs them).
  std::vector<int> owner(microbatches.size(), 0);
  if (options.dp > 1) {
    std::vector<double> times;
    for (const MicroBatch& mb : microbatches) times.push_back(mixed_cost_of(costs, mb, rule).time_ms);
    owner = balance_replicas(times, options.dp);
  }
  for (std::size_t k = 0; k < microbatches.size(); ++k) {  // DP order inside each replica
    candidate.replicas[static_cast<std::size_t>(owner[k])].push_back(std::move(microbatches[k]));
  }
  const std::optional<double> objective =
      replicas_objective(candidate.replicas, costs, rule, options);
  // A padded cut's segments fit as padded rows; run varlen they fit too wherever a varlen
  // row is no heavier than the padded one, which a measured table need not promise (a
  // long row folded onto its longest measured length, at a batch it did not measure).
  if (!objective && options.varlen_padded_cut) return std::nullopt;
  DYNAPIPE_CHECK(objective.has_value(), "a DP micro-batch does not fit its own memory rule");
  if (!(*objective < incumbent_ms)) return std::nullopt;
  candidate.objective_ms = *objective;
  return candidate;
}

// Deal the ordered samples to replicas in a snake (0, 1, .., dp−1, dp−1, .., 0, ...) so
// every replica gets the same length profile, then one exact DP per replica.
std::optional<Candidate> split_samples(const StrategyInput& input, ShapeCosts& costs,
                                       MemoryRule rule, double incumbent_ms) {
  const BatchingOptions& options = input.options;
  const std::size_t dp = static_cast<std::size_t>(options.dp);
  std::vector<std::vector<std::size_t>> shards(dp);
  for (std::size_t k = 0; k < input.order.size(); ++k) {
    const std::size_t round = k / dp, slot = k % dp;
    shards[round % 2 == 0 ? slot : dp - 1 - slot].push_back(input.order[k]);
  }
  Candidate candidate;
  candidate.replicas.resize(dp);
  if (input.order.size() < dp) return std::nullopt;  // a replica would get no sample
  for (std::size_t r = 0; r < dp; ++r) {
    // Each replica's objective is a lower bound of the maximum: the incumbent prunes.
    const Partition partition = solve(input, shards[r], costs, rule, 1.0, incumbent_ms);
    if (!partition.found) return std::nullopt;
    candidate.replicas[r] =
        cut(input.samples, shards[r], partition.starts, options, lone_sample_form(costs.cost_model()));
  }
  const std::optional<double> objective =
      replicas_objective(candidate.replicas, costs, rule, options);
  DYNAPIPE_CHECK(objective.has_value(), "a DP micro-batch does not fit its own memory rule");
  if (!(*objective < incumbent_ms)) return std::nullopt;
  candidate.objective_ms = *objective;
  return candidate;
}

}  // namespace

std::optional<Candidate> run_dynapipe(const StrategyInput& input, ShapeCosts& costs,
                                      MemoryRule rule, double incumbent_ms) {
  const ReplicaSplit split = input.options.dp == 1 ? ReplicaSplit::Microbatches
                                                   : input.options.replica_split;
  std::optional<Candidate> by_microbatches, by_samples;
  if (split != ReplicaSplit::Samples) {
    by_microbatches = split_microbatches(input, costs, rule, incumbent_ms);
  }
  if (split != ReplicaSplit::Microbatches) {
    const double bound = by_microbatches ? by_microbatches->objective_ms : incumbent_ms;
    by_samples = split_samples(input, costs, rule, bound);
  }
  return by_samples ? by_samples : by_microbatches;
}

}  // namespace dynapipe::detail
