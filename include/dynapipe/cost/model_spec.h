// ModelSpec: the transformer shape the planner and the runtime agree on, its presets,
// and how its layers are laid out over pipeline stages.
//
//   ModelSpec spec = load_model_spec("gpt-6.7b");          // preset, or a .json file
//   auto stages = assign_layers_uniform(spec, /*num_stages=*/4);
//   std::int64_t n = stage_parameter_count(spec, stages[0]);
//
// Every function here is pure and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dynapipe/core/model_kind.h"

namespace dynapipe {

struct ModelSpec {
  std::string name;
  ModelKind kind = ModelKind::Gpt;
  int hidden = 0;       // d_model
  int heads = 0;        // attention heads
  int kv_channels = 0;  // per-head dimension (0 = hidden / heads)
  int ffn_hidden = 0;   // MLP inner width
  int layers = 0;       // GPT: transformer layers; T5: encoder layers
  int dec_layers = 0;   // T5: decoder layers; GPT: 0
  int vocab = 0;        // vocabulary size (the byte tokenizer needs >= 259)
  int max_positions = 0;  // learned position table size; must cover --max-seqlen

  int head_dim() const { return kv_channels > 0 ? kv_channels : hidden / heads; }
  // Width of Q, K, V and of the attention output: heads * head_dim (T5-11B: 16384 > hidden).
  int attention_width() const { return heads * head_dim(); }
  int total_layers() const { return layers + dec_layers; }
  // Whole model, tied weights counted once (see docs/models.md for the layout).
  std::int64_t parameter_count() const;
  // Throws InvalidArgument naming the first field that is out of range.
  void validate() const;
  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

// Parameters of the pieces the layer stack is made of (docs/models.md):
//   layer (GPT) / encoder layer: LN, QKV, attention output, LN, MLP (all with biases);
//   decoder layer: encoder layer + cross-attention (Q, KV, output) + its LN;
//   embedding: token table (vocab x hidden) + learned positions (max_positions x hidden);
//   head: final LN + LM head, whose weight is tied to the token table.
std::int64_t layer_parameter_count(const ModelSpec& spec);    // GPT layer or T5 encoder layer
std::int64_t decoder_layer_parameter_count(const ModelSpec& spec);  // T5 decoder layer
std::int64_t embedding_parameter_count(const ModelSpec& spec);
std::int64_t head_parameter_count(const ModelSpec& spec);     // final LN only (tied LM head)

// Presets: gpt-tiny, gpt-small, gpt-6.7b, t5-tiny, t5-small, t5-11b (see docs/models.md).
std::vector<std::string> model_preset_names();
// A preset name, or the path of a JSON file with the fields above. Throws NotFound for
// an unknown name / missing file, ParseError for a malformed file.
ModelSpec load_model_spec(const std::string& name_or_path);

// The JSON object form of a ModelSpec (the fields above; `kind` is "gpt" or "t5"), as
// model files, profiles and plan configs write it. parse_model_spec() throws ParseError
// naming `where` and the field, then validates (InvalidArgument).
std::string model_spec_to_json(const ModelSpec& spec);
ModelSpec parse_model_spec(const std::string& json, const std::string& where);

// The part of the model one pipeline stage holds. Encoder/decoder ranges are
// half-open layer indices; for GPT only the enc range is used.
struct StageLayers {
  int enc_begin = 0, enc_end = 0;  // GPT: decoder-only layers live here
  int dec_begin = 0, dec_end = 0;  // T5 decoder layers
  bool has_embedding = false;      // token (+ position) embedding of the input
  bool has_dec_embedding = false;  // T5: decoder token embedding (where the decoder starts)
  bool has_head = false;           // final norm + LM head + loss
  int num_layers() const { return (enc_end - enc_begin) + (dec_end - dec_begin); }
  bool has_encoder() const { return enc_end > enc_begin; }
  bool has_decoder() const { return dec_end > dec_begin; }
  friend bool operator==(const StageLayers&, const StageLayers&) = default;
};

// Contiguous, as-even-as-possible split of the layer stack (T5: encoder layers then
// decoder layers) over num_stages stages; the first stage carries the embedding, the
// last the head. Throws InvalidArgument if num_stages exceeds the layer count.
// With an uneven split the first (total % num_stages) stages get one layer more.
std::vector<StageLayers> assign_layers_uniform(const ModelSpec& spec, int num_stages);

// The contiguous split with layers_per_stage[i] layers on stage i (each >= 1, summing to the
// layer count; T5: encoder then decoder), embedding on the first stage and head on the last.
// Throws InvalidArgument naming the counts otherwise.
std::vector<StageLayers> assign_layers(const ModelSpec& spec, const std::vector<int>& layers_per_stage);
std::vector<int> layers_per_stage(const std::vector<StageLayers>& stages);

// The virtual stages of an interleaved layout over the device split `layers_per_device`:
// virtual stage k·D + d (D devices) holds chunk k of device d's layers, its count split as
// evenly as possible (earlier chunks one layer more), so device d keeps exactly
// layers_per_device[d] layers, and the layers run contiguously over the virtual stages in
// order. Throws InvalidArgument when a device has fewer layers than `chunks`.
std::vector<StageLayers> assign_layers_interleaved(const ModelSpec& spec, const std::vector<int>& layers_per_device,
                                                   int chunks);

// Parameters a stage holds: its layers, plus a token table wherever an embedding or the
// head lives (a stage holding several of them shares one copy; different stages each
// hold their own copy, whose gradients the runtime keeps in sync), plus the position
// table with each embedding and the final LN with the head.
std::int64_t stage_parameter_count(const ModelSpec& spec, const StageLayers& stage);

}  // namespace dynapipe
