// Profile: measured per-layer costs of one model on one device, the input of the
// profiled cost model (`--cost-model PROFILE.json`). The JSON form is described in
// docs/profile-format.md; `dynapipe profile` writes it, parse_profile() reads it.
//
//   Profile p = parse_profile(read_file("gpt-tiny.cpu.json"), "gpt-tiny.cpu.json");
//   auto model = make_profiled_cost_model(p, options);
//   std::string json = profile_to_json(p);                  // round-trips exactly
//
// A profile is a plain value; every function here is pure and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dynapipe/core/model_kind.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/device_spec.h"
#include "dynapipe/cost/model_spec.h"

namespace dynapipe {

// Memory the profiled model reports for a shape that ran out of memory when profiled
// (1 PiB: larger than any device, small enough that sums of it do not overflow).
inline constexpr std::int64_t kInfeasibleBytes = std::int64_t{1} << 50;

// The pieces a stage is made of. Part of profile format v1: spelled as in the JSON.
enum class ProfileLayerKind : std::uint8_t {
  Embedding = 0,  // token + position lookup; T5's decoder embedding uses it at dec_seqlen
  Layer = 1,      // GPT transformer layer
  Encoder = 2,    // T5 encoder layer
  Decoder = 3,    // T5 decoder layer (self + cross attention); keyed by seqlen and dec_seqlen
  Head = 4,       // final norm + LM head + loss; keyed by the length it runs on
                  // (GPT: seqlen, T5: dec_seqlen, written as `seqlen`)
};
inline constexpr int kNumProfileLayerKinds = 5;
std::string_view profile_layer_kind_name(ProfileLayerKind kind);  // "embedding", ...
std::optional<ProfileLayerKind> parse_profile_layer_kind(std::string_view name);

// One measured shape of one layer. Times and memory are for ONE layer of the kind.
struct ProfilePoint {
  std::int64_t batch = 0;
  std::int64_t seqlen = 0;
  std::int64_t dec_seqlen = 0;      // Decoder only
  double fwd_ms = 0;
  double bwd_ms = 0;                // full backward including recomputation
  std::optional<double> bwd_input_ms;   // both or neither; when absent the profiled model
  std::optional<double> bwd_weight_ms;  // splits bwd_ms (docs/profile-format.md)
  std::int64_t stored_bytes = 0;    // kept from forward until backward
  std::int64_t peak_bytes = 0;      // transient on top of stored, during forward or backward
  friend bool operator==(const ProfilePoint&, const ProfilePoint&) = default;
};

struct ProfileLayer {
  ProfileLayerKind kind = ProfileLayerKind::Layer;
  std::int64_t parameter_bytes = 0;  // one layer (embedding: token + position tables)
  // Indexed by Recompute. Layer/Encoder/Decoder need all three modes; Embedding and Head
  // need "none" only (recomputation does not apply to them; the none table is used).
  std::vector<ProfilePoint> points[3];
  // Fixed time of one layer run on varlen rows over the same rows run dense, per forward
  // and per backward: what the varlen attention kernels cost beyond the attention work the
  // density rule counts (on an H200 a T5-11B decoder layer +0.46 / +0.12 ms; RESULTS.md,
  // "GPU: plans priced for the card they run on"). Transformer layers only; optional in
  // the JSON ("varlen_fixed_ms": {"fwd": F, "bwd": B}), 0 when absent.
  double varlen_fwd_ms = 0;
  double varlen_bwd_ms = 0;
  friend bool operator==(const ProfileLayer&, const ProfileLayer&) = default;
};

struct Profile {
  ModelSpec model;
  // name, memory and link figures; bytes_per_element from the header. The analytic
  // calibration fields are not part of the format.
  DeviceSpec device;
  // Tensor-parallel degree the layers were measured at (per-device times, memory and
  // parameter bytes). Optional in the JSON ("tensor_parallel", default 1).
  int tensor_parallel = 1;
  // Per rank: memory the runtime itself takes on top of model states and activations
  // (LibTorch's first-use state); every stage's static bytes count it. Optional in the JSON
  // ("device.runtime_bytes", default 0); `dynapipe profile --stages` measures it.
  std::int64_t runtime_bytes = 0;
  std::vector<ProfileLayer> layers;  // one per kind the model has, any order
  const ProfileLayer* find(ProfileLayerKind kind) const;
  friend bool operator==(const Profile&, const Profile&) = default;
};

// Deterministic, human-readable JSON (profile format v1).
std::string profile_to_json(const Profile& profile);
// Throws ParseError "<where>: <json path> must be <expected>, got <actual>" for any
// malformed or inconsistent content (docs/profile-format.md, "Validation").
Profile parse_profile(const std::string& json, const std::string& where);
// Reads and parses a profile file. Throws NotFound if it cannot be opened.
Profile load_profile(const std::string& path);

// The shapes build_profile() samples. dec_seqlens is used by T5 models only.
struct ProfileGrid {
  std::vector<std::int64_t> batches;
  std::vector<std::int64_t> seqlens;
  std::vector<std::int64_t> dec_seqlens;
};

// first, 2 first, 4 first, ... below last, then last: the default lengths of a profile
// grid that covers every length up to `last` (`dynapipe profile --max-seqlen`). Throws
// InvalidArgument unless 1 <= first <= last.
std::vector<std::int64_t> doubling_lengths(std::int64_t first, std::int64_t last);

// Samples `per_layer` (any CostModel laid out with exactly one layer per stage, e.g. an
// analytic model built with num_stages = total_layers()) on `grid` and decomposes its
// stage costs into per-kind tables. Needs GPT >= 3 layers, T5 >= 2 encoder and >= 2
// decoder layers (so each kind can be separated); throws InvalidArgument otherwise.
Profile build_profile(const CostModel& per_layer, const ProfileGrid& grid);

// The profiled cost model over `profile` (ParseError-free by construction: pass a parsed
// or built profile). `source` is what describe() reports after "profile:".
std::unique_ptr<CostModel> make_profiled_cost_model(const Profile& profile,
                                                    const CostModelOptions& options,
                                                    const std::string& source = "<memory>");

}  // namespace dynapipe
