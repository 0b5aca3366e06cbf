#include "cli/transformer_graph.h"

#include <memory>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe::cli {

ProfileGraph transformer_graph(const std::string& cost_spec, const ModelSpec& model, const MicroBatchShape& shape,
                               int seqlen_multiple) {
  CostModelOptions options;
  options.num_stages = model.total_layers();
  options.seqlen_multiple = seqlen_multiple;
  return transformer_graph(*make_cost_model(cost_spec, model, options), shape);
}

ProfileGraph transformer_graph(const CostModel& per_layer, const MicroBatchShape& shape) {
  const ModelSpec& model = per_layer.model();
  DYNAPIPE_CHECK(per_layer.num_stages() == model.total_layers(), "transformer graph needs one layer per stage");
  if (shape.batch < 1 || shape.seqlen < 1 || (model.kind == ModelKind::T5) != (shape.dec_seqlen > 0)) {
    throw Error(ErrorKind::InvalidArgument,
                cat("graph export shape must have batch >= 1, seqlen >= 1 and a decoder length exactly for T5, got ",
                    shape.batch, "x", shape.seqlen, "+", shape.dec_seqlen));
  }
  ProfileGraph graph;
  ProfileNode input;
  input.id = "node0";
  input.desc = "Input0";
  graph.nodes.push_back(input);
  const int bytes_per_element = per_layer.device().bytes_per_element;
  for (int l = 0; l < model.total_layers(); ++l) {
    const StageLayers& layers = per_layer.stages()[l];
    const StageCost cost = per_layer.stage_cost(l, shape, {}, Recompute::None);
    ProfileNode node;
    node.id = cat("node", l + 1);
    const bool decoder = layers.has_decoder();
    node.desc = cat(model.kind == ModelKind::T5 ? (decoder ? "DecoderLayer(" : "EncoderLayer(") : "Layer(",
                    decoder ? layers.dec_begin : layers.enc_begin, ")", layers.has_embedding ? " + embedding" : "",
                    layers.has_dec_embedding ? " + decoder embedding" : "", layers.has_head ? " + head" : "");
    node.forward_ms = cost.fwd_ms;
    node.backward_ms = cost.bwd_ms;
    node.activation_bytes = static_cast<double>(cost.output_bytes);
    node.parameter_bytes = static_cast<double>(stage_parameter_count(model, layers) * bytes_per_element);
    graph.nodes.push_back(node);
    graph.edges.push_back({l, l + 1});
  }
  return graph;
}

}  // namespace dynapipe::cli
