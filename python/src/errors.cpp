// dynapipe.Error and one subclass per ErrorKind, with the C++ message unchanged.
// Kinds that are bad input are also ValueErrors; a wrong argument type is InvalidType
// (an InvalidArgument that is also a TypeError).
#include <array>

#include "bindings.h"

namespace dynapipe::python {
namespace {

constexpr int kNumKinds = static_cast<int>(ErrorKind::Internal) + 1;

struct ErrorClasses {
  PyObject* base = nullptr;
  std::array<PyObject*, kNumKinds> by_kind{};
  PyObject* invalid_type = nullptr;
};

ErrorClasses& classes() {
  static ErrorClasses c;  // the references live as long as the module (never freed)
  return c;
}

PyObject* new_class(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string qualified = std::string("dynapipe.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;
}

}  // namespace

void bind_errors(py::module_& m) {
  ErrorClasses& c = classes();
  py::handle exception = PyExc_Exception;
  py::handle value_error = PyExc_ValueError;
  c.base = new_class(m, "Error", "Base of every error dynapipe raises; str() is the message.",
                     py::make_tuple(exception));
  py::handle base = c.base;
  struct Kind {
    ErrorKind kind;
    const char* name;
    const char* doc;
    py::handle extra;  // the builtin exception it also is
  };
  const Kind kinds[] = {
      {ErrorKind::InvalidArgument, "InvalidArgument", "An option or value is out of range.",
       value_error},
      {ErrorKind::NotFound, "NotFound", "A named file, preset or key does not exist.",
       value_error},
      {ErrorKind::ParseError, "ParseError", "A file or byte string is malformed.", value_error},
      {ErrorKind::Infeasible, "Infeasible", "Valid inputs, but no plan fits the memory limit.",
       value_error},
      {ErrorKind::Unsupported, "Unsupported", "A valid request this build cannot serve.",
       PyExc_NotImplementedError},
      {ErrorKind::Timeout, "Timeout", "A peer or store did not answer in time.", PyExc_TimeoutError},
      {ErrorKind::PeerFailure, "PeerFailure", "Another executor failed.", PyExc_RuntimeError},
      {ErrorKind::Internal, "Internal", "An invariant broke: a bug in dynapipe.", PyExc_RuntimeError},
  };
  for (const Kind& k : kinds) {
    c.by_kind[static_cast<int>(k.kind)] = new_class(m, k.name, k.doc, py::make_tuple(base, k.extra));
  }
  c.invalid_type = new_class(
      m, "InvalidType", "An argument of the wrong type.",
      py::make_tuple(py::handle(c.by_kind[static_cast<int>(ErrorKind::InvalidArgument)]),
                     py::handle(PyExc_TypeError)));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TypeMismatch& e) {
      PyErr_SetString(classes().invalid_type, e.what());
    } catch (const Error& e) {
      PyErr_SetString(classes().by_kind[static_cast<int>(e.kind())], e.what());
    }
  });
}

}  // namespace dynapipe::python
