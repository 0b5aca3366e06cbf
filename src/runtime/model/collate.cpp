// collate() and SyntheticTokenSource; conventions in collate.h.
#include "runtime/model/collate.h"

#include <ATen/ATen.h>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {

SyntheticTokenSource::SyntheticTokenSource(const std::vector<Sample>& samples, int vocab,
                                           std::uint64_t seed)
    : vocab_(vocab), seed_(seed) {
  if (vocab < 4) {
    throw Error(ErrorKind::InvalidArgument, cat("synthetic tokens: vocab must be >= 4, got ", vocab));
  }
  for (const Sample& s : samples) samples_[s.id] = s;
}

SampleTokens SyntheticTokenSource::tokens(SampleId id) const {
  auto it = samples_.find(id);
  if (it == samples_.end()) {
    throw Error(ErrorKind::NotFound, cat("synthetic tokens: sample id ", id, " is unknown"));
  }
  // splitmix64 of (seed, id, index): the same id always gets the same tokens.
  auto token = [&](std::uint64_t stream, std::int64_t i) {
    std::uint64_t z = seed_ * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(id) * 0xd1b54a32d192ed03ULL +
                      stream * 0x8cb92ba72f3d8dd7ULL + static_cast<std::uint64_t>(i) + 0x632be59bd9b4e019ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<std::int32_t>(3 + z % static_cast<std::uint64_t>(vocab_ - 3));
  };
  SampleTokens t;
  t.input.resize(it->second.input_len);
  t.target.resize(it->second.target_len);
  for (std::int64_t i = 0; i < it->second.input_len; ++i) t.input[i] = token(1, i);
  for (std::int64_t i = 0; i < it->second.target_len; ++i) t.target[i] = token(2, i);
  return t;
}

std::int64_t loss_tokens(const Sample& sample, ModelKind kind) {
  if (kind == ModelKind::Gpt && sample.input_len == 0) return std::max(0, sample.target_len - 1);
  return sample.target_len;
}

namespace {

// One [rows, len] int64 matrix per field, filled row by row.
struct Grid {
  Grid(std::int64_t rows, std::int64_t len, std::int64_t fill)
      : len(len), data(static_cast<std::size_t>(rows * len), fill) {}
  std::int64_t& at(std::int64_t r, std::int64_t j) { return data[static_cast<std::size_t>(r * len + j)]; }
  at::Tensor tensor(std::int64_t rows) const {
    return at::tensor(at::ArrayRef<std::int64_t>(data), at::kLong).view({rows, len});
  }
  std::int64_t len;
  std::vector<std::int64_t> data;
};

}  // namespace

MicroBatchTensors collate(const MicroBatch& mb, const TokenSource& source, ModelKind kind,
                          AttentionMode mode, double loss_scale) {
  std::vector<std::vector<SampleId>> rows = mb.rows;
  if (rows.empty()) {
    for (SampleId id : mb.sample_ids) rows.push_back({id});
  }
  const std::int64_t b = mb.shape.batch;
  if (static_cast<std::int64_t>(rows.size()) != b) {
    throw Error(ErrorKind::InvalidArgument,
                cat("collate: micro-batch ", mb.id, " has ", rows.size(),
                    " rows, its shape.batch must match, got ", b));
  }
  std::size_t in_rows = 0;
  for (const auto& row : rows) in_rows += row.size();
  if (in_rows != mb.sample_ids.size()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("collate: micro-batch ", mb.id, " rows hold ", in_rows,
                    " samples, sample_ids must list the same, got ", mb.sample_ids.size()));
  }
  const std::int64_t s = mb.shape.seqlen;
  const std::int64_t d = kind == ModelKind::T5 ? mb.shape.dec_seqlen : 0;
  auto overflow = [&](std::int64_t r, const char* what, std::int64_t need, std::int64_t have) {
    throw Error(ErrorKind::InvalidArgument,
                cat("collate: micro-batch ", mb.id, " row ", r, " needs ", need, " ", what,
                    " tokens, its shape must hold them, got ", have));
  };

  Grid tok(b, s, kPadToken), seg(b, s, 0), pos(b, s, 0), lab(b, kind == ModelKind::Gpt ? s : d, kIgnoreLabel);
  Grid dtok(b, d, kPadToken), dseg(b, d, 0), dpos(b, d, 0);
  for (std::int64_t r = 0; r < b; ++r) {
    std::int64_t cur = 0, dcur = 0, k = 0;
    for (SampleId id : rows[r]) {
      ++k;
      SampleTokens t = source.tokens(id);
      const std::int64_t ni = static_cast<std::int64_t>(t.input.size());
      const std::int64_t nt = static_cast<std::int64_t>(t.target.size());
      if (kind == ModelKind::Gpt) {
        if (cur + ni + nt > s) overflow(r, "", cur + ni + nt, s);
        for (std::int64_t j = 0; j < ni + nt; ++j) {
          tok.at(r, cur + j) = j < ni ? t.input[j] : t.target[j - ni];
          seg.at(r, cur + j) = k;
          pos.at(r, cur + j) = j;
        }
        // Token j predicts token j+1; only predictions of target tokens count.
        for (std::int64_t j = std::max<std::int64_t>(ni - 1, 0); j + 1 < ni + nt; ++j) {
          if (j + 1 >= ni) lab.at(r, cur + j) = t.target[j + 1 - ni];
        }
        cur += ni + nt;
      } else {
        if (cur + ni > s) overflow(r, "encoder", cur + ni, s);
        if (dcur + nt > d) overflow(r, "decoder", dcur + nt, d);
        for (std::int64_t j = 0; j < ni; ++j) {
          tok.at(r, cur + j) = t.input[j];
          seg.at(r, cur + j) = k;
          pos.at(r, cur + j) = j;
        }
        for (std::int64_t j = 0; j < nt; ++j) {
          dtok.at(r, dcur + j) = j == 0 ? source.bos_token() : t.target[j - 1];
          dseg.at(r, dcur + j) = k;
          dpos.at(r, dcur + j) = j;
          lab.at(r, dcur + j) = t.target[j];
        }
        cur += ni;
        dcur += nt;
      }
    }
  }
  MicroBatchTensors out;
  out.tokens = tok.tensor(b);
  out.segments = seg.tensor(b);
  out.positions = pos.tensor(b);
  out.labels = lab.tensor(b);
  if (kind == ModelKind::T5) {
    out.dec_tokens = dtok.tensor(b);
    out.dec_segments = dseg.tensor(b);
    out.dec_positions = dpos.tensor(b);
  }
  out.mode = mode;
  out.loss_scale = loss_scale;
  return out;
}

}  // namespace dynapipe::runtime
