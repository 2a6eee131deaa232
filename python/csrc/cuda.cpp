// Bindings of the GPU part (GPU builds only; elsewhere register_cuda adds nothing and
// fourd._C.HAVE_CUDA is False). Addresses and streams cross as ints (tensor.data_ptr(),
// torch.cuda.Stream.cuda_stream; 0 = the legacy default stream); dtype and op are the
// fourd::DataType / fourd::ReduceOp codes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"

#ifdef FOURD_HAVE_CUDA
#include "fourd_cuda.hpp"
#endif

namespace py = pybind11;

namespace fourd_py {

void register_cuda(py::module_& m) {
#ifdef FOURD_HAVE_CUDA
  m.def(
      "cuda_device_count",
      [] {
        std::string why;
        const int n = fourd::cuda::deviceCount(&why);
        return std::make_pair(n, n > 0 ? std::string() : why);
      },
      "(count, reason): CUDA devices visible to this process; reason says why when count is 0.");
  m.def("nccl_version", &fourd::cuda::ncclVersion,
        "Version of the linked NCCL library as NCCL encodes it (2.23.3 -> 22303).");
  m.def(
      "cuda_reduce",
      [](uintptr_t dst, const std::vector<uintptr_t>& srcs, size_t count, int dtype, int op,
         uintptr_t stream, double avgFactor) {
        std::vector<const void*> p(srcs.size());
        for (size_t i = 0; i < srcs.size(); ++i) p[i] = reinterpret_cast<const void*>(srcs[i]);
        fourd_py::withoutGil([&] {
          fourd::cuda::reduce(reinterpret_cast<void*>(dst), p.data(), static_cast<int>(p.size()),
                              count, static_cast<fourd::DataType>(dtype),
                              static_cast<fourd::ReduceOp>(op), reinterpret_cast<void*>(stream),
                              avgFactor);
        });
      },
      py::arg("dst"), py::arg("srcs"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("stream") = 0, py::arg("avg_factor") = 0.0,
      "dst = srcs[0] (op) srcs[1] ... element-wise on the current device, enqueued on `stream`.");
  m.def(
      "cuda_permute_blocks",
      [](uintptr_t dst, uintptr_t src, size_t blockBytes, const std::vector<int>& perm,
         uintptr_t stream) {
        fourd_py::withoutGil([&] {
          fourd::cuda::permuteBlocks(
              reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), blockBytes,
              perm.data(), static_cast<int>(perm.size()), reinterpret_cast<void*>(stream));
        });
      },
      py::arg("dst"), py::arg("src"), py::arg("block_bytes"), py::arg("perm"),
      py::arg("stream") = 0, "dst block i = src block perm[i], enqueued on `stream`.");
#else
  (void)m;
#endif
}

}  // namespace fourd_py
