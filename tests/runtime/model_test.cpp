// Stage models (GPT, T5), collation, attention modes, recompute, split backward and the
// reference trainer. The equivalence tests are the point: the same global batch must give
// the same loss however it is split into micro-batches, packed, attended or pipelined.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dynapipe/core/error.h"
#include "runtime/model/collate.h"
#include "runtime/model/model.h"
#include "runtime/model/reference_trainer.h"

namespace dynapipe::runtime {
namespace {

// ---------------------------------------------------------------- helpers

ModelSpec tiny_spec(ModelKind kind) {
  ModelSpec s;
  s.name = kind == ModelKind::Gpt ? "gpt-test" : "t5-test";
  s.kind = kind;
  s.hidden = 32;
  s.heads = 4;
  s.ffn_hidden = 64;
  s.layers = kind == ModelKind::Gpt ? 4 : 3;
  s.dec_layers = kind == ModelKind::Gpt ? 0 : 3;
  s.vocab = 64;
  s.max_positions = 128;
  return s;
}

std::int64_t round8(std::int64_t n) { return (n + 7) / 8 * 8; }

std::vector<Sample> make_samples(int n, std::uint64_t seed, int max_in = 20, int max_tg = 8) {
  std::vector<Sample> out;
  std::uint64_t z = seed * 2654435761ULL + 12345;
  auto next = [&](int lo, int hi) {
    z = z * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + static_cast<int>((z >> 33) % static_cast<std::uint64_t>(hi - lo + 1));
  };
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.id = 100 + i;
    s.input_len = next(1, max_in);
    s.target_len = next(1, max_tg);
    out.push_back(s);
  }
  return out;
}

std::int64_t total_loss_tokens(const std::vector<Sample>& samples, ModelKind kind) {
  std::int64_t n = 0;
  for (const Sample& s : samples) n += loss_tokens(s, kind);
  return n;
}

// A micro-batch of the given rows (each a list of samples); packed if any row has > 1.
MicroBatch make_mb(int id, const std::vector<std::vector<Sample>>& rows, ModelKind kind) {
  MicroBatch mb;
  mb.id = id;
  std::int64_t enc = 0, dec = 0;
  bool packed = false;
  for (const auto& row : rows) {
    std::int64_t e = 0, d = 0;
    std::vector<SampleId> ids;
    for (const Sample& s : row) {
      mb.sample_ids.push_back(s.id);
      ids.push_back(s.id);
      e += kind == ModelKind::Gpt ? s.input_len + s.target_len : s.input_len;
      d += s.target_len;
      mb.target_tokens += s.target_len;
      mb.real_tokens += s.input_len + s.target_len;
    }
    enc = std::max(enc, e);
    dec = std::max(dec, d);
    packed = packed || row.size() > 1;
    mb.rows.push_back(ids);
  }
  if (!packed) mb.rows.clear();
  mb.shape.batch = static_cast<std::int64_t>(rows.size());
  mb.shape.seqlen = round8(enc);
  mb.shape.dec_seqlen = kind == ModelKind::T5 ? round8(dec + 1) : 0;
  return mb;
}

// Ways to split one global batch.
std::vector<MicroBatch> one_padded(const std::vector<Sample>& samples, ModelKind kind) {
  std::vector<std::vector<Sample>> rows;
  for (const Sample& s : samples) rows.push_back({s});
  return {make_mb(0, rows, kind)};
}

std::vector<MicroBatch> many_padded(const std::vector<Sample>& samples, ModelKind kind, int per_mb) {
  std::vector<MicroBatch> out;
  for (std::size_t i = 0; i < samples.size(); i += per_mb) {
    std::vector<std::vector<Sample>> rows;
    for (std::size_t j = i; j < std::min(samples.size(), i + per_mb); ++j) rows.push_back({samples[j]});
    out.push_back(make_mb(static_cast<int>(out.size()), rows, kind));
  }
  return out;
}

// First-fit packing into rows of `capacity` tokens (encoder side for T5), rows_per_mb rows.
std::vector<MicroBatch> packed(const std::vector<Sample>& samples, ModelKind kind, int capacity,
                               int rows_per_mb) {
  std::vector<std::vector<Sample>> rows;
  std::vector<int> used;
  for (const Sample& s : samples) {
    const int need = kind == ModelKind::Gpt ? s.input_len + s.target_len : s.input_len;
    std::size_t r = 0;
    while (r < rows.size() && used[r] + need > capacity) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    rows[r].push_back(s);
    used[r] += need;
  }
  std::vector<MicroBatch> out;
  for (std::size_t i = 0; i < rows.size(); i += rows_per_mb) {
    std::vector<std::vector<Sample>> part(rows.begin() + i,
                                          rows.begin() + std::min(rows.size(), i + rows_per_mb));
    MicroBatch mb = make_mb(static_cast<int>(out.size()), part, kind);
    if (mb.rows.empty()) {  // a lone sample per row: still list rows, as packing would
      for (const auto& row : part) mb.rows.push_back({row[0].id});
    }
    out.push_back(mb);
  }
  return out;
}

std::vector<MicroBatchTensors> collate_all(const std::vector<MicroBatch>& mbs, const TokenSource& src,
                                           ModelKind kind, AttentionMode mode, double scale) {
  std::vector<MicroBatchTensors> out;
  for (const MicroBatch& mb : mbs) out.push_back(collate(mb, src, kind, mode, scale));
  return out;
}

void expect_close(double a, double b, double rel, const std::string& what) {
  EXPECT_LE(std::abs(a - b), rel * std::max(std::abs(a), std::abs(b)) + 1e-12)
      << what << ": " << a << " vs " << b;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

std::map<std::string, at::Tensor> named_grads(const ReferenceTrainer& t) {
  std::map<std::string, at::Tensor> out;
  for (const auto& stage : t.stages()) {
    for (const auto& item : stage->named_parameters()) {
      out[item.key()] = item.value().grad().defined() ? item.value().grad().clone()
                                                      : at::zeros_like(item.value());
    }
  }
  return out;
}

std::map<std::string, at::Tensor> named_params(const ReferenceTrainer& t) {
  std::map<std::string, at::Tensor> out;
  for (const auto& stage : t.stages()) {
    for (const auto& item : stage->named_parameters()) out[item.key()] = item.value().detach().clone();
  }
  return out;
}

void expect_same_tensors(const std::map<std::string, at::Tensor>& a,
                         const std::map<std::string, at::Tensor>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    ASSERT_NE(it, b.end()) << what << ": missing " << name;
    const double scale = std::max(1e-6, t.abs().max().item<double>());
    EXPECT_LE(max_abs_diff(t, it->second), tol * scale) << what << ": " << name;
  }
}

void seed_global_rng(std::uint64_t seed) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

class ModelTest : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

// ---------------------------------------------------------------- collation

// Tokens that spell out which sample and position they are: easy to check by hand.
class FixedTokens : public TokenSource {
 public:
  SampleTokens tokens(SampleId id) const override {
    auto it = map.find(id);
    if (it == map.end()) throw Error(ErrorKind::NotFound, cat("no sample ", id));
    return it->second;
  }
  std::int64_t bos_token() const override { return 1; }
  std::map<SampleId, SampleTokens> map;
};

std::vector<std::int64_t> row_of(const at::Tensor& t, std::int64_t r) {
  at::Tensor row = t[r].contiguous();
  return std::vector<std::int64_t>(row.data_ptr<std::int64_t>(), row.data_ptr<std::int64_t>() + row.numel());
}

TEST_F(ModelTest, CollateGptPacksInputThenTargetAndLabelsTargetsOnly) {
  FixedTokens src;
  src.map[1] = {{10, 11}, {20, 21, 22}};
  src.map[2] = {{30}, {40, 41}};
  MicroBatch mb;
  mb.sample_ids = {1, 2};
  mb.rows = {{1, 2}};
  mb.shape = {1, 16, 0};
  MicroBatchTensors t = collate(mb, src, ModelKind::Gpt, AttentionMode::Packed, 0.5);
  ASSERT_EQ(t.tokens.sizes(), (std::vector<std::int64_t>{1, 16}));
  const std::int64_t I = kIgnoreLabel;
  EXPECT_EQ(row_of(t.tokens, 0), (std::vector<std::int64_t>{10, 11, 20, 21, 22, 30, 40, 41, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(row_of(t.segments, 0), (std::vector<std::int64_t>{1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(row_of(t.positions, 0), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0}));
  // Token 11 predicts 20, ..., 21 predicts 22; 22 must not predict 30 (next sample).
  EXPECT_EQ(row_of(t.labels, 0), (std::vector<std::int64_t>{I, 20, 21, 22, I, 40, 41, I, I, I, I, I, I, I, I, I}));
  EXPECT_FALSE(t.dec_tokens.defined());
  EXPECT_EQ(t.mode, AttentionMode::Packed);
  EXPECT_DOUBLE_EQ(t.loss_scale, 0.5);
}

TEST_F(ModelTest, CollateT5DecodesBosThenTargetWithTargetLabels) {
  FixedTokens src;
  src.map[1] = {{10, 11, 12}, {20, 21}};
  src.map[2] = {{30}, {40, 41, 42}};
  MicroBatch mb;
  mb.sample_ids = {1, 2};
  mb.shape = {2, 8, 8};  // one sample per row (rows empty)
  MicroBatchTensors t = collate(mb, src, ModelKind::T5, AttentionMode::Padded, 1.0);
  const std::int64_t I = kIgnoreLabel;
  EXPECT_EQ(row_of(t.tokens, 0), (std::vector<std::int64_t>{10, 11, 12, 0, 0, 0, 0, 0}));
  EXPECT_EQ(row_of(t.tokens, 1), (std::vector<std::int64_t>{30, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(row_of(t.dec_tokens, 0), (std::vector<std::int64_t>{1, 20, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(row_of(t.dec_tokens, 1), (std::vector<std::int64_t>{1, 40, 41, 0, 0, 0, 0, 0}));
  EXPECT_EQ(row_of(t.labels, 0), (std::vector<std::int64_t>{20, 21, I, I, I, I, I, I}));
  EXPECT_EQ(row_of(t.labels, 1), (std::vector<std::int64_t>{40, 41, 42, I, I, I, I, I}));
  EXPECT_EQ(row_of(t.dec_segments, 1), (std::vector<std::int64_t>{1, 1, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(row_of(t.dec_positions, 1), (std::vector<std::int64_t>{0, 1, 2, 0, 0, 0, 0, 0}));
}

TEST_F(ModelTest, CollateRejectsARowLongerThanTheShape) {
  FixedTokens src;
  src.map[1] = {{10, 11, 12}, {20, 21}};
  MicroBatch mb;
  mb.id = 3;
  mb.sample_ids = {1};
  mb.shape = {1, 4, 0};
  try {
    collate(mb, src, ModelKind::Gpt, AttentionMode::Padded, 1.0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("micro-batch 3 row 0 needs 5"), std::string::npos) << e.what();
  }
  mb.shape = {2, 8, 0};
  EXPECT_THROW(collate(mb, src, ModelKind::Gpt, AttentionMode::Padded, 1.0), Error);
}

// ---------------------------------------------------------------- shapes per stage

void check_stage_shapes(ModelKind kind, int pp) {
  ModelSpec spec = tiny_spec(kind);
  auto samples = make_samples(5, 1);
  SyntheticTokenSource src(samples, spec.vocab, 1);
  MicroBatch mb = one_padded(samples, kind)[0];
  MicroBatchTensors t = collate(mb, src, kind, AttentionMode::Padded, 1.0);
  const std::int64_t b = mb.shape.batch, s = mb.shape.seqlen, d = mb.shape.dec_seqlen;
  auto layers = assign_layers_uniform(spec, pp);
  at::Tensor x;
  for (int i = 0; i < pp; ++i) {
    auto stage = make_stage_model(spec, layers[i], ModelOptions{});
    StageOutput out = stage->forward(x, t);
    SCOPED_TRACE(cat(model_kind_name(kind), " pp ", pp, " stage ", i));
    if (i + 1 == pp) {
      ASSERT_TRUE(out.loss.defined());
      EXPECT_TRUE(stage_output_shape(spec, layers[i], mb.shape).empty());
      EXPECT_EQ(out.loss.dim(), 0);
      EXPECT_TRUE(std::isfinite(out.loss.item<double>()));
      EXPECT_FALSE(out.hidden.defined());
      continue;
    }
    ASSERT_TRUE(out.hidden.defined());
    const bool dec_part = kind == ModelKind::T5 && (layers[i].has_decoder() || layers[i].has_dec_embedding);
    EXPECT_EQ(out.hidden.sizes(), (std::vector<std::int64_t>{b, dec_part ? s + d : s, spec.hidden}));
    EXPECT_EQ(out.hidden.sizes(), stage_output_shape(spec, layers[i], mb.shape));
    EXPECT_FALSE(out.hidden.isnan().any().item<bool>());
    x = out.hidden.detach();
  }
}

TEST_F(ModelTest, GptStageShapesAtPp123) {
  for (int pp : {1, 2, 3}) check_stage_shapes(ModelKind::Gpt, pp);
}

TEST_F(ModelTest, T5StageShapesAtPp123) {
  // pp 2 splits 3+3 layers at the encoder/decoder boundary; pp 3 (2,2,2) puts the last
  // encoder layer and the first decoder layer on stage 1.
  for (int pp : {1, 2, 3}) check_stage_shapes(ModelKind::T5, pp);
}

TEST_F(ModelTest, RejectsInconsistentLayers) {
  ModelSpec spec = tiny_spec(ModelKind::T5);
  StageLayers l;
  l.dec_begin = 0;
  l.dec_end = 2;  // decoder layer 0 without the decoder embedding
  EXPECT_THROW(make_stage_model(spec, l, ModelOptions{}), Error);
  ModelOptions bad;
  bad.dropout = 1.5;
  EXPECT_THROW(make_stage_model(spec, assign_layers_uniform(spec, 1)[0], bad), Error);
}

TEST_F(ModelTest, PositionsBeyondTheTableAreAnError) {
  ModelSpec spec = tiny_spec(ModelKind::Gpt);
  spec.max_positions = 8;
  std::vector<Sample> samples{{1, 6, 4, -1}};
  SyntheticTokenSource src(samples, spec.vocab, 1);
  auto t = collate(one_padded(samples, ModelKind::Gpt)[0], src, ModelKind::Gpt, AttentionMode::Padded, 1.0);
  auto stage = make_stage_model(spec, assign_layers_uniform(spec, 1)[0], ModelOptions{});
  try {
    stage->forward({}, t);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("position"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- attention

// Runs all stages but the head and returns the last hidden state (the T5 decoder part).
at::Tensor hidden_before_head(const ModelSpec& spec, const MicroBatchTensors& t) {
  auto layers = assign_layers_uniform(spec, 1)[0];
  layers.has_head = false;
  auto stage = make_stage_model(spec, layers, ModelOptions{.seed = 3});
  at::Tensor h = stage->forward({}, t).hidden;
  if (spec.kind == ModelKind::T5) h = h.narrow(1, t.tokens.size(1), t.dec_tokens.size(1));
  return h;
}

class PerturbedTokens : public TokenSource {
 public:
  PerturbedTokens(const TokenSource& inner, SampleId victim) : inner_(inner), victim_(victim) {}
  SampleTokens tokens(SampleId id) const override {
    SampleTokens t = inner_.tokens(id);
    if (id == victim_) {
      for (auto& x : t.input) x = 3 + (x + 7) % 50;
      for (auto& x : t.target) x = 3 + (x + 11) % 50;
    }
    return t;
  }

 private:
  const TokenSource& inner_;
  SampleId victim_;
};

void check_no_mixing(ModelKind kind, AttentionMode mode) {
  SCOPED_TRACE(cat(model_kind_name(kind), " mode ", static_cast<int>(mode)));
  ModelSpec spec = tiny_spec(kind);
  std::vector<Sample> samples{{1, 9, 5, -1}, {2, 7, 4, -1}, {3, 5, 3, -1}};
  SyntheticTokenSource src(samples, spec.vocab, 5);
  MicroBatch mb = make_mb(0, {{samples[0], samples[1], samples[2]}}, kind);
  MicroBatchTensors base = collate(mb, src, kind, mode, 1.0);
  MicroBatchTensors changed = collate(mb, PerturbedTokens(src, 1), kind, mode, 1.0);
  ASSERT_FALSE(at::equal(base.tokens, changed.tokens));
  at::Tensor h0 = hidden_before_head(spec, base), h1 = hidden_before_head(spec, changed);
  // Sample 1 is segment 1; samples 2 and 3 must be untouched, bit for bit... up to the
  // float noise of a different batched matmul, which is zero here (same shapes).
  at::Tensor seg = kind == ModelKind::Gpt ? base.segments : base.dec_segments;
  at::Tensor others = seg[0].ge(2).nonzero().reshape({-1});
  at::Tensor mine = seg[0].eq(1).nonzero().reshape({-1});
  EXPECT_EQ(max_abs_diff(h0[0].index_select(0, others), h1[0].index_select(0, others)), 0.0);
  EXPECT_GT(max_abs_diff(h0[0].index_select(0, mine), h1[0].index_select(0, mine)), 1e-4);
  // Loss terms of samples 2 and 3 (labels of sample 1 masked out) are unchanged too.
  auto stage = make_stage_model(spec, assign_layers_uniform(spec, 1)[0], ModelOptions{.seed = 3});
  for (MicroBatchTensors* t : {&base, &changed}) {
    t->labels = t->labels.masked_fill(seg.eq(1), kIgnoreLabel);
  }
  EXPECT_EQ(stage->forward({}, base).loss.item<double>(), stage->forward({}, changed).loss.item<double>());
}

TEST_F(ModelTest, PackedSamplesNeverSeeEachOther) {
  for (ModelKind kind : {ModelKind::Gpt, ModelKind::T5}) {
    for (AttentionMode mode : {AttentionMode::Packed, AttentionMode::Varlen}) check_no_mixing(kind, mode);
  }
}

void check_modes_agree(ModelKind kind) {
  SCOPED_TRACE(model_kind_name(kind));
  ModelSpec spec = tiny_spec(kind);
  auto samples = make_samples(7, 2);
  SyntheticTokenSource src(samples, spec.vocab, 2);
  const double scale = 1.0 / static_cast<double>(total_loss_tokens(samples, kind));
  auto packed_mbs = packed(samples, kind, 32, 100);
  ASSERT_EQ(packed_mbs.size(), 1u);
  MicroBatchTensors dense = collate(packed_mbs[0], src, kind, AttentionMode::Packed, scale);
  MicroBatchTensors varlen = collate(packed_mbs[0], src, kind, AttentionMode::Varlen, scale);
  at::Tensor hd = hidden_before_head(spec, dense), hv = hidden_before_head(spec, varlen);
  EXPECT_LT(max_abs_diff(hd, hv), 1e-5);
  EXPECT_FALSE(hv.isnan().any().item<bool>());
  auto stage = make_stage_model(spec, assign_layers_uniform(spec, 1)[0], ModelOptions{.seed = 3});
  const double l_dense = stage->forward({}, dense).loss.item<double>();
  const double l_varlen = stage->forward({}, varlen).loss.item<double>();
  MicroBatchTensors padded = collate(one_padded(samples, kind)[0], src, kind, AttentionMode::Padded, scale);
  MicroBatchTensors padded_varlen = collate(one_padded(samples, kind)[0], src, kind, AttentionMode::Varlen, scale);
  const double l_padded = stage->forward({}, padded).loss.item<double>();
  const double l_padded_varlen = stage->forward({}, padded_varlen).loss.item<double>();
  expect_close(l_dense, l_varlen, 1e-5, "packed vs varlen");
  expect_close(l_dense, l_padded, 1e-5, "packed vs padded");
  expect_close(l_padded, l_padded_varlen, 1e-5, "padded vs padded-varlen");
}

TEST_F(ModelTest, PaddedPackedAndVarlenGiveTheSameOutputs) {
  check_modes_agree(ModelKind::Gpt);
  check_modes_agree(ModelKind::T5);
}

// ---------------------------------------------------------------- training equivalence

struct Split {
  std::string name;
  std::vector<MicroBatch> mbs;
  AttentionMode mode;
};

std::vector<Split> splits_of(const std::vector<Sample>& samples, ModelKind kind) {
  return {
      {"one padded micro-batch", one_padded(samples, kind), AttentionMode::Padded},
      {"micro-batches of 3", many_padded(samples, kind, 3), AttentionMode::Padded},
      {"micro-batches of 1", many_padded(samples, kind, 1), AttentionMode::Padded},
      {"packed rows", packed(samples, kind, 40, 2), AttentionMode::Packed},
      {"packed rows, varlen", packed(samples, kind, 40, 2), AttentionMode::Varlen},
      // What varlen dynapipe plans: every sample of the batch in one long row.
      {"one long row, varlen", packed(samples, kind, 1 << 20, 1), AttentionMode::Varlen},
  };
}

void check_loss_equivalence(ModelKind kind) {
  ModelSpec spec = tiny_spec(kind);
  auto samples = make_samples(10, 4);
  SyntheticTokenSource src(samples, spec.vocab, 4);
  const double scale = 1.0 / static_cast<double>(total_loss_tokens(samples, kind));
  std::vector<std::vector<double>> losses;
  std::vector<std::string> names;
  for (const Split& split : splits_of(samples, kind)) {
    ReferenceTrainer trainer(spec, assign_layers_uniform(spec, 1), ModelOptions{.seed = 9}, TrainerOptions{.lr = 3e-3});
    auto batch = collate_all(split.mbs, src, kind, split.mode, scale);
    std::vector<double> l;
    for (int step = 0; step < 10; ++step) l.push_back(trainer.train_step(batch));
    losses.push_back(l);
    names.push_back(split.name);
  }
  EXPECT_LT(losses[0].back(), losses[0].front());  // it learns
  for (std::size_t i = 1; i < losses.size(); ++i) {
    for (int step = 0; step < 10; ++step) {
      expect_close(losses[0][step], losses[i][step], 1e-4,
                   cat(model_kind_name(kind), " ", names[i], " step ", step));
    }
  }
}

TEST_F(ModelTest, GptLossIsTheSameHoweverTheBatchIsSplit) { check_loss_equivalence(ModelKind::Gpt); }
TEST_F(ModelTest, T5LossIsTheSameHoweverTheBatchIsSplit) { check_loss_equivalence(ModelKind::T5); }

void check_pipeline_equals_whole(ModelKind kind) {
  ModelSpec spec = tiny_spec(kind);
  auto samples = make_samples(8, 6);
  SyntheticTokenSource src(samples, spec.vocab, 6);
  const double scale = 1.0 / static_cast<double>(total_loss_tokens(samples, kind));
  auto batch = collate_all(many_padded(samples, kind, 3), src, kind, AttentionMode::Padded, scale);
  ReferenceTrainer whole(spec, assign_layers_uniform(spec, 1), ModelOptions{.seed = 11}, TrainerOptions{.lr = 3e-3});
  auto init = named_params(whole);
  std::vector<double> expected;
  for (int step = 0; step < 5; ++step) expected.push_back(whole.train_step(batch));
  for (int pp : {2, 3}) {
    SCOPED_TRACE(cat(model_kind_name(kind), " pp ", pp));
    ReferenceTrainer piped(spec, assign_layers_uniform(spec, pp), ModelOptions{.seed = 11}, TrainerOptions{.lr = 3e-3});
    expect_same_tensors(init, named_params(piped), 0.0, "initial parameters");
    for (int step = 0; step < 5; ++step) {
      expect_close(expected[step], piped.train_step(batch), 1e-5, cat("step ", step));
    }
    expect_same_tensors(named_params(whole), named_params(piped), 1e-4, "trained parameters");
  }
}

TEST_F(ModelTest, GptPipelineStagesEqualTheWholeModel) { check_pipeline_equals_whole(ModelKind::Gpt); }
TEST_F(ModelTest, T5PipelineStagesEqualTheWholeModel) { check_pipeline_equals_whole(ModelKind::T5); }

// ---------------------------------------------------------------- recompute, split backward

void check_recompute(ModelKind kind, AttentionMode mode, double dropout) {
  SCOPED_TRACE(cat(model_kind_name(kind), " mode ", static_cast<int>(mode), " dropout ", dropout));
  ModelSpec spec = tiny_spec(kind);
  auto samples = make_samples(6, 8);
  SyntheticTokenSource src(samples, spec.vocab, 8);
  const double scale = 1.0 / static_cast<double>(total_loss_tokens(samples, kind));
  auto batch = collate_all(packed(samples, kind, 32, 2), src, kind, mode, scale);
  std::map<std::string, at::Tensor> reference;
  double reference_loss = 0;
  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    ReferenceTrainer trainer(spec, assign_layers_uniform(spec, 2), ModelOptions{.dropout = dropout, .seed = 5},
                             TrainerOptions{});
    trainer.set_recompute(rc);
    seed_global_rng(77);
    const double loss = trainer.forward_backward(batch);
    auto grads = named_grads(trainer);
    if (rc == Recompute::None) {
      reference = grads;
      reference_loss = loss;
      continue;
    }
    EXPECT_EQ(loss, reference_loss) << recompute_name(rc);
    expect_same_tensors(reference, grads, 1e-5, cat("recompute ", recompute_name(rc)));
  }
}

TEST_F(ModelTest, RecomputeGivesTheSameGradients) {
  for (ModelKind kind : {ModelKind::Gpt, ModelKind::T5}) {
    check_recompute(kind, AttentionMode::Packed, 0.0);
    check_recompute(kind, AttentionMode::Varlen, 0.0);
  }
  // Dropout masks are replayed in the recomputation (RNG state restored).
  check_recompute(ModelKind::Gpt, AttentionMode::Packed, 0.1);
  check_recompute(ModelKind::T5, AttentionMode::Varlen, 0.1);
}

void check_split_backward(ModelKind kind, Recompute rc) {
  SCOPED_TRACE(cat(model_kind_name(kind), " recompute ", recompute_name(rc)));
  ModelSpec spec = tiny_spec(kind);
  auto samples = make_samples(6, 9);
  SyntheticTokenSource src(samples, spec.vocab, 9);
  const double scale = 1.0 / static_cast<double>(total_loss_tokens(samples, kind));
  auto batch = collate_all(many_padded(samples, kind, 2), src, kind, AttentionMode::Padded, scale);
  ReferenceTrainer fused(spec, assign_layers_uniform(spec, 2), ModelOptions{.seed = 5}, TrainerOptions{});
  ReferenceTrainer split(spec, assign_layers_uniform(spec, 2), ModelOptions{.seed = 5}, TrainerOptions{.split_backward = true});
  fused.set_recompute(rc);
  split.set_recompute(rc);
  EXPECT_EQ(fused.forward_backward(batch), split.forward_backward(batch));
  expect_same_tensors(named_grads(fused), named_grads(split), 1e-5, "split backward");
}

TEST_F(ModelTest, SplitBackwardGivesTheSameGradients) {
  for (ModelKind kind : {ModelKind::Gpt, ModelKind::T5}) {
    for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) check_split_backward(kind, rc);
  }
}

TEST_F(ModelTest, BackwardInputDefersOnlyLinearWeights) {
  ModelSpec spec = tiny_spec(ModelKind::Gpt);
  auto samples = make_samples(3, 10);
  SyntheticTokenSource src(samples, spec.vocab, 10);
  auto layers = assign_layers_uniform(spec, 2);
  auto s0 = make_stage_model(spec, layers[0], ModelOptions{.seed = 1});
  auto s1 = make_stage_model(spec, layers[1], ModelOptions{.seed = 1});
  auto t = collate(one_padded(samples, ModelKind::Gpt)[0], src, ModelKind::Gpt, AttentionMode::Padded, 0.1);
  at::Tensor h = s0->forward({}, t).hidden;
  at::Tensor in = h.detach().requires_grad_(true);
  at::Tensor loss = s1->forward(in, t).loss;
  DeferredWeightGrads w = backward_input(loss);
  ASSERT_TRUE(in.grad().defined());  // the input gradient is ready to send
  EXPECT_FALSE(w.empty());
  for (const auto& p : s1->named_parameters()) {
    const bool linear = p.key().find("norm") == std::string::npos && p.key().find("ln_") == std::string::npos;
    EXPECT_EQ(p.value().grad().defined(), !linear) << p.key();
  }
  w.flush();
  EXPECT_TRUE(w.empty());
  for (const auto& p : s1->named_parameters()) EXPECT_TRUE(p.value().grad().defined()) << p.key();
  w.flush();  // idempotent
}

// ---------------------------------------------------------------- determinism

TEST_F(ModelTest, SameSeedGivesIdenticalParametersAndLosses) {
  for (ModelKind kind : {ModelKind::Gpt, ModelKind::T5}) {
    ModelSpec spec = tiny_spec(kind);
    auto samples = make_samples(5, 12);
    SyntheticTokenSource src(samples, spec.vocab, 12);
    const double scale = 1.0 / static_cast<double>(total_loss_tokens(samples, kind));
    auto batch = collate_all(many_padded(samples, kind, 2), src, kind, AttentionMode::Varlen, scale);
    ReferenceTrainer a(spec, assign_layers_uniform(spec, 2), ModelOptions{.seed = 21}, TrainerOptions{});
    ReferenceTrainer b(spec, assign_layers_uniform(spec, 2), ModelOptions{.seed = 21}, TrainerOptions{});
    ReferenceTrainer c(spec, assign_layers_uniform(spec, 2), ModelOptions{.seed = 22}, TrainerOptions{});
    expect_same_tensors(named_params(a), named_params(b), 0.0, "same seed");
    EXPECT_GT(max_abs_diff(named_params(a).begin()->second, named_params(c).begin()->second), 0.0);
    for (int step = 0; step < 3; ++step) EXPECT_EQ(a.train_step(batch), b.train_step(batch));
  }
}

// ---------------------------------------------------------------- timing (manual)

// Not a test: prints one training step's time of gpt-tiny / t5-tiny shapes on one thread
// for a ~4k-token batch. Run with --gtest_also_run_disabled_tests.
TEST_F(ModelTest, DISABLED_StepTime) {
  for (ModelKind kind : {ModelKind::Gpt, ModelKind::T5}) {
    ModelSpec spec;  // the gpt-tiny / t5-tiny presets of cost/model_spec.cpp
    spec.kind = kind;
    spec.hidden = 128;
    spec.heads = 4;
    spec.ffn_hidden = 512;
    spec.layers = kind == ModelKind::Gpt ? 4 : 2;
    spec.dec_layers = kind == ModelKind::Gpt ? 0 : 2;
    spec.vocab = 320;
    spec.max_positions = 8192;
    std::vector<Sample> samples;
    std::int64_t tokens = 0;
    auto lengths = make_samples(200, 3, 200, 60);
    for (const Sample& s : lengths) {
      if (tokens + s.input_len + s.target_len > 4096) break;
      samples.push_back(s);
      tokens += s.input_len + s.target_len;
    }
    SyntheticTokenSource src(samples, spec.vocab, 3);
    const double scale = 1.0 / static_cast<double>(total_loss_tokens(samples, kind));
    struct Case {
      const char* name;
      std::vector<MicroBatch> mbs;
      AttentionMode mode;
    };
    std::vector<Case> cases{
        {"padded, 4 micro-batches", many_padded(samples, kind, (samples.size() + 3) / 4), AttentionMode::Padded},
        {"packed 512, 4 rows/mb", packed(samples, kind, 512, 4), AttentionMode::Packed},
        {"packed 512, varlen", packed(samples, kind, 512, 4), AttentionMode::Varlen},
    };
    for (const Case& c : cases) {
      auto batch = collate_all(c.mbs, src, kind, c.mode, scale);
      std::int64_t padded = 0;
      for (const auto& mb : c.mbs) padded += mb.shape.tokens();
      for (Recompute rc : {Recompute::None, Recompute::Full}) {
        ReferenceTrainer trainer(spec, assign_layers_uniform(spec, 1), ModelOptions{.seed = 1}, TrainerOptions{});
        trainer.set_recompute(rc);
        trainer.train_step(batch);  // warm-up
        const int reps = 3;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) trainer.train_step(batch);
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
        std::printf("%s %-26s recompute %-4s: %zu samples, %lld real tokens, %lld computed, %.1f ms/step\n",
                    kind == ModelKind::Gpt ? "gpt-tiny" : "t5-tiny ", c.name,
                    std::string(recompute_name(rc)).c_str(), samples.size(), static_cast<long long>(tokens),
                    static_cast<long long>(padded), ms);
      }
    }
  }
}

}  // namespace
}  // namespace dynapipe::runtime
