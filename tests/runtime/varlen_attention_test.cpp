// Batched varlen attention (runtime/model/varlen_attention.h): the grouping is exact for its
// objective (brute force over every partition of small span sets), and on random layouts
// the batched call gives the dense masked path's outputs and gradients, whatever the
// grouping, for self (causal or not) and cross attention.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dynapipe/core/error.h"
#include "runtime/model/layers.h"
#include "runtime/model/varlen_attention.h"

namespace dynapipe::runtime::model {
namespace {

class VarlenAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

double partition_cost(const std::vector<Span>& spans, const std::vector<std::vector<std::size_t>>& groups,
                      double overhead) {
  double cost = 0.0;
  for (const auto& g : groups) {
    std::int64_t q = 0, k = 0;
    for (std::size_t i : g) {
      q = std::max(q, spans[i].q_len);
      k = std::max(k, spans[i].k_len);
    }
    cost += overhead + static_cast<double>(g.size()) * static_cast<double>(q * k);
  }
  return cost;
}

// Cheapest cost over every set partition (restricted growth strings).
double brute_force_cost(const std::vector<Span>& spans, double overhead) {
  const std::size_t n = spans.size();
  std::vector<std::size_t> label(n, 0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(std::size_t, std::size_t)> rec = [&](std::size_t i, std::size_t used) {
    if (i == n) {
      std::vector<std::vector<std::size_t>> groups(used);
      for (std::size_t j = 0; j < n; ++j) groups[label[j]].push_back(j);
      best = std::min(best, partition_cost(spans, groups, overhead));
      return;
    }
    for (std::size_t g = 0; g <= used; ++g) {
      label[i] = g;
      rec(i + 1, std::max(used, g + 1));
    }
  };
  rec(0, 0);
  return best;
}

void expect_partition(const std::vector<std::vector<std::size_t>>& groups, std::size_t n) {
  std::multiset<std::size_t> seen;
  for (const auto& g : groups) {
    EXPECT_FALSE(g.empty());
    seen.insert(g.begin(), g.end());
  }
  ASSERT_EQ(seen.size(), n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
}

std::vector<Span> self_spans(const std::vector<std::int64_t>& lengths) {
  std::vector<Span> spans;
  std::int64_t start = 0;
  for (std::int64_t len : lengths) {
    spans.push_back({0, start, len, start, len});
    start += len;
  }
  return spans;
}

TEST_F(VarlenAttentionTest, GroupingOnHandCheckedLengths) {
  // 4, 4, 4 and 100: sharing costs 4·100² extra, far above one call's overhead of 1,000.
  auto spans = self_spans({4, 100, 4, 4});
  auto groups = group_spans(spans, 1000.0);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<std::size_t>{0, 2, 3}));
  EXPECT_EQ(groups[1], (std::vector<std::size_t>{1}));
  // Free calls: one per distinct length. Dear calls: everything in one.
  EXPECT_EQ(group_spans(self_spans({3, 5, 3, 7, 5}), 0.0).size(), 3u);
  EXPECT_EQ(group_spans(self_spans({3, 5, 3, 7, 5, 900}), 1e12).size(), 1u);
  // 10 and 11 share (11² · 2 + C < 10² + 11² + 2C), 40 stays alone.
  auto mixed = group_spans(self_spans({10, 11, 40}), 200.0);
  ASSERT_EQ(mixed.size(), 2u);
  EXPECT_EQ(mixed[0], (std::vector<std::size_t>{0, 1}));
  EXPECT_TRUE(group_spans({}, 100.0).empty());
}

TEST_F(VarlenAttentionTest, GroupingIsOptimalAgainstBruteForce) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    const std::size_t n = 1 + rng() % 8;
    std::vector<std::int64_t> lengths;
    for (std::size_t i = 0; i < n; ++i) lengths.push_back(1 + static_cast<std::int64_t>(rng() % 40));
    const double overhead = static_cast<double>(rng() % 2000);
    auto spans = self_spans(lengths);
    auto groups = group_spans(spans, overhead);
    SCOPED_TRACE(trial);
    expect_partition(groups, n);
    EXPECT_DOUBLE_EQ(partition_cost(spans, groups, overhead), brute_force_cost(spans, overhead));
  }
}

TEST_F(VarlenAttentionTest, GroupingOfManySpansIsAPartitionAndBeatsBothExtremes) {
  std::mt19937_64 rng(11);
  std::vector<Span> spans;
  for (int i = 0; i < 3000; ++i) {
    // Cross-attention of short samples: q and k independent, areas below one call's overhead.
    const std::int64_t q = 1 + static_cast<std::int64_t>(rng() % 30);
    spans.push_back({i, 0, q, 0, 1 + static_cast<std::int64_t>(rng() % 60)});
  }
  auto groups = group_spans(spans, kDefaultGroupOverhead);
  expect_partition(groups, spans.size());
  std::vector<std::vector<std::size_t>> one(1), each;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    one[0].push_back(i);
    each.push_back({i});
  }
  const double cost = partition_cost(spans, groups, kDefaultGroupOverhead);
  EXPECT_LE(cost, partition_cost(spans, one, kDefaultGroupOverhead));
  EXPECT_LE(cost, partition_cost(spans, each, kDefaultGroupOverhead));
  EXPECT_LT(groups.size(), 100u);
}

// ---------------------------------------------------------------- values and gradients

// Segment ids [rows, len]: each row holds samples of lengths drawn from `lengths`, then padding.
at::Tensor random_segments(std::mt19937_64& rng, std::int64_t rows, std::int64_t len,
                           const std::function<std::int64_t()>& draw) {
  at::Tensor seg = at::zeros({rows, len}, at::kLong);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t start = 0, k = 0;
    while (true) {
      const std::int64_t l = draw();
      if (start + l > len) break;
      ++k;
      seg[r].narrow(0, start, l).fill_(k);
      start += l;
    }
  }
  return seg;
}

struct Result {
  at::Tensor out, dq, dk, dv;
};

Result run(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& grad,
           const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& f) {
  at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
             v = v0.clone().requires_grad_(true);
  at::Tensor out = f(q, k, v);
  torch::autograd::backward({out}, {grad});
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

void expect_same(const Result& a, const Result& b, const std::string& what) {
  auto diff = [](const at::Tensor& x, const at::Tensor& y) { return (x - y).abs().max().item<double>(); };
  EXPECT_LT(diff(a.out, b.out), 1e-5) << what << ": output";
  EXPECT_LT(diff(a.dq, b.dq), 1e-5) << what << ": dq";
  EXPECT_LT(diff(a.dk, b.dk), 1e-5) << what << ": dk";
  EXPECT_LT(diff(a.dv, b.dv), 1e-5) << what << ": dv";
}

// The batched path under several groupings and the per-span loop all equal the dense path.
void check_against_dense(const AttentionLayout& dense, const AttentionLayout& varlen,
                         std::int64_t heads, std::int64_t dim, const std::string& what) {
  const std::int64_t rows = dense.rows;
  at::Tensor q = at::randn({rows, heads, dense.q_len, dim});
  at::Tensor k = at::randn({rows, heads, dense.k_len, dim});
  at::Tensor v = at::randn({rows, heads, dense.k_len, dim});
  at::Tensor grad = at::randn({rows, heads, dense.q_len, dim});
  Result ref = run(q, k, v, grad, [&](auto& a, auto& b, auto& c) { return attention_core(a, b, c, dense); });
  expect_same(ref, run(q, k, v, grad, [&](auto& a, auto& b, auto& c) { return attention_core(a, b, c, varlen); }),
              what + " default grouping");
  for (double overhead : {0.0, 1e12}) {
    VarlenPlan plan = plan_varlen(varlen.spans, varlen.causal, rows, varlen.q_len, varlen.k_len, overhead);
    expect_same(ref, run(q, k, v, grad, [&](auto& a, auto& b, auto& c) { return varlen_attention(a, b, c, plan); }),
                cat(what, " overhead ", overhead));
  }
  expect_same(ref, run(q, k, v, grad, [&](auto& a, auto& b, auto& c) {
                return varlen_attention_loop(a, b, c, varlen.spans, varlen.causal);
              }),
              what + " loop");
}

TEST_F(VarlenAttentionTest, SelfAttentionEqualsTheDenseMaskOnRandomLayouts) {
  std::mt19937_64 rng(3);
  at::manual_seed(3);
  struct Case {
    const char* name;
    std::int64_t rows, len;
    std::function<std::int64_t()> draw;
  };
  std::vector<Case> cases = {
      // One long row holding hundreds of short samples of few distinct lengths.
      {"one long row", 1, 1200, [&] { return 1 + static_cast<std::int64_t>(rng() % 8); }},
      // Many rows of one sample each (the padded layout).
      {"rows of one", 12, 40, [&] { return 40 - static_cast<std::int64_t>(rng() % 30); }},
      // A FLAN-like mix: mostly short, some long.
      {"mixed rows", 3, 160, [&] { return rng() % 5 == 0 ? 40 + static_cast<std::int64_t>(rng() % 100)
                                                         : 1 + static_cast<std::int64_t>(rng() % 24); }},
  };
  for (const Case& c : cases) {
    for (bool causal : {true, false}) {
      at::Tensor seg = random_segments(rng, c.rows, c.len, c.draw);
      if (std::string(c.name) == "rows of one") seg = seg.clamp_max(1);  // one sample a row
      AttentionLayout dense = make_self_layout(seg, causal, AttentionMode::Packed);
      AttentionLayout varlen = make_self_layout(seg, causal, AttentionMode::Varlen);
      if (std::string(c.name) == "one long row") {
        EXPECT_GT(varlen.spans.size(), 200u);
      }
      check_against_dense(dense, varlen, 2, 8, cat(c.name, causal ? " causal" : " bidirectional"));
    }
  }
}

TEST_F(VarlenAttentionTest, CrossAttentionEqualsTheDenseMaskOnRandomLayouts) {
  std::mt19937_64 rng(5);
  at::manual_seed(5);
  for (int trial = 0; trial < 3; ++trial) {
    // Decoder and encoder rows with the same samples; some samples have no input, whose
    // decoder queries see nothing (zeros in both paths).
    const std::int64_t rows = trial == 0 ? 1 : 4, enc_len = trial == 0 ? 900 : 120, dec_len = trial == 0 ? 400 : 50;
    at::Tensor enc = at::zeros({rows, enc_len}, at::kLong), dec = at::zeros({rows, dec_len}, at::kLong);
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t e = 0, d = 0;
      for (std::int64_t k = 1;; ++k) {
        const std::int64_t in = rng() % 6 == 0 ? 0 : 1 + static_cast<std::int64_t>(rng() % 30);
        const std::int64_t tg = 1 + static_cast<std::int64_t>(rng() % 12);
        if (e + in > enc_len || d + tg > dec_len) break;
        if (in > 0) enc[r].narrow(0, e, in).fill_(k);
        dec[r].narrow(0, d, tg).fill_(k);
        e += in;
        d += tg;
      }
    }
    AttentionLayout dense = make_cross_layout(dec, enc, AttentionMode::Packed);
    AttentionLayout varlen = make_cross_layout(dec, enc, AttentionMode::Varlen);
    check_against_dense(dense, varlen, 2, 8, cat("cross trial ", trial));
  }
}

TEST_F(VarlenAttentionTest, SharesOneCallAmongSimilarSpans) {
  // 300 samples of lengths 1..6 in one row: a handful of groups, not 300 calls.
  std::vector<std::int64_t> lengths;
  for (int i = 0; i < 300; ++i) lengths.push_back(1 + i % 6);
  VarlenPlan plan = plan_varlen(self_spans(lengths), true, 1, 1050, 1050);
  EXPECT_LE(plan.groups.size(), 3u);
  std::int64_t members = 0;
  for (const SpanGroup& g : plan.groups) members += g.count;
  EXPECT_EQ(members, 300);
  EXPECT_EQ(plan.out_index.numel(), 1050);
}

}  // namespace
}  // namespace dynapipe::runtime::model
