// Import of the DynaPipe artifact's measured cost models into Profiles (the conversion
// rules are in include/dynapipe/cost/artifact_profile.h and docs/cost-model.md).
#include "dynapipe/cost/artifact_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "cost/layer_cost.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/json_reader.h"
#include "dynapipe/core/statistics.h"
#include "dynapipe/cost/device_spec.h"

#ifndef DYNAPIPE_ASSETS_DIR
#define DYNAPIPE_ASSETS_DIR "assets"
#endif

namespace dynapipe {
namespace {

constexpr double kBytesPerMb = 1e6;
constexpr const char* kModes[3] = {"none", "selective", "full"};

// (seqlen, dec_seqlen, batch): dec_seqlen 0 for one-length components.
using ShapeKey = std::tuple<std::int64_t, std::int64_t, std::int64_t>;

// One component's rows of a timing or memory list: shape -> the first value of each
// measurement of that shape.
std::map<ShapeKey, std::vector<double>> read_rows(const JsonValue& list, bool two_lengths) {
  std::map<ShapeKey, std::vector<double>> rows;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const JsonValue row = list[i];
    const JsonValue seqlen = row["seqlen"];
    if (seqlen.size() != (two_lengths ? 2u : 1u)) {
      seqlen.fail(two_lengths ? "[enc, dec]" : "[seqlen]");
    }
    const std::int64_t s = seqlen[std::size_t{0}].integer(1);
    const std::int64_t d = two_lengths ? seqlen[std::size_t{1}].integer(1) : 0;
    const std::int64_t mbs = row["mbs"].integer(1);
    const JsonValue values = row["values"];
    if (values.size() < 1) values.fail("a non-empty array");
    rows[{s, d, mbs}].push_back(values[std::size_t{0}].number(0));
  }
  return rows;
}

std::map<ShapeKey, double> medians(const std::map<ShapeKey, std::vector<double>>& rows) {
  std::map<ShapeKey, double> out;
  for (const auto& [key, values] : rows) out[key] = median(values);
  return out;
}

struct ComponentTables {
  std::map<ShapeKey, double> fwd, bwd, stored, peak;  // ms, ms, MB, MB
};

ComponentTables read_component(const JsonValue& config, const std::string& component, bool two_lengths,
                               bool with_memory) {
  ComponentTables t;
  const JsonValue timing = config["timing"];
  t.fwd = medians(read_rows(timing[component + "/forward"], two_lengths));
  t.bwd = medians(read_rows(timing[component + "/backward"], two_lengths));
  if (with_memory) {
    t.stored = medians(read_rows(config["stored_activation"][component], two_lengths));
    t.peak = medians(read_rows(config["peak_activation"][component], two_lengths));
  }
  return t;
}

std::int64_t mb_to_bytes(double mb) { return static_cast<std::int64_t>(std::llround(mb * kBytesPerMb)); }

// Layer points: the shapes measured in all four tables.
std::vector<ProfilePoint> layer_points(const ComponentTables& t, bool decoder) {
  std::vector<ProfilePoint> points;
  for (const auto& [key, fwd] : t.fwd) {
    const auto bwd = t.bwd.find(key);
    const auto stored = t.stored.find(key);
    const auto peak = t.peak.find(key);
    if (bwd == t.bwd.end() || stored == t.stored.end() || peak == t.peak.end()) continue;
    ProfilePoint p;
    p.seqlen = std::get<0>(key);
    p.dec_seqlen = decoder ? std::get<1>(key) : 0;
    p.batch = std::get<2>(key);
    p.fwd_ms = fwd;
    p.bwd_ms = bwd->second;
    p.stored_bytes = mb_to_bytes(stored->second);
    // The artifact's peak includes the layer's own stored activation.
    p.peak_bytes = std::max<std::int64_t>(0, mb_to_bytes(peak->second) - p.stored_bytes);
    points.push_back(p);
  }
  return points;
}

// A decoder (seqlen, dec_seqlen) pair of the grid with no measurement at any batch ran out
// of memory when profiled: one batch-1 point with infeasible memory (times copied from the
// nearest shorter decoder length, so interpolation stays finite).
void add_unmeasured_decoder_pairs(std::vector<ProfilePoint>& points) {
  std::vector<std::int64_t> enc, dec;
  std::map<std::pair<std::int64_t, std::int64_t>, const ProfilePoint*> any;
  for (const ProfilePoint& p : points) {
    enc.push_back(p.seqlen);
    dec.push_back(p.dec_seqlen);
    auto& slot = any[{p.seqlen, p.dec_seqlen}];
    if (slot == nullptr || p.batch < slot->batch) slot = &p;
  }
  for (auto* axis : {&enc, &dec}) {
    std::sort(axis->begin(), axis->end());
    axis->erase(std::unique(axis->begin(), axis->end()), axis->end());
  }
  std::vector<ProfilePoint> added;
  for (std::int64_t s : enc) {
    const ProfilePoint* shorter = nullptr;
    for (std::int64_t d : dec) {
      const auto it = any.find({s, d});
      if (it != any.end()) {
        shorter = it->second;
        continue;
      }
      ProfilePoint p = shorter != nullptr ? *shorter : ProfilePoint{};
      p.batch = 1;
      p.seqlen = s;
      p.dec_seqlen = d;
      p.stored_bytes = kInfeasibleBytes;
      p.peak_bytes = 0;
      added.push_back(p);
    }
  }
  points.insert(points.end(), added.begin(), added.end());
}

struct Config {
  int tp = 0;
  int mode = 0;  // index into kModes
  std::size_t index = 0;
};

std::vector<Config> list_configs(const JsonValue& configs) {
  std::vector<Config> out;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const JsonValue c = configs[i];
    Config config;
    config.index = i;
    config.tp = static_cast<int>(c["tensor_parallel"].integer(1, 1024));
    const std::string mode = c["recompute"].string();
    const auto it = std::find(std::begin(kModes), std::end(kModes), mode);
    if (it == std::end(kModes)) c["recompute"].fail("\"none\", \"selective\" or \"full\"");
    config.mode = static_cast<int>(it - std::begin(kModes));
    out.push_back(config);
  }
  return out;
}

}  // namespace

std::vector<int> artifact_tensor_parallel_degrees(const std::string& json, const std::string& where) {
  const JsonDocument document(json, where);
  std::vector<int> degrees;
  for (const Config& c : list_configs(document.root()["configs"])) degrees.push_back(c.tp);
  std::sort(degrees.begin(), degrees.end());
  degrees.erase(std::unique(degrees.begin(), degrees.end()), degrees.end());
  return degrees;
}

Profile import_artifact_profile(const std::string& json, const std::string& where, const ModelSpec& model,
                                int tp) {
  const JsonDocument document(json, where);
  const JsonValue r = document.root();
  const JsonValue configs = r["configs"];
  const std::vector<Config> all = list_configs(configs);
  const bool t5 = model.kind == ModelKind::T5;
  const std::string artifact_model = r.has("model") ? r["model"].string() : "";
  if (!artifact_model.empty() && artifact_model.starts_with("t5") != t5) {
    throw Error(ErrorKind::InvalidArgument,
                cat(where, ": measures '", artifact_model, "', which is not a ", model_kind_name(model.kind),
                    " model like '", model.name, "'"));
  }

  Profile profile;
  profile.model = model;
  profile.tensor_parallel = tp;
  const DeviceSpec a100 = device_preset("a100-40g");
  profile.device.name = "a100-40g";
  profile.device.memory_bytes = a100.memory_bytes;
  profile.device.link_bandwidth_gbs = a100.link_bandwidth_gbs;
  profile.device.link_latency_ms = a100.link_latency_ms;
  profile.device.allreduce_bandwidth_gbs = a100.allreduce_bandwidth_gbs;
  profile.device.peak_tflops = a100.peak_tflops;
  profile.device.memory_bandwidth_gbs = a100.memory_bandwidth_gbs;
  profile.device.bytes_per_element = 2;  // fp16 mixed precision

  const ProfileLayerKind stack_kind = t5 ? ProfileLayerKind::Encoder : ProfileLayerKind::Layer;
  ProfileLayer stack, decoder, embedding, head;
  stack.kind = stack_kind;
  decoder.kind = ProfileLayerKind::Decoder;
  embedding.kind = ProfileLayerKind::Embedding;
  head.kind = ProfileLayerKind::Head;
  bool found[3] = {false, false, false};
  for (const Config& c : all) {
    if (c.tp != tp) continue;
    const JsonValue config = configs[c.index];
    found[c.mode] = true;
    stack.points[c.mode] = layer_points(read_component(config, "encoder", false, true), false);
    if (t5) {
      decoder.points[c.mode] = layer_points(read_component(config, "decoder", true, true), true);
      add_unmeasured_decoder_pairs(decoder.points[c.mode]);
    }
    if (c.mode != 0) continue;
    // Parameter bytes (per device) as recorded with the no-recompute measurements.
    const JsonValue state = config["model_state"];
    stack.parameter_bytes = mb_to_bytes(state["encoder"].number(0));
    embedding.parameter_bytes = mb_to_bytes(state["embedding"].number(0));
    if (t5) decoder.parameter_bytes = mb_to_bytes(state["decoder"].number(0));
    // Embedding and head from the no-recompute config: the postprocess time is the head's;
    // their activation memory is not recorded, so it comes from the analytic formulas with
    // the vocabulary split tp ways.
    const ComponentTables post = read_component(config, "postprocess", false, false);
    detail::LayerCoefficients coefficients;
    coefficients.e = profile.device.bytes_per_element;
    coefficients.h = model.hidden;
    coefficients.v = std::ceil(static_cast<double>(model.vocab) / tp);
    for (const auto& [key, fwd] : post.fwd) {
      const auto bwd = post.bwd.find(key);
      if (bwd == post.bwd.end()) continue;
      const std::int64_t s = std::get<0>(key), b = std::get<2>(key);
      const double tokens = static_cast<double>(b * s);
      const detail::LayerCost e = detail::embedding_cost(coefficients, tokens);
      const detail::LayerCost h = detail::head_cost(coefficients, tokens);
      ProfilePoint p;
      p.batch = b;
      p.seqlen = s;
      p.stored_bytes = std::llround(e.stored_bytes);
      p.peak_bytes = std::llround(e.peak_bytes);
      embedding.points[0].push_back(p);
      p.fwd_ms = fwd;
      p.bwd_ms = bwd->second;
      p.stored_bytes = std::llround(h.stored_bytes);
      p.peak_bytes = std::llround(h.peak_bytes);
      head.points[0].push_back(p);
    }
  }
  if (!found[0] && !found[1] && !found[2]) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--tp must be one of ", join(artifact_tensor_parallel_degrees(json, where), ", "),
                    " for the measurements in ", where, ", got ", tp));
  }
  for (int m = 0; m < 3; ++m) {
    if (!found[m]) r["configs"].fail(cat("a list with recompute \"", kModes[m], "\" at tensor_parallel ", tp));
  }
  head.parameter_bytes = head_parameter_count(model) * profile.device.bytes_per_element;
  profile.layers.push_back(std::move(embedding));
  profile.layers.push_back(std::move(stack));
  if (t5) profile.layers.push_back(std::move(decoder));
  profile.layers.push_back(std::move(head));
  // The format's own validation (grids, rows, duplicates) is the check of the conversion.
  return parse_profile(profile_to_json(profile), where);
}

std::string a100_measured_dir() {
  const char* env = std::getenv("DYNAPIPE_ASSETS_DIR");
  const std::string base = env != nullptr && *env != '\0' ? env : DYNAPIPE_ASSETS_DIR;
  return base + "/a100-measured";
}

std::unique_ptr<CostModel> make_a100_measured_cost_model(const ModelSpec& model, const CostModelOptions& options) {
  options.validate();
  std::string preset;
  for (const char* name : {"gpt-6.7b", "t5-11b"}) {
    ModelSpec candidate = load_model_spec(name);
    candidate.name = model.name;
    if (candidate == model) preset = name;
  }
  if (preset.empty()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--cost-model a100-measured has measurements of --model gpt-6.7b and t5-11b only, got '",
                    model.name, "'"));
  }
  // Parsing the T5 file takes a while: keep each (model, tp) profile for the process.
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, std::shared_ptr<const Profile>> cache;
  std::shared_ptr<const Profile> profile;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = cache[{preset, options.tp}];
    if (!slot) {
      const std::string path = a100_measured_dir() + "/" + preset + ".json";
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        cache.erase({preset, options.tp});
        throw Error(ErrorKind::NotFound,
                    cat("--cost-model a100-measured: cannot open ", path, " (set DYNAPIPE_ASSETS_DIR to the assets directory)"));
      }
      std::stringstream text;
      text << in.rdbuf();
      try {
        slot = std::make_shared<Profile>(import_artifact_profile(text.str(), path, load_model_spec(preset), options.tp));
      } catch (...) {
        cache.erase({preset, options.tp});
        throw;
      }
    }
    profile = slot;
  }
  Profile named = *profile;
  named.model.name = model.name;
  return make_profiled_cost_model(named, options, cat("a100-measured:", preset));
}

}  // namespace dynapipe
