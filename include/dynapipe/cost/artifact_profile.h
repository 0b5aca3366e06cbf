// Profiles from the DynaPipe artifact's measured cost models (the JSON export of its
// pickles, assets/a100-measured/): per-layer times and activation memory of GPT-6.7B and
// T5-11B on A100-40GB at tensor parallelism 1, 2, 4, 8. `--cost-model a100-measured`
// plans with them through the profiled cost model.
//
//   Profile p = import_artifact_profile(read_file("gpt-6.7b.json"), "gpt-6.7b.json",
//                                       load_model_spec("gpt-6.7b"), /*tp=*/2);
//   auto model = make_a100_measured_cost_model(spec, {.num_stages = 4, .tp = 2});
//
// Conversion (docs/cost-model.md, "Measured A100 model"): MB are 10^6 bytes; duplicate
// measurements of a shape keep their median; a layer's peak becomes peak − stored (the
// artifact's peak includes the layer's stored activation, the profile format's does
// not); the `postprocess` time is the head's (the embedding costs no time), and the
// embedding's and head's activation memory, which the artifact does not record, come
// from the analytic formulas; a decoder (seqlen, dec_seqlen) pair never measured is out
// of memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/profile.h"

namespace dynapipe {

// The tensor-parallel degrees the artifact measured (1, 2, 4, 8).
std::vector<int> artifact_tensor_parallel_degrees(const std::string& json, const std::string& where);

// The profile of `model` at tensor parallelism `tp`. Throws ParseError naming `where` and
// the JSON path for malformed content, InvalidArgument when the file holds another model
// kind or no measurement at `tp` (naming the degrees it has).
Profile import_artifact_profile(const std::string& json, const std::string& where,
                                const ModelSpec& model, int tp);

// The directory of the bundled measurements: $DYNAPIPE_ASSETS_DIR/a100-measured when that
// variable is set, else the source tree's assets/a100-measured.
std::string a100_measured_dir();

// `--cost-model a100-measured`: the bundled measurement of `model` (gpt-6.7b or t5-11b,
// by shape) at options.tp, parsed once per process and cached. Throws InvalidArgument
// for another model or a degree without measurements, NotFound when the file is missing.
std::unique_ptr<CostModel> make_a100_measured_cost_model(const ModelSpec& model,
                                                         const CostModelOptions& options);

}  // namespace dynapipe
