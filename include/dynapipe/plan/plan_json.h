// JSON codec of the execution plan (docs/plan-format.md; the layout is a user contract,
// docs/plan-format.md "Plan JSON"). JSON is the form for people and files; the wire form of one
// iteration is plan_binary.h.
//
//   std::string text = plan_to_json(plan, /*indent=*/2);
//   ExecutionPlan back = plan_from_json(text, "plan.json");
//
// Output is deterministic (same plan => same bytes): keys in a fixed order, doubles in
// the shortest form that reads back to the same value. Readers ignore keys they do not
// know. Every malformed value throws Error(ParseError) naming `where` and the JSON path:
//   "plan.json: iterations[2].replicas[0].executors[1].instructions[7].op must be an
//    instruction op (LoadInput, Forward, ...), got \"Fwd\""
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "dynapipe/core/model_kind.h"
#include "dynapipe/plan/execution_plan.h"

namespace dynapipe {

inline constexpr int kPlanFormatVersion = 1;

// indent < 0: one line; otherwise pretty-printed with that many spaces. Throws
// InvalidArgument for values JSON cannot carry (non-finite doubles) or inconsistent
// structs (estimates not parallel to micro-batches).
std::string plan_to_json(const ExecutionPlan& plan, int indent = 2);
ExecutionPlan plan_from_json(const std::string& text, const std::string& where);

// One iteration (the "iterations[i]" object). Shapes are spelled per model kind, so the
// kind is given (the full plan takes it from config.model.kind).
std::string iteration_to_json(const IterationPlan& iteration, ModelKind model, int indent = 2);
IterationPlan iteration_from_json(const std::string& text, ModelKind model,
                                  const std::string& where);

// The plan's "summary" object, as `dynapipe plan --summary-json` prints it.
std::string summary_to_json(const PlanSummary& summary, int indent = -1);
PlanSummary summary_from_json(const std::string& text, const std::string& where);

}  // namespace dynapipe
