// Planner options from Python keyword arguments, through the CLI's option table
// (planner/plan_options.h): same names, defaults, ranges and messages.
#include <pybind11/stl.h>

#include <variant>

#include "bindings.h"
#include "dynapipe/core/strings.h"
#include "options.h"

namespace dynapipe::python {
namespace {

const PlanOptionSpec* find_spec(const std::string& name) {
  for (const PlanOptionSpec& spec : plan_option_table()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

std::vector<std::string> option_names() {
  std::vector<std::string> names;
  for (const PlanOptionSpec& spec : plan_option_table()) names.push_back(spec.name);
  return names;
}

void set_field(PlanOptions& options, std::int64_t PlanOptions::*member, py::handle value,
               const std::string& name) {
  options.*member = to_int(value, name);
}
void set_field(PlanOptions& options, double PlanOptions::*member, py::handle value,
               const std::string& name) {
  options.*member = to_double(value, name);
}
void set_field(PlanOptions& options, std::string PlanOptions::*member, py::handle value,
               const std::string& name) {
  // model and cost_model may name files: accept os.PathLike too.
  options.*member = to_path(value, name);
}
void set_field(PlanOptions& options, std::uint64_t PlanOptions::*member, py::handle value,
               const std::string& name) {
  const std::int64_t v = to_int(value, name);
  if (v < 0) throw Error(ErrorKind::InvalidArgument, cat(name, " must be >= 0, got ", v));
  options.*member = static_cast<std::uint64_t>(v);
}

template <typename T>
py::object field_value(const PlanOptions& options, T PlanOptions::*member) {
  return py::cast(options.*member);
}

}  // namespace

PlanOptions options_from_kwargs(const py::kwargs& kwargs) {
  PlanOptions options;
  for (const auto& [key, value] : kwargs) {
    const std::string name = key.cast<std::string>();
    const PlanOptionSpec* spec = find_spec(name);
    if (spec == nullptr) {
      throw TypeMismatch(cat("unknown option '", name, "': expected one of ",
                             join(option_names(), ", ")));
    }
    std::visit([&](auto member) { set_field(options, member, value, name); }, spec->field);
  }
  return options;
}

py::dict options_to_dict(const PlanOptions& options) {
  py::dict d;
  for (const PlanOptionSpec& spec : plan_option_table()) {
    d[py::str(spec.name)] =
        std::visit([&](auto member) { return field_value(options, member); }, spec.field);
  }
  return d;
}

void bind_options(py::module_& m) {
  m.def(
      "plan_options",
      [] {
        const PlanOptions defaults;
        py::list rows;
        for (const PlanOptionSpec& spec : plan_option_table()) {
          py::dict row;
          row["name"] = spec.name;
          row["flag"] = spec.flag;
          row["help"] = spec.help;
          row["default"] =
              std::visit([&](auto member) { return field_value(defaults, member); }, spec.field);
          const bool numeric = spec.min < spec.max;
          const bool integer = std::holds_alternative<std::int64_t PlanOptions::*>(spec.field);
          auto bound = [&](double v) {
            if (!numeric) return py::object(py::none());
            return integer ? py::cast(static_cast<std::int64_t>(v)) : py::cast(v);
          };
          row["min"] = bound(spec.min);
          row["max"] = bound(spec.max);
          row["choices"] = spec.choices.empty() ? py::object(py::none()) : py::cast(spec.choices);
          rows.append(row);
        }
        return rows;
      },
      "The options of Planner(): one dict per option with name, flag (the CLI's), help,\n"
      "default, min/max (numbers) and choices (strings), in the CLI's order.");
}

}  // namespace dynapipe::python
