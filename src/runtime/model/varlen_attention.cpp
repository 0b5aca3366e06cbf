// Batched varlen attention; see varlen_attention.h.
#include "runtime/model/varlen_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <tuple>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime::model {

namespace {

at::Tensor long_tensor(const std::vector<std::int64_t>& values) {
  return at::tensor(at::ArrayRef<std::int64_t>(values), at::kLong);
}

}  // namespace

namespace {

struct Partition {
  double cost = 0.0;
  std::vector<std::vector<std::size_t>> groups;
};

// The cheapest partition of `order` (span indices in which equal sizes are adjacent) into
// contiguous runs, each costing overhead + count · max q_len · max k_len.
Partition best_contiguous_partition(const std::vector<Span>& spans, const std::vector<std::size_t>& order,
                                    double overhead) {
  // Equal sizes always share a group (splitting them only adds overhead), so the DP runs
  // over distinct sizes: run u = order[first[u], first[u + 1]).
  std::vector<std::size_t> first;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Span& s = spans[order[i]];
    if (i == 0 || s.q_len != spans[order[i - 1]].q_len || s.k_len != spans[order[i - 1]].k_len) {
      first.push_back(i);
    }
  }
  const std::size_t u = first.size();
  first.push_back(order.size());

  // best[j] = cheapest partition of runs [0, j); the last group of it starts at cut[j].
  std::vector<double> best(u + 1, std::numeric_limits<double>::infinity());
  std::vector<std::size_t> cut(u + 1, 0);
  best[0] = 0.0;
  for (std::size_t j = 1; j <= u; ++j) {
    std::int64_t max_q = 0, max_k = 0;
    double count = 0.0;
    for (std::size_t i = j; i-- > 0;) {
      const Span& s = spans[order[first[i]]];
      max_q = std::max(max_q, s.q_len);
      max_k = std::max(max_k, s.k_len);
      count += static_cast<double>(first[i + 1] - first[i]);
      const double group = overhead + count * static_cast<double>(max_q) * static_cast<double>(max_k);
      // best[] is non-decreasing and the group only grows as i falls: nothing cheaper left.
      if (group >= best[j]) break;
      if (best[i] + group < best[j]) {
        best[j] = best[i] + group;
        cut[j] = i;
      }
    }
  }
  Partition p;
  p.cost = best[u];
  for (std::size_t j = u; j > 0; j = cut[j]) {
    p.groups.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(first[cut[j]]),
                          order.begin() + static_cast<std::ptrdiff_t>(first[j]));
  }
  std::reverse(p.groups.begin(), p.groups.end());
  return p;
}

// Length class of ratio √2: spans of one class differ by less than 1.42x.
std::int64_t length_class(std::int64_t len) {
  return static_cast<std::int64_t>(std::floor(2.0 * std::log2(static_cast<double>(std::max<std::int64_t>(len, 1)))));
}

}  // namespace

std::vector<std::vector<std::size_t>> group_spans(const std::vector<Span>& spans, double overhead) {
  // Self-attention spans are one-dimensional (q_len = k_len) and the area order makes the
  // DP exact. Cross-attention spans are two-dimensional: area order may put 10x500 next to
  // 100x50, so also try "class of one length, then the other" and keep the cheapest.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::size_t>;
  const std::vector<std::function<Key(const Span&, std::size_t)>> keys = {
      [](const Span& s, std::size_t i) { return Key{s.q_len * s.k_len, s.q_len, s.k_len, i}; },
      [](const Span& s, std::size_t i) { return Key{length_class(s.k_len), s.q_len, s.k_len, i}; },
      [](const Span& s, std::size_t i) { return Key{length_class(s.q_len), s.k_len, s.q_len, i}; },
  };
  const bool one_dimensional =
      std::all_of(spans.begin(), spans.end(), [](const Span& s) { return s.q_len == s.k_len; });
  Partition best;
  best.cost = std::numeric_limits<double>::infinity();
  for (const auto& key : keys) {
    std::vector<Key> sort_keys;
    sort_keys.reserve(spans.size());
    for (std::size_t i = 0; i < spans.size(); ++i) sort_keys.push_back(key(spans[i], i));
    std::vector<std::size_t> order(spans.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sort_keys[a] < sort_keys[b]; });
    Partition p = best_contiguous_partition(spans, order, overhead);
    if (p.cost < best.cost) best = std::move(p);
    if (one_dimensional) break;
  }
  return best.groups;
}

VarlenPlan plan_varlen(const std::vector<Span>& spans, bool causal, std::int64_t rows,
                       std::int64_t q_len, std::int64_t k_len, double overhead) {
  VarlenPlan plan;
  plan.rows = rows;
  plan.q_len = q_len;
  plan.k_len = k_len;
  std::vector<std::int64_t> out_index;
  for (const std::vector<std::size_t>& members : group_spans(spans, overhead)) {
    SpanGroup g;
    g.count = static_cast<std::int64_t>(members.size());
    for (std::size_t m : members) {
      const Span& s = spans[m];
      DYNAPIPE_CHECK(s.q_len > 0 && s.k_len > 0 && s.row >= 0 && s.row < rows &&
                         s.q_start >= 0 && s.q_start + s.q_len <= q_len && s.k_start >= 0 &&
                         s.k_start + s.k_len <= k_len && (!causal || s.q_len == s.k_len),
                     "plan_varlen: span out of the layout");
      g.q_pad = std::max(g.q_pad, s.q_len);
      g.k_pad = std::max(g.k_pad, s.k_len);
    }
    std::vector<std::int64_t> q_index, k_index, q_real, k_lens;
    bool ragged_q = false, ragged_k = false;
    for (std::size_t slot = 0; slot < members.size(); ++slot) {
      const Span& s = spans[members[slot]];
      const std::int64_t q0 = s.row * q_len + s.q_start, k0 = s.row * k_len + s.k_start;
      for (std::int64_t t = 0; t < g.q_pad; ++t) q_index.push_back(q0 + (t < s.q_len ? t : 0));
      for (std::int64_t t = 0; t < g.k_pad; ++t) k_index.push_back(k0 + (t < s.k_len ? t : 0));
      for (std::int64_t t = 0; t < s.q_len; ++t) {
        q_real.push_back(static_cast<std::int64_t>(slot) * g.q_pad + t);
        out_index.push_back(q0 + t);
      }
      ragged_q = ragged_q || s.q_len < g.q_pad;
      ragged_k = ragged_k || s.k_len < g.k_pad;
      k_lens.push_back(s.k_len);
    }
    if (g.count == 1) {
      g.single = spans[members[0]];
    } else {
      g.q_index = long_tensor(q_index);
      g.k_index = long_tensor(k_index);
    }
    if (ragged_q) g.q_real = long_tensor(q_real);
    // Padded keys are masked; padded queries see real keys (finite) and are dropped after.
    if (ragged_k) {
      g.mask = at::arange(g.k_pad, at::kLong).unsqueeze(0).ge(long_tensor(k_lens).unsqueeze(1))
                   .view({g.count, 1, 1, g.k_pad});
    }
    if (causal) {
      at::Tensor future = at::ones({g.q_pad, g.k_pad}, at::kBool).triu(1).view({1, 1, g.q_pad, g.k_pad});
      g.mask = g.mask.defined() ? g.mask.logical_or(future) : future;
    }
    plan.groups.push_back(std::move(g));
  }
  plan.out_index = long_tensor(out_index);
  return plan;
}

at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const VarlenPlan& plan) {
  const std::int64_t rows = q.size(0), heads = q.size(1), dim = q.size(3);
  DYNAPIPE_CHECK(rows == plan.rows && q.size(2) == plan.q_len && k.size(2) == plan.k_len,
                 "varlen_attention: tensors do not match the plan");
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  // Token-major views [rows · len, heads, dim]; for q, k, v cut from one projection these
  // are views, not copies.
  at::Tensor qt = q.transpose(1, 2).reshape({rows * plan.q_len, heads, dim});
  at::Tensor kt = k.transpose(1, 2).reshape({rows * plan.k_len, heads, dim});
  at::Tensor vt = v.transpose(1, 2).reshape({rows * plan.k_len, heads, dim});
  std::vector<at::Tensor> outputs;
  outputs.reserve(plan.groups.size());
  for (const SpanGroup& g : plan.groups) {
    if (g.count == 1) {
      // Views, no copies: a lone span (usually a long sample) costs what the loop cost.
      const Span& sp = g.single;
      at::Tensor qs = q[sp.row].narrow(1, sp.q_start, sp.q_len);
      at::Tensor ks = k[sp.row].narrow(1, sp.k_start, sp.k_len);
      at::Tensor vs = v[sp.row].narrow(1, sp.k_start, sp.k_len);
      at::Tensor scores = at::matmul(qs, ks.transpose(-2, -1)).mul_(scale);
      if (g.mask.defined()) scores.masked_fill_(g.mask[0], kMaskedScore);
      outputs.push_back(at::matmul(at::softmax(scores, -1), vs).transpose(0, 1));  // [q_len, heads, dim]
      continue;
    }
    auto gather = [&](const at::Tensor& t, const at::Tensor& index, std::int64_t pad) {
      return t.index_select(0, index).view({g.count, pad, heads, dim}).transpose(1, 2);
    };
    at::Tensor qg = gather(qt, g.q_index, g.q_pad);
    at::Tensor kg = gather(kt, g.k_index, g.k_pad);
    at::Tensor vg = gather(vt, g.k_index, g.k_pad);
    at::Tensor scores = at::matmul(qg, kg.transpose(-2, -1)).mul_(scale);
    if (g.mask.defined()) scores.masked_fill_(g.mask, kMaskedScore);
    at::Tensor out = at::matmul(at::softmax(scores, -1), vg)
                         .transpose(1, 2)
                         .reshape({g.count * g.q_pad, heads, dim});
    outputs.push_back(g.q_real.defined() ? out.index_select(0, g.q_real) : out);
  }
  at::Tensor result = at::zeros({rows * plan.q_len, heads, dim}, q.options());
  if (!outputs.empty()) {
    at::Tensor packed = outputs.size() == 1 ? outputs[0] : at::cat(outputs, 0);
    result = result.index_copy(0, plan.out_index, packed);
  }
  return result.view({rows, plan.q_len, heads, dim}).transpose(1, 2);
}

at::Tensor varlen_attention_loop(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::vector<Span>& spans, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const std::int64_t rows = q.size(0), heads = q.size(1), q_len = q.size(2), dim = q.size(3);
  auto zeros = [&](std::int64_t n) { return at::zeros({heads, n, dim}, q.options()); };
  std::vector<at::Tensor> out_rows;
  out_rows.reserve(static_cast<std::size_t>(rows));
  std::size_t next = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<at::Tensor> pieces;
    std::int64_t cursor = 0;
    for (; next < spans.size() && spans[next].row == r; ++next) {
      const Span& sp = spans[next];
      if (sp.q_start > cursor) pieces.push_back(zeros(sp.q_start - cursor));
      at::Tensor qs = q[r].narrow(1, sp.q_start, sp.q_len);
      at::Tensor ks = k[r].narrow(1, sp.k_start, sp.k_len);
      at::Tensor vs = v[r].narrow(1, sp.k_start, sp.k_len);
      at::Tensor scores = at::matmul(qs, ks.transpose(-2, -1)).mul_(scale);
      if (causal) scores.masked_fill_(at::ones({sp.q_len, sp.k_len}, at::kBool).triu(1), kMaskedScore);
      pieces.push_back(at::matmul(at::softmax(scores, -1), vs));
      cursor = sp.q_start + sp.q_len;
    }
    if (cursor < q_len) pieces.push_back(zeros(q_len - cursor));
    out_rows.push_back(pieces.size() == 1 ? pieces[0] : at::cat(pieces, 1));
  }
  return at::stack(out_rows, 0);
}

}  // namespace dynapipe::runtime::model
