// Keyword arguments <-> PlanOptions (the CLI's option table).
#pragma once

#include "bindings.h"
#include "dynapipe/planner/plan_options.h"

namespace dynapipe::python {

// Throws InvalidType for an unknown keyword or a value of the wrong type; ranges are
// checked later by to_plan_config(), with the CLI's message.
PlanOptions options_from_kwargs(const py::kwargs& kwargs);
py::dict options_to_dict(const PlanOptions& options);

}  // namespace dynapipe::python
