// JSON codec of ExecutionPlan / IterationPlan / PlanSummary (docs/plan-format.md).
//
// Writers emit keys in the documented order (nlohmann::ordered_json) and doubles in
// nlohmann's shortest round-trip form. Readers walk the document with the JSON path of
// every value at hand, so each error names it; keys they do not know are ignored.
#include "dynapipe/plan/plan_json.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "dynapipe/core/error.h"
#include "dynapipe/core/json_reader.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

using Json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------- writing

double finite(double value, const char* field) {
  if (!std::isfinite(value)) {
    throw Error(ErrorKind::InvalidArgument,
                cat("plan JSON: ", field, " must be a finite number, got ", value));
  }
  return value;
}

Json doubles(const std::vector<double>& values, const char* field) {
  Json out = Json::array();
  for (double v : values) out.push_back(finite(v, field));
  return out;
}

Json model_to_json(const ModelSpec& m) {
  Json j;
  j["name"] = m.name;
  j["kind"] = model_kind_name(m.kind);
  j["hidden"] = m.hidden;
  j["heads"] = m.heads;
  j["kv_channels"] = m.kv_channels;
  j["ffn_hidden"] = m.ffn_hidden;
  j["layers"] = m.layers;
  j["dec_layers"] = m.dec_layers;
  j["vocab"] = m.vocab;
  j["max_positions"] = m.max_positions;
  return j;
}

Json config_to_json(const PlanConfig& c) {
  Json j;
  j["model"] = model_to_json(c.model);
  j["samples_path"] = c.samples_path;
  j["strategy"] = strategy_name(c.strategy);
  j["schedule"] = schedule_kind_name(c.schedule);
  j["cost_model"] = c.cost_model;
  if (c.tp != 1) j["tp"] = c.tp;  // absent = 1 (plans from before tensor parallelism)
  j["pp"] = c.pp;
  j["dp"] = c.dp;
  j["zero"] = c.zero;
  j["chunks"] = c.chunks;
  j["max_seqlen"] = c.max_seqlen;
  j["max_target_len"] = c.max_target_len;
  j["global_batch_tokens"] = c.global_batch_tokens;
  j["memory_limit_gib"] = finite(c.memory_limit_gib, "config.memory_limit_gib");
  j["seqlen_multiple"] = c.seqlen_multiple;
  j["seed"] = c.seed;
  j["iterations"] = c.iterations;
  if (c.micro_batch_size != 0) j["micro_batch_size"] = c.micro_batch_size;
  if (c.token_budget != 0) j["token_budget"] = c.token_budget;
  if (c.recompute) j["recompute"] = recompute_name(*c.recompute);
  if (c.vertical_sync) j["vertical_sync"] = 1;
  if (c.mixed_recompute) j["mixed_recompute"] = 1;
  if (!c.stage_layers.empty()) j["layers_per_stage"] = layers_per_stage(c.stage_layers);
  if (!c.stage_replicas.empty()) j["stage_replicas"] = c.stage_replicas;  // absent = 1 each
  return j;
}

Json instruction_to_json(const Instruction& in) {
  Json j;
  j["op"] = instruction_op_name(in.op);
  if (in.mb >= 0) j["mb"] = in.mb;
  if (in.stage >= 0) j["stage"] = in.stage;
  if (in.peer >= 0) j["peer"] = in.peer;
  if (!in.shape.empty()) j["shape"] = in.shape;
  if (in.buffer >= 0) j["buffer"] = in.buffer;
  if (!in.inputs.empty()) j["inputs"] = in.inputs;
  if (in.version >= 0) j["version"] = in.version;
  return j;
}

Json microbatch_to_json(const MicroBatch& mb, const MicroBatchEstimate* estimate, ModelKind model) {
  Json j;
  j["id"] = mb.id;
  j["sample_ids"] = mb.sample_ids;
  if (!mb.rows.empty()) j["rows"] = mb.rows;
  Json shape;
  shape["batch"] = mb.shape.batch;
  if (model == ModelKind::Gpt) {
    shape["seqlen"] = mb.shape.seqlen;
  } else {
    shape["enc_seqlen"] = mb.shape.seqlen;
    shape["dec_seqlen"] = mb.shape.dec_seqlen;
  }
  j["shape"] = shape;
  if (!(mb.density == AttentionDensity{})) {
    j["density"] = {{"enc", finite(mb.density.enc, "density.enc")},
                    {"dec", finite(mb.density.dec, "density.dec")}};
  }
  j["real_tokens"] = mb.real_tokens;
  j["target_tokens"] = mb.target_tokens;
  if (mb.recompute) j["recompute"] = recompute_name(*mb.recompute);
  if (estimate != nullptr) {
    j["est_fwd_ms"] = doubles(estimate->fwd_ms, "est_fwd_ms");
    j["est_bwd_ms"] = doubles(estimate->bwd_ms, "est_bwd_ms");
    j["est_activation_bytes"] = estimate->activation_bytes;
  }
  return j;
}

Json replica_to_json(const ReplicaPlan& r, ModelKind model) {
  if (!r.estimates.empty() && r.estimates.size() != r.microbatches.size()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("plan JSON: replica estimates must be empty or one per micro-batch (",
                    r.microbatches.size(), "), got ", r.estimates.size()));
  }
  Json j;
  Json mbs = Json::array();
  for (std::size_t i = 0; i < r.microbatches.size(); ++i) {
    mbs.push_back(microbatch_to_json(r.microbatches[i], r.estimates.empty() ? nullptr : &r.estimates[i], model));
  }
  j["microbatches"] = std::move(mbs);
  j["schedule"] = schedule_kind_name(r.schedule);
  j["recompute"] = recompute_name(r.recompute);
  j["est_iteration_ms"] = finite(r.est_iteration_ms, "est_iteration_ms");
  j["est_peak_memory_bytes"] = r.est_peak_memory_bytes;
  Json timeline = Json::array();
  for (const TimedOp& t : r.timeline) {
    Json op;
    op["stage"] = t.op.stage;
    op["op"] = std::string(1, op_kind_letter(t.op.kind));
    op["mb"] = t.op.mb;
    op["start_ms"] = finite(t.start_ms, "timeline start_ms");
    op["end_ms"] = finite(t.end_ms, "timeline end_ms");
    op["device"] = t.device;
    timeline.push_back(std::move(op));
  }
  j["timeline"] = std::move(timeline);
  Json executors = Json::array();
  for (const ExecutorProgram& p : r.executors) {
    Json e;
    e["rank"] = p.rank;
    e["stage"] = p.device;
    e["replica"] = p.replica;
    if (p.stage_replica != 0) e["stage_replica"] = p.stage_replica;  // absent = 0
    Json instructions = Json::array();
    for (const Instruction& in : p.instructions) instructions.push_back(instruction_to_json(in));
    e["instructions"] = std::move(instructions);
    executors.push_back(std::move(e));
  }
  j["executors"] = std::move(executors);
  return j;
}

Json iteration_to_json_value(const IterationPlan& it, ModelKind model) {
  Json j;
  j["index"] = it.index;
  j["sample_ids"] = it.sample_ids;
  j["truncated_ids"] = it.truncated_ids;
  Json replicas = Json::array();
  for (const ReplicaPlan& r : it.replicas) replicas.push_back(replica_to_json(r, model));
  j["replicas"] = std::move(replicas);
  j["est_iteration_ms"] = finite(it.est_iteration_ms, "est_iteration_ms");
  j["padding_efficiency"] = finite(it.padding_efficiency, "padding_efficiency");
  j["planning_ms"] = finite(it.planning_ms, "planning_ms");
  return j;
}

Json summary_to_json_value(const PlanSummary& s) {
  Json j;
  j["iterations"] = s.iterations;
  j["mean_est_iteration_ms"] = finite(s.mean_est_iteration_ms, "summary.mean_est_iteration_ms");
  j["est_tokens_per_s"] = finite(s.est_tokens_per_s, "summary.est_tokens_per_s");
  j["padding_efficiency"] = finite(s.padding_efficiency, "summary.padding_efficiency");
  j["mean_planning_ms"] = finite(s.mean_planning_ms, "summary.mean_planning_ms");
  j["p99_planning_ms"] = finite(s.p99_planning_ms, "summary.p99_planning_ms");
  return j;
}

std::string dump(const Json& j, int indent) {
  return j.dump(indent < 0 ? -1 : indent, ' ', /*ensure_ascii=*/false,
                Json::error_handler_t::replace);
}

// ---------------------------------------------------------------------------- reading

ModelSpec model_from(const JsonValue& n) {
  ModelSpec m;
  m.name = n["name"].string();
  const std::optional<ModelKind> kind = parse_model_kind(n["kind"].string());
  if (!kind) n["kind"].fail("\"gpt\" or \"t5\"");
  m.kind = *kind;
  m.hidden = n["hidden"].int32();
  m.heads = n["heads"].int32();
  m.kv_channels = n["kv_channels"].int32();
  m.ffn_hidden = n["ffn_hidden"].int32();
  m.layers = n["layers"].int32();
  m.dec_layers = n["dec_layers"].int32();
  m.vocab = n["vocab"].int32();
  m.max_positions = n["max_positions"].int32();
  return m;
}

std::string quoted_list(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view name : names) out += cat(out.empty() ? "" : ", ", "\"", name, "\"");
  return cat("one of ", out);
}

Strategy strategy_from(const JsonValue& n) {
  const std::optional<Strategy> strategy = parse_strategy(n.string());
  if (!strategy) n.fail(quoted_list(strategy_names()));
  return *strategy;
}

ScheduleKind schedule_from(const JsonValue& n, bool allow_auto) {
  std::vector<std::string_view> names = schedule_kind_names();
  if (!allow_auto) names.erase(names.begin());
  const std::optional<ScheduleKind> kind = parse_schedule_kind(n.string());
  if (!kind || (!allow_auto && *kind == ScheduleKind::Auto)) n.fail(quoted_list(names));
  return *kind;
}

PlanConfig config_from(const JsonValue& n) {
  PlanConfig c;
  c.model = model_from(n["model"]);
  c.samples_path = n["samples_path"].string();
  c.strategy = strategy_from(n["strategy"]);
  c.schedule = schedule_from(n["schedule"], /*allow_auto=*/true);
  c.cost_model = n["cost_model"].string();
  if (n.has("tp")) c.tp = n["tp"].int32(1);
  c.pp = n["pp"].int32(1);
  c.dp = n["dp"].int32(1);
  c.zero = n.has("zero") ? n["zero"].int32(0, 1) : 0;  // added after format v1: optional
  c.chunks = n["chunks"].int32(1);
  c.max_seqlen = n["max_seqlen"].integer(0);
  c.max_target_len = n["max_target_len"].integer(0);
  c.global_batch_tokens = n["global_batch_tokens"].integer(0);
  c.memory_limit_gib = n["memory_limit_gib"].number();
  c.seqlen_multiple = n["seqlen_multiple"].int32(1);
  c.seed = n["seed"].uint64();
  c.iterations = n["iterations"].integer(0);
  if (n.has("micro_batch_size")) c.micro_batch_size = n["micro_batch_size"].integer(0);
  if (n.has("token_budget")) c.token_budget = n["token_budget"].integer(1);
  if (n.has("vertical_sync")) c.vertical_sync = n["vertical_sync"].int32(0, 1) == 1;
  if (n.has("mixed_recompute")) c.mixed_recompute = n["mixed_recompute"].int32(0, 1) == 1;
  if (n.has("recompute")) {
    const JsonValue recompute = n["recompute"];
    const auto mode = parse_recompute(recompute.string());
    if (!mode) recompute.fail("one of \"none\", \"selective\", \"full\"");
    c.recompute = *mode;
  }
  if (n.has("layers_per_stage")) {
    const JsonValue counts = n["layers_per_stage"];
    std::vector<int> per_stage;
    for (std::int64_t count : counts.integers(1)) per_stage.push_back(static_cast<int>(count));
    if (static_cast<int>(per_stage.size()) != c.pp) counts.fail(cat("pp (", c.pp, ") layer counts"));
    try {
      c.stage_layers = assign_layers(c.model, per_stage);
    } catch (const Error&) {
      counts.fail(cat("layer counts summing to the model's ", c.model.total_layers(), " layers"));
    }
  }
  if (n.has("stage_replicas")) {
    const JsonValue replicas = n["stage_replicas"];
    for (std::int64_t r : replicas.integers(1)) c.stage_replicas.push_back(static_cast<int>(r));
    if (static_cast<int>(c.stage_replicas.size()) != c.pp)
      replicas.fail(cat("pp (", c.pp, ") replications"));
  }
  return c;
}

Instruction instruction_from(const JsonValue& n) {
  n.expect_object();
  Instruction in;
  JsonValue op = n["op"];
  std::string name = op.string();
  auto parsed = parse_instruction_op(name);
  if (!parsed) op.fail("an instruction op (LoadInput, Forward, Backward, ..., OptimizerStep)");
  in.op = *parsed;
  if (n.has("mb")) in.mb = n["mb"].int32();
  if (n.has("stage")) in.stage = n["stage"].int32();
  if (n.has("peer")) in.peer = n["peer"].int32();
  if (n.has("shape")) in.shape = n["shape"].integers(1);
  if (n.has("buffer")) in.buffer = n["buffer"].int32();
  if (n.has("inputs")) in.inputs = n["inputs"].list<int>([](const JsonValue& x) { return x.int32(); });
  if (n.has("version")) in.version = n["version"].int32(0);  // added after format v1: optional
  return in;
}

OpKind op_kind_from(const JsonValue& n) {
  std::string s = n.string();
  if (s == "F") return OpKind::F;
  if (s == "B") return OpKind::B;
  if (s == "I") return OpKind::I;
  if (s == "W") return OpKind::W;
  n.fail("one of \"F\", \"B\", \"I\", \"W\"");
}

ReplicaPlan replica_from(const JsonValue& n, ModelKind model) {
  n.expect_object();
  ReplicaPlan r;
  JsonValue mbs = n["microbatches"];
  std::size_t count = mbs.size();
  bool with_estimates = count > 0 && mbs[std::size_t{0}].has("est_fwd_ms");
  for (std::size_t i = 0; i < count; ++i) {
    JsonValue m = mbs[i];
    m.expect_object();
    MicroBatch mb;
    mb.id = m["id"].int32(static_cast<int>(i), static_cast<int>(i));
    mb.sample_ids = m["sample_ids"].integers();
    if (m.has("rows")) mb.rows = m["rows"].list<std::vector<SampleId>>([](const JsonValue& row) { return row.integers(); });
    JsonValue shape = m["shape"];
    mb.shape.batch = shape["batch"].integer(1);
    if (model == ModelKind::Gpt) {
      mb.shape.seqlen = shape["seqlen"].integer(1);
    } else {
      mb.shape.seqlen = shape["enc_seqlen"].integer(1);
      mb.shape.dec_seqlen = shape["dec_seqlen"].integer(1);
    }
    if (m.has("density")) {
      mb.density.enc = m["density"]["enc"].number();
      mb.density.dec = m["density"]["dec"].number();
    }
    mb.real_tokens = m["real_tokens"].integer(0);
    mb.target_tokens = m["target_tokens"].integer(0);
    if (m.has("recompute")) {
      const JsonValue recompute = m["recompute"];
      const auto mode = parse_recompute(recompute.string());
      if (!mode) recompute.fail("one of \"none\", \"selective\", \"full\"");
      mb.recompute = *mode;
    }
    if (m.has("est_fwd_ms") != with_estimates) {
      m.fail_field("est_fwd_ms", "present on every micro-batch or on none");
    }
    if (with_estimates) {
      MicroBatchEstimate e;
      e.fwd_ms = m["est_fwd_ms"].numbers();
      e.bwd_ms = m["est_bwd_ms"].numbers();
      e.activation_bytes = m["est_activation_bytes"].integers(0);
      r.estimates.push_back(std::move(e));
    }
    r.microbatches.push_back(std::move(mb));
  }
  r.schedule = schedule_from(n["schedule"], /*allow_auto=*/false);
  JsonValue recompute = n["recompute"];
  auto mode = parse_recompute(recompute.string());
  if (!mode) recompute.fail("one of \"none\", \"selective\", \"full\"");
  r.recompute = *mode;
  r.est_iteration_ms = n["est_iteration_ms"].number();
  r.est_peak_memory_bytes = n["est_peak_memory_bytes"].integers(0);
  r.timeline = n["timeline"].list<TimedOp>([](const JsonValue& t) {
    t.expect_object();
    TimedOp op;
    op.op.stage = t["stage"].int32();
    op.op.kind = op_kind_from(t["op"]);
    op.op.mb = t["mb"].int32();
    op.start_ms = t["start_ms"].number();
    op.end_ms = t["end_ms"].number();
    op.device = t.has("device") ? t["device"].int32() : 0;
    return op;
  });
  r.executors = n["executors"].list<ExecutorProgram>([](const JsonValue& e) {
    e.expect_object();
    ExecutorProgram p;
    p.rank = e["rank"].int32();
    p.device = e["stage"].int32();
    p.replica = e.has("replica") ? e["replica"].int32() : 0;
    p.stage_replica = e.has("stage_replica") ? e["stage_replica"].int32(0) : 0;
    p.instructions = e["instructions"].list<Instruction>(instruction_from);
    return p;
  });
  return r;
}

IterationPlan iteration_from(const JsonValue& n, ModelKind model) {
  n.expect_object();
  IterationPlan it;
  it.index = n["index"].integer(0);
  it.sample_ids = n["sample_ids"].integers();
  it.truncated_ids = n["truncated_ids"].integers();
  it.replicas = n["replicas"].list<ReplicaPlan>([model](const JsonValue& r) { return replica_from(r, model); });
  it.est_iteration_ms = n["est_iteration_ms"].number();
  it.padding_efficiency = n["padding_efficiency"].number();
  it.planning_ms = n["planning_ms"].number();
  return it;
}

PlanSummary summary_from(const JsonValue& n) {
  n.expect_object();
  PlanSummary s;
  s.iterations = n["iterations"].integer(0);
  s.mean_est_iteration_ms = n["mean_est_iteration_ms"].number();
  s.est_tokens_per_s = n["est_tokens_per_s"].number();
  s.padding_efficiency = n["padding_efficiency"].number();
  s.mean_planning_ms = n["mean_planning_ms"].number();
  s.p99_planning_ms = n["p99_planning_ms"].number();
  return s;
}

}  // namespace

std::string plan_to_json(const ExecutionPlan& plan, int indent) {
  Json j;
  j["format"] = "dynapipe-plan";
  j["version"] = kPlanFormatVersion;
  j["config"] = config_to_json(plan.config);
  Json iterations = Json::array();
  for (const IterationPlan& it : plan.iterations) iterations.push_back(iteration_to_json_value(it, plan.config.model.kind));
  j["iterations"] = std::move(iterations);
  j["summary"] = summary_to_json_value(plan.summary);
  return dump(j, indent);
}

ExecutionPlan plan_from_json(const std::string& text, const std::string& where) {
  const JsonDocument document(text, where);
  const JsonValue root = document.root();
  root.expect_object();
  if (root["format"].string() != "dynapipe-plan") root["format"].fail("\"dynapipe-plan\"");
  root["version"].integer(kPlanFormatVersion, kPlanFormatVersion);
  ExecutionPlan plan;
  plan.config = config_from(root["config"]);
  ModelKind model = plan.config.model.kind;
  plan.iterations = root["iterations"].list<IterationPlan>([model](const JsonValue& n) { return iteration_from(n, model); });
  plan.summary = summary_from(root["summary"]);
  return plan;
}

std::string iteration_to_json(const IterationPlan& iteration, ModelKind model, int indent) {
  return dump(iteration_to_json_value(iteration, model), indent);
}

IterationPlan iteration_from_json(const std::string& text, ModelKind model, const std::string& where) {
  const JsonDocument document(text, where);
  return iteration_from(document.root(), model);
}

std::string summary_to_json(const PlanSummary& summary, int indent) {
  return dump(summary_to_json_value(summary), indent);
}

PlanSummary summary_from_json(const std::string& text, const std::string& where) {
  const JsonDocument document(text, where);
  return summary_from(document.root());
}

}  // namespace dynapipe
