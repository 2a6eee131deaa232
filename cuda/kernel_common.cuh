// Private to cuda/: error checks, launch sizing and the parameter blocks shared by the kernel
// translation units (reductions are instantiated in several .cu files so they compile in
// parallel).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "fourd_cuda.hpp"

namespace fourd::cuda::detail {

/// Throws CudaError naming `what`, with CUDA's error name and string.
[[noreturn]] void throwCudaError(cudaError_t err, const char* what);

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throwCudaError(err, what);
}

/// After a <<<...>>> launch: reports a bad configuration (and any earlier asynchronous error
/// still pending on this thread) as a CudaError.
inline void checkLaunch(const char* what) { check(cudaGetLastError(), what); }

/// Streaming multiprocessors of the current device (cached per device).
int multiProcessorCount();

/// Threads per block of every kernel here: 8 warps keep enough loads in flight per SM at full
/// occupancy without making the grid-stride tail long.
inline constexpr int kThreads = 256;

/// Blocks for a grid-stride kernel that has `work` units, each worth one thread for one
/// iteration: enough to cover the work, never more than fill the device `blocksPerSm` deep
/// (beyond that, extra blocks only add scheduling and tail cost).
inline unsigned gridFor(size_t work, int blocksPerSm) {
  const size_t needed = (work + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(multiProcessorCount()) *
                     static_cast<size_t>(blocksPerSm > 0 ? blocksPerSm : 1);
  const size_t blocks = needed < cap ? needed : cap;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

/// Launch parameters of one reduce launch. Passed by value as a __grid_constant__ kernel
/// parameter, so the source table needs no device allocation and no copy.
struct ReduceParams {
  void* dst;
  const void* srcs[kMaxReduceSources];
  int nsrcs;
  size_t count;   // elements
  size_t head;    // scalar elements before the 16-byte aligned body
  size_t nvec;    // 16-byte vectors in the body
  double factor;  // kAvg: multiply the sum by this before rounding
};

/// Enqueues one reduce launch of element type T (instantiated in reduce_*.cu).
/// `op == kAvg` means a sum scaled by p.factor; the caller has validated everything.
template <typename T>
void launchReduce(const ReduceParams& p, ReduceOp op, cudaStream_t stream);

}  // namespace fourd::cuda::detail
