// JSON form of a PipeDream partition (docs/partition.md).
#include <nlohmann/json.hpp>

#include "dynapipe/partition/pipedream_partition.h"

namespace dynapipe {

std::string pipedream_partition_json(const PipeDreamPartition& partition, bool summary) {
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const PipeDreamStage& stage : partition.stages) {
    nlohmann::ordered_json s;
    s["replicas"] = stage.replicas;
    s["states"] = {stage.first_state, stage.end_state};
    s["num_nodes"] = stage.nodes.size();
    if (!summary) {
      s["replicas_per_level"] = stage.replicas_per_level;
      s["nodes"] = stage.nodes;
      s["compute_s"] = stage.compute_s;
      s["parameter_bytes"] = stage.parameter_bytes;
      s["activation_bytes"] = stage.activation_bytes;
      s["compute_per_input_s"] = stage.compute_per_input_s;
      s["allreduce_per_input_s"] = stage.allreduce_per_input_s;
      s["transfer_per_input_s"] = stage.transfer_per_input_s;
    }
    stages.push_back(std::move(s));
  }
  nlohmann::ordered_json out;
  out["time_per_stage"] = partition.time_per_stage_s;
  out["stages"] = std::move(stages);
  if (!summary) {
    out["single_worker_s"] = partition.single_worker_s;
    out["data_parallel_s"] = partition.data_parallel_s;
    out["speedup_over_data_parallel"] = partition.speedup_over_data_parallel();
    out["speedup_over_single_worker"] = partition.speedup_over_single_worker();
    out["num_states"] = partition.num_states;
    out["stage_of_node"] = partition.stage_of_node;
  }
  return out.dump(summary ? -1 : 2);
}

}  // namespace dynapipe
