// Which layers each pipeline stage holds (`--partition uniform|balanced|joint`).
//
//   uniform   as many layers per stage as possible alike (assign_layers_uniform);
//   balanced  the fastest on the first global batches (as planned) of: the uniform split,
//             the min-max split of one --max-seqlen row's layer times (uniform where only
//             uniform holds the weights), and the min-max splits of those batches' work
//             with each stage held to its own 1F1B memory rule for one --max-seqlen row
//             (stage s keeps pp − s in flight; one split per recompute mode that fits).
//             Without batches: the lightest memory-ruled split of one row, else the
//             time-only one;
//   joint     the split minimising the estimated iteration time of the first global
//             batches as the planner plans them under that split (dynamic micro-batching and
//             schedule included): a local search from the better of uniform and balanced,
//             moving one stage boundary by one layer at a time and, where no such move
//             helps, giving one stage's layer to a stage further away; each round's moves
//             planned at once.
//
// balanced and joint pass over a candidate split the configured schedule cannot run (a
// one-layer stage under --schedule interleaved); where none suits it, the planner says why.
//
// The result goes to PlanConfig::stage_layers, which the cost model, the stage models and
// the plan file read; a split equal to the uniform one is returned empty, so plans of
// uniform splits stay what they were.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dynapipe/core/sample.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/plan/execution_plan.h"

namespace dynapipe {

enum class LayerPartition { Uniform, Balanced, Joint };

std::optional<LayerPartition> parse_layer_partition(std::string_view name);
std::string_view layer_partition_name(LayerPartition partition);
std::vector<std::string> layer_partition_names();

struct LayerPartitionOptions {
  int joint_batches = 4;  // balanced, joint: global batches (from the first) each split is planned on
  int joint_max_rounds = 64;  // joint: local-search rounds at most
  // balanced, joint: threads planning the candidate splits (a joint round's moves) at once
  // (0: one per hardware thread); the split chosen is the same for any count.
  int threads = 1;
  // balanced, joint: called after each split is planned, from the thread that planned it
  // (progress; must be thread-safe). Empty: none.
  std::function<void()> split_planned;
};

// The stage layers for `config` (its stage_layers ignored); empty means uniform. `batches`
// is read by balanced and joint (the first options.joint_batches of them). Throws what the
// planner throws for the config (InvalidArgument, Infeasible when no candidate split fits
// memory).
std::vector<StageLayers> choose_stage_layers(const PlanConfig& config, LayerPartition partition,
                                             const std::vector<GlobalBatch>& batches,
                                             const LayerPartitionOptions& options = {});

}  // namespace dynapipe
