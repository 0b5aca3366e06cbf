// The `_dynapipe` extension; `import dynapipe` re-exports it (python/dynapipe/__init__.py).
#include "bindings.h"

PYBIND11_MODULE(_dynapipe, m) {
  using namespace dynapipe::python;
  m.doc() = "DynaPipe planner core: dynamic micro-batching and pipeline planning.";
  m.attr("__version__") = "0.1.0";
  bind_errors(m);
  bind_options(m);
  bind_plan(m);
  bind_planner(m);
}
