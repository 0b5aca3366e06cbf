// fit_device: fits the time calibration of an analytic device preset to measured
// per-layer profiles (`dynapipe profile`), by grid search. The figures of the cpu preset
// (docs/cost-model.md, "Presets") come from it:
//
//   build/dynapipe profile --model gpt-tiny --out gpt.json --max-seqlen 2048
//   build/dynapipe profile --model t5-tiny --out t5.json --max-seqlen 2048 --max-target-len 512
//   build/bench/fit_device cpu gpt.json t5.json
//
// For every measured point of every layer kind and recompute mode it compares the
// analytic forward + backward time of one layer (build_profile() of a one-layer-per-stage
// analytic model on the profile's own grid) with the measurement. The score is the median
// plus a quarter of the 90th percentile of |log(analytic / measured)| over all points of
// all profiles, as the A100 fit. It searches matmul throughput (peak x efficiency),
// matmul_half_rows, attention_efficiency, memory bandwidth, op overhead and backward
// speedup around the preset, and prints the preset's and the best fit's errors per
// profile and layer kind. Memory terms are not fitted (they are bytes, not calibration).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/device_spec.h"
#include "dynapipe/cost/profile.h"

namespace dynapipe {
namespace {

struct Measured {
  Profile profile;
  ProfileGrid grid;  // the shapes it measured
};

ProfileGrid grid_of(const Profile& profile) {
  std::vector<std::int64_t> batches, seqlens, dec_seqlens;
  for (const ProfileLayer& layer : profile.layers) {
    for (const auto& points : layer.points) {
      for (const ProfilePoint& p : points) {
        batches.push_back(p.batch);
        if (layer.kind == ProfileLayerKind::Decoder || layer.kind == ProfileLayerKind::Layer ||
            layer.kind == ProfileLayerKind::Encoder) {
          seqlens.push_back(p.seqlen);
        }
        if (p.dec_seqlen > 0) dec_seqlens.push_back(p.dec_seqlen);
      }
    }
  }
  for (auto* v : {&batches, &seqlens, &dec_seqlens}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  return {batches, seqlens, dec_seqlens};
}

// log(analytic / measured) of every point both have, per layer kind (all modes).
std::map<ProfileLayerKind, std::vector<double>> errors(const Measured& m, const DeviceSpec& device) {
  CostModelOptions options;
  options.num_stages = m.profile.model.total_layers();  // uniform: one layer per stage
  const std::unique_ptr<CostModel> per_layer = make_analytic_cost_model(m.profile.model, device, options);
  const Profile analytic = build_profile(*per_layer, m.grid);
  std::map<ProfileLayerKind, std::vector<double>> out;
  for (const ProfileLayer& measured : m.profile.layers) {
    const ProfileLayer* modelled = analytic.find(measured.kind);
    if (modelled == nullptr) continue;
    for (int mode = 0; mode < 3; ++mode) {
      for (const ProfilePoint& p : measured.points[mode]) {
        const double got = p.fwd_ms + p.bwd_ms;
        if (!(got > 0)) continue;
        for (const ProfilePoint& q : modelled->points[mode]) {
          if (q.batch == p.batch && q.seqlen == p.seqlen && q.dec_seqlen == p.dec_seqlen) {
            out[measured.kind].push_back(std::log((q.fwd_ms + q.bwd_ms) / got));
            break;
          }
        }
      }
    }
  }
  return out;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

std::vector<double> magnitudes(std::vector<double> errors) {
  for (double& e : errors) e = std::abs(e);
  return errors;
}

double score(const std::vector<Measured>& profiles, const DeviceSpec& device) {
  std::vector<double> all;
  for (const Measured& m : profiles) {
    for (const auto& [kind, e] : errors(m, device)) all.insert(all.end(), e.begin(), e.end());
  }
  all = magnitudes(std::move(all));
  return quantile(all, 0.5) + 0.25 * quantile(all, 0.9);
}

void report(const std::vector<Measured>& profiles, const DeviceSpec& d, const char* label) {
  std::printf("%s: matmul %.1f GFLOP/s (peak %.3f TFLOP/s x %.2f), half rows %.0f, attention %.3f, "
              "bandwidth %.2f GB/s, op %.4f ms, backward speedup %.2f; score %.4f\n",
              label, d.peak_tflops * d.matmul_efficiency * 1e3, d.peak_tflops, d.matmul_efficiency,
              d.matmul_half_rows, d.attention_efficiency, d.memory_bandwidth_gbs, d.op_overhead_ms,
              d.backward_speedup, score(profiles, d));
  for (const Measured& m : profiles) {
    for (const auto& [kind, e] : errors(m, d)) {
      const std::vector<double> size = magnitudes(e);
      std::printf("  %-10s %-9s %3zu points: median error %+6.1f%%, median |error| %5.1f%%, p90 %5.1f%%\n",
                  m.profile.model.name.c_str(), std::string(profile_layer_kind_name(kind)).c_str(),
                  e.size(), 100 * (std::exp(quantile(e, 0.5)) - 1),
                  100 * (std::exp(quantile(size, 0.5)) - 1), 100 * (std::exp(quantile(size, 0.9)) - 1));
    }
  }
}

int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fit_device PRESET PROFILE.json [PROFILE.json ...]\n");
    return 2;
  }
  const DeviceSpec preset = device_preset(argv[1]);
  std::vector<Measured> profiles;
  for (int k = 2; k < argc; ++k) {
    Measured m{load_profile(argv[k]), {}};
    m.grid = grid_of(m.profile);
    profiles.push_back(std::move(m));
  }
  report(profiles, preset, "preset");

  // Multiplicative steps around the preset; the matmul throughput is peak x efficiency
  // (only their product enters the time), kept as peak with the preset's efficiency.
  const std::vector<double> scale = {0.5, 0.63, 0.8, 1.0, 1.25, 1.6, 2.0, 2.5, 3.2, 4.0, 5.0, 6.4};
  const std::vector<double> fine = {0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0};
  DeviceSpec best = preset;
  double best_score = score(profiles, preset);
  for (double peak : scale) {
    for (double half : fine) {
      for (double attention : scale) {
        for (double bandwidth : scale) {
          for (double op : fine) {
            for (double backward : {1.0, 1.2, 1.4}) {
              DeviceSpec d = preset;
              d.peak_tflops = preset.peak_tflops * peak;
              d.matmul_half_rows = preset.matmul_half_rows * half;
              d.attention_efficiency = std::min(1.0, preset.attention_efficiency * attention);
              d.memory_bandwidth_gbs = preset.memory_bandwidth_gbs * bandwidth;
              d.op_overhead_ms = preset.op_overhead_ms * op;
              d.backward_speedup = backward;
              const double s = score(profiles, d);
              if (s < best_score) {
                best_score = s;
                best = d;
              }
            }
          }
        }
      }
    }
  }
  report(profiles, best, "best fit");
  return 0;
}

}  // namespace
}  // namespace dynapipe

int main(int argc, char** argv) {
  try {
    return dynapipe::run(argc, argv);
  } catch (const dynapipe::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return dynapipe::exit_code(e.kind());
  }
}
