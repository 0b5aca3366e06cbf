// The GPT and T5 stage models: make_stage_model() builds the StageModel of one pipeline
// stage from the model's shape and the layers that stage holds.
//
//   ModelSpec spec = load_model_spec("gpt-tiny");
//   auto stages = assign_layers_uniform(spec, 2);
//   auto stage0 = make_stage_model(spec, stages[0], ModelOptions{.seed = 7});
//   StageOutput out = stage0->forward({}, collate(mb, tokens, spec.kind, mode, scale));
//
// Parameters are initialised from (seed, layer) alone, so the same layer has the same
// weights whichever stage holds it: a pp=2 model equals a pp=1 model, parameter by
// parameter (names are global too, e.g. "enc_layers.3.fc1.weight").
// Not thread-safe: one thread drives one stage model. See docs/models-runtime.md.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dynapipe/core/model_kind.h"
#include "dynapipe/cost/model_spec.h"
#include "runtime/stage_model.h"

namespace dynapipe::runtime {

struct ModelOptions {
  double dropout = 0.0;                  // residual + embedding dropout, [0, 1). Default 0.
  std::uint64_t seed = 0;                // parameter init (and nothing else). Default 0.
  Recompute recompute = Recompute::None; // initial StageModel::recompute(). Default None.
  // Throws InvalidArgument naming the field.
  void validate() const;
};

// Throws InvalidArgument if the spec or layers are inconsistent (layer ranges outside the
// model, a T5 decoder stage without a preceding encoder output, ...).
std::shared_ptr<StageModel> make_stage_model(const ModelSpec& spec, const StageLayers& layers,
                                             const ModelOptions& options);

// Shape of the activation this stage sends for a micro-batch of `shape` ({} on the stage
// with the head): GPT and T5 encoder-only stages [batch, seqlen, hidden]; T5 stages that
// hold decoder layers or the decoder embedding [batch, seqlen + dec_seqlen, hidden].
// A stage receives the previous stage's output shape.
std::vector<std::int64_t> stage_output_shape(const ModelSpec& spec, const StageLayers& layers,
                                             const MicroBatchShape& shape);

}  // namespace dynapipe::runtime
