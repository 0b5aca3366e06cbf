// Interim wire format: JSON of the fields the runtime reads.
// TODO(#plan-binary): replace both bodies by plan/plan_binary.h's encode_iteration() /
// decode_iteration() once plan/ lands; decode_plan keeps its error wrapping.
#include "runtime/exec/plan_codec.h"

#include <nlohmann/json.hpp>

#include "dynapipe/core/error.h"

namespace dynapipe::runtime {

namespace {
using nlohmann::json;

json to_json(const MicroBatch& mb) {
  return {{"id", mb.id}, {"sample_ids", mb.sample_ids}, {"rows", mb.rows},
          {"shape", {mb.shape.batch, mb.shape.seqlen, mb.shape.dec_seqlen}},
          {"density", {mb.density.enc, mb.density.dec}},
          {"real_tokens", mb.real_tokens}, {"target_tokens", mb.target_tokens}};
}
MicroBatch microbatch_from(const json& j) {
  MicroBatch mb;
  mb.id = j.at("id").get<int>();
  mb.sample_ids = j.at("sample_ids").get<std::vector<SampleId>>();
  mb.rows = j.at("rows").get<std::vector<std::vector<SampleId>>>();
  auto shape = j.at("shape").get<std::vector<std::int64_t>>();
  if (shape.size() != 3) throw std::invalid_argument("micro-batch shape must have 3 fields");
  mb.shape = {shape[0], shape[1], shape[2]};
  auto density = j.at("density").get<std::vector<double>>();
  if (density.size() != 2) throw std::invalid_argument("density must have 2 fields");
  mb.density = {density[0], density[1]};
  mb.real_tokens = j.at("real_tokens").get<std::int64_t>();
  mb.target_tokens = j.at("target_tokens").get<std::int64_t>();
  return mb;
}
json to_json(const ExecutorProgram& p) {
  json instructions = json::array();
  for (const auto& in : p.instructions)
    instructions.push_back({static_cast<int>(in.op), in.mb, in.stage, in.peer, in.shape, in.buffer});
  return {{"rank", p.rank}, {"device", p.device}, {"replica", p.replica}, {"instructions", instructions}};
}
ExecutorProgram program_from(const json& j) {
  ExecutorProgram p;
  p.rank = j.at("rank").get<int>();
  p.device = j.at("device").get<int>();
  p.replica = j.at("replica").get<int>();
  for (const auto& i : j.at("instructions")) {
    Instruction in;
    int op = i.at(0).get<int>();
    if (op < 0 || op >= kNumInstructionOps) throw std::invalid_argument(cat("bad op ", op));
    in.op = static_cast<InstructionOp>(op);
    in.mb = i.at(1).get<int>();
    in.stage = i.at(2).get<int>();
    in.peer = i.at(3).get<int>();
    in.shape = i.at(4).get<std::vector<std::int64_t>>();
    in.buffer = i.at(5).get<int>();
    p.instructions.push_back(std::move(in));
  }
  return p;
}
}  // namespace

std::string encode_plan(const IterationPlan& plan) {
  json replicas = json::array();
  for (const auto& r : plan.replicas) {
    json mbs = json::array(), executors = json::array();
    for (const auto& mb : r.microbatches) mbs.push_back(to_json(mb));
    for (const auto& p : r.executors) executors.push_back(to_json(p));
    replicas.push_back({{"microbatches", mbs}, {"executors", executors}, {"schedule", r.schedule},
                        {"recompute", static_cast<int>(r.recompute)},
                        {"est_iteration_ms", r.est_iteration_ms},
                        {"est_peak_memory_bytes", r.est_peak_memory_bytes}});
  }
  json j = {{"index", plan.index}, {"sample_ids", plan.sample_ids},
            {"truncated_ids", plan.truncated_ids}, {"replicas", replicas},
            {"est_iteration_ms", plan.est_iteration_ms},
            {"padding_efficiency", plan.padding_efficiency}, {"planning_ms", plan.planning_ms}};
  return j.dump();
}

IterationPlan decode_plan(std::string_view bytes, std::int64_t iteration, int rank) {
  IterationPlan plan;
  try {
    auto j = json::parse(bytes);
    plan.index = j.at("index").get<std::int64_t>();
    plan.sample_ids = j.at("sample_ids").get<std::vector<SampleId>>();
    plan.truncated_ids = j.at("truncated_ids").get<std::vector<SampleId>>();
    plan.est_iteration_ms = j.at("est_iteration_ms").get<double>();
    plan.padding_efficiency = j.at("padding_efficiency").get<double>();
    plan.planning_ms = j.at("planning_ms").get<double>();
    for (const auto& r : j.at("replicas")) {
      ReplicaPlan replica;
      for (const auto& mb : r.at("microbatches")) replica.microbatches.push_back(microbatch_from(mb));
      for (const auto& p : r.at("executors")) replica.executors.push_back(program_from(p));
      replica.schedule = r.at("schedule").get<std::string>();
      int recompute = r.at("recompute").get<int>();
      if (recompute < 0 || recompute > 2) throw std::invalid_argument("bad recompute");
      replica.recompute = static_cast<Recompute>(recompute);
      replica.est_iteration_ms = r.at("est_iteration_ms").get<double>();
      replica.est_peak_memory_bytes = r.at("est_peak_memory_bytes").get<std::vector<std::int64_t>>();
      plan.replicas.push_back(std::move(replica));
    }
  } catch (const Error& e) {
    throw Error(ErrorKind::ParseError, cat("plan store: iteration ", iteration, ", rank ", rank, ": ", e.what()));
  } catch (const std::exception& e) {
    throw Error(ErrorKind::ParseError,
                cat("plan store: iteration ", iteration, ", rank ", rank, ": plan does not decode: ", e.what()));
  }
  if (plan.index != iteration)
    throw Error(ErrorKind::ParseError, cat("plan store: iteration ", iteration, ", rank ", rank,
                                           ": plan index must be ", iteration, ", got ", plan.index));
  return plan;
}

}  // namespace dynapipe::runtime
