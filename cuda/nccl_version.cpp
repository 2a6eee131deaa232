// NCCL queries that need no device. Kept in a plain C++ file: nvcc never sees nccl.h here.
#include <nccl.h>

#include <string>

#include "fourd_cuda.hpp"

namespace fourd::cuda {

int ncclVersion() {
  int v = 0;
  const ncclResult_t r = ncclGetVersion(&v);
  if (r != ncclSuccess) {
    throw CudaError(std::string("NCCL error in ncclGetVersion: ") + ncclGetErrorString(r),
                    static_cast<int>(r));
  }
  return v;
}

}  // namespace fourd::cuda
