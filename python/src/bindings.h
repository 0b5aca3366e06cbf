// Shared declarations of the `_dynapipe` extension: one bind_*() per source file, and the
// argument conversions every binding uses so that a wrong type or value raises a
// dynapipe.Error naming the argument instead of pybind11's generic TypeError.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dynapipe/core/error.h"

namespace dynapipe::python {

namespace py = pybind11;

// A Python argument of the wrong type: raised as dynapipe.InvalidType (an
// InvalidArgument that is also a TypeError).
class TypeMismatch : public Error {
 public:
  explicit TypeMismatch(const std::string& message) : Error(ErrorKind::InvalidArgument, message) {}
};

void bind_errors(py::module_& m);
void bind_options(py::module_& m);
void bind_plan(py::module_& m);
void bind_planner(py::module_& m);

// Conversions; `what` names the argument in the message ("pp", "input_lens[3]").
std::int64_t to_int(py::handle value, const std::string& what);
double to_double(py::handle value, const std::string& what);
std::string to_str(py::handle value, const std::string& what);
std::string to_path(py::handle value, const std::string& what);  // str or os.PathLike
// A 1-D sequence of integers: any buffer-protocol object (array.array, numpy, memoryview)
// with an integer format, or any iterable of ints (list, tuple, a torch tensor's items).
std::vector<std::int64_t> to_int_vector(py::handle value, const std::string& what);

}  // namespace dynapipe::python
