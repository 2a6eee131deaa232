// fourd._C: the private extension module. The public surface is fourd/__init__.py.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "fourd/grid.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "fourd native core (private; use the fourd package)";
  fourd_py::register_errors(m);
  fourd_py::register_vocabulary(m);
  fourd_py::register_grid(m);
  fourd_py::register_compression(m);
  register_cost_model(m);
  fourd_py::register_cuda(m);
  m.attr("__version__") = FOURD_VERSION;
#ifdef FOURD_HAVE_CUDA
  m.attr("HAVE_CUDA") = true;
#else
  m.attr("HAVE_CUDA") = false;
#endif
}
