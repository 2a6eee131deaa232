// Host side of fourd's CUDA kernels: argument checks, dispatch on dtype, device queries and the
// mapping of CUDA errors to fourd::cuda::CudaError.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "fourd_cuda.hpp"
#include "kernel_common.cuh"

namespace fourd::cuda {

namespace detail {

void throwCudaError(cudaError_t err, const char* what) {
  throw CudaError(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + ": " +
                      cudaGetErrorString(err),
                  static_cast<int>(err));
}

int multiProcessorCount() {
  // Cached per device: the attribute query costs a driver call, and this runs on every launch.
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev >= 0 && dev < kMaxDevices) {
    const int cached = cache[dev].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int n = 0;
  check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
        "cudaDeviceGetAttribute(multiProcessorCount)");
  if (n <= 0) n = 1;
  if (dev >= 0 && dev < kMaxDevices) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace detail

namespace {

using detail::ReduceParams;

const char* dtypeName(DataType t) {
  const char* name = fourd::detail::dataTypeName(t);
  return name != nullptr ? name : "unknown";
}

void checkOp(ReduceOp op, DataType dtype) {
  const int v = static_cast<int>(op);
  if (v < 0 || v >= kNumReduceOps) {
    throw InvalidArgument("op: expected sum, prod, min, max or avg; found the value " +
                          std::to_string(v));
  }
  if (op == ReduceOp::kAvg && !isFloating(dtype)) {
    throw InvalidArgument(std::string("op: 'avg' needs a floating dtype; found ") +
                          dtypeName(dtype));
  }
}

// A misaligned element pointer would fault inside the kernel ("misaligned address"), and that
// error is sticky: it would poison the whole CUDA context. Refuse it here instead.
void checkPointer(const void* p, size_t elemSize, DataType dtype, const char* argName) {
  if (p == nullptr) throw InvalidArgument(std::string(argName) + ": null pointer with count > 0");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % elemSize != 0) {
    throw InvalidArgument(std::string(argName) + ": expected an address aligned to " +
                          std::to_string(elemSize) + " bytes for " + dtypeName(dtype) +
                          "; found an offset of " + std::to_string(a % elemSize));
  }
}

// Splits the buffers into a scalar head, a 16-byte aligned body and a scalar tail. The body
// exists only when all addresses share the same offset modulo 16 (then one head length aligns
// them all) and that offset is a whole number of elements.
void planAlignment(ReduceParams& p, size_t elemSize) {
  const uintptr_t mis = reinterpret_cast<uintptr_t>(p.dst) & 15u;
  bool same = mis % elemSize == 0;
  for (int i = 0; i < p.nsrcs && same; ++i) {
    same = (reinterpret_cast<uintptr_t>(p.srcs[i]) & 15u) == mis;
  }
  if (!same) {
    p.head = p.count;
    p.nvec = 0;
    return;
  }
  const size_t lanes = 16 / elemSize;
  p.head = std::min(p.count, mis == 0 ? size_t(0) : (16 - mis) / elemSize);
  p.nvec = (p.count - p.head) / lanes;
}

void launch(const ReduceParams& p, DataType dtype, ReduceOp op, cudaStream_t stream) {
  switch (dtype) {
    case DataType::kFloat32:
      return detail::launchReduce<float>(p, op, stream);
    case DataType::kFloat64:
      return detail::launchReduce<double>(p, op, stream);
    case DataType::kFloat16:
      return detail::launchReduce<__half>(p, op, stream);
    case DataType::kBFloat16:
      return detail::launchReduce<__nv_bfloat16>(p, op, stream);
    case DataType::kInt8:
      return detail::launchReduce<int8_t>(p, op, stream);
    case DataType::kUInt8:
      return detail::launchReduce<uint8_t>(p, op, stream);
    case DataType::kInt32:
      return detail::launchReduce<int32_t>(p, op, stream);
    case DataType::kInt64:
      return detail::launchReduce<int64_t>(p, op, stream);
  }
  throw InvalidArgument("dtype: unknown data type");
}

}  // namespace

size_t elementSize(DataType t) {
  if (const size_t size = dataTypeSize(t)) return size;
  throw InvalidArgument(
      "dtype: expected one of float32, float64, float16, bfloat16, int8, uint8, "
      "int32, int64; found the value " +
      std::to_string(static_cast<int>(t)));
}

int deviceCount(std::string* whyNone) noexcept {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // Clear the (non-sticky) error so it does not surface at the next unrelated launch check.
    (void)cudaGetLastError();
    if (whyNone != nullptr) {
      try {
        *whyNone = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
      } catch (...) {
      }
    }
    return 0;
  }
  if (n == 0 && whyNone != nullptr) {
    try {
      *whyNone = "the CUDA runtime reports 0 devices";
    } catch (...) {
    }
  }
  return n;
}

void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType dtype,
            ReduceOp op, void* stream, double avgFactor) {
  const size_t es = elementSize(dtype);
  checkOp(op, dtype);
  if (nsrcs < 1) {
    throw InvalidArgument("nsrcs: expected at least 1 source buffer; found " +
                          std::to_string(nsrcs));
  }
  if (srcs == nullptr) throw InvalidArgument("srcs: expected a host array of pointers; found null");
  if (count == 0) return;
  checkPointer(dst, es, dtype, "dst");
  for (int i = 0; i < nsrcs; ++i) {
    checkPointer(srcs[i], es, dtype, ("srcs[" + std::to_string(i) + "]").c_str());
  }
  const double factor = avgFactor > 0.0 ? avgFactor : 1.0 / nsrcs;
  cudaStream_t s = static_cast<cudaStream_t>(stream);

  if (nsrcs <= kMaxReduceSources) {
    ReduceParams p{};
    p.dst = dst;
    p.nsrcs = nsrcs;
    std::copy(srcs, srcs + nsrcs, p.srcs);
    p.count = count;
    p.factor = factor;
    planAlignment(p, es);
    launch(p, dtype, op, s);
    return;
  }

  // More sources than one launch takes: the first launch reduces kMaxReduceSources sources into
  // dst, each later one folds dst with the next kMaxReduceSources - 1. A source that *is* dst must
  // be read before the first launch overwrites it, so it moves to the front (the operators are
  // commutative; only the rounding order of floating sums changes).
  std::vector<const void*> order(srcs, srcs + nsrcs);
  const auto alias = std::find(order.begin(), order.end(), static_cast<const void*>(dst));
  if (alias != order.end()) std::rotate(order.begin(), alias, alias + 1);
  int done = 0;
  while (done < nsrcs) {
    ReduceParams p{};
    p.dst = dst;
    int k = 0;
    if (done > 0) p.srcs[k++] = dst;
    const int take = std::min(kMaxReduceSources - k, nsrcs - done);
    for (int i = 0; i < take; ++i) p.srcs[k++] = order[done + i];
    done += take;
    p.nsrcs = k;
    p.count = count;
    p.factor = factor;
    planAlignment(p, es);
    // avg: plain sums until the last launch, which scales once.
    const ReduceOp passOp = (op == ReduceOp::kAvg && done < nsrcs) ? ReduceOp::kSum : op;
    launch(p, dtype, passOp, s);
  }
}

void scale(void* dst, const void* src, size_t count, DataType dtype, double factor, void* stream) {
  const size_t es = elementSize(dtype);
  if (!isFloating(dtype)) {
    throw InvalidArgument(std::string("dtype: scale needs a floating dtype; found ") +
                          dtypeName(dtype));
  }
  if (count == 0) return;
  checkPointer(dst, es, dtype, "dst");
  checkPointer(src, es, dtype, "src");
  ReduceParams p{};
  p.dst = dst;
  p.srcs[0] = src;
  p.nsrcs = 1;
  p.count = count;
  p.factor = factor;
  planAlignment(p, es);
  launch(p, dtype, ReduceOp::kAvg, static_cast<cudaStream_t>(stream));
}

}  // namespace fourd::cuda
