// Profile format v1: JSON reading (validated, ParseError with the JSON path), writing,
// and build_profile() which samples any per-layer cost model into a profile.
#include "dynapipe/cost/profile.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "cost/model_spec_json.h"
#include "dynapipe/core/error.h"

namespace dynapipe {
namespace {

constexpr const char* kFormat = "dynapipe-profile";
constexpr std::int64_t kVersion = 1;

bool is_layer_stack(ProfileLayerKind kind) {
  return kind == ProfileLayerKind::Layer || kind == ProfileLayerKind::Encoder ||
         kind == ProfileLayerKind::Decoder;
}

// The kinds a model of this family is made of, in file order.
std::vector<ProfileLayerKind> kinds_of(ModelKind kind) {
  if (kind == ModelKind::Gpt) {
    return {ProfileLayerKind::Embedding, ProfileLayerKind::Layer, ProfileLayerKind::Head};
  }
  return {ProfileLayerKind::Embedding, ProfileLayerKind::Encoder, ProfileLayerKind::Decoder,
          ProfileLayerKind::Head};
}

ProfilePoint parse_point(const JsonValue& r, bool is_decoder) {
  r.only_fields({"batch", "seqlen", "dec_seqlen", "fwd_ms", "bwd_ms", "bwd_input_ms", "bwd_weight_ms",
                 "stored_bytes", "peak_bytes"});
  ProfilePoint p;
  p.batch = r["batch"].integer(1);
  p.seqlen = r["seqlen"].integer(1);
  if (is_decoder) {
    p.dec_seqlen = r["dec_seqlen"].integer(1);
  } else if (r.has("dec_seqlen")) {
    r.fail_field("dec_seqlen", "absent outside a decoder table");
  }
  p.fwd_ms = r["fwd_ms"].number(0);
  p.bwd_ms = r["bwd_ms"].number(0);
  if (r.has("bwd_input_ms") != r.has("bwd_weight_ms")) {
    r.fail_field(r.has("bwd_input_ms") ? "bwd_weight_ms" : "bwd_input_ms",
                 "present when its counterpart (bwd_input_ms / bwd_weight_ms) is");
  }
  if (r.has("bwd_input_ms")) {
    p.bwd_input_ms = r["bwd_input_ms"].number(0);
    p.bwd_weight_ms = r["bwd_weight_ms"].number(0);
  }
  p.stored_bytes = r["stored_bytes"].integer(0);
  p.peak_bytes = r["peak_bytes"].integer(0);
  return p;
}

// Grid sanity: no duplicate shape, at least two batch values and two seqlen values (the
// interpolation needs a cell), and (decoder) every (seqlen, dec_seqlen) pair measured at
// some batch, so that missing points can be filled along the batch axis.
void check_grid(const JsonValue& r, const std::vector<ProfilePoint>& points, bool is_decoder) {
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> seen;
  std::set<std::int64_t> batches, seqlens, dec_seqlens;
  std::set<std::pair<std::int64_t, std::int64_t>> rows;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const ProfilePoint& p = points[i];
    if (!seen.insert({p.batch, p.seqlen, p.dec_seqlen}).second) {
      r[i].fail(cat("a shape not listed before in this table (duplicate batch ", p.batch, ", seqlen ",
                       p.seqlen, is_decoder ? cat(", dec_seqlen ", p.dec_seqlen) : std::string(), ")"));
    }
    batches.insert(p.batch);
    seqlens.insert(p.seqlen);
    dec_seqlens.insert(p.dec_seqlen);
    rows.insert({p.seqlen, p.dec_seqlen});
  }
  auto need_two = [&](const std::set<std::int64_t>& axis, const char* name) {
    if (axis.size() < 2) r.fail(cat("points with at least 2 distinct ", name, " values"));
  };
  need_two(batches, "batch");
  need_two(seqlens, "seqlen");
  if (is_decoder) {
    need_two(dec_seqlens, "dec_seqlen");
    for (std::int64_t s : seqlens) {
      for (std::int64_t d : dec_seqlens) {
        if (!rows.count({s, d})) {
          r.fail(cat("points covering every (seqlen, dec_seqlen) pair at some batch; (", s, ", ", d,
                     ") has none"));
        }
      }
    }
  }
}

ProfileLayer parse_layer(const JsonValue& r, ModelKind model_kind) {
  r.only_fields({"kind", "parameter_bytes", "varlen_fixed_ms", "points"});
  ProfileLayer layer;
  const auto kind = parse_profile_layer_kind(r["kind"].string());
  std::vector<std::string> allowed;
  for (ProfileLayerKind k : kinds_of(model_kind)) allowed.emplace_back(profile_layer_kind_name(k));
  if (!kind || std::find(allowed.begin(), allowed.end(), profile_layer_kind_name(*kind)) == allowed.end()) {
    r.fail_field("kind", cat("one of ", join(allowed, ", "), " for a ", model_kind_name(model_kind), " model"));
  }
  layer.kind = *kind;
  layer.parameter_bytes = r["parameter_bytes"].integer(0);
  if (r.has("varlen_fixed_ms")) {
    if (!is_layer_stack(layer.kind)) r.fail_field("varlen_fixed_ms", "absent for embedding and head");
    const JsonValue fixed = r["varlen_fixed_ms"];
    fixed.only_fields({"fwd", "bwd"});
    layer.varlen_fwd_ms = fixed["fwd"].number(0);
    layer.varlen_bwd_ms = fixed["bwd"].number(0);
  }
  const JsonValue points = r["points"];
  points.only_fields({"none", "selective", "full"});
  const bool is_decoder = layer.kind == ProfileLayerKind::Decoder;
  for (Recompute mode : kRecomputeModes) {
    const std::string name(recompute_name(mode));
    if (!points.has(name)) {
      if (mode == Recompute::None || is_layer_stack(layer.kind)) {
        points.fail_field(name, "a list of points (this kind needs none, selective and full tables; "
                                "embedding and head need none only)");
      }
      continue;
    }
    const JsonValue list = points[name];
    auto& out = layer.points[static_cast<int>(mode)];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const JsonValue item = list[i];
      item.expect_object();
      out.push_back(parse_point(item, is_decoder));
    }
    check_grid(list, out, is_decoder);
  }
  return layer;
}

nlohmann::ordered_json point_to_json(const ProfilePoint& p, bool is_decoder) {
  nlohmann::ordered_json j;
  j["batch"] = p.batch;
  j["seqlen"] = p.seqlen;
  if (is_decoder) j["dec_seqlen"] = p.dec_seqlen;
  j["fwd_ms"] = p.fwd_ms;
  j["bwd_ms"] = p.bwd_ms;
  if (p.bwd_input_ms && p.bwd_weight_ms) {
    j["bwd_input_ms"] = *p.bwd_input_ms;
    j["bwd_weight_ms"] = *p.bwd_weight_ms;
  }
  j["stored_bytes"] = p.stored_bytes;
  j["peak_bytes"] = p.peak_bytes;
  return j;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::NotFound, cat(path, ": cannot open the profile file"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string_view profile_layer_kind_name(ProfileLayerKind kind) {
  switch (kind) {
    case ProfileLayerKind::Embedding: return "embedding";
    case ProfileLayerKind::Layer: return "layer";
    case ProfileLayerKind::Encoder: return "encoder";
    case ProfileLayerKind::Decoder: return "decoder";
    case ProfileLayerKind::Head: return "head";
  }
  return "layer";
}

std::optional<ProfileLayerKind> parse_profile_layer_kind(std::string_view name) {
  for (int i = 0; i < kNumProfileLayerKinds; ++i) {
    const auto kind = static_cast<ProfileLayerKind>(i);
    if (profile_layer_kind_name(kind) == name) return kind;
  }
  return std::nullopt;
}

const ProfileLayer* Profile::find(ProfileLayerKind kind) const {
  for (const ProfileLayer& layer : layers) {
    if (layer.kind == kind) return &layer;
  }
  return nullptr;
}

std::string profile_to_json(const Profile& profile) {
  nlohmann::ordered_json root;
  root["format"] = kFormat;
  root["version"] = kVersion;
  root["model"] = nlohmann::ordered_json::parse(model_spec_to_json(profile.model));
  nlohmann::ordered_json device;
  device["name"] = profile.device.name;
  device["memory_bytes"] = profile.device.memory_bytes;
  device["link_bandwidth_gbs"] = profile.device.link_bandwidth_gbs;
  device["link_latency_ms"] = profile.device.link_latency_ms;
  device["allreduce_bandwidth_gbs"] = profile.device.allreduce_bandwidth_gbs;
  if (profile.device.peak_tflops > 0) device["peak_tflops"] = profile.device.peak_tflops;
  if (profile.device.memory_bandwidth_gbs > 0) device["memory_bandwidth_gbs"] = profile.device.memory_bandwidth_gbs;
  if (profile.runtime_bytes > 0) device["runtime_bytes"] = profile.runtime_bytes;
  root["device"] = device;
  root["bytes_per_element"] = profile.device.bytes_per_element;
  if (profile.tensor_parallel != 1) root["tensor_parallel"] = profile.tensor_parallel;
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const ProfileLayer& layer : profile.layers) {
    nlohmann::ordered_json l;
    l["kind"] = std::string(profile_layer_kind_name(layer.kind));
    l["parameter_bytes"] = layer.parameter_bytes;
    if (layer.varlen_fwd_ms > 0 || layer.varlen_bwd_ms > 0) {
      l["varlen_fixed_ms"] = {{"fwd", layer.varlen_fwd_ms}, {"bwd", layer.varlen_bwd_ms}};
    }
    nlohmann::ordered_json points = nlohmann::ordered_json::object();
    for (Recompute mode : kRecomputeModes) {
      const auto& list = layer.points[static_cast<int>(mode)];
      if (list.empty()) continue;
      nlohmann::ordered_json items = nlohmann::ordered_json::array();
      for (const ProfilePoint& p : list) items.push_back(point_to_json(p, layer.kind == ProfileLayerKind::Decoder));
      points[std::string(recompute_name(mode))] = items;
    }
    l["points"] = points;
    layers.push_back(l);
  }
  root["layers"] = layers;
  // One point per line keeps a profile readable and diffable.
  std::string text = "{\n";
  bool first = true;
  for (const auto& [key, value] : root.items()) {
    if (!first) text += ",\n";
    first = false;
    text += "  " + nlohmann::ordered_json(key).dump() + ": ";
    if (key != "layers") {
      text += value.dump();
      continue;
    }
    text += "[\n";
    for (std::size_t i = 0; i < value.size(); ++i) {
      const auto& l = value[i];
      text += "    {\"kind\": " + l["kind"].dump() + ", \"parameter_bytes\": " + l["parameter_bytes"].dump();
      if (l.contains("varlen_fixed_ms")) text += ", \"varlen_fixed_ms\": " + l["varlen_fixed_ms"].dump();
      text += ", \"points\": {\n";
      bool first_mode = true;
      for (const auto& [mode, items] : l["points"].items()) {
        if (!first_mode) text += ",\n";
        first_mode = false;
        text += "      " + nlohmann::ordered_json(mode).dump() + ": [\n";
        for (std::size_t k = 0; k < items.size(); ++k) {
          text += "        " + items[k].dump() + (k + 1 < items.size() ? ",\n" : "\n");
        }
        text += "      ]";
      }
      text += "\n    }}";
      text += i + 1 < value.size() ? ",\n" : "\n";
    }
    text += "  ]";
  }
  text += "\n}\n";
  return text;
}

Profile parse_profile(const std::string& json, const std::string& where) {
  const JsonDocument document(json, where);
  const JsonValue r = document.root();
  r.only_fields({"format", "version", "model", "device", "bytes_per_element", "tensor_parallel", "layers"});
  if (r["format"].string() != kFormat) r.fail_field("format", cat("\"", kFormat, "\""));
  r["version"].integer(kVersion, kVersion);

  Profile profile;
  const JsonValue model = r["model"];
  model.expect_object();
  profile.model = detail::model_spec_from_json(model, "");
  try {
    profile.model.validate();
  } catch (const Error& e) {
    throw Error(ErrorKind::ParseError, cat(where, ": model: ", e.what()));
  }

  const JsonValue device = r["device"];
  device.only_fields({"name", "memory_bytes", "link_bandwidth_gbs", "link_latency_ms",
                      "allreduce_bandwidth_gbs", "peak_tflops", "memory_bandwidth_gbs", "runtime_bytes"});
  profile.device.name = device["name"].string();
  profile.device.memory_bytes = device["memory_bytes"].integer(0);
  profile.device.link_bandwidth_gbs = device["link_bandwidth_gbs"].number(0);
  profile.device.link_latency_ms = device["link_latency_ms"].number(0);
  profile.device.allreduce_bandwidth_gbs = device["allreduce_bandwidth_gbs"].number(0);
  if (device.has("peak_tflops")) profile.device.peak_tflops = device["peak_tflops"].number(0);
  if (device.has("memory_bandwidth_gbs")) {
    profile.device.memory_bandwidth_gbs = device["memory_bandwidth_gbs"].number(0);
  }
  if (device.has("runtime_bytes")) profile.runtime_bytes = device["runtime_bytes"].integer(0);
  profile.device.bytes_per_element = static_cast<int>(r["bytes_per_element"].integer(1, 8));
  if (r.has("tensor_parallel")) {
    profile.tensor_parallel = static_cast<int>(r["tensor_parallel"].integer(1, 1024));
    if (profile.model.heads % profile.tensor_parallel != 0) {
      r["tensor_parallel"].fail(cat("a divisor of the model's ", profile.model.heads, " heads"));
    }
  }

  const JsonValue layers = r["layers"];
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const JsonValue item = layers[i];
    item.expect_object();
    ProfileLayer layer = parse_layer(item, profile.model.kind);
    if (profile.find(layer.kind)) item.fail_field("kind", "a kind not listed before");
    profile.layers.push_back(std::move(layer));
  }
  for (ProfileLayerKind kind : kinds_of(profile.model.kind)) {
    if (!profile.find(kind)) {
      layers.fail(cat("a list with a \"", profile_layer_kind_name(kind), "\" entry (a ",
                      model_kind_name(profile.model.kind), " model needs embedding, ",
                      profile.model.kind == ModelKind::Gpt ? "layer" : "encoder, decoder", " and head)"));
    }
  }
  return profile;
}

Profile load_profile(const std::string& path) { return parse_profile(read_text_file(path), path); }

namespace {

// Subtracts the cost of `part` from `whole` (times and stored; never below 0). The peak
// is kept whole: stage peaks are maxima, and max(whole.peak, part.peak) == whole.peak
// reconstructs the stage exactly (docs/profile-format.md).
StageCost minus(const StageCost& whole, const StageCost& part) {
  StageCost d = whole;
  d.fwd_ms = std::max(0.0, whole.fwd_ms - part.fwd_ms);
  d.bwd_ms = std::max(0.0, whole.bwd_ms - part.bwd_ms);
  d.bwd_input_ms = std::max(0.0, whole.bwd_input_ms - part.bwd_input_ms);
  d.bwd_weight_ms = std::max(0.0, whole.bwd_weight_ms - part.bwd_weight_ms);
  d.stored_bytes = std::max<std::int64_t>(0, whole.stored_bytes - part.stored_bytes);
  return d;
}

ProfilePoint to_point(const StageCost& c, std::int64_t batch, std::int64_t seqlen, std::int64_t dec_seqlen) {
  ProfilePoint p;
  p.batch = batch;
  p.seqlen = seqlen;
  p.dec_seqlen = dec_seqlen;
  p.fwd_ms = c.fwd_ms;
  p.bwd_ms = c.bwd_ms;
  p.bwd_input_ms = c.bwd_input_ms;
  p.bwd_weight_ms = c.bwd_weight_ms;
  p.stored_bytes = c.stored_bytes;
  p.peak_bytes = c.peak_bytes;
  return p;
}

std::vector<std::int64_t> sorted_union(std::vector<std::int64_t> a, const std::vector<std::int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}

}  // namespace

Profile build_profile(const CostModel& per_layer, const ProfileGrid& unsorted_grid) {
  const ProfileGrid grid{.batches = sorted_union(unsorted_grid.batches, {}),
                         .seqlens = sorted_union(unsorted_grid.seqlens, {}),
                         .dec_seqlens = sorted_union(unsorted_grid.dec_seqlens, {})};
  const ModelSpec& spec = per_layer.model();
  const bool t5 = spec.kind == ModelKind::T5;
  if (per_layer.num_stages() != spec.total_layers()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("build_profile: the cost model must have one stage per layer (", spec.total_layers(),
                    "), got ", per_layer.num_stages()));
  }
  if (t5 ? (spec.layers < 2 || spec.dec_layers < 2) : spec.layers < 3) {
    throw Error(ErrorKind::InvalidArgument,
                cat("build_profile: model '", spec.name, "' must have ",
                    t5 ? ">= 2 encoder and >= 2 decoder layers" : ">= 3 layers", " to separate its parts"));
  }
  auto require_axis = [](const std::vector<std::int64_t>& axis, const char* name) {
    if (axis.size() < 2 || axis.front() < 1) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("build_profile: grid ", name, " must have >= 2 distinct values >= 1, got ", join(axis, ",")));
    }
  };
  require_axis(grid.batches, "batches");
  require_axis(grid.seqlens, "seqlens");
  if (t5) require_axis(grid.dec_seqlens, "dec_seqlens");

  const int e = per_layer.device().bytes_per_element;
  Profile profile;
  profile.model = spec;
  // Only the fields of the format: the analytic calibration is not part of a profile.
  profile.device.name = per_layer.device().name;
  profile.device.memory_bytes = per_layer.device().memory_bytes;
  profile.device.link_bandwidth_gbs = per_layer.device().link_bandwidth_gbs;
  profile.device.link_latency_ms = per_layer.device().link_latency_ms;
  profile.device.allreduce_bandwidth_gbs = per_layer.device().allreduce_bandwidth_gbs;
  profile.device.peak_tflops = per_layer.device().peak_tflops;
  profile.device.memory_bandwidth_gbs = per_layer.device().memory_bandwidth_gbs;
  profile.device.bytes_per_element = e;

  const int last = per_layer.num_stages() - 1;
  const int enc = spec.layers;
  const AttentionDensity dense;
  auto cost = [&](int stage, std::int64_t b, std::int64_t s, std::int64_t d, Recompute mode) {
    return per_layer.stage_cost(stage, {.batch = b, .seqlen = s, .dec_seqlen = d}, dense, mode);
  };
  // Embedding and head tables are measured without recomputation, which does not apply.
  const std::int64_t any_dec = t5 ? grid.dec_seqlens.front() : 0;
  const std::vector<std::int64_t> emb_lengths = t5 ? sorted_union(grid.seqlens, grid.dec_seqlens) : grid.seqlens;
  ProfileLayer embedding{.kind = ProfileLayerKind::Embedding,
                         .parameter_bytes = embedding_parameter_count(spec) * e, .points = {}};
  for (std::int64_t b : grid.batches) {
    for (std::int64_t s : emb_lengths) {
      const StageCost emb = minus(cost(0, b, s, any_dec, Recompute::None), cost(1, b, s, any_dec, Recompute::None));
      embedding.points[0].push_back(to_point(emb, b, s, 0));
    }
  }

  ProfileLayer stack{.kind = t5 ? ProfileLayerKind::Encoder : ProfileLayerKind::Layer,
                     .parameter_bytes = layer_parameter_count(spec) * e, .points = {}};
  ProfileLayer decoder{.kind = ProfileLayerKind::Decoder,
                       .parameter_bytes = decoder_layer_parameter_count(spec) * e, .points = {}};
  ProfileLayer head{.kind = ProfileLayerKind::Head, .parameter_bytes = head_parameter_count(spec) * e, .points = {}};
  for (Recompute mode : kRecomputeModes) {
    const int m = static_cast<int>(mode);
    for (std::int64_t b : grid.batches) {
      for (std::int64_t s : grid.seqlens) {
        stack.points[m].push_back(to_point(cost(1, b, s, any_dec, mode), b, s, 0));
        if (!t5 && mode == Recompute::None) {
          head.points[0].push_back(to_point(minus(cost(last, b, s, 0, mode), cost(1, b, s, 0, mode)), b, s, 0));
        }
      }
      if (!t5) continue;
      for (std::int64_t s : grid.seqlens) {
        for (std::int64_t d : grid.dec_seqlens) {
          // A pure decoder stage when there is one; else the first decoder stage minus its
          // decoder embedding (measured on the encoder side at length d).
          StageCost dec;
          if (spec.dec_layers >= 3) {
            dec = cost(enc + 1, b, s, d, mode);
          } else {
            const StageCost emb_d = minus(cost(0, b, d, d, Recompute::None), cost(1, b, d, d, Recompute::None));
            dec = minus(cost(enc, b, s, d, mode), emb_d);
          }
          decoder.points[m].push_back(to_point(dec, b, s, d));
          if (mode == Recompute::None && s == grid.seqlens.front()) {
            head.points[0].push_back(to_point(minus(cost(last, b, s, d, mode), dec), b, d, 0));
          }
        }
      }
    }
  }
  profile.layers.push_back(std::move(embedding));
  profile.layers.push_back(std::move(stack));
  if (t5) profile.layers.push_back(std::move(decoder));
  profile.layers.push_back(std::move(head));
  return profile;
}

std::vector<std::int64_t> doubling_lengths(std::int64_t first, std::int64_t last) {
  if (first < 1 || last < first) {
    throw Error(ErrorKind::InvalidArgument, cat("profile lengths must run from >= 1 up to >= ", first, ", got ", last));
  }
  std::vector<std::int64_t> lengths;
  for (std::int64_t length = first; length < last; length *= 2) lengths.push_back(length);
  lengths.push_back(last);
  return lengths;
}

}  // namespace dynapipe
