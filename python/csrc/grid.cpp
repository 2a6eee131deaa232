// Bindings of Grid, Communicator and Work. Buffers cross as integers (address, element count,
// dtype code, device): the extension never links libtorch, so one build serves every torch.
#include <pthread.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pythread.h>

#include <array>
#include <atomic>
#include <bitset>
#include <utility>
#include <vector>

#include <mpi.h>

#include "bindings.hpp"
#include "fourd/error.hpp"
#include "fourd/grid.hpp"
#include "internal/group.hpp"
#include "internal/mpi_backend.hpp"
#include "internal/op_context.hpp"

namespace py = pybind11;
using fourd::Buffer;
using fourd::CallOptions;
using fourd::Communicator;
using fourd::DataType;
using fourd::DeviceType;
using fourd::Grid;
using fourd::Work;

namespace fourd_py {

namespace {

unsigned long gMainThread = 0;

bool isFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Installed as fourd's interrupt check: on the main thread, run Python's signal handlers; a
// pending KeyboardInterrupt stops the wait (the caller re-raises it).
bool pyInterruptCheck() {
  if (!Py_IsInitialized() || isFinalizing()) return false;
  if (PyThread_get_thread_ident() != gMainThread) return false;
  PyGILState_STATE st = PyGILState_Ensure();
  const int r = PyErr_CheckSignals();
  PyGILState_Release(st);
  return r != 0;
}

// Runs `f` with the GIL released; re-raises a pending Python error (KeyboardInterrupt) first.
template <class F>
auto released(F&& f) -> decltype(f()) {
  std::exception_ptr err;
  decltype(f()) result{};
  withoutGil([&] {
    try {
      result = f();
    } catch (...) {
      err = std::current_exception();
    }
  });
  if (err) {
    if (PyErr_Occurred()) throw py::error_already_set();
    std::rethrow_exception(err);
  }
  return result;
}

// References released on a thread Python does not know. An asynchronous operation's buffers
// are kept alive until it completes, and it completes on fourd's progress thread. Taking the GIL
// there would create and then delete a Python thread state, each under the interpreter's
// thread-list lock; a fork() in that window leaves the lock held in the child, and CPython 3.11
// takes it in the child (deleting the other threads' states) before re-initializing it, so the
// child hangs inside os.fork(). Such a reference goes on a lock-free list instead, dropped by the
// main thread from a pending call (Py_AddPendingCall takes no interpreter-wide lock, and its own
// lock is re-initialized at fork), or by the next fourd call that holds the GIL.
struct Deferred {
  PyObject* obj;
  Deferred* next;
};
std::atomic<Deferred*> gDeferred{nullptr};
std::atomic<bool> gDrainScheduled{false};

int drainDeferred(void* = nullptr) {
  gDrainScheduled.store(false);
  for (Deferred* d = gDeferred.exchange(nullptr); d;) {
    Deferred* next = d->next;
    Py_DECREF(d->obj);
    delete d;
    d = next;
  }
  return 0;
}

void releaseReference(PyObject* p) {
  if (!Py_IsInitialized() || isFinalizing()) return;  // interpreter gone: leak
  if (PyGILState_GetThisThreadState() != nullptr) {
    // A thread with a Python thread state: taking the GIL creates nothing.
    PyGILState_STATE st = PyGILState_Ensure();
    Py_DECREF(p);
    PyGILState_Release(st);
    return;
  }
  auto* d = new Deferred{p, gDeferred.load()};
  while (!gDeferred.compare_exchange_weak(d->next, d)) {
  }
  if (!gDrainScheduled.exchange(true) && Py_AddPendingCall(&drainDeferred, nullptr) != 0)
    gDrainScheduled.store(false);  // the queue is full: the next release or call schedules it
}

// With the GIL held: drops what the progress threads handed over.
void drainReleased() {
  if (gDeferred.load(std::memory_order_relaxed) != nullptr) drainDeferred();
}

std::shared_ptr<void> keepAlive(py::object o) {
  if (o.is_none()) return nullptr;
  return std::shared_ptr<void>(o.release().ptr(),
                               [](void* q) { releaseReference(static_cast<PyObject*>(q)); });
}

// A buffer as Python resolved it; CUDA buffers carry the caller's stream.
Buffer buf(uintptr_t ptr, size_t count, int dtype, int device, int deviceIndex,
           uintptr_t stream = 0) {
  return Buffer(reinterpret_cast<void*>(ptr), count, static_cast<DataType>(dtype),
                static_cast<DeviceType>(device), deviceIndex, reinterpret_cast<void*>(stream));
}

DeviceType deviceArg(const std::string& d) {
  if (d == "cpu") return DeviceType::kCpu;
  if (d == "cuda") return DeviceType::kCuda;
  throw fourd::InvalidArgument("device: expected 'cpu' or 'cuda', found '" + d + "'");
}

CallOptions opts(int algorithm, double timeout, bool async, bool acc32,
                 const std::string& compression = std::string()) {
  CallOptions o;
  o.compression = compression;
  o.algorithm = static_cast<fourd::Algorithm>(algorithm);
  o.timeoutSeconds = timeout;
  o.async = async;
  o.accumulateFp32 = acc32;
  return o;
}

py::object finish(std::shared_ptr<Work> w, bool async, py::object keep) {
  if (!async) return py::none();
  drainReleased();
  if (!w->isCompleted()) w->setKeepAlive(keepAlive(std::move(keep)));
  return py::cast(w);
}

// Waits in short slices with the GIL released, so that Ctrl-C is seen. Interrupted, the
// operation is cancelled (docs/errors.md: the axis is poisoned) and this waits until it is gone
// before KeyboardInterrupt propagates, so that it never writes the caller's buffers after.
void waitWork(Work& w, py::object timeout) {
  const double limit = timeout.is_none() ? -1.0 : timeout.cast<double>();
  const auto start = std::chrono::steady_clock::now();
  auto slice = [&w](double seconds) {
    return withoutGil([&] {
      try {
        return w.wait(seconds);
      } catch (...) {
        return true;  // completed with an error: rethrown below with the GIL held
      }
    });
  };
  while (true) {
    double step = 0.05;
    if (limit >= 0) {
      const double left =
          limit - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (left <= 0) {
        if (w.isCompleted()) break;
        throw fourd::TimeoutError("fourd: Work.wait: " + w.description() +
                                  " did not complete within " + std::to_string(limit) +
                                  " s (it keeps running; wait again, or let "
                                  "its own deadline end it)");
      }
      step = std::min(step, left);
    }
    if (slice(step)) break;
    if (PyErr_CheckSignals() != 0) {
      w.cancel("interrupted (Ctrl-C) in Work.wait");
      while (!slice(0.05)) {
      }
      throw py::error_already_set();
    }
  }
  if (auto e = w.error()) std::rethrow_exception(e);
}

// fourd's dtype code (fourd::DataType's value, as it crosses the binding).
constexpr int dtypeCode(fourd::DataType t) { return static_cast<int>(t); }

// The code of a signed integer type of `bytes` bytes (the C types map by width), or -1.
constexpr int integerCode(size_t bytes) {
  return bytes == 4   ? dtypeCode(fourd::DataType::kInt32)
         : bytes == 8 ? dtypeCode(fourd::DataType::kInt64)
                      : -1;
}

// fourd's dtype code of a buffer-protocol view, or -1.
int bufferDtype(const Py_buffer& view) {
  using fourd::DataType;
  int c = -1;
  const char* f = view.format ? view.format : "B";
  if (*f == '=' || *f == '<' || *f == '@') ++f;
  const bool single = f[0] != '\0' && f[1] == '\0';
  if (single) {
    switch (f[0]) {
      case 'f':
        c = view.itemsize == 4 ? dtypeCode(DataType::kFloat32) : -1;
        break;
      case 'd':
        c = view.itemsize == 8 ? dtypeCode(DataType::kFloat64) : -1;
        break;
      case 'e':
        c = view.itemsize == 2 ? dtypeCode(DataType::kFloat16) : -1;
        break;
      case 'b':
        c = dtypeCode(DataType::kInt8);
        break;
      case 'B':
        c = dtypeCode(DataType::kUInt8);
        break;
      case 'i':
      case 'l':
      case 'q':
        c = integerCode(static_cast<size_t>(view.itemsize));
        break;
      default:
        break;
    }
  }
  return c;
}

// Fast path for numpy arrays (and any buffer-protocol object): (address, count, dtype code) of
// a C-contiguous buffer of a supported type, writable if asked; None otherwise, and the Python
// layer then produces the precise error message.
py::object bufferInfo(py::handle obj, bool writable) {
  Py_buffer view;
  const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
    PyErr_Clear();
    return py::none();
  }
  const int code = bufferDtype(view);
  py::object out = py::none();
  if (code >= 0) {
    out = py::make_tuple(reinterpret_cast<uintptr_t>(view.buf),
                         static_cast<size_t>(view.len / view.itemsize), code);
  }
  PyBuffer_Release(&view);
  return out;
}

// Module-level functions: the MPI library, the build, the buffer fast path.
void bindModuleFunctions(py::module_& m) {
  m.def("buffer_info", &bufferInfo, py::arg("obj"), py::arg("writable"));
  gMainThread = PyThread_get_thread_ident();
  py::object threading = py::module_::import("threading");
  gMainThread = threading.attr("main_thread")().attr("ident").cast<unsigned long>();
  fourd::detail::setInterruptCheck(&pyInterruptCheck);
  // A pending drain scheduled in the parent is not the child's to run.
  pthread_atfork(nullptr, nullptr, [] { gDrainScheduled.store(false); });

  m.def("mpi_library_version", &fourd::mpiLibraryVersion);
  m.def("mpi_family", &fourd::mpiFamily, py::arg("library_version"));
  m.def("mpi_header_family", &fourd::mpiHeaderFamily);
  m.def("mpi_abi_mismatch", &fourd::mpiAbiMismatch);
  m.def("mpi_initialized", [] {
    int flag = 0;
    MPI_Initialized(&flag);
    return flag != 0;
  });
  m.def("build_info", &fourd::buildInfo);
  m.def("mpi_thread_level", [] {
    int p = 0;
    MPI_Query_thread(&p);
    return p;
  });
}

void bindWork(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work", "Handle on a collective operation.")
      .def("is_completed", &Work::isCompleted, "True once the operation finished; never blocks.")
      .def("wait", &waitWork, py::arg("timeout") = py::none(),
           "Wait until the operation completes (re-raising its error). timeout in seconds; on "
           "expiry raises fourd.TimeoutError and the operation keeps running.")
      .def_property_readonly("description", &Work::description)
      .def("__repr__", [](const Work& w) {
        return "<fourd.Work " + w.description() + (w.isCompleted() ? " completed>" : " running>");
      });
}

using CommunicatorClass = py::class_<Communicator>;

void bindCommunicatorInfo(CommunicatorClass& c) {
  c.def_property_readonly(
      "mpi_handle",
      [](Communicator& comm) {
        return static_cast<long long>(
            MPI_Comm_c2f(fourd::detail::mpiHandle(comm.group().backend())));
      },
      "The Fortran handle of the group's MPI communicator (mpi4py.MPI.Comm.f2py), for what "
      "fourd itself does not do; fourd's own traffic uses it too: duplicate it first.");
  c.def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("mask", &Communicator::mask)
      .def_property_readonly("name", &Communicator::name)
      .def_property_readonly("world_ranks", &Communicator::worldRanks)
      .def_property_readonly("topology",
                             [](const Communicator& c) { return topologyDict(c.topology()); })
      .def_property_readonly("poisoned", &Communicator::poisoned)
      .def_property_readonly("poison_reason", &Communicator::poisonReason)
      .def("abort", &Communicator::abort, py::arg("reason"),
           "Poisons the communicator on this rank: later calls raise AbortedError naming "
           "`reason`; Grid.group makes a poisoned group anew (docs/errors.md).");
}

// torch's Tensor type and dtype objects with fourd's dtype codes, registered by fourd._tensor
// once the caller's torch is imported (set_torch); empty before. The references are kept for
// the life of the process (never released, so nothing runs at interpreter shutdown).
struct TorchRegistry {
  PyObject* tensorType = nullptr;
  std::vector<std::pair<PyObject*, int>> dtypes;
};
TorchRegistry gTorch;

bool isTorchTensor(py::handle t) {
  return gTorch.tensorType != nullptr &&
         Py_TYPE(t.ptr()) == reinterpret_cast<PyTypeObject*>(gTorch.tensorType);
}

int torchCode(PyObject* dtype) {
  for (const auto& [d, code] : gTorch.dtypes)
    if (d == dtype) return code;
  return -1;
}

// Interned attribute names, made once (the GIL is held).
PyObject* attrName(const char* s) { return PyUnicode_InternFromString(s); }
// A new reference to `o.<name>`, or to what its method `name` returns (nullptr, no error set,
// when it fails).
py::object attr(py::handle o, PyObject* n) {
  PyObject* r = PyObject_GetAttr(o.ptr(), n);
  if (r == nullptr) PyErr_Clear();
  return py::reinterpret_steal<py::object>(r);
}
py::object callMethod(py::handle o, PyObject* n) {
  PyObject* r = PyObject_CallMethodNoArgs(o.ptr(), n);
  if (r == nullptr) PyErr_Clear();
  return py::reinterpret_steal<py::object>(r);
}

// A contiguous CPU torch.Tensor (exactly that type) of a fourd dtype, read through its Python
// attributes (the extension never links libtorch): false, no error set, for anything else. One
// that requires grad only where `grad` allows it (its data, as torch's backends take it).
struct TensorView {
  uintptr_t ptr = 0;
  size_t count = 0;
  int code = -1;
  bool read(py::handle t, bool grad) {
    if (!isTorchTensor(t)) return false;
    static PyObject* const isCpu = attrName("is_cpu");
    static PyObject* const dtype = attrName("dtype");
    static PyObject* const requiresGrad = attrName("requires_grad");
    static PyObject* const isContiguous = attrName("is_contiguous");
    static PyObject* const dataPtr = attrName("data_ptr");
    static PyObject* const numel = attrName("numel");
    py::object cpu = attr(t, isCpu), dt = attr(t, dtype);
    if (!cpu || cpu.ptr() != Py_True || !dt) return false;
    code = torchCode(dt.ptr());
    if (code < 0) return false;
    if (!grad) {
      py::object g = attr(t, requiresGrad);
      if (!g || g.ptr() != Py_False) return false;
    }
    py::object contiguous = callMethod(t, isContiguous);
    if (!contiguous || contiguous.ptr() != Py_True) return false;
    py::object p = callMethod(t, dataPtr), n = callMethod(t, numel);
    if (!p || !n) return false;
    ptr = PyLong_AsSize_t(p.ptr());
    count = PyLong_AsSize_t(n.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return true;
  }
  Buffer cpu() const { return buf(ptr, count, code, 0, 0); }
};

// fourd's dtype code of a numpy type number (-1: none fourd has); the C integer types by width.
int numpyDtype(int typeNum) {
  using api = py::detail::npy_api;
  using fourd::DataType;
  constexpr int kHalf = 23;  // NPY_HALF, which pybind11 does not name
  switch (typeNum) {
    case api::NPY_FLOAT_:
      return dtypeCode(DataType::kFloat32);
    case api::NPY_DOUBLE_:
      return dtypeCode(DataType::kFloat64);
    case kHalf:
      return dtypeCode(DataType::kFloat16);
    case api::NPY_BYTE_:
      return dtypeCode(DataType::kInt8);
    case api::NPY_UBYTE_:
      return dtypeCode(DataType::kUInt8);
    case api::NPY_INT_:
      return integerCode(sizeof(int));
    case api::NPY_LONG_:
      return integerCode(sizeof(long));
    case api::NPY_LONGLONG_:
      return integerCode(sizeof(long long));
    default:
      return -1;
  }
}

// What the blocking hot paths take in one native call: a C-contiguous buffer-protocol view of
// `obj` (numpy), or a contiguous CPU torch tensor (TensorView; one fourd writes must not
// require grad), and its dtype code; false with no Python error set when `obj` is neither.
struct ArrayView {
  Py_buffer view{};
  bool held = false;
  int code = -1;
  uintptr_t address = 0;
  size_t elements = 0;
  ArrayView(const ArrayView&) = delete;
  ArrayView& operator=(const ArrayView&) = delete;
  ArrayView() = default;
  ~ArrayView() {
    if (held) PyBuffer_Release(&view);
  }
  bool get(py::handle obj, bool writable) {
    if (readNumpy(obj, writable)) return true;
    if (isTorchTensor(obj)) {
      TensorView t;
      if (!t.read(obj, !writable)) return false;
      address = t.ptr;
      elements = t.count;
      code = t.code;
      return true;
    }
    const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
      PyErr_Clear();
      return false;
    }
    held = true;
    code = bufferDtype(view);
    address = reinterpret_cast<uintptr_t>(view.buf);
    elements = code >= 0 ? static_cast<size_t>(view.len / view.itemsize) : 0;
    return code >= 0;
  }
  Buffer cpu() const { return buf(address, elements, code, 0, 0); }

 private:
  // A numpy array of a dtype fourd has, C-contiguous, in native byte order (and writable when
  // fourd writes it), read from the array's own fields; anything else (another dtype, a view
  // that is not contiguous) false, for the buffer protocol below to take or refuse.
  bool readNumpy(py::handle obj, bool writable) {
    const auto& api = py::detail::npy_api::get();
    if (!api.PyArray_Check_(obj.ptr())) return false;
    const auto* a = py::detail::array_proxy(obj.ptr());
    const int need = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ |
                     (writable ? py::detail::npy_api::NPY_ARRAY_WRITEABLE_ : 0);
    if ((a->flags & need) != need) return false;
    const auto* d = py::detail::array_descriptor_proxy(a->descr);
    if (d->byteorder == '>') return false;
    code = numpyDtype(d->type_num);
    if (code < 0) return false;
    size_t n = 1;
    for (int i = 0; i < a->nd; ++i) n *= static_cast<size_t>(a->dimensions[i]);
    address = reinterpret_cast<uintptr_t>(a->data);
    elements = n;
    return true;
  }
};

// The collectives, as Python resolves their buffers (grid.py is the only caller).
void bindReductions(CommunicatorClass& c) {
  c.def("all_reduce",
        [](Communicator& c, uintptr_t in, uintptr_t out, size_t count, int dtype, int dev,
           int devIdx, uintptr_t stream, int op, int algorithm, double timeout, bool async,
           bool acc32, py::object keep, const std::string& codec) {
          const CallOptions o = opts(algorithm, timeout, async, acc32, codec);
          auto w = released([&] {
            return c.allReduce(buf(in, count, dtype, dev, devIdx, stream),
                               buf(out, count, dtype, dev, devIdx, stream),
                               static_cast<fourd::ReduceOp>(op), o);
          });
          return finish(std::move(w), async, std::move(keep));
        })
      .def("all_reduce_into",
           // Out of place: the counts are checked by the core (they must be equal).
           [](Communicator& c, uintptr_t in, size_t inCount, uintptr_t out, size_t outCount,
              int dtype, int dev, int devIdx, uintptr_t stream, int op, int algorithm,
              double timeout, bool async, bool acc32, py::object keep, const std::string& codec) {
             const CallOptions o = opts(algorithm, timeout, async, acc32, codec);
             auto w = released([&] {
               return c.allReduce(buf(in, inCount, dtype, dev, devIdx, stream),
                                  buf(out, outCount, dtype, dev, devIdx, stream),
                                  static_cast<fourd::ReduceOp>(op), o);
             });
             return finish(std::move(w), async, std::move(keep));
           });
}

void bindGatherScatter(CommunicatorClass& c) {
  c.def("all_gather",
        [](Communicator& c, uintptr_t in, size_t inCount, uintptr_t out, size_t outCount, int dtype,
           int dev, int devIdx, uintptr_t stream, int algorithm, double timeout, bool async,
           py::object keep, const std::string& codec) {
          const CallOptions o = opts(algorithm, timeout, async, false, codec);
          auto w = released([&] {
            return c.allGather(buf(in, inCount, dtype, dev, devIdx, stream),
                               buf(out, outCount, dtype, dev, devIdx, stream), o);
          });
          return finish(std::move(w), async, std::move(keep));
        })
      .def("reduce_scatter",
           [](Communicator& c, uintptr_t in, size_t inCount, uintptr_t out, size_t outCount,
              int dtype, int dev, int devIdx, uintptr_t stream, int op, int algorithm,
              double timeout, bool async, bool acc32, py::object keep, const std::string& codec) {
             const CallOptions o = opts(algorithm, timeout, async, acc32, codec);
             auto w = released([&] {
               return c.reduceScatter(buf(in, inCount, dtype, dev, devIdx, stream),
                                      buf(out, outCount, dtype, dev, devIdx, stream),
                                      static_cast<fourd::ReduceOp>(op), o);
             });
             return finish(std::move(w), async, std::move(keep));
           })
      .def("broadcast",
           [](Communicator& c, uintptr_t p, size_t count, int dtype, int dev, int devIdx,
              uintptr_t stream, int root, double timeout, bool async, py::object keep) {
             const CallOptions o = opts(0, timeout, async, false);
             auto w = released(
                 [&] { return c.broadcast(buf(p, count, dtype, dev, devIdx, stream), root, o); });
             return finish(std::move(w), async, std::move(keep));
           })
      .def("barrier", [](Communicator& c, double timeout) {
        const CallOptions o = opts(0, timeout, false, false);
        released([&] { return c.barrier(o); });
      });
}

// The hot paths of fourd.distributed's ProcessGroup: a blocking all_reduce (in place),
// all_gather_into_tensor or reduce_scatter_tensor of contiguous CPU torch tensors whose
// (collective, dtype, op) went through the backend's general path once (learn()). Each is one
// call from the backend's method: the tensors and torch's options object are read here through
// their Python attributes (the extension never links libtorch), which saves the interpreter's
// steps and the general binding's fifteen argument conversions. False (nothing done, no error):
// the call is not such a one, and the method takes the general path, which also words errors.
class TorchCalls {
 public:
  static constexpr int kKinds = 3;  // 0 all_reduce, 1 all_gather, 2 reduce_scatter
  static constexpr int kCodes = 32;
  static constexpr int kOps = 16;

  TorchCalls(py::object comm, int algorithm, double timeout, py::dict opCodes)
      : commObj_(std::move(comm)),
        comm_(commObj_.cast<Communicator*>()),
        algorithm_(algorithm),
        timeout(timeout) {
    ops_.fill(-1);
    for (auto item : opCodes) {
      const int v = item.first.cast<int>();
      if (v < 0 || v >= kOps) throw fourd::InvalidArgument("TorchCalls: op value");
      ops_[v] = item.second.cast<int>();
    }
  }

  void learn(int kind, py::handle dtype, int opValue) {
    const int code = torchCode(dtype.ptr());
    if (kind >= 0 && kind < kKinds && code >= 0 && opValue >= 0 && opValue < kOps &&
        ops_[opValue] >= 0)
      learned_[index(kind, code, opValue)] = true;
  }

  py::list learned() const {
    py::list out;
    for (int k = 0; k < kKinds; ++k)
      for (int c = 0; c < kCodes; ++c)
        for (int o = 0; o < kOps; ++o)
          if (learned_[index(k, c, o)]) out.append(py::make_tuple(k, c, o));
    return out;
  }

  bool allReduce(py::handle t, py::handle options) {
    TensorView v;
    const int op = opValue(options);
    if (op < 0 || !v.read(t, true) || !learned_[index(0, v.code, op)]) return false;
    const CallOptions o = opts(algorithm_, timeout, false, false);
    released([&] {
      return comm_->allReduce(v.cpu(), v.cpu(), static_cast<fourd::ReduceOp>(ops_[op]), o);
    });
    return true;
  }

  bool allGather(py::handle out, py::handle in, py::handle options) {
    TensorView o, i;
    if (!blocking(options) || !o.read(out, true) || !i.read(in, true) || o.code != i.code ||
        !learned_[index(1, i.code, 0)])
      return false;
    const CallOptions c = opts(algorithm_, timeout, false, false);
    released([&] { return comm_->allGather(i.cpu(), o.cpu(), c); });
    return true;
  }

  bool reduceScatter(py::handle out, py::handle in, py::handle options) {
    TensorView o, i;
    const int op = opValue(options);
    if (op < 0 || !o.read(out, true) || !i.read(in, true) || o.code != i.code ||
        !learned_[index(2, i.code, op)])
      return false;
    const CallOptions c = opts(algorithm_, timeout, false, false);
    released([&] {
      return comm_->reduceScatter(i.cpu(), o.cpu(), static_cast<fourd::ReduceOp>(ops_[op]), c);
    });
    return true;
  }

 private:
  static size_t index(int kind, int code, int op) {
    return (static_cast<size_t>(kind) * kCodes + code) * kOps + op;
  }

  static bool blocking(py::handle options) {
    static PyObject* const asyncOp = attrName("asyncOp");
    py::object a = attr(options, asyncOp);
    return a && a.ptr() == Py_False;
  }

  // torch's RedOpType value of a blocking call's options.reduceOp (its hash: ReduceOp hashes to
  // it, PREMUL_SUM to its own value whatever its factor), or -1 for one fourd has no hot path for.
  int opValue(py::handle options) const {
    if (!blocking(options)) return -1;
    static PyObject* const reduceOp = attrName("reduceOp");
    py::object r = attr(options, reduceOp);
    if (!r) return -1;
    const Py_hash_t h = PyObject_Hash(r.ptr());
    if (h == -1) PyErr_Clear();
    return h >= 0 && h < kOps && ops_[h] >= 0 ? static_cast<int>(h) : -1;
  }

  py::object commObj_;  // keeps the communicator (and its grid) alive
  Communicator* comm_;
  int algorithm_;

 public:
  double timeout;  // seconds (0: the grid's default); the group's set_timeout changes it

 private:
  std::array<int, kOps> ops_{};
  std::bitset<kKinds * kCodes * kOps> learned_;
};

void bindTorchCalls(py::module_& m) {
  m.def(
      "set_torch",
      [](py::handle tensorType, py::dict dtypeCodes) {
        if (gTorch.tensorType != nullptr) return;  // once a process: one torch
        for (auto item : dtypeCodes) {
          const int code = item.second.cast<int>();
          if (code < 0 || code >= TorchCalls::kCodes)
            throw fourd::InvalidArgument("set_torch: dtype code out of range");
          gTorch.dtypes.emplace_back(item.first.inc_ref().ptr(), code);
        }
        gTorch.tensorType = tensorType.inc_ref().ptr();
      },
      py::arg("tensor_type"), py::arg("dtype_codes"),
      "Registers torch.Tensor and torch's dtypes (fourd's codes) with the native hot paths.");
  py::class_<TorchCalls>(m, "TorchCalls")
      .def(py::init<py::object, int, double, py::dict>(), py::arg("comm"), py::arg("algorithm"),
           py::arg("timeout"), py::arg("op_codes"))
      .def_readwrite("timeout", &TorchCalls::timeout)
      .def("learn", &TorchCalls::learn, py::arg("kind"), py::arg("dtype"), py::arg("op_value"),
           "After a blocking call of (kind: 0 all_reduce, 1 all_gather, 2 reduce_scatter; "
           "dtype; torch's RedOpType value, 0 for all_gather) went through the general path.")
      .def("learned", &TorchCalls::learned, "(kind, dtype code, op value) of the hot paths made.")
      .def("all_reduce", &TorchCalls::allReduce)
      .def("all_gather", &TorchCalls::allGather)
      .def("reduce_scatter", &TorchCalls::reduceScatter);
}

// ---- FastCalls: the blocking hot paths as plain CPython methods ------------------------------
//
// The blocking calls of Grid.all_reduce / all_gather / reduce_scatter on numpy arrays or
// contiguous CPU torch tensors with no codec run through one of these (one object per planned
// (axis, op, algorithm), its codes inside). Their arguments are the buffers, read by ArrayView,
// then optionally the timeout and accumulate_fp32; the answer: True, done; False, nothing
// done, take the general path. What is left out is pybind11's dispatch (the self cast, the
// overload walk, the argument loaders): on one
// rank, where the collective is a no-op, it was about 0.25 us of a 1 KiB call's 0.65 us of
// native time, and every microsecond of a small call counts again for each rank that shares a
// core. Errors are set as the registered translators set them (setPythonError).
struct FastCallsObject {
  PyObject_HEAD Communicator* comm;
  PyObject* owner;  // the Python Communicator (and through it the grid), kept alive
  int op;
  int algorithm;
};

// Made by fast_calls only (the type cannot be instantiated from Python); a null communicator
// is refused all the same, rather than dereferenced.
bool fastReady(const FastCallsObject* f) {
  if (f->comm != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "fourd: FastCalls without a communicator");
  return false;
}

PyObject* fastResult(bool done) {
  if (done) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// The optional arguments after the buffers: timeout (seconds, 0: the default deadline) and,
// where the collective reduces, accumulate_fp32.
struct FastOptions {
  double timeout = 0.0;
  bool acc32 = false;
};

bool fastArgs(const char* name, PyObject* const* args, Py_ssize_t nargs, Py_ssize_t buffers,
              Py_ssize_t most, FastOptions* o) {
  if (nargs < buffers || nargs > most) {
    PyErr_Format(PyExc_TypeError, "FastCalls.%s takes %zd to %zd arguments (%zd given)", name,
                 buffers, most, nargs);
    return false;
  }
  if (nargs > buffers) {
    o->timeout = PyFloat_AsDouble(args[buffers]);
    if (o->timeout == -1.0 && PyErr_Occurred()) return false;
  }
  if (nargs > buffers + 1) {
    const int t = PyObject_IsTrue(args[buffers + 1]);
    if (t < 0) return false;
    o->acc32 = t != 0;
  }
  return true;
}

PyObject* fastAllReduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* f = reinterpret_cast<FastCallsObject*>(self);
  FastOptions fo;
  if (!fastArgs("all_reduce", args, nargs, 1, 3, &fo) || !fastReady(f)) return nullptr;
  try {
    ArrayView a;
    if (!a.get(args[0], true)) return fastResult(false);
    const CallOptions o = opts(f->algorithm, fo.timeout, false, fo.acc32);
    released([&] {
      return f->comm->allReduce(a.cpu(), a.cpu(), static_cast<fourd::ReduceOp>(f->op), o);
    });
    return fastResult(true);
  } catch (...) {
    setPythonError(std::current_exception());
    return nullptr;
  }
}

// out, in: the two-buffer collectives (all_reduce out of place, all_gather, reduce_scatter).
template <int kKind>
PyObject* fastPair(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  static const char* const names[] = {"all_reduce_into", "all_gather", "reduce_scatter"};
  auto* f = reinterpret_cast<FastCallsObject*>(self);
  FastOptions fo;
  const Py_ssize_t most = kKind == 1 ? 3 : 4;  // all_gather reduces nothing
  if (!fastArgs(names[kKind], args, nargs, 2, most, &fo) || !fastReady(f)) return nullptr;
  try {
    ArrayView o, i;
    if (!o.get(args[0], true) || !i.get(args[1], false) || o.code != i.code) {
      return fastResult(false);
    }
    const CallOptions opt = opts(f->algorithm, fo.timeout, false, fo.acc32);
    const auto op = static_cast<fourd::ReduceOp>(f->op);
    released([&] {
      if (kKind == 0) return f->comm->allReduce(i.cpu(), o.cpu(), op, opt);
      if (kKind == 1) return f->comm->allGather(i.cpu(), o.cpu(), opt);
      return f->comm->reduceScatter(i.cpu(), o.cpu(), op, opt);
    });
    return fastResult(true);
  } catch (...) {
    setPythonError(std::current_exception());
    return nullptr;
  }
}

void fastDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(reinterpret_cast<FastCallsObject*>(self)->owner);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMethodDef gFastMethods[] = {
    {"all_reduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastAllReduce)),
     METH_FASTCALL,
     "all_reduce(tensor[, timeout[, accumulate_fp32]]) in place: True, done; False, take the "
     "general path."},
    {"all_reduce_into", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastPair<0>)),
     METH_FASTCALL,
     "all_reduce_into(output, input[, timeout[, accumulate_fp32]]): as all_reduce, out of "
     "place."},
    {"all_gather", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastPair<1>)),
     METH_FASTCALL, "all_gather(output, input[, timeout]): as all_reduce."},
    {"reduce_scatter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fastPair<2>)),
     METH_FASTCALL, "reduce_scatter(output, input[, timeout[, accumulate_fp32]]): as all_reduce."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot gFastSlots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(fastDealloc)},
                            {Py_tp_methods, gFastMethods},
                            {Py_tp_doc, const_cast<char*>("A planned call's blocking hot paths.")},
                            {0, nullptr}};

PyType_Spec gFastSpec = {"fourd._C.FastCalls", sizeof(FastCallsObject), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, gFastSlots};

void bindFastCalls(py::module_& m) {
  auto type = py::reinterpret_steal<py::object>(PyType_FromSpec(&gFastSpec));
  if (!type) throw py::error_already_set();
  m.attr("FastCalls") = type;
  m.def(
      "fast_calls",
      [type](py::object comm, int op, int algorithm) {
        Communicator* c = comm.cast<Communicator*>();
        auto* tp = reinterpret_cast<PyTypeObject*>(type.ptr());
        PyObject* obj = tp->tp_alloc(tp, 0);
        if (obj == nullptr) throw py::error_already_set();
        auto* f = reinterpret_cast<FastCallsObject*>(obj);
        f->comm = c;
        f->owner = comm.release().ptr();
        f->op = op;
        f->algorithm = algorithm;
        return py::reinterpret_steal<py::object>(obj);
      },
      py::arg("comm"), py::arg("op"), py::arg("algorithm"),
      "The blocking hot paths of one planned (communicator, op code, algorithm code).");
}

// The codec a call would use (Communicator::compression).
void bindCompressionQuery(CommunicatorClass& c) {
  c.def(
      "compression",
      [](const Communicator& c, const std::string& coll, size_t nbytes, const std::string& dtype,
         const std::string& device, const std::string& requested) {
        const auto r = c.compression(fourd::parseCollective(coll), nbytes,
                                     fourd::parseDataType(dtype), deviceArg(device), requested);
        py::dict d;
        d["codec"] = r.codec.empty() ? py::object(py::none()) : py::object(py::str(r.codec));
        d["source"] = r.source;
        d["where"] = r.where;
        d["note"] = r.note;
        return d;
      },
      py::arg("collective"), py::arg("nbytes"), py::arg("dtype") = "float32",
      py::arg("device") = "cpu", py::arg("requested") = "");
}

// The choices of tuning in use that a run saves and the next one seeds (profile/tuning.py).
void bindSavedTuning(CommunicatorClass& c) {
  c.def(
       "tuned_calls",
       [](const Communicator& c) {
         py::list out;
         for (const auto& t : c.tunedCalls()) {
           py::list call;
           call.append(fourd::collectiveName(t.collective));
           call.append(t.nbytes);
           call.append(fourd::toString(t.dtype));
           call.append(fourd::algorithmName(t.algorithm));
           if (t.provisional) {
             py::list cands;
             for (auto a : t.candidates) cands.append(fourd::algorithmName(a));
             call.append(t.calls);
             call.append(cands);
             call.append(py::cast(t.seconds));
             call.append(t.recheckGap);
           }
           if (t.inPlace != fourd::Algorithm::kAuto) call.append(fourd::algorithmName(t.inPlace));
           out.append(py::tuple(call));
         }
         return out;
       },
       "The choices tuning in use made under the current profile: final ones "
       "(collective, nbytes, dtype, algorithm[, in-place algorithm]), provisional switches "
       "(collective, nbytes, dtype, algorithm, calls run since the exploration, [candidates], "
       "[seconds], calls it runs before its re-check[, in-place algorithm]); the in-place "
       "algorithm of a key whose calls agree on their placement.")
      .def(
          "seed_tuning",
          [](Communicator& c, const std::vector<py::tuple>& calls) {
            std::vector<Communicator::TunedCall> v;
            for (const auto& t : calls) {
              if (t.size() < 4 || t.size() == 6 || t.size() > 9) {
                throw fourd::InvalidArgument(
                    "seed_tuning: expected tuples of 4 (a final choice; 5 with its in-place "
                    "algorithm) or 8 (a provisional one; 7 without its re-check gap, 9 with "
                    "its in-place algorithm) items, found " +
                    std::to_string(t.size()));
              }
              Communicator::TunedCall call{fourd::parseCollective(t[0].cast<std::string>()),
                                           t[1].cast<size_t>(),
                                           fourd::parseDataType(t[2].cast<std::string>()),
                                           fourd::parseAlgorithm(t[3].cast<std::string>())};
              if (t.size() >= 7) {
                call.provisional = true;
                call.calls = t[4].cast<int>();
                for (auto a : t[5].cast<std::vector<std::string>>()) {
                  call.candidates.push_back(fourd::parseAlgorithm(a));
                }
                call.seconds = t[6].cast<std::vector<double>>();
                if (t.size() >= 8) call.recheckGap = t[7].cast<int>();
              }
              if (t.size() == 5 || t.size() == 9) {
                call.inPlace = fourd::parseAlgorithm(t[t.size() - 1].cast<std::string>());
              }
              v.push_back(std::move(call));
            }
            return c.seedTuning(v);
          },
          py::arg("calls"),
          "Seeds saved choices, as tuned_calls gives them (the same list on every rank of "
          "the group); returns how many were taken.");
}

// What the selector and the tuning say of a call.
void bindQueries(CommunicatorClass& c) {
  c.def(
       "choose",
       [](const Communicator& c, const std::string& coll, size_t nbytes, const std::string& dtype,
          bool inPlace, const std::string& device) {
         return std::string(fourd::algorithmName(c.choose(fourd::parseCollective(coll), nbytes,
                                                          fourd::parseDataType(dtype), inPlace,
                                                          deviceArg(device))));
       },
       py::arg("collective"), py::arg("nbytes"), py::arg("dtype") = "float32",
       py::arg("in_place") = false, py::arg("device") = "cpu")
      .def_property(
          "default_algorithm",
          [](const Communicator& c) {
            return std::string(fourd::algorithmName(c.defaultAlgorithm()));
          },
          [](Communicator& c, const std::string& a) {
            c.setDefaultAlgorithm(fourd::parseAlgorithm(a));
          },
          "The algorithm of calls that ask for 'auto' on this group ('auto': none).")
      .def(
          "tuning",
          [](const Communicator& c, const std::string& coll, size_t nbytes,
             const std::string& dtype, bool inPlace) {
            const auto t = c.tuning(fourd::parseCollective(coll), nbytes,
                                    fourd::parseDataType(dtype), inPlace);
            py::dict d;
            d["state"] = t.state.empty() ? std::string("not yet run") : t.state;
            py::list cands, secs;
            for (auto a : t.candidates) cands.append(fourd::algorithmName(a));
            for (double x : t.seconds) secs.append(x);
            d["candidates"] = cands;
            d["measured_s"] = secs;
            d["explore_calls"] = t.exploreCalls;
            d["recheck_gap"] = t.recheckGap;
            d["call_period_s"] = t.period;
            d["saved"] = t.saved;
            d["settled"] = t.settled == fourd::Algorithm::kAuto
                               ? py::object(py::none())
                               : py::object(py::str(fourd::algorithmName(t.settled)));
            d["placement_agreed"] = t.agreed;
            d["settled_in_place"] =
                t.agreed ? py::object(py::str(fourd::algorithmName(t.inPlaceSettled)))
                         : py::object(py::none());
            return d;
          },
          py::arg("collective"), py::arg("nbytes"), py::arg("dtype") = "float32",
          py::arg("in_place") = false)
      .def(
          "explain",
          [](const Communicator& c, const std::string& coll, size_t nbytes,
             const std::string& dtype, bool inPlace, const std::string& device) {
            const auto e = c.explain(fourd::parseCollective(coll), nbytes,
                                     fourd::parseDataType(dtype), inPlace, deviceArg(device));
            py::list rows;
            for (const auto& p : e.candidates) {
              py::dict d;
              d["algorithm"] = fourd::algorithmName(p.algorithm);
              d["predicted_s"] = p.seconds;
              d["correction"] = p.correction;
              d["supported"] = p.supported;
              d["reason"] = p.reason;
              rows.append(d);
            }
            py::dict out;
            out["candidates"] = rows;
            out["choice"] = fourd::algorithmName(e.choice);
            out["source"] = e.source;
            return out;
          },
          py::arg("collective"), py::arg("nbytes"), py::arg("dtype") = "float32",
          py::arg("in_place") = false, py::arg("device") = "cpu");
}

// Deletes a Grid with the GIL released: its destructor drains the communicators, whose progress
// threads take the GIL to release the Python buffers of operations that complete meanwhile.
// Holding the GIL there kept them from finishing until the deadline.
// The GIL comes back in gil_scoped_release's destructor here, not through withoutGil: a deleter
// is noexcept either way. Only a grid dropped by a daemon thread at the very moment the
// interpreter starts exiting could meet the abort that withoutGil avoids (bindings.hpp).
struct GridDeleter {
  void operator()(Grid* g) const noexcept {
    if (Py_IsInitialized() && !isFinalizing() && PyGILState_Check()) {
      py::gil_scoped_release rel;
      delete g;
    } else {
      delete g;
    }
  }
};

void bindGrid(py::module_& m) {
  py::class_<Grid, std::unique_ptr<Grid, GridDeleter>>(m, "Grid")
      .def(py::init([](intptr_t commF, std::vector<int> sizes, const std::string& order, int rpn,
                       double timeout, bool debug, bool abortOnTimeout,
                       const std::string& compression) {
             fourd::GridConfig cfg;
             for (int i = 0; i < 4; ++i) cfg.sizes[i] = sizes.at(i);
             cfg.order = order;
             cfg.ranksPerNode = rpn;
             cfg.timeoutSeconds = timeout;
             cfg.debug = debug;
             cfg.abortOnTimeout = abortOnTimeout;
             cfg.compression = compression;
             MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(commF));
             return released([&] { return new Grid(comm, cfg); });
           }),
           py::arg("comm_f"), py::arg("sizes"), py::arg("order"), py::arg("ranks_per_node"),
           py::arg("timeout"), py::arg("debug"), py::arg("abort_on_timeout"),
           py::arg("compression") = "")
      .def_property_readonly("world_rank", &Grid::worldRank)
      .def_property_readonly("world_size", &Grid::worldSize)
      .def_property_readonly("sizes",
                             [](const Grid& g) {
                               auto s = g.processGrid().sizes();
                               return std::vector<int>(s.begin(), s.end());
                             })
      .def_property_readonly("order", [](const Grid& g) { return g.processGrid().orderName(); })
      .def_property_readonly("host_names", &Grid::hostNames)
      .def_property_readonly(
          "core_share",
          [](const Grid& g) {
            const auto& c = g.coreShare();
            py::dict d;
            d["ranks"] = c.ranks;
            d["cores"] = c.cores;
            d["oversubscribed"] = c.oversubscribed;
            return d;
          },
          "How this rank's waits poll: the world ranks sharing its cores (those on the same "
          "kernel), the cores they may run on together, and whether waits yield at once.")
      .def_property_readonly("num_nodes", [](const Grid& g) { return g.topology().numNodes(); })
      .def_property_readonly("virtual_topology", &Grid::virtualTopology)
      .def_property_readonly("finalized", &Grid::finalized)
      .def("coords",
           [](const Grid& g, int r) {
             auto c = g.processGrid().coords(r);
             return std::vector<int>(c.begin(), c.end());
           })
      .def("rank_of",
           [](const Grid& g, std::vector<int> c) {
             return g.processGrid().rankOf({c.at(0), c.at(1), c.at(2), c.at(3)});
           })
      .def("group_ranks",
           [](const Grid& g, int r, unsigned mask) { return g.processGrid().groupRanks(r, mask); })
      .def("group_rank",
           [](const Grid& g, int r, unsigned mask) { return g.processGrid().groupRank(r, mask); })
      .def("node_of", [](const Grid& g, int r) { return g.topology().nodeOf(r); })
      .def("local_rank", [](const Grid& g, int r) { return g.topology().localRank(r); })
      .def("communicator", &Grid::communicator, py::return_value_policy::reference_internal)
      .def(
          "group",
          [](Grid& g, const std::vector<int>& ranks, double timeout) -> Communicator& {
            return *released([&]() -> Communicator* { return &g.group(ranks, timeout); });
          },
          py::arg("world_ranks"), py::arg("timeout") = 0.0,
          py::return_value_policy::reference_internal,
          "The communicator of these world ranks in this order (collective over them).")
      .def("finalize",
           [](Grid& g, double timeout) { return withoutGil([&] { return g.finalize(timeout); }); })
      .def_property_readonly("profile", [](const Grid& g) { return g.profile(); })
      .def("set_profile", &Grid::setProfile);
}

}  // namespace

void register_grid(py::module_& m) {
  bindModuleFunctions(m);
  bindWork(m);
  CommunicatorClass comm(m, "Communicator");
  bindCommunicatorInfo(comm);
  bindReductions(comm);
  bindGatherScatter(comm);
  bindQueries(comm);
  bindSavedTuning(comm);
  bindCompressionQuery(comm);
  bindGrid(m);
  bindTorchCalls(m);
  bindFastCalls(m);
}
}  // namespace fourd_py
