#include "dynapipe/cost/cost_model.h"

#include <algorithm>
#include <filesystem>

#include "dynapipe/core/error.h"
#include "dynapipe/cost/artifact_profile.h"
#include "dynapipe/cost/profile.h"

namespace dynapipe {
namespace {

constexpr std::string_view kAnalyticPrefix = "analytic:";
constexpr std::string_view kProfilePrefix = "profile:";
constexpr std::string_view kA100Measured = "a100-measured";

// The first shape field where two models differ, as "hidden 128 vs 256"; empty if none.
// The name is not compared: a profile made for a preset fits the same shape from a file.
std::string first_difference(const ModelSpec& a, const ModelSpec& b) {
  if (a.kind != b.kind) return cat("kind ", model_kind_name(a.kind), " vs ", model_kind_name(b.kind));
  const std::pair<const char*, std::pair<int, int>> fields[] = {
      {"hidden", {a.hidden, b.hidden}},
      {"heads", {a.heads, b.heads}},
      {"head_dim", {a.head_dim(), b.head_dim()}},
      {"ffn_hidden", {a.ffn_hidden, b.ffn_hidden}},
      {"layers", {a.layers, b.layers}},
      {"dec_layers", {a.dec_layers, b.dec_layers}},
      {"vocab", {a.vocab, b.vocab}},
      {"max_positions", {a.max_positions, b.max_positions}},
  };
  for (const auto& [field, values] : fields) {
    if (values.first != values.second) return cat(field, " ", values.first, " vs ", values.second);
  }
  return "";
}

}  // namespace

void CostModel::stage_costs(const MicroBatchShape& shape, const AttentionDensity& density,
                            Recompute recompute, std::span<StageCost> out) const {
  DYNAPIPE_CHECK(out.size() == static_cast<std::size_t>(num_stages()),
                 cat("stage_costs: ", out.size(), " slots for ", num_stages(), " stages"));
  for (int s = 0; s < num_stages(); ++s) {
    out[static_cast<std::size_t>(s)] = stage_cost(s, shape, density, recompute);
  }
}

double CostModel::bottleneck_ms_and_bytes(const MicroBatchShape& shape,
                                          const AttentionDensity& density, Recompute recompute,
                                          std::span<StageCost> scratch,
                                          std::span<std::int64_t> bytes) const {
  const std::size_t p = static_cast<std::size_t>(num_stages());
  DYNAPIPE_CHECK(scratch.size() == p && bytes.size() == 2 * p,
                 cat("bottleneck_ms_and_bytes: ", scratch.size(), " and ", bytes.size(),
                     " slots for ", p, " stages"));
  stage_costs(shape, density, recompute, scratch);
  double time_ms = 0;
  for (std::size_t s = 0; s < p; ++s) {
    const StageCost& c = scratch[s];
    time_ms = std::max(time_ms, c.fwd_ms + c.bwd_ms);
    bytes[s] = c.held_bytes();
    bytes[p + s] = c.peak_bytes;
  }
  return time_ms;
}

void CostModel::bottleneck_ms_and_bytes_modes(const MicroBatchShape& shape,
                                              const AttentionDensity& density,
                                              std::span<const Recompute> modes,
                                              std::span<StageCost> scratch,
                                              std::span<double> times,
                                              std::span<std::int64_t> bytes) const {
  const std::size_t p = static_cast<std::size_t>(num_stages());
  DYNAPIPE_CHECK(times.size() == modes.size() && bytes.size() == 2 * p * modes.size(),
                 cat("bottleneck_ms_and_bytes_modes: ", times.size(), " times and ", bytes.size(),
                     " byte slots for ", modes.size(), " modes of ", p, " stages"));
  for (std::size_t k = 0; k < modes.size(); ++k) {
    times[k] = bottleneck_ms_and_bytes(shape, density, modes[k], scratch,
                                       bytes.subspan(2 * p * k, 2 * p));
  }
}

void CostModel::bottleneck_ms_and_bytes_many(std::span<const MicroBatchShape> shapes,
                                             std::span<const AttentionDensity> densities,
                                             std::span<const Recompute> modes,
                                             std::span<StageCost> scratch, std::span<double> times,
                                             std::span<std::int64_t> bytes) const {
  const std::size_t p = static_cast<std::size_t>(num_stages()), k = modes.size();
  DYNAPIPE_CHECK(densities.size() == shapes.size() && times.size() == k * shapes.size() &&
                     bytes.size() == 2 * p * k * shapes.size(),
                 cat("bottleneck_ms_and_bytes_many: ", shapes.size(), " shapes, ", densities.size(),
                     " densities, ", times.size(), " times and ", bytes.size(), " byte slots for ", k,
                     " modes of ", p, " stages"));
  const std::size_t n = shapes.size();
  for (std::size_t i = 0; i < k; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      times[n * i + j] = bottleneck_ms_and_bytes(shapes[j], densities[j], modes[i], scratch,
                                                 bytes.subspan(2 * p * (n * i + j), 2 * p));
    }
  }
}

std::optional<AffineTimeBound> CostModel::affine_time_bound(Recompute) const {
  return std::nullopt;
}

std::int64_t model_state_bytes(std::int64_t parameters, int bytes_per_element, int zero_shards) {
  DYNAPIPE_CHECK(zero_shards >= 1, cat("zero_shards ", zero_shards));
  const std::int64_t optimizer_bytes = bytes_per_element == 2 ? 12 : 2 * bytes_per_element;
  const std::int64_t optimizer_total = parameters * optimizer_bytes;
  return parameters * 2 * bytes_per_element + (optimizer_total + zero_shards - 1) / zero_shards;
}

void check_tensor_parallel(const ModelSpec& model, int tp) {
  if (tp < 1 || model.heads % tp != 0 || model.ffn_hidden % tp != 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--tp must be >= 1 and divide the ", model.heads, " attention heads and the ffn width ",
                    model.ffn_hidden, " of ", model.name, ", got ", tp));
  }
}

void CostModelOptions::validate() const {
  auto require = [](bool ok, const char* field, int got) {
    if (!ok) throw Error(ErrorKind::InvalidArgument, cat("cost model options: ", field, " must be >= 1, got ", got));
  };
  require(num_stages >= 1, "num_stages", num_stages);
  require(zero_shards >= 1, "zero_shards", zero_shards);
  require(seqlen_multiple >= 1, "seqlen_multiple", seqlen_multiple);
  require(tp >= 1, "tp", tp);
}

std::vector<StageLayers> resolve_stage_layers(const ModelSpec& model, const CostModelOptions& options) {
  if (options.layers.empty()) return assign_layers_uniform(model, options.num_stages);
  if (static_cast<int>(options.layers.size()) != options.num_stages) {
    throw Error(ErrorKind::InvalidArgument, cat("cost model options: layers must list num_stages (", options.num_stages,
                                                ") stages, got ", options.layers.size()));
  }
  if (assign_layers(model, layers_per_stage(options.layers)) != options.layers) {
    throw Error(ErrorKind::InvalidArgument,
                cat("cost model options: layers must be a contiguous split of model '", model.name,
                    "' with the embedding first and the head last"));
  }
  return options.layers;
}

double CostModel::p2p_ms(std::int64_t bytes) const {
  if (bytes <= 0) return 0;
  const DeviceSpec& d = device();
  if (d.link_bandwidth_gbs <= 0) return d.link_latency_ms;
  return d.link_latency_ms + static_cast<double>(bytes) / (d.link_bandwidth_gbs * 1e6);
}

std::string CostModel::extrapolation_warning(std::int64_t, std::int64_t) const { return {}; }

double CostModel::allreduce_ms(std::int64_t bytes, int replicas) const {
  if (replicas <= 1 || bytes <= 0) return 0;
  const DeviceSpec& d = device();
  // Ring all-reduce: every replica sends and receives 2 (r - 1) / r of the buffer, in
  // 2 (r - 1) latency-bound steps.
  const double r = replicas;
  const double transfer = d.allreduce_bandwidth_gbs > 0
                              ? 2 * (r - 1) / r * static_cast<double>(bytes) / (d.allreduce_bandwidth_gbs * 1e6)
                              : 0;
  return 2 * (r - 1) * d.link_latency_ms + transfer;
}

std::unique_ptr<CostModel> make_cost_model(const std::string& spec, const ModelSpec& model,
                                           const CostModelOptions& options) {
  options.validate();
  check_tensor_parallel(model, options.tp);
  if (spec == kA100Measured) return make_a100_measured_cost_model(model, options);
  if (spec.starts_with(kAnalyticPrefix)) {
    const std::string device = spec.substr(kAnalyticPrefix.size());
    DeviceSpec d;
    try {
      d = device_preset(device);
    } catch (const Error& e) {
      throw Error(e.kind(), cat("--cost-model '", spec, "': ", e.what()));
    }
    return make_analytic_cost_model(model, d, options);
  }
  const std::string path = spec.starts_with(kProfilePrefix) ? spec.substr(kProfilePrefix.size()) : spec;
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) {
    throw Error(ErrorKind::NotFound,
                cat("--cost-model must be analytic:<device> (", join(device_preset_names(), ", "),
                    "), a100-measured or a profile file, got '", spec, "' (no such file)"));
  }
  Profile profile = load_profile(path);
  const std::string difference = first_difference(profile.model, model);
  if (!difference.empty()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--cost-model '", spec, "': the profile is for model '", profile.model.name,
                    "' but the requested model is '", model.name, "' (", difference, ")"));
  }
  profile.model.name = model.name;
  return make_profiled_cost_model(profile, options, path);
}

}  // namespace dynapipe
