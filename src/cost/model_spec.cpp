#include "dynapipe/cost/model_spec.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cost/model_spec_json.h"
#include "dynapipe/core/error.h"

namespace dynapipe {
namespace {

ModelSpec make_preset(const char* name, ModelKind kind, int hidden, int heads, int kv_channels,
                      int ffn_hidden, int layers, int dec_layers, int vocab) {
  ModelSpec spec;
  spec.name = name;
  spec.kind = kind;
  spec.hidden = hidden;
  spec.heads = heads;
  spec.kv_channels = kv_channels;
  spec.ffn_hidden = ffn_hidden;
  spec.layers = layers;
  spec.dec_layers = dec_layers;
  spec.vocab = vocab;
  spec.max_positions = 8192;
  return spec;
}

// The tiny models train on a 2-core CPU in seconds; the small ones are for CPU
// benchmarks; the large ones are the shapes of the DynaPipe paper (docs/models.md).
// Vocab 320 covers the byte tokenizer's 259 ids, rounded up to a multiple of 64.
const std::vector<ModelSpec>& presets() {
  static const std::vector<ModelSpec> kPresets = {
      make_preset("gpt-tiny", ModelKind::Gpt, 128, 4, 0, 512, 4, 0, 320),
      make_preset("gpt-small", ModelKind::Gpt, 256, 8, 0, 1024, 8, 0, 320),
      make_preset("gpt-6.7b", ModelKind::Gpt, 4096, 32, 0, 16384, 32, 0, 50304),
      make_preset("t5-tiny", ModelKind::T5, 128, 4, 0, 512, 2, 2, 320),
      make_preset("t5-small", ModelKind::T5, 256, 8, 0, 1024, 4, 4, 320),
      make_preset("t5-11b", ModelKind::T5, 1024, 128, 128, 65536, 24, 24, 32128),
  };
  return kPresets;
}

std::int64_t attention_block_parameters(std::int64_t h, std::int64_t k) {
  // Q, K, V projections h -> k with bias, output projection k -> h with bias.
  return h * 3 * k + 3 * k + k * h + h;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::NotFound, cat(path, ": cannot open file"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::int64_t layer_parameter_count(const ModelSpec& spec) {
  const std::int64_t h = spec.hidden, f = spec.ffn_hidden;
  const std::int64_t mlp = h * f + f + f * h + h;
  return 2 * h + attention_block_parameters(h, spec.attention_width()) + 2 * h + mlp;
}

std::int64_t decoder_layer_parameter_count(const ModelSpec& spec) {
  const std::int64_t h = spec.hidden;
  return layer_parameter_count(spec) + 2 * h + attention_block_parameters(h, spec.attention_width());
}

std::int64_t embedding_parameter_count(const ModelSpec& spec) {
  return static_cast<std::int64_t>(spec.vocab) * spec.hidden +
         static_cast<std::int64_t>(spec.max_positions) * spec.hidden;
}

std::int64_t head_parameter_count(const ModelSpec& spec) { return 2 * std::int64_t{spec.hidden}; }

std::int64_t ModelSpec::parameter_count() const {
  std::int64_t n = embedding_parameter_count(*this) + head_parameter_count(*this);
  n += layers * layer_parameter_count(*this);
  n += dec_layers * decoder_layer_parameter_count(*this);
  return n;
}

void ModelSpec::validate() const {
  const std::string where = cat("model '", name, "'");
  auto require = [&](bool ok, const char* field, const char* expected, std::int64_t got) {
    if (!ok) {
      throw Error(ErrorKind::InvalidArgument, cat(where, ": ", field, " must be ", expected, ", got ", got));
    }
  };
  require(hidden >= 1, "hidden", ">= 1", hidden);
  require(heads >= 1, "heads", ">= 1", heads);
  require(kv_channels >= 0, "kv_channels", ">= 0 (0 = hidden / heads)", kv_channels);
  require(kv_channels > 0 || hidden % heads == 0, "hidden",
          "a multiple of heads when kv_channels is 0", hidden);
  require(ffn_hidden >= 1, "ffn_hidden", ">= 1", ffn_hidden);
  require(layers >= 1, "layers", ">= 1", layers);
  if (kind == ModelKind::Gpt) {
    require(dec_layers == 0, "dec_layers", "0 for a GPT model", dec_layers);
  } else {
    require(dec_layers >= 1, "dec_layers", ">= 1 for a T5 model", dec_layers);
  }
  require(vocab >= 1, "vocab", ">= 1", vocab);
  require(max_positions >= 1, "max_positions", ">= 1", max_positions);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  return names;
}

std::string model_spec_to_json(const ModelSpec& spec) {
  nlohmann::ordered_json j;
  j["name"] = spec.name;
  j["kind"] = std::string(model_kind_name(spec.kind));
  j["hidden"] = spec.hidden;
  j["heads"] = spec.heads;
  j["kv_channels"] = spec.kv_channels;
  j["ffn_hidden"] = spec.ffn_hidden;
  j["layers"] = spec.layers;
  j["dec_layers"] = spec.dec_layers;
  j["vocab"] = spec.vocab;
  j["max_positions"] = spec.max_positions;
  return j.dump(2);
}

namespace detail {
// Shared with profile.cpp, which embeds a model object.
ModelSpec model_spec_from_json(const JsonValue& r, const std::string& default_name) {
  r.only_fields({"name", "kind", "hidden", "heads", "kv_channels", "ffn_hidden", "layers",
                 "dec_layers", "vocab", "max_positions"});
  constexpr std::int64_t kMaxDim = std::int64_t{1} << 30;
  ModelSpec spec;
  spec.name = r.has("name") ? r["name"].string() : default_name;
  const std::optional<ModelKind> kind = parse_model_kind(r["kind"].string());
  if (!kind) r.fail_field("kind", "\"gpt\" or \"t5\"");
  spec.kind = *kind;
  auto dim = [&](const char* key, std::int64_t lo) {
    return static_cast<int>(r[key].integer(lo, kMaxDim));
  };
  spec.hidden = dim("hidden", 1);
  spec.heads = dim("heads", 1);
  spec.kv_channels = r.has("kv_channels") ? dim("kv_channels", 0) : 0;
  spec.ffn_hidden = dim("ffn_hidden", 1);
  spec.layers = dim("layers", 1);
  spec.dec_layers = r.has("dec_layers") ? dim("dec_layers", 0) : 0;
  spec.vocab = dim("vocab", 1);
  spec.max_positions = dim("max_positions", 1);
  return spec;
}
}  // namespace detail

ModelSpec parse_model_spec(const std::string& json, const std::string& where) {
  const JsonDocument document(json, where);
  const JsonValue reader = document.root();
  reader.expect_object();
  ModelSpec spec = detail::model_spec_from_json(reader, where);
  spec.validate();
  return spec;
}

ModelSpec load_model_spec(const std::string& name_or_path) {
  for (const auto& p : presets()) {
    if (p.name == name_or_path) return p;
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(name_or_path, ec)) {
    throw Error(ErrorKind::NotFound,
                cat("--model: must be a preset (", join(model_preset_names(), ", "),
                    ") or a model JSON file, got '", name_or_path, "'"));
  }
  const std::string stem = std::filesystem::path(name_or_path).stem().string();
  const JsonDocument document(read_text_file(name_or_path), name_or_path);
  const JsonValue reader = document.root();
  reader.expect_object();
  ModelSpec spec = detail::model_spec_from_json(reader, stem);
  spec.validate();
  return spec;
}

std::vector<StageLayers> assign_layers_uniform(const ModelSpec& spec, int num_stages) {
  const int total = spec.total_layers();
  if (num_stages < 1) {
    throw Error(ErrorKind::InvalidArgument, cat("pipeline stages (--pp) must be >= 1, got ", num_stages));
  }
  if (num_stages > total) {
    throw Error(ErrorKind::InvalidArgument,
                cat("pipeline stages (--pp x chunks) must be at most the ", total, " layers of model '",
                    spec.name, "', got ", num_stages));
  }
  const int base = total / num_stages;
  const int extra = total % num_stages;
  std::vector<int> counts(num_stages);
  for (int i = 0; i < num_stages; ++i) counts[i] = base + (i < extra ? 1 : 0);
  return assign_layers(spec, counts);
}

std::vector<StageLayers> assign_layers(const ModelSpec& spec, const std::vector<int>& layers_per_stage) {
  const int total = spec.total_layers();
  int sum = 0;
  bool positive = !layers_per_stage.empty();
  for (int n : layers_per_stage) {
    sum += n;
    positive = positive && n >= 1;
  }
  if (!positive || sum != total) {
    throw Error(ErrorKind::InvalidArgument,
                cat("layers per stage must be >= 1 each and sum to the ", total, " layers of model '", spec.name,
                    "', got ", join(layers_per_stage, ",")));
  }
  const int enc = spec.layers;  // T5: the stack is encoder layers [0, enc) then decoder layers
  const int num_stages = static_cast<int>(layers_per_stage.size());
  std::vector<StageLayers> stages(num_stages);
  int begin = 0;
  for (int i = 0; i < num_stages; ++i) {
    const int end = begin + layers_per_stage[i];
    StageLayers& s = stages[i];
    s.enc_begin = std::min(begin, enc);
    s.enc_end = std::min(end, enc);
    s.dec_begin = std::max(begin, enc) - enc;
    s.dec_end = std::max(end, enc) - enc;
    s.has_embedding = i == 0;
    s.has_dec_embedding = spec.dec_layers > 0 && begin <= enc && enc < end;
    s.has_head = i == num_stages - 1;
    begin = end;
  }
  return stages;
}

std::vector<StageLayers> assign_layers_interleaved(const ModelSpec& spec, const std::vector<int>& layers_per_device,
                                                   int chunks) {
  const int devices = static_cast<int>(layers_per_device.size());
  const bool enough = chunks >= 1 && devices >= 1 &&
                      *std::min_element(layers_per_device.begin(), layers_per_device.end()) >= chunks;
  if (!enough) {
    throw Error(ErrorKind::InvalidArgument,
                cat("an interleaved layout of ", chunks, " chunks needs at least ", chunks,
                    " layers on every stage, got ", join(layers_per_device, ",")));
  }
  std::vector<int> virtual_counts(static_cast<std::size_t>(devices * chunks));
  for (int d = 0; d < devices; ++d) {
    const int count = layers_per_device[d];
    for (int k = 0; k < chunks; ++k) virtual_counts[k * devices + d] = count / chunks + (k < count % chunks ? 1 : 0);
  }
  return assign_layers(spec, virtual_counts);
}

std::vector<int> layers_per_stage(const std::vector<StageLayers>& stages) {
  std::vector<int> counts;
  for (const StageLayers& s : stages) counts.push_back(s.num_layers());
  return counts;
}

std::int64_t stage_parameter_count(const ModelSpec& spec, const StageLayers& stage) {
  std::int64_t n = (stage.enc_end - stage.enc_begin) * layer_parameter_count(spec) +
                   (stage.dec_end - stage.dec_begin) * decoder_layer_parameter_count(spec);
  const std::int64_t h = spec.hidden;
  if (stage.has_embedding || stage.has_dec_embedding || stage.has_head) n += std::int64_t{spec.vocab} * h;
  if (stage.has_embedding || stage.has_dec_embedding) n += std::int64_t{spec.max_positions} * h;
  if (stage.has_head) n += head_parameter_count(spec);
  return n;
}

}  // namespace dynapipe
