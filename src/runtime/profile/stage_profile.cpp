// measure_stage_profile() (dynapipe/runtime/profiler.h): whole stages run together on a
// (tokens, length) grid; the analytic cpu tables scaled point by point by measured /
// estimated time of the whole pipeline at that shape.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/runtime/profiler.h"
#include "runtime/exec/host_allocator.h"
#include "runtime/process_memory.h"
#include "runtime/profile/stage_runner.h"

namespace dynapipe::runtime {

void StageProfilerOptions::validate(const ModelSpec& spec) const {
  if (pp < 1 || pp > spec.total_layers()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--pp must be in [1, ", spec.total_layers(), "] (the model's layers), got ", pp));
  }
  auto lengths = [&](const char* flag, const std::vector<std::int64_t>& values) {
    for (std::int64_t v : values) {
      if (v < 1 || v > spec.max_positions) {
        throw Error(ErrorKind::InvalidArgument,
                    cat(flag, " values must be in [1, ", spec.max_positions, "], got ", v));
      }
    }
    if (std::set<std::int64_t>(values.begin(), values.end()).size() < 2) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(flag, " must hold at least two distinct values, got '", join(values, ","), "'"));
    }
  };
  lengths("--seqlens", seqlens);
  if (spec.kind == ModelKind::T5) lengths("--dec-seqlens", dec_seqlens);
  if (max_tokens < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("--max-tokens must be >= 1, got ", max_tokens));
  }
  if (std::find(modes.begin(), modes.end(), Recompute::None) == modes.end()) {
    throw Error(ErrorKind::InvalidArgument,
                "--stage-recompute must include none (embedding and head tables scale with it)");
  }
  if (warmup < 0) throw Error(ErrorKind::InvalidArgument, cat("--warmup must be >= 0, got ", warmup));
  if (repeats < 1) throw Error(ErrorKind::InvalidArgument, cat("--repeats must be >= 1, got ", repeats));
  if (threads < 1) throw Error(ErrorKind::InvalidArgument, cat("--threads must be >= 1, got ", threads));
}

namespace profile {
namespace {

struct GridShape {
  std::int64_t batch, seqlen, dec_seqlen;
};

// Per length: 1, 4, 16, ... rows and the most rows of that length within max_tokens.
std::vector<GridShape> stage_shapes(const ModelSpec& spec, const StageProfilerOptions& o) {
  const bool t5 = spec.kind == ModelKind::T5;
  const std::set<std::int64_t> decs(o.dec_seqlens.begin(), o.dec_seqlens.end());
  std::vector<GridShape> shapes;
  for (std::int64_t s : std::set<std::int64_t>(o.seqlens.begin(), o.seqlens.end())) {
    // T5 pairs each encoder length with the longest decoder length not above it.
    std::int64_t d = 0;
    if (t5) {
      auto it = decs.upper_bound(s);
      d = it == decs.begin() ? *decs.begin() : *std::prev(it);
    }
    std::int64_t most = 1;
    while (2 * most * (s + d) <= o.max_tokens) most *= 2;
    for (std::int64_t b = 1; b < most; b *= 4) shapes.push_back({b, s, d});
    shapes.push_back({most, s, d});
  }
  return shapes;
}

// One measured shape: the pipeline's summed forward and backward ms, measured and estimated.
struct Sums {
  std::int64_t batch;
  double fwd, bwd, est_fwd, est_bwd;
};

// Measured / estimated by (batch, seqlen) for one recompute mode. Along a length's row the
// measured and estimated sums are each interpolated linearly in batch before dividing (a
// fixed cost per micro-batch makes the ratio fall like 1/batch, not linearly); between
// lengths the ratios are interpolated linearly; beyond the measured shapes they are held.
class RatioTable {
 public:
  void add(std::int64_t seqlen, Sums m) {
    auto& row = rows_[seqlen];
    row.push_back(m);
    std::sort(row.begin(), row.end(), [](const Sums& a, const Sums& b) { return a.batch < b.batch; });
  }
  std::pair<double, double> at(std::int64_t batch, std::int64_t seqlen) const {
    auto hi = rows_.lower_bound(seqlen);
    if (hi == rows_.end()) return in_row(std::prev(hi)->second, batch);
    if (hi->first == seqlen || hi == rows_.begin()) return in_row(hi->second, batch);
    auto lo = std::prev(hi);
    const double w = static_cast<double>(seqlen - lo->first) / static_cast<double>(hi->first - lo->first);
    const auto [f0, b0] = in_row(lo->second, batch);
    const auto [f1, b1] = in_row(hi->second, batch);
    return {f0 + w * (f1 - f0), b0 + w * (b1 - b0)};
  }

 private:
  static std::pair<double, double> ratios(const Sums& m) { return {m.fwd / m.est_fwd, m.bwd / m.est_bwd}; }
  static std::pair<double, double> in_row(const std::vector<Sums>& row, std::int64_t batch) {
    if (batch <= row.front().batch) return ratios(row.front());
    if (batch >= row.back().batch) return ratios(row.back());
    auto hi = std::lower_bound(row.begin(), row.end(), batch,
                               [](const Sums& m, std::int64_t b) { return m.batch < b; });
    auto lo = std::prev(hi);
    const double w = static_cast<double>(batch - lo->batch) / static_cast<double>(hi->batch - lo->batch);
    auto mix = [w](double a, double b) { return a + w * (b - a); };
    return ratios({batch, mix(lo->fwd, hi->fwd), mix(lo->bwd, hi->bwd), mix(lo->est_fwd, hi->est_fwd),
                   mix(lo->est_bwd, hi->est_bwd)});
  }
  std::map<std::int64_t, std::vector<Sums>> rows_;
};

double round_ms(double ms) { return std::round(ms * 1e4) / 1e4; }

bool has_modes(ProfileLayerKind kind) {
  return kind != ProfileLayerKind::Embedding && kind != ProfileLayerKind::Head;
}

}  // namespace
}  // namespace profile

StageProfile measure_stage_profile(const ModelSpec& spec, const StageProfilerOptions& options) {
  using namespace profile;
  options.validate(spec);
  const std::vector<StageLayers> layout = assign_layers_uniform(spec, options.pp);
  const auto estimate = make_cost_model("analytic:cpu", spec, CostModelOptions{.num_stages = options.pp});
  const std::vector<GridShape> shapes = stage_shapes(spec, options);

  StageProfile result;
  std::map<Recompute, RatioTable> ratios;
  keep_freed_host_memory(true);  // as train keeps them by default: time what it runs
  // The runtime's own memory: the process's peak over the first (smallest) round, less
  // what the model accounts for -- model states, and that shape's activations.
  reset_peak_rss();
  const std::int64_t rss_before = status_bytes("VmRSS:");
  std::optional<std::int64_t> runtime_bytes;
  StageRunner runner(spec, layout, options.seed, options.threads);
  const int total = static_cast<int>(shapes.size() * options.modes.size());
  int done = 0;
  std::vector<StageCost> est(static_cast<std::size_t>(options.pp));
  for (Recompute mode : options.modes) {
    for (const GridShape& g : shapes) {
      const StageRoundTimes t =
          runner.run({g.batch, g.seqlen, g.dec_seqlen}, mode, options.warmup, options.repeats);
      const MicroBatchShape shape{.batch = g.batch, .seqlen = g.seqlen, .dec_seqlen = g.dec_seqlen};
      estimate->stage_costs(shape, AttentionDensity{}, mode, est);
      if (!runtime_bytes) {
        std::int64_t accounted = 0;
        for (int s = 0; s < options.pp; ++s) {
          accounted += estimate->static_bytes(s) + est[s].stored_bytes + est[s].peak_bytes;
        }
        runtime_bytes = std::max<std::int64_t>(0, status_bytes("VmHWM:") - rss_before - accounted);
      }
      StageMeasurement m{.mode = mode, .batch = g.batch, .seqlen = g.seqlen, .dec_seqlen = g.dec_seqlen,
                         .fwd_ms = t.fwd_ms, .bwd_ms = t.bwd_ms, .optimizer_ms = t.optimizer_ms};
      double fwd = 0, bwd = 0, est_fwd = 0, est_bwd = 0;
      for (int s = 0; s < options.pp; ++s) {
        m.est_fwd_ms.push_back(est[s].fwd_ms);
        m.est_bwd_ms.push_back(est[s].bwd_ms);
        fwd += t.fwd_ms[s];
        bwd += t.bwd_ms[s];
        est_fwd += est[s].fwd_ms;
        est_bwd += est[s].bwd_ms;
      }
      DYNAPIPE_CHECK(est_fwd > 0 && est_bwd > 0, "analytic stage estimate must be positive");
      ratios[mode].add(g.seqlen, Sums{g.batch, fwd, bwd, est_fwd, est_bwd});
      result.measurements.push_back(std::move(m));
      ++done;
      if (options.progress) {
        options.progress({done, total,
                          cat(recompute_name(mode), " b=", g.batch, " s=", g.seqlen,
                              g.dec_seqlen > 0 ? cat(" d=", g.dec_seqlen) : std::string(), ": ",
                              std::llround(fwd + bwd), " ms, x",
                              std::round((fwd + bwd) / (est_fwd + est_bwd) * 100) / 100, " analytic")});
      }
    }
  }

  // The analytic tables on a grid that spans the measured batches, then scaled.
  ProfileGrid grid{{}, options.seqlens, {}};
  if (spec.kind == ModelKind::T5) grid.dec_seqlens = options.dec_seqlens;
  std::int64_t most = 2;
  for (const GridShape& g : shapes) most = std::max(most, g.batch);
  for (std::int64_t b = 1; b <= most; b *= 2) grid.batches.push_back(b);
  const auto per_layer =
      make_cost_model("analytic:cpu", spec, CostModelOptions{.num_stages = spec.total_layers()});
  result.profile = build_profile(*per_layer, grid);
  result.profile.runtime_bytes = runtime_bytes.value_or(0);
  for (ProfileLayer& layer : result.profile.layers) {
    for (int mode = 0; mode < 3; ++mode) {
      const auto measured = ratios.find(static_cast<Recompute>(mode));
      const RatioTable& table =
          has_modes(layer.kind) && measured != ratios.end() ? measured->second : ratios.at(Recompute::None);
      for (ProfilePoint& p : layer.points[mode]) {
        const auto [f, b] = table.at(p.batch, p.seqlen);
        p.fwd_ms = round_ms(p.fwd_ms * f);
        p.bwd_ms = round_ms(p.bwd_ms * b);
        if (p.bwd_input_ms) p.bwd_input_ms = round_ms(*p.bwd_input_ms * b);
        if (p.bwd_weight_ms) p.bwd_weight_ms = round_ms(*p.bwd_weight_ms * b);
      }
    }
  }
  (void)parse_profile(profile_to_json(result.profile), "stage profile");
  return result;
}

}  // namespace dynapipe::runtime
