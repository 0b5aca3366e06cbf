// ModelSpec: the transformer shape the planner and the runtime agree on, its presets,
// and how its layers are laid out over pipeline stages.
//
//   ModelSpec spec = load_model_spec("gpt-6.7b");          // preset, or a .json file
//   auto stages = assign_layers_uniform(spec, /*num_stages=*/4);
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
  int total_layers() const { return layers + dec_layers; }
  std::int64_t parameter_count() const;
  // Throws InvalidArgument naming the first field that is out of range.
  void validate() const;
};

// Presets: gpt-tiny, gpt-small, gpt-6.7b, t5-tiny, t5-small, t5-11b (see docs/models.md).
std::vector<std::string> model_preset_names();
// A preset name, or the path of a JSON file with the fields above. Throws NotFound for
// an unknown name / missing file, ParseError for a malformed file.
ModelSpec load_model_spec(const std::string& name_or_path);

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
};

// Contiguous, as-even-as-possible split of the layer stack (T5: encoder layers then
// decoder layers) over num_stages stages; the first stage carries the embedding, the
// last the head. Throws InvalidArgument if num_stages exceeds the layer count.
std::vector<StageLayers> assign_layers_uniform(const ModelSpec& spec, int num_stages);

}  // namespace dynapipe
