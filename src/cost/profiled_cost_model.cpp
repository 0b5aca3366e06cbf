// The profiled cost model: per-layer tables from a Profile, interpolated piecewise
// linearly on their (batch, seqlen[, dec_seqlen]) grid and summed per stage. The rules
// (interpolation, extrapolation, missing points, stage peak) are in
// docs/profile-format.md.
#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "dynapipe/cost/profile.h"

namespace dynapipe {
namespace {

// When a point gives bwd_ms only, this share of it is the weight gradient: a dense
// layer's backward is two equal matmuls (dX, dW), but attention and elementwise work
// belong to the input gradient, so dW is about a third.
constexpr double kDefaultWeightFraction = 1.0 / 3.0;

// The interpolated quantities of one table entry.
enum Quantity { kFwd, kBwd, kBwdInput, kBwdWeight, kStored, kPeak, kNumQuantities };
using Values = std::array<double, kNumQuantities>;

bool is_infeasible(const Values& v) { return v[kStored] >= static_cast<double>(kInfeasibleBytes); }

// One (layer kind, recompute mode) table on its full grid, missing points filled.
class Table {
 public:
  Table(const std::vector<ProfilePoint>& points, bool is_decoder) {
    for (const ProfilePoint& p : points) {
      batch_.push_back(static_cast<double>(p.batch));
      seq_.push_back(static_cast<double>(p.seqlen));
      dec_.push_back(is_decoder ? static_cast<double>(p.dec_seqlen) : 0.0);
    }
    for (auto* axis : {&batch_, &seq_, &dec_}) {
      std::sort(axis->begin(), axis->end());
      axis->erase(std::unique(axis->begin(), axis->end()), axis->end());
    }
    const std::size_t nb = batch_.size(), ns = seq_.size(), nd = dec_.size();
    values_.assign(nb * ns * nd, Values{});
    std::vector<char> measured(values_.size(), 0);
    for (const ProfilePoint& p : points) {
      const std::size_t i = index(find(batch_, p.batch), find(seq_, p.seqlen),
                                  is_decoder ? find(dec_, p.dec_seqlen) : 0);
      Values& v = values_[i];
      v[kFwd] = p.fwd_ms;
      v[kBwd] = p.bwd_ms;
      v[kBwdInput] = p.bwd_input_ms ? *p.bwd_input_ms : p.bwd_ms * (1 - kDefaultWeightFraction);
      v[kBwdWeight] = p.bwd_weight_ms ? *p.bwd_weight_ms : p.bwd_ms * kDefaultWeightFraction;
      v[kStored] = static_cast<double>(p.stored_bytes);
      v[kPeak] = static_cast<double>(p.peak_bytes);
      measured[i] = 1;
    }
    for (std::size_t is = 0; is < ns; ++is) {
      for (std::size_t id = 0; id < nd; ++id) fill_row(is, id, measured);
    }
  }

  // Multilinear interpolation with linear extrapolation beyond the edges; a shape whose
  // cell touches an out-of-memory point is out of memory.
  Values at(double b, double s, double d) const {
    std::size_t ib, is, id;
    double tb, ts, td;
    locate(batch_, b, ib, tb);
    locate(seq_, s, is, ts);
    locate(dec_, d, id, td);
    Values out{};
    bool infeasible = false;
    for (int corner = 0; corner < 8; ++corner) {
      const int cb = corner & 1, cs = (corner >> 1) & 1, cd = (corner >> 2) & 1;
      const double w = (cb ? tb : 1 - tb) * (cs ? ts : 1 - ts) * (cd ? td : 1 - td);
      if (w == 0) continue;
      const Values& v = values_[index(ib + cb, is + cs, id + cd)];
      infeasible = infeasible || is_infeasible(v);
      for (int q = 0; q < kNumQuantities; ++q) out[q] += w * v[q];
    }
    for (double& x : out) x = std::max(0.0, x);
    if (infeasible) out[kStored] = out[kPeak] = static_cast<double>(kInfeasibleBytes);
    return out;
  }

 private:
  static std::size_t find(const std::vector<double>& axis, std::int64_t x) {
    return static_cast<std::size_t>(std::lower_bound(axis.begin(), axis.end(), static_cast<double>(x)) -
                                    axis.begin());
  }
  // Cell [i, i + 1] holding x (the edge cell outside the axis) and x's position t in it;
  // t < 0 or t > 1 extrapolates. A one-value axis (the GPT dec axis) has t = 0.
  static void locate(const std::vector<double>& axis, double x, std::size_t& i, double& t) {
    if (axis.size() == 1) {
      i = 0;
      t = 0;
      return;
    }
    const auto it = std::upper_bound(axis.begin(), axis.end(), x);
    const std::size_t hi = std::clamp<std::size_t>(static_cast<std::size_t>(it - axis.begin()), 1, axis.size() - 1);
    i = hi - 1;
    t = (x - axis[i]) / (axis[hi] - axis[i]);
  }
  std::size_t index(std::size_t ib, std::size_t is, std::size_t id) const {
    // Corners past a one-value axis collapse onto it (their weight is 0 anyway).
    ib = std::min(ib, batch_.size() - 1);
    is = std::min(is, seq_.size() - 1);
    id = std::min(id, dec_.size() - 1);
    return (ib * seq_.size() + is) * dec_.size() + id;
  }

  // Fills the unmeasured batches of one (seqlen, dec_seqlen) row (the parser guarantees
  // one measured point per row): between measured batches by interpolation, below them
  // by extrapolation, above the largest measured batch as out of memory (the profiler
  // skips shapes past an OOM), with times extrapolated from the two largest.
  void fill_row(std::size_t is, std::size_t id, const std::vector<char>& measured) {
    std::vector<std::size_t> known;
    for (std::size_t ib = 0; ib < batch_.size(); ++ib) {
      if (measured[index(ib, is, id)]) known.push_back(ib);
    }
    DYNAPIPE_CHECK(!known.empty(), "profile row without a measured point");
    auto line = [&](std::size_t lo, std::size_t hi, double b) {
      const Values& a = values_[index(lo, is, id)];
      const Values& c = values_[index(hi, is, id)];
      Values v{};
      if (lo == hi) {  // one measurement: proportional to batch
        for (int q = 0; q < kNumQuantities; ++q) v[q] = a[q] * b / batch_[lo];
        return v;
      }
      const double t = (b - batch_[lo]) / (batch_[hi] - batch_[lo]);
      for (int q = 0; q < kNumQuantities; ++q) v[q] = std::max(0.0, a[q] + t * (c[q] - a[q]));
      return v;
    };
    for (std::size_t ib = 0; ib < batch_.size(); ++ib) {
      if (measured[index(ib, is, id)]) continue;
      const double b = batch_[ib];
      const auto above = std::upper_bound(known.begin(), known.end(), ib);
      Values& v = values_[index(ib, is, id)];
      if (above == known.begin()) {
        v = line(known[0], known[std::min<std::size_t>(1, known.size() - 1)], b);
      } else if (above == known.end()) {
        v = line(known[known.size() >= 2 ? known.size() - 2 : 0], known.back(), b);
        v[kStored] = v[kPeak] = static_cast<double>(kInfeasibleBytes);
      } else {
        v = line(*(above - 1), *above, b);
      }
    }
  }

  std::vector<double> batch_, seq_, dec_;
  std::vector<Values> values_;  // [batch][seqlen][dec_seqlen]
};

class ProfiledCostModel final : public CostModel {
 public:
  ProfiledCostModel(const Profile& profile, const CostModelOptions& options, std::string source)
      : profile_(profile), options_(options), source_(std::move(source)),
        stages_(resolve_stage_layers(profile.model, options)) {
    const ModelSpec& model = profile.model;
    for (const ProfileLayer& layer : profile.layers) {
      const int k = static_cast<int>(layer.kind);
      for (int m = 0; m < 3; ++m) {
        // Embedding and head use their "none" table for every mode.
        const auto& points = layer.points[m].empty() ? layer.points[0] : layer.points[m];
        DYNAPIPE_CHECK(!points.empty(), cat("profile table ", profile_layer_kind_name(layer.kind), " is empty"));
        tables_[k][m] = std::make_unique<Table>(points, layer.kind == ProfileLayerKind::Decoder);
      }
      parameter_bytes_[k] = layer.parameter_bytes;
      varlen_fixed_[k] = {layer.varlen_fwd_ms, layer.varlen_bwd_ms};
    }
    const bool t5 = model.kind == ModelKind::T5;
    stack_kind_ = static_cast<int>(t5 ? ProfileLayerKind::Encoder : ProfileLayerKind::Layer);
    for (int k : {static_cast<int>(ProfileLayerKind::Embedding), stack_kind_, static_cast<int>(ProfileLayerKind::Head)}) {
      DYNAPIPE_CHECK(tables_[k][0] != nullptr, cat("profile lacks kind ", k));
    }
    if (t5) DYNAPIPE_CHECK(tables_[static_cast<int>(ProfileLayerKind::Decoder)][0] != nullptr, "profile lacks decoder");
    // The lengths every table a row passes through has measured (fold()).
    longest_enc_ = static_cast<double>(largest_measured_length(static_cast<ProfileLayerKind>(stack_kind_), false));
    if (t5) {
      longest_enc_ = std::min(longest_enc_, static_cast<double>(largest_measured_length(ProfileLayerKind::Decoder, false)));
      longest_dec_ = static_cast<double>(largest_measured_length(ProfileLayerKind::Decoder, true));
    }

    // Static memory: the profile's parameter bytes in the stage_parameter_count() layout:
    // one embedding per stage that embeds, the head's own bytes, and a token-table copy
    // for a head stage without an embedding (the LM head is tied to the token table).
    const int e = profile.device.bytes_per_element;
    // Under tensor parallelism the token table is split over the tp devices (vocab-parallel).
    const std::int64_t token_table_bytes =
        std::int64_t{model.vocab} * model.hidden * e / std::max(1, profile.tensor_parallel);
    for (const StageLayers& s : stages_) {
      std::int64_t bytes = (s.enc_end - s.enc_begin) * parameter_bytes_[stack_kind_] +
                           (s.dec_end - s.dec_begin) * parameter_bytes_[static_cast<int>(ProfileLayerKind::Decoder)];
      const bool embeds = s.has_embedding || s.has_dec_embedding;
      if (embeds) bytes += parameter_bytes_[static_cast<int>(ProfileLayerKind::Embedding)];
      if (s.has_head) {
        bytes += parameter_bytes_[static_cast<int>(ProfileLayerKind::Head)];
        if (!embeds) bytes += token_table_bytes;
      }
      static_bytes_.push_back(model_state_bytes(bytes / e, e, options.zero_shards) + profile.runtime_bytes);
      weight_bytes_.push_back(bytes);
    }
  }

  const ModelSpec& model() const override { return profile_.model; }
  const DeviceSpec& device() const override { return profile_.device; }
  const std::vector<StageLayers>& stages() const override { return stages_; }

  StageCost stage_cost(int stage, const MicroBatchShape& shape, const AttentionDensity& density,
                       Recompute recompute) const override {
    DYNAPIPE_CHECK(stage >= 0 && stage < num_stages(), cat("stage ", stage, " of ", num_stages()));
    const StageLayers& s = stages_[stage];
    const bool t5 = profile_.model.kind == ModelKind::T5;
    const int m = static_cast<int>(recompute);
    double b = static_cast<double>(shape.batch);
    double se = static_cast<double>(round_up(shape.seqlen, options_.seqlen_multiple));
    double sd = t5 ? static_cast<double>(round_up(shape.dec_seqlen, options_.seqlen_multiple)) : 0.0;
    AttentionDensity folded = density;
    fold(b, se, sd, folded);

    Values total{};
    double peak = 0;
    auto add = [&](const Values& v, int count) {
      for (int q = kFwd; q <= kStored; ++q) total[q] += count * v[q];
      peak = std::max(peak, v[kPeak]);
    };
    // A varlen micro-batch (any density below 1: its rows run the varlen kernels) pays
    // each transformer layer's fixed varlen cost; a recomputed forward pays it again.
    const bool varlen = !(density == AttentionDensity{});
    auto add_varlen_fixed = [&](int kind, int count) {
      if (!varlen) return;
      const auto [fwd, bwd] = varlen_fixed_[kind];
      const double backward = bwd + (recompute == Recompute::None ? 0.0 : fwd);
      total[kFwd] += count * fwd;
      total[kBwd] += count * backward;
      total[kBwdInput] += count * backward;  // attention has no weights
    };
    constexpr int kEmbedding = static_cast<int>(ProfileLayerKind::Embedding);
    constexpr int kDecoder = static_cast<int>(ProfileLayerKind::Decoder);
    constexpr int kHead = static_cast<int>(ProfileLayerKind::Head);
    if (b > 0) {
      if (s.has_embedding && se > 0) add(tables_[kEmbedding][m]->at(b, se, 0), 1);
      if (s.has_encoder() && se > 0) {
        add(layer_values(*tables_[stack_kind_][m], b, se, 0, folded.enc), s.enc_end - s.enc_begin);
        add_varlen_fixed(stack_kind_, s.enc_end - s.enc_begin);
      }
      if (s.has_dec_embedding && sd > 0) add(tables_[kEmbedding][m]->at(b, sd, 0), 1);
      if (s.has_decoder() && sd > 0) {
        add(layer_values(*tables_[kDecoder][m], b, se, sd, std::sqrt(folded.enc * folded.dec)),
            s.dec_end - s.dec_begin);
        add_varlen_fixed(kDecoder, s.dec_end - s.dec_begin);
      }
      const double head_len = t5 ? sd : se;
      if (s.has_head && head_len > 0) add(tables_[kHead][m]->at(b, head_len, 0), 1);
    }

    const double cap = static_cast<double>(kInfeasibleBytes);
    StageCost cost;
    cost.fwd_ms = total[kFwd];
    cost.bwd_ms = total[kBwd];
    cost.bwd_input_ms = total[kBwdInput];
    cost.bwd_weight_ms = total[kBwdWeight];
    cost.stored_bytes = static_cast<std::int64_t>(std::min(cap, std::ceil(total[kStored])));
    cost.peak_bytes = static_cast<std::int64_t>(std::min(cap, std::ceil(peak)));
    if (!s.has_head) {
      const double rows = s.has_decoder() || s.has_dec_embedding ? se + sd : se;
      cost.output_bytes = static_cast<std::int64_t>(profile_.device.bytes_per_element * b * rows *
                                                    profile_.model.hidden);
    }
    return cost;
  }

  std::int64_t static_bytes(int stage) const override {
    DYNAPIPE_CHECK(stage >= 0 && stage < num_stages(), cat("stage ", stage, " of ", num_stages()));
    return static_bytes_[stage];
  }

  std::int64_t weight_bytes(int stage) const override {
    DYNAPIPE_CHECK(stage >= 0 && stage < num_stages(), cat("stage ", stage, " of ", num_stages()));
    return weight_bytes_[stage];
  }

  std::string describe() const override { return cat("profile:", source_); }

  bool varlen_costs_extra() const override {
    return std::ranges::any_of(varlen_fixed_, [](const auto& fixed) { return fixed.first > 0 || fixed.second > 0; });
  }

  bool lone_samples_dense() const override { return true; }

  std::string extrapolation_warning(std::int64_t max_seqlen, std::int64_t max_dec_seqlen) const override {
    const bool t5 = profile_.model.kind == ModelKind::T5;
    const auto stack = static_cast<ProfileLayerKind>(stack_kind_);
    std::string past;
    auto check = [&](ProfileLayerKind kind, bool decoder, std::int64_t wanted, const char* flag) {
      const std::int64_t measured = largest_measured_length(kind, decoder);
      if (wanted <= measured) return;
      past += cat(past.empty() ? "" : "; ", t5 ? (decoder ? "decoder " : "encoder ") : "", "lengths up to ", measured,
                  ", ", flag, " is ", wanted);
    };
    check(stack, false, max_seqlen, "--max-seqlen");
    if (t5) check(ProfileLayerKind::Decoder, true, max_dec_seqlen, "--max-target-len");
    if (past.empty()) return {};
    return cat("warning: ", describe(), " measured ", past,
               ": longer micro-batches are extrapolated linearly (attention grows quadratically, so they are "
               "underestimated); measure up to them with dynapipe profile --max-seqlen ", max_seqlen,
               t5 ? cat(" --max-target-len ", max_dec_seqlen) : std::string());
  }

 private:
  // A row longer than the tables measured but sparse enough (a varlen row of many
  // samples) becomes the same tokens in f times as many rows of 1/f the length, each f
  // times denser: the matmuls see the same rows, and Σ L² is unchanged. Extrapolating a
  // dense measurement past its length would instead charge attention the row does not
  // compute (for c(s) = linear + q·s², one row of 2·S_max tokens at density 1/8 by
  // ~3x). A dense row, or one too dense to fold, is extrapolated as before.
  void fold(double& b, double& se, double& sd, AttentionDensity& d) const {
    const double f = std::max(se / longest_enc_, sd > 0 ? sd / longest_dec_ : 0.0);
    if (!(f > 1) || d.enc * f > 1 || (sd > 0 && d.dec * f > 1)) return;
    b *= f;
    se /= f;
    sd /= f;
    d.enc *= f;
    if (sd > 0) d.dec *= f;
  }

  // A layer's values at a density below 1 (packed rows, block-diagonal attention); the
  // profile is measured dense.
  //
  // Times: the same tokens n = b·s and the same Σ L² = b·s²·ρ in dense rows of the
  // mean-square length ρ·s, i.e. b/ρ rows (the fold above, all the way to density 1). A
  // layer's work depends on exactly those two (matmuls on n rows, attention on Σ L²), so
  // any two cuts of the same samples into rows cost the same, and the table is read at a
  // shape it measured (or extrapolates along its batch axis) instead of being split into
  // parts. On a measured H100 (bench/gpu_profile.py, RESULTS) 24 packed GPT micro-batches
  // of equal and mixed lengths ran within 4.3% of it, T5's encoder within 5.8% and its
  // decoder within 12% (mixed lengths; equal ones 5.5%).
  //
  // Memory: c(b, s) = linear(b·s) + quadratic(b·s²), and c(2b, s/2) keeps the tokens and
  // halves the quadratic part, so (1 - ρ) of 2 (c(b, s) - c(2b, s/2)) is removed. (Folded,
  // the many short rows would often lie past the batches the profiler measured at that
  // length, which the format reads as out of memory.)
  static Values layer_values(const Table& table, double b, double s, double d, double density) {
    Values full = table.at(b, s, d);
    if (density >= 1 || is_infeasible(full)) return full;
    const double rho = std::max(density, 1e-9);
    const Values dense = table.at(b / rho, s * rho, d * rho);
    for (int q : {kFwd, kBwd, kBwdInput, kBwdWeight}) full[q] = std::max(0.0, dense[q]);
    const Values half = table.at(2 * b, s / 2, d / 2);
    for (int q : {kStored, kPeak}) {
      const double quadratic = std::clamp(2 * (full[q] - half[q]), 0.0, full[q]);
      full[q] -= (1 - rho) * quadratic;
    }
    return full;
  }

  // The longest sequence (decoder: dec_seqlen) any table of `kind` measured.
  std::int64_t largest_measured_length(ProfileLayerKind kind, bool decoder) const {
    std::int64_t largest = 0;
    for (const ProfileLayer& layer : profile_.layers) {
      if (layer.kind != kind) continue;
      for (const auto& table : layer.points) {
        for (const ProfilePoint& p : table) largest = std::max(largest, decoder ? p.dec_seqlen : p.seqlen);
      }
    }
    return largest;
  }

  Profile profile_;
  CostModelOptions options_;
  std::string source_;
  std::vector<StageLayers> stages_;
  std::vector<std::int64_t> static_bytes_;
  std::vector<std::int64_t> weight_bytes_;
  std::unique_ptr<Table> tables_[kNumProfileLayerKinds][3];
  std::int64_t parameter_bytes_[kNumProfileLayerKinds] = {};
  std::pair<double, double> varlen_fixed_[kNumProfileLayerKinds] = {};  // (fwd, bwd) ms per layer
  int stack_kind_ = 0;
  double longest_enc_ = 0, longest_dec_ = 0;  // measured by every table on the row's path
};

}  // namespace

std::unique_ptr<CostModel> make_profiled_cost_model(const Profile& profile, const CostModelOptions& options,
                                                    const std::string& source) {
  options.validate();
  if (options.tp != profile.tensor_parallel) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--tp must be ", profile.tensor_parallel, " for the profile '", source,
                    "' (measured at that tensor-parallel degree), got ", options.tp));
  }
  return std::make_unique<ProfiledCostModel>(profile, options, source);
}

}  // namespace dynapipe
