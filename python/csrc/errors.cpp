// Maps fourd's C++ exceptions to the Python classes defined in fourd/errors.py. The classes are
// handed over once at import (set_error_classes) so they can subclass ValueError, TypeError and
// TimeoutError in plain Python.
#include <pybind11/pybind11.h>

#include <exception>
#include <map>
#include <new>
#include <string>

#include "bindings.hpp"
#include "fourd/error.hpp"

namespace py = pybind11;

namespace fourd_py {

namespace {
// Leaked on purpose: they must outlive the interpreter's module teardown.
std::map<std::string, py::object>* gClasses = new std::map<std::string, py::object>();

void raise(const char* key, const char* what) {
  auto it = gClasses->find(key);
  if (it == gClasses->end()) it = gClasses->find("Error");
  if (it == gClasses->end()) {
    PyErr_SetString(PyExc_RuntimeError, what);
    return;
  }
  PyErr_SetString(it->second.ptr(), what);
}
}  // namespace

bool setFourdError(std::exception_ptr p) {
  if (!p) return false;
  try {
    std::rethrow_exception(p);
  } catch (const fourd::InvalidArgument& e) {
    raise("InvalidArgument", e.what());
  } catch (const fourd::TypeMismatch& e) {
    raise("TypeMismatch", e.what());
  } catch (const fourd::TimeoutError& e) {
    raise("TimeoutError", e.what());
  } catch (const fourd::AbortedError& e) {
    raise("AbortedError", e.what());
  } catch (const fourd::MismatchError& e) {
    raise("MismatchError", e.what());
  } catch (const fourd::BackendError& e) {
    raise("BackendError", e.what());
  } catch (const fourd::Error& e) {
    raise("Error", e.what());
  } catch (...) {
    return false;
  }
  return true;
}

void setPythonError(std::exception_ptr p) {
  if (setFourdError(p)) return;
  try {
    std::rethrow_exception(p);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "fourd: an unknown C++ exception");
  }
}

void register_errors(py::module_& m) {
  m.def("set_error_classes", [](py::dict d) {
    for (auto item : d)
      (*gClasses)[py::str(item.first)] = py::reinterpret_borrow<py::object>(item.second);
  });
  py::register_exception_translator([](std::exception_ptr p) { setFourdError(p); });
}

}  // namespace fourd_py
