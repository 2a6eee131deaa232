// Shared declarations of the binding sources: module.cpp calls one register_<area>() per file.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include "fourd/topology.hpp"

namespace fourd_py {

void register_errors(pybind11::module_& m);
/// Sets the Python error of a C++ exception as the registered translators do (errors.cpp):
/// fourd's classes, then pybind11's error_already_set restored, std::bad_alloc as MemoryError,
/// anything else as RuntimeError. For code that does not go through pybind11's dispatch.
void setPythonError(std::exception_ptr p);
void register_vocabulary(pybind11::module_& m);  // vocabulary.cpp: names, ProcessGrid, Topology
void register_grid(pybind11::module_& m);
void register_compression(pybind11::module_& m);  // compression.cpp: codecs and policies
void register_cuda(pybind11::module_& m);         // cuda.cpp: adds nothing without FOURD_HAVE_CUDA

/// Runs `f` with the GIL released and takes it back; an exception of `f` is rethrown with the GIL
/// held. Use this, not pybind11::gil_scoped_release: at interpreter exit a daemon thread that
/// takes the GIL back is ended by pthread_exit, whose forced unwind must leave through ordinary
/// frames. From gil_scoped_release's destructor (noexcept) it calls std::terminate and the whole
/// process aborts ("terminate called without an active exception"); from here it ends the
/// thread, as it ends any other daemon thread.
template <class F>
auto withoutGil(F&& f) -> decltype(f()) {
  using R = decltype(f());
  std::exception_ptr err;
  PyThreadState* const state = PyEval_SaveThread();
  if constexpr (std::is_void_v<R>) {
    try {
      std::forward<F>(f)();
    } catch (...) {
      err = std::current_exception();
    }
    PyEval_RestoreThread(state);
    if (err) std::rethrow_exception(err);
  } else {
    std::optional<R> result;
    try {
      result.emplace(std::forward<F>(f)());
    } catch (...) {
      err = std::current_exception();
    }
    PyEval_RestoreThread(state);
    if (err) std::rethrow_exception(err);
    return std::move(*result);
  }
}

/// A GroupTopology as a dict (size, num_nodes, k, uniform, node_index, local_index, ...).
pybind11::dict topologyDict(const fourd::GroupTopology& t);

}  // namespace fourd_py

// Defined in cost_model.cpp (global namespace).
void register_cost_model(pybind11::module_& m);
