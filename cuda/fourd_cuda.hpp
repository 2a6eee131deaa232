// Host-callable API of fourd's CUDA kernels: element-wise reductions and block packing.
//
// Plain C++17: g++ and nvcc both accept this header, so the core, the bindings and the tests
// call the kernels without being compiled by nvcc. CUDA types do not appear here: a stream is a
// `void*` holding a cudaStream_t (nullptr = the legacy default stream), and every pointer to data
// is a device pointer (cudaMalloc, a torch CUDA tensor, or memory otherwise reachable from the
// current device).
//
// Threading and ordering: every kernel runs on the device that is current on the calling thread
// (cudaSetDevice), is enqueued on `stream` and returns without waiting; the caller synchronises.
// The functions keep no state besides a per-device cache of attributes, and may be called from
// several threads at once.
//
// Errors: a bad argument throws fourd::InvalidArgument before anything is enqueued; a failure
// reported by the CUDA runtime throws fourd::cuda::CudaError (a fourd::BackendError) whose
// code() is the cudaError_t value and whose message carries CUDA's error name and string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "fourd/data_type.hpp"
#include "fourd/error.hpp"

namespace fourd::cuda {

/// A failure reported by the CUDA runtime or NCCL library. code() is the cudaError_t (or
/// ncclResult_t) value; what() names the operation and carries the library's own error string.
class CudaError : public BackendError {
 public:
  CudaError(const std::string& what, int code) : BackendError(what, code) {}
};

/// Number of CUDA devices visible to this process. Never throws: returns 0 when there is no
/// device or no usable driver, and then stores CUDA's reason ("cudaErrorNoDevice: no CUDA-capable
/// device is detected", "cudaErrorInsufficientDriver: ...") into `*whyNone` when given.
int deviceCount(std::string* whyNone = nullptr) noexcept;

/// Version of the NCCL library linked in, as NCCL encodes it (2.23.3 -> 22303). Needs no device.
/// Throws CudaError if NCCL reports an error.
int ncclVersion();

/// Most sources one reduce() launch takes; more are reduced in several launches (see reduce()).
inline constexpr int kMaxReduceSources = 64;

/// dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[nsrcs-1][i] for i < count.
///
/// - `count` is in elements of `dtype`; count == 0 enqueues nothing. Every pointer must be
///   aligned to the element size (as any CUDA allocation or tensor element is).
/// - `srcs` is a host array of `nsrcs` >= 1 device pointers. `dst` may equal any source exactly
///   (in-place reduction); any other overlap between dst and a source is undefined.
/// - float16 and bfloat16 accumulate in float32 and round to nearest even once, at the end.
///   With more than kMaxReduceSources sources the work is split into launches that each round
///   once (the first reduces kMaxReduceSources sources into dst, the next ones fold dst with the
///   following kMaxReduceSources - 1 sources), so 16-bit floats then round once per launch.
/// - Integer sum and prod wrap around (two's complement); min and max compare with `<`, so the
///   result for NaN inputs is unspecified, as in the CPU kernels.
/// - ReduceOp::kAvg (floating dtypes only) is the sum multiplied by `avgFactor` in the
///   accumulation type just before the final rounding; avgFactor <= 0 means 1.0 / nsrcs. Callers
///   whose sum spans more buffers than these pass 1.0 / groupSize.
/// - Vectorised path: 16-byte loads and stores when dst and every source share the same address
///   offset modulo 16 (a scalar head and tail are peeled); otherwise element-wise loads.
///
/// Throws InvalidArgument for nsrcs < 1, a null or misaligned pointer with count > 0, an unknown
/// dtype or op, or kAvg on an integer dtype; CudaError when the launch fails.
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType dtype,
            ReduceOp op, void* stream, double avgFactor = 0.0);

/// dst[i] = src[i] * factor for i < count (floating dtypes only; dst may equal src). Finishes a
/// ReduceOp::kAvg whose sum was produced elsewhere (by NCCL or MPI). 16-bit floats are scaled
/// in float32 and rounded once. Throws InvalidArgument for an integer dtype.
void scale(void* dst, const void* src, size_t count, DataType dtype, double factor, void* stream);

/// One contiguous piece of a batched copy, in bytes, relative to the dst and src base pointers.
struct CopyRegion {
  size_t dstOffset = 0;
  size_t srcOffset = 0;
  size_t bytes = 0;
};

/// How copyRegions() moves the bytes.
enum class CopyMethod : int {
  kAuto = 0,    ///< kernel for small regions, cudaMemcpyAsync for very large ones
  kKernel = 1,  ///< batched copy kernels (one launch per kMaxRegionsPerLaunch regions)
  kMemcpy = 2,  ///< one cudaMemcpyAsync per region
};

/// Regions one batched copy kernel launch takes (they travel as kernel parameters).
inline constexpr int kMaxRegionsPerLaunch = 128;

/// Regions at least this large are copied with cudaMemcpyAsync under CopyMethod::kAuto.
inline constexpr size_t kMemcpyRegionBytes = size_t(64) << 20;

/// Copies each region: bytes [srcOffset, srcOffset + bytes) of src go to
/// [dstOffset, dstOffset + bytes) of dst. `regions` is a host array of n >= 0 entries; regions
/// with bytes == 0 are skipped. The destination ranges must not overlap one another, and no
/// destination range may overlap a source range (checked: InvalidArgument). Each region copies
/// with the widest access (16, 8, 4 or 1 bytes) that its two addresses allow.
void copyRegions(void* dst, const void* src, const CopyRegion* regions, int n, void* stream,
                 CopyMethod method = CopyMethod::kAuto);

/// Block permutation (a gather of equal blocks): dst block i = src block perm[i] for
/// i < nblocks, each block `blockBytes` bytes; dst holds nblocks blocks. `perm` is a host array;
/// a source block may appear more than once. dst and src must not overlap. Throws
/// InvalidArgument for perm[i] outside [0, nblocks) or overlapping buffers.
void permuteBlocks(void* dst, const void* src, size_t blockBytes, const int* perm, int nblocks,
                   void* stream, CopyMethod method = CopyMethod::kAuto);

/// Size in bytes of one element of `t` (fourd::dataTypeSize, which is defined in its header, so
/// this target still links on its own). Throws InvalidArgument for an unknown value.
size_t elementSize(DataType t);

}  // namespace fourd::cuda
