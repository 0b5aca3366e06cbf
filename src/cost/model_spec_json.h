// The ModelSpec <-> JSON object mapping shared by model files and profiles. Private to cost/.
#pragma once

#include <string>

#include "dynapipe/core/json_reader.h"
#include "dynapipe/cost/model_spec.h"

namespace dynapipe::detail {

// Reads the fields of a model object (not validated: callers validate after).
ModelSpec model_spec_from_json(const JsonValue& reader, const std::string& default_name);

}  // namespace dynapipe::detail
