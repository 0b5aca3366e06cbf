// Python -> C++ argument conversions with dynapipe messages (bindings.h).
#include <cmath>
#include <cstring>

#include "bindings.h"
#include "dynapipe/core/strings.h"

namespace dynapipe::python {
namespace {

std::string type_name(py::handle value) { return Py_TYPE(value.ptr())->tp_name; }

template <typename T>
void append_buffer(const py::buffer_info& info, std::vector<std::int64_t>& out) {
  const auto* base = static_cast<const char*>(info.ptr);
  for (py::ssize_t i = 0; i < info.shape[0]; ++i) {
    T v;
    std::memcpy(&v, base + i * info.strides[0], sizeof(T));
    out.push_back(static_cast<std::int64_t>(v));
  }
}

// Reads an integer buffer; false when the format is not an integer type.
bool read_int_buffer(const py::buffer_info& info, std::vector<std::int64_t>& out,
                     const std::string& what) {
  std::string format = info.format;
  if (!format.empty() && std::strchr("@=<!", format[0]) != nullptr) format.erase(0, 1);
  if (format.size() != 1) return false;
  out.reserve(static_cast<std::size_t>(info.shape[0]));
  const auto size = info.itemsize;
  switch (format[0]) {
    case 'b': append_buffer<std::int8_t>(info, out); return true;
    case 'B': append_buffer<std::uint8_t>(info, out); return true;
    case 'h': append_buffer<std::int16_t>(info, out); return true;
    case 'H': append_buffer<std::uint16_t>(info, out); return true;
    case 'i': case 'l': case 'q': case 'n':
      if (size == 4) append_buffer<std::int32_t>(info, out);
      else if (size == 8) append_buffer<std::int64_t>(info, out);
      else return false;
      return true;
    case 'I': case 'L': case 'Q': case 'N':
      if (size == 4) {
        append_buffer<std::uint32_t>(info, out);
      } else if (size == 8) {
        const auto* base = static_cast<const char*>(info.ptr);
        for (py::ssize_t i = 0; i < info.shape[0]; ++i) {
          std::uint64_t v;
          std::memcpy(&v, base + i * info.strides[0], sizeof(v));
          if (v > static_cast<std::uint64_t>(INT64_MAX)) {
            throw Error(ErrorKind::InvalidArgument,
                        cat(what, "[", i, "] must fit in a 64-bit signed integer, got ", v));
          }
          out.push_back(static_cast<std::int64_t>(v));
        }
      } else {
        return false;
      }
      return true;
    default:
      return false;
  }
}

}  // namespace

std::int64_t to_int(py::handle value, const std::string& what) {
  PyObject* obj = value.ptr();
  if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
    throw TypeMismatch(cat(what, " must be an integer, got ", type_name(value)));
  }
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) {
    throw Error(ErrorKind::InvalidArgument,
                cat(what, " must fit in a 64-bit signed integer, got ", py::str(index).cast<std::string>()));
  }
  return v;
}

double to_double(py::handle value, const std::string& what) {
  PyObject* obj = value.ptr();
  const bool numeric = PyFloat_Check(obj) || PyLong_Check(obj) || PyIndex_Check(obj) ||
                       (Py_TYPE(obj)->tp_as_number != nullptr &&
                        Py_TYPE(obj)->tp_as_number->nb_float != nullptr);
  if (PyBool_Check(obj) || !numeric) {
    throw TypeMismatch(cat(what, " must be a number, got ", type_name(value)));
  }
  const double v = PyFloat_AsDouble(obj);
  if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

std::string to_str(py::handle value, const std::string& what) {
  if (!PyUnicode_Check(value.ptr())) {
    throw TypeMismatch(cat(what, " must be a str, got ", type_name(value)));
  }
  return value.cast<std::string>();
}

std::string to_path(py::handle value, const std::string& what) {
  if (PyUnicode_Check(value.ptr())) return value.cast<std::string>();
  if (PyObject_HasAttrString(value.ptr(), "__fspath__")) {
    py::object path = py::reinterpret_steal<py::object>(PyOS_FSPath(value.ptr()));
    if (path && PyUnicode_Check(path.ptr())) return path.cast<std::string>();
    PyErr_Clear();
  }
  throw TypeMismatch(cat(what, " must be a str or os.PathLike, got ", type_name(value)));
}

std::vector<std::int64_t> to_int_vector(py::handle value, const std::string& what) {
  PyObject* obj = value.ptr();
  std::vector<std::int64_t> out;
  if (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyByteArray_Check(obj)) {
    throw TypeMismatch(cat(what, " must be a sequence of integers, got ", type_name(value)));
  }
  if (PyObject_CheckBuffer(obj)) {
    const py::buffer_info info = py::reinterpret_borrow<py::buffer>(value).request();
    if (info.ndim != 1) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(what, " must be one-dimensional, got ", info.ndim, " dimensions"));
    }
    if (!read_int_buffer(info, out, what)) {
      throw TypeMismatch(cat(what, " must hold integers, got a buffer of format '", info.format, "'"));
    }
    return out;
  }
  // Fast path for exact ints (lists from Python code); the element's name is built only
  // when it is needed for a message, as formatting it costs more than the conversion.
  auto element = [&](PyObject* item, std::size_t i) {
    if (PyLong_CheckExact(item)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
      if (overflow == 0) return static_cast<std::int64_t>(v);
    }
    return to_int(item, cat(what, "[", i, "]"));
  };
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(obj, ""));
    if (!seq) throw py::error_already_set();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    out.reserve(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) out.push_back(element(items[i], static_cast<std::size_t>(i)));
    return out;
  }
  py::object iterator = py::reinterpret_steal<py::object>(PyObject_GetIter(obj));
  if (!iterator) {
    PyErr_Clear();
    throw TypeMismatch(cat(what, " must be a sequence of integers, got ", type_name(value)));
  }
  std::size_t i = 0;
  while (py::object item = py::reinterpret_steal<py::object>(PyIter_Next(iterator.ptr()))) {
    out.push_back(element(item.ptr(), i));
    ++i;
  }
  if (PyErr_Occurred()) throw py::error_already_set();
  return out;
}

}  // namespace dynapipe::python
