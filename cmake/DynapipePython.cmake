# Finds Python 3 and pybind11 for python/ (docs/python.md). Without either, python/ is
# skipped with a message and the rest builds as before.
#
# Debian's /usr/bin/python3 is the interpreter that sees python3-pybind11 and
# python3-torch; a python3 earlier on PATH (pyenv, venv) usually does not, so it is the
# default when present. Override with -DPython3_EXECUTABLE=...
if(NOT DYNAPIPE_BUILD_PYTHON)
  return()
endif()
if(DYNAPIPE_SANITIZE)
  # A sanitized extension does not load into an uninstrumented interpreter.
  message(STATUS "dynapipe: Python module not built with DYNAPIPE_SANITIZE")
  return()
endif()
if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python interpreter of the dynapipe module")
endif()
find_package(Python3 COMPONENTS Interpreter Development.Module)
if(Python3_FOUND)
  find_package(pybind11 2.6 CONFIG QUIET)
endif()
if(NOT Python3_FOUND OR NOT pybind11_FOUND)
  message(STATUS "dynapipe: Python module not built (needs Python 3 headers and pybind11)")
  return()
endif()
set(DYNAPIPE_PYTHON_INSTALL_DIR
    "lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages"
    CACHE STRING "Install directory of the dynapipe package, relative to the install prefix")
message(STATUS "dynapipe: Python module for ${Python3_EXECUTABLE} (pybind11 ${pybind11_VERSION})")
add_subdirectory(python)
