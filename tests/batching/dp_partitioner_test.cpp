#include "dynapipe/batching/dp_partitioner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/core/units.h"

namespace dynapipe {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The reference's toy cost: t = 3·(0.5 + 0.001·count·round8(max length)), lengths sorted
// descending so the first item of a segment is its longest.
SegmentTable toy_table(const std::vector<std::int64_t>& lengths) {
  const int n = static_cast<int>(lengths.size());
  SegmentTable table(n);
  for (int i = 0; i < n; ++i) {
    for (int c = 1; i + c <= n; ++c) {
      table.push(i, 3 * (0.5 + 0.001 * c * static_cast<double>(round_up(lengths[i], 8))));
    }
  }
  return table;
}

struct BruteForce {
  double objective = kInf;
  std::vector<int> starts;
};

// Every one of the 2^(n−1) cut sets.
BruteForce brute_force(const SegmentTable& table, int num_stages, double weight) {
  const int n = table.size();
  BruteForce best;
  for (std::uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
    std::vector<int> starts{0};
    for (int k = 1; k < n; ++k) {
      if (mask & (1u << (k - 1))) starts.push_back(k);
    }
    double sum = 0, max = 0;
    bool ok = true;
    for (std::size_t s = 0; s < starts.size() && ok; ++s) {
      const int end = s + 1 < starts.size() ? starts[s + 1] : n;
      const int count = end - starts[s];
      if (count > table.window(starts[s])) {
        ok = false;
        break;
      }
      const double t = table.time_ms(starts[s], count);
      sum += t;
      max = std::max(max, t);
    }
    if (!ok) continue;
    const double objective = weight * sum + (num_stages - 1) * max;
    if (objective < best.objective) best = {objective, starts};
  }
  return best;
}

TEST(DpPartitionerTest, ReferenceFixtureFourStagesIsExact) {
  const SegmentTable table = toy_table({1000, 980, 500, 490, 480, 100, 90, 80});
  const Partition best = solve_partition(table, {.num_stages = 4});
  ASSERT_TRUE(best.found);
  EXPECT_NEAR(best.objective_ms, 32.376, 1e-9);
  EXPECT_EQ(best.starts, (std::vector<int>{0, 1, 2, 3, 5}));
  EXPECT_NEAR(best.sum_ms, 18.876, 1e-9);
  EXPECT_NEAR(best.max_ms, 4.5, 1e-9);
}

TEST(DpPartitionerTest, ReferenceThinningReproducesItsSuboptimalAnswer) {
  const SegmentTable table = toy_table({1000, 980, 500, 490, 480, 100, 90, 80});
  const Partition thinned =
      solve_partition(table, {.num_stages = 4, .min_tmax_interval_ms = 5});
  ASSERT_TRUE(thinned.found);
  EXPECT_NEAR(thinned.objective_ms, 39.204, 1e-9);
  EXPECT_EQ(thinned.starts, (std::vector<int>{0, 1, 2, 5}));
}

TEST(DpPartitionerTest, ReferenceFixtureOneStageMinimisesTheSum) {
  const SegmentTable table = toy_table({2048, 1500, 1200, 700, 650, 300, 120, 64, 40, 16});
  const Partition best = solve_partition(table, {.num_stages = 1});
  ASSERT_TRUE(best.found);
  EXPECT_NEAR(best.objective_ms, 28.944, 1e-9);
  EXPECT_EQ(best.starts, (std::vector<int>{0, 1, 3, 6}));
  EXPECT_EQ(best.dp_passes, 1);
}

TEST(DpPartitionerTest, EmptyAndUncoverableTables) {
  EXPECT_TRUE(solve_partition(SegmentTable(0), {.num_stages = 4}).found);
  SegmentTable gap(3);  // item 1 starts no segment and none covers it
  gap.push(0, 1.0);
  gap.push(2, 1.0);
  const Partition none = solve_partition(gap, {.num_stages = 2});
  EXPECT_FALSE(none.found);
  EXPECT_TRUE(none.starts.empty());
}

TEST(DpPartitionerTest, PushRowEqualsPushingEachTime) {
  SegmentTable one_by_one(4), by_rows(4);
  const std::vector<std::vector<double>> rows{{1.0, 1.5, 2.5}, {}, {0.5, 0.75}, {2.0}};
  for (int i = 0; i < 4; ++i) {
    for (double t : rows[static_cast<std::size_t>(i)]) one_by_one.push(i, t);
    by_rows.push_row(i, std::span<const double>(rows[static_cast<std::size_t>(i)]).first(
                            std::min<std::size_t>(1, rows[static_cast<std::size_t>(i)].size())));
    by_rows.push_row(i, std::span<const double>(rows[static_cast<std::size_t>(i)]).subspan(
                            std::min<std::size_t>(1, rows[static_cast<std::size_t>(i)].size())));
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(by_rows.window(i), one_by_one.window(i));
    for (int c = 1; c <= by_rows.window(i); ++c) {
      EXPECT_EQ(by_rows.time_ms(i, c), one_by_one.time_ms(i, c));
    }
  }
  EXPECT_EQ(solve_partition(by_rows, {.num_stages = 2}).starts,
            solve_partition(one_by_one, {.num_stages = 2}).starts);
  SegmentTable short_table(2);
  const double too_many[] = {1.0, 2.0};
  EXPECT_THROW(short_table.push_row(1, too_many), Error);  // past the end
}

TEST(DpPartitionerTest, IncumbentPrunesWorseSolutions) {
  const SegmentTable table = toy_table({1000, 980, 500, 490, 480, 100, 90, 80});
  EXPECT_FALSE(solve_partition(table, {.num_stages = 4, .incumbent_ms = 32.0}).found);
  EXPECT_TRUE(solve_partition(table, {.num_stages = 4, .incumbent_ms = 32.5}).found);
}

// Random tables, three families: toy-cost monotone rows without and with memory windows,
// and arbitrary times (non-monotone), checked against all 2^(n−1) cut sets.
TEST(DpPartitionerTest, MatchesBruteForceOnRandomTables) {
  int checked = 0;
  for (std::uint64_t seed = 1; seed <= 600; ++seed) {
    Rng rng(seed);
    const int n = static_cast<int>(rng.uniform_int(1, 12));
    const int family = static_cast<int>(seed % 3);
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(n));
    for (auto& l : lengths) l = rng.uniform_int(1, 2048);
    std::sort(lengths.rbegin(), lengths.rend());
    const double fixed = rng.uniform(0.01, 2.0), per_token = rng.uniform(1e-4, 3e-3);
    const std::int64_t token_cap = rng.uniform_int(2048, 8192);
    SegmentTable table(n);
    for (int i = 0; i < n; ++i) {
      for (int c = 1; i + c <= n; ++c) {
        const std::int64_t tokens = c * round_up(lengths[static_cast<std::size_t>(i)], 8);
        if (family == 1 && c > 1 && tokens > token_cap) break;  // memory window
        const double t = family == 2 ? rng.uniform(0.1, 10.0)
                                     : fixed + per_token * static_cast<double>(tokens);
        table.push(i, t);
      }
    }
    for (int p : {1, 2, 4, 8}) {
      for (double weight : {1.0, 0.5}) {
        const BruteForce expected = brute_force(table, p, weight);
        const Partition got = solve_partition(table, {.num_stages = p, .sum_weight = weight});
        ASSERT_TRUE(got.found) << "seed " << seed << " p " << p;
        ASSERT_NEAR(got.objective_ms, expected.objective, 1e-9)
            << "seed " << seed << " family " << family << " n " << n << " p " << p;
        // The reported partition really has the reported objective.
        ASSERT_NEAR(weight * got.sum_ms + (p - 1) * got.max_ms, got.objective_ms, 1e-9);
        if (family != 2) {  // the toy costs: a segment is no faster than its longest item
          const Partition trusted = solve_partition(
              table, {.num_stages = p, .sum_weight = weight, .items_bound_segments = true});
          ASSERT_EQ(trusted.starts, got.starts) << "seed " << seed << " p " << p;
          ASSERT_EQ(trusted.objective_ms, got.objective_ms) << "seed " << seed << " p " << p;
          ASSERT_LE(trusted.dp_passes, got.dp_passes) << "seed " << seed << " p " << p;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 600 * 8);
}

// min Σ t over partitions using only segments with t <= threshold (+inf if none): a plain
// DP, the definition the search's passes must agree with.
double min_sum_within(const SegmentTable& table, double threshold) {
  std::vector<double> f(static_cast<std::size_t>(table.size()) + 1, kInf);
  f[0] = 0;
  for (int i = 0; i < table.size(); ++i) {
    if (f[i] == kInf) continue;
    for (int c = 1; c <= table.window(i); ++c) {
      const double t = table.time_ms(i, c);
      if (t <= threshold) f[i + c] = std::min(f[i + c], f[i] + t);
    }
  }
  return f.back();
}

// A table of n items whose rows grow with the segment, as the varlen costs do: 0.8 ms plus
// 0.002 ms per token of the items (16–512 each), plus up to `noise` ms per segment, kept
// non-decreasing along a row; or, not monotone, arbitrary times. Every segment time, sorted
// and distinct, is a threshold.
struct SweptTable {
  SegmentTable table;
  std::vector<double> thresholds;
};
SweptTable swept_table(Rng& rng, int n, int max_window, bool monotone, double noise) {
  std::vector<double> tokens(static_cast<std::size_t>(n));
  for (double& t : tokens) t = static_cast<double>(rng.uniform_int(16, 512));
  SweptTable out{SegmentTable(n), {}};
  for (int i = 0; i < n; ++i) {
    double time = 0, row_tokens = 0;
    for (int c = 1; c <= max_window && i + c <= n; ++c) {
      row_tokens += tokens[static_cast<std::size_t>(i + c - 1)];
      const double next = monotone ? 0.8 + 0.002 * row_tokens + rng.uniform(0, noise)
                                   : rng.uniform(0.5, 20.0);
      time = monotone ? std::max(time, next) : next;
      out.table.push(i, time);
      out.thresholds.push_back(time);
    }
  }
  std::sort(out.thresholds.begin(), out.thresholds.end());
  out.thresholds.erase(std::unique(out.thresholds.begin(), out.thresholds.end()), out.thresholds.end());
  return out;
}

// min over every threshold T of w·f_T + (p−1)·T: the optimum by its definition.
double every_threshold_optimum(const SweptTable& swept, int num_stages, double weight) {
  double best = kInf;
  for (double threshold : swept.thresholds) {
    const double f = min_sum_within(swept.table, threshold);
    if (f < kInf) best = std::min(best, weight * f + (num_stages - 1) * threshold);
  }
  return best;
}

// Tables too long for brute force (50–100 items, windows up to 40), where the search's
// descending chain takes tens of passes: its objective is the minimum over every segment
// time T of w·f_T + (p−1)·T, each f_T from a plain DP, and it runs far fewer passes than
// there are thresholds. Rows grow with the segment (the varlen costs' shape, with a little
// noise that keeps them sorted) or are arbitrary.
TEST(DpPartitionerTest, LongTablesMatchEveryThresholdSwept) {
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    Rng rng(seed);
    const int n = static_cast<int>(rng.uniform_int(50, 100));
    const bool monotone = seed % 4 != 0;
    const int max_window = static_cast<int>(rng.uniform_int(8, 40));
    const SweptTable swept = swept_table(rng, n, max_window, monotone, 1e-3);
    const SegmentTable& table = swept.table;
    const std::vector<double>& thresholds = swept.thresholds;
    for (int p : {2, 4, 8}) {
      for (double weight : {1.0, 0.5}) {
        const double expected = every_threshold_optimum(swept, p, weight);
        const Partition got = solve_partition(table, {.num_stages = p, .sum_weight = weight});
        ASSERT_TRUE(got.found) << "seed " << seed << " p " << p;
        ASSERT_NEAR(got.objective_ms, expected, 1e-9 * expected)
            << "seed " << seed << " monotone " << monotone << " p " << p << " w " << weight;
        ASSERT_NEAR(weight * got.sum_ms + (p - 1) * got.max_ms, got.objective_ms, 1e-9 * expected);
        EXPECT_LT(got.dp_passes, static_cast<int>(thresholds.size()) / 4) << "seed " << seed;
      }
    }
  }
}

// A caller's lower bound of f_T (PartitionOptions::sum_lower_bound_ms) lets the chain skip
// thresholds: the same optimum as without it and as every threshold swept, with fewer DP
// passes. The bounds: f_T itself (the tightest there is, so the most skips, and bounds that
// sit on the incumbent exactly), f_T shaved by 2% (far from it, as the cost model's affine
// bound can be) and 0 (no information: the same passes as without).
TEST(DpPartitionerTest, ALowerBoundOfTheSumSkipsThresholdsAndKeepsTheOptimum) {
  int fewer = 0, runs = 0;
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    Rng rng(seed);
    const int n = static_cast<int>(rng.uniform_int(12, 80));
    const int max_window = static_cast<int>(rng.uniform_int(4, 30));
    const SweptTable swept = swept_table(rng, n, max_window, true, 0.0);
    const SegmentTable& table = swept.table;
    for (int p : {2, 4, 8}) {
      for (double weight : {1.0, 0.5}) {
        const double expected = every_threshold_optimum(swept, p, weight);
        const PartitionOptions plain{.num_stages = p, .sum_weight = weight, .items_bound_segments = true};
        const Partition without = solve_partition(table, plain);
        for (const double shave : {1.0, 0.98, 0.0}) {
          PartitionOptions bounded = plain;
          bounded.sum_lower_bound_ms = [&](double t, double) { return shave * min_sum_within(table, t); };
          const Partition got = solve_partition(table, bounded);
          ASSERT_TRUE(got.found) << "seed " << seed << " p " << p;
          ASSERT_NEAR(got.objective_ms, expected, 1e-9 * expected)
              << "seed " << seed << " p " << p << " w " << weight << " shave " << shave;
          ASSERT_NEAR(weight * got.sum_ms + (p - 1) * got.max_ms, got.objective_ms, 1e-9 * expected);
          ASSERT_LE(got.dp_passes, without.dp_passes) << "seed " << seed << " shave " << shave;
          if (shave == 0.0) {
            EXPECT_EQ(got.starts, without.starts) << "seed " << seed;
            EXPECT_EQ(got.dp_passes, without.dp_passes) << "seed " << seed;
          }
          if (shave == 1.0) {
            fewer += got.dp_passes < without.dp_passes ? 1 : 0;
            ++runs;
          }
        }
      }
    }
  }
  // The tightest bound leaves out a pass in most searches.
  EXPECT_GT(fewer, runs / 2) << fewer << " of " << runs;
}

TEST(DpPartitionerTest, ThinnedSearchEqualsEvaluatingEveryKeptThreshold) {
  for (std::uint64_t seed = 1; seed <= 100; ++seed) {
    Rng rng(seed);
    const int n = static_cast<int>(rng.uniform_int(2, 10));
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(n));
    for (auto& l : lengths) l = rng.uniform_int(1, 2048);
    std::sort(lengths.rbegin(), lengths.rend());
    const SegmentTable table = toy_table(lengths);
    const double interval = rng.uniform(0.5, 5.0);
    // Reference semantics, spelled out: for every kept threshold T, brute-force f_T.
    std::vector<double> all;
    for (int i = 0; i < n; ++i) {
      for (double t : table.row(i)) all.push_back(t);
    }
    std::sort(all.begin(), all.end());
    std::vector<double> kept;
    for (double t : all) {
      if (kept.empty() || t > kept.back() + interval) kept.push_back(t);
    }
    if (kept.back() < all.back()) kept.push_back(all.back());  // our one deviation
    double expected = kInf;
    for (double threshold : kept) {
      SegmentTable capped(n);
      for (int i = 0; i < n; ++i) {
        for (double t : table.row(i)) {
          if (t > threshold) break;
          capped.push(i, t);
        }
      }
      const BruteForce f = brute_force(capped, 1, 1.0);
      if (f.objective < kInf) expected = std::min(expected, f.objective + 3 * threshold);
    }
    const Partition got =
        solve_partition(table, {.num_stages = 4, .min_tmax_interval_ms = interval});
    ASSERT_NEAR(got.objective_ms, expected, 1e-9) << "seed " << seed;
  }
}

}  // namespace
}  // namespace dynapipe
