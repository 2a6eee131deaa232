// Element-wise reduction kernels (private to cuda/). Included by reduce_float.cu,
// reduce_half.cu and reduce_int.cu, which instantiate launchReduce<T> for their types.
//
// One kernel per (type, op): a grid-stride loop over 16-byte vectors. Each thread keeps kUnroll
// vectors in flight per source before combining them, so a warp has several independent 16-byte
// loads outstanding: that, not arithmetic, is what a memory-bound reduction needs to approach
// the copy bandwidth. The few elements before the first 16-byte boundary and after the last
// one go through a scalar grid-stride loop in the same launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernel_common.cuh"

namespace fourd::cuda::detail {

// ---- accumulation types: 16-bit floats accumulate in float32 and round once --------------------
template <typename T>
struct AccumOf {
  using type = T;
};
template <>
struct AccumOf<__half> {
  using type = float;
};
template <>
struct AccumOf<__nv_bfloat16> {
  using type = float;
};

template <typename T>
__device__ __forceinline__ typename AccumOf<T>::type toAccum(T v) {
  return v;
}
template <>
__device__ __forceinline__ float toAccum<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float toAccum<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T fromAccum(typename AccumOf<T>::type v) {
  return v;
}
template <>
__device__ __forceinline__ __half fromAccum<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromAccum<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- the operators ----------------------------------------------------------------------------
// Integer sum and product wrap around without undefined behaviour: they are computed in the
// unsigned type of the same width, as the CPU kernels do, so CPU and GPU paths agree bit for bit.
template <typename A>
struct WrapOf {
  using type = A;
};
template <>
struct WrapOf<int8_t> {
  using type = uint8_t;
};
template <>
struct WrapOf<int32_t> {
  using type = uint32_t;
};
template <>
struct WrapOf<int64_t> {
  using type = uint64_t;
};

template <ReduceOp Op, typename A>
__device__ __forceinline__ A applyOp(A a, A b) {
  using W = typename WrapOf<A>::type;
  if constexpr (Op == ReduceOp::kSum) {
    return static_cast<A>(static_cast<W>(a) + static_cast<W>(b));
  } else if constexpr (Op == ReduceOp::kProd) {
    return static_cast<A>(static_cast<W>(a) * static_cast<W>(b));
  } else if constexpr (Op == ReduceOp::kMin) {
    return b < a ? b : a;
  } else {
    return a < b ? b : a;
  }
}

// ---- vectors ----------------------------------------------------------------------------------
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kLanes = 16 / sizeof(T);
  T e[kLanes];
};

// Vectors in flight per thread and source: up to 4, with at most 16 accumulator lanes per thread
// (float32 4 x 4, float16 2 x 8, int8 1 x 16) so that everything stays in registers at
// kMinBlocksPerSm resident blocks.
template <typename T>
struct UnrollOf {
  static constexpr int kLanes = Vec16<T>::kLanes;
  static constexpr int value = kLanes * 4 <= 16 ? 4 : (16 / kLanes > 0 ? 16 / kLanes : 1);
};

// At least 4 resident blocks of kThreads per SM (<= 64 registers a thread): half of the SM's
// threads, each with UnrollOf<T> 16-byte loads in flight per source, cover the memory latency
// (Little's law: ~25 KB in flight per SM at ~5 TB/s and ~0.7 us on an H200).
inline constexpr int kMinBlocksPerSm = 4;

// Reduces vectors base, base + stride, ..., base + (U - 1) * stride of the body. Check = false
// for full tiles (no bounds tests, so no predicates held across the source loop).
template <typename T, ReduceOp Op, bool Scale, bool Check>
__device__ __forceinline__ void reduceVectors(const ReduceParams& p, size_t base, size_t stride,
                                              typename AccumOf<T>::type factor) {
  using A = typename AccumOf<T>::type;
  using V = Vec16<T>;
  constexpr int kLanes = V::kLanes;
  constexpr int kUnroll = UnrollOf<T>::value;
  A acc[kUnroll][kLanes];
  {
    const V* s = reinterpret_cast<const V*>(static_cast<const T*>(p.srcs[0]) + p.head);
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // Out-of-range lanes of the last tile read as zeros; they are never stored.
      v[u] = (!Check || base + u * stride < p.nvec) ? s[base + u * stride] : V{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < kLanes; ++k) acc[u][k] = toAccum(v[u].e[k]);
    }
  }
  // Not unrolled: unrolling over sources multiplies the registers held by in-flight loads.
#pragma unroll 1
  for (int j = 1; j < p.nsrcs; ++j) {
    const V* s = reinterpret_cast<const V*>(static_cast<const T*>(p.srcs[j]) + p.head);
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      v[u] = (!Check || base + u * stride < p.nvec) ? s[base + u * stride] : V{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < kLanes; ++k) acc[u][k] = applyOp<Op>(acc[u][k], toAccum(v[u].e[k]));
    }
  }
  V* d = reinterpret_cast<V*>(static_cast<T*>(p.dst) + p.head);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (!Check || base + u * stride < p.nvec) {
      V out;
#pragma unroll
      for (int k = 0; k < kLanes; ++k) {
        out.e[k] = fromAccum<T>(Scale ? static_cast<A>(acc[u][k] * factor) : acc[u][k]);
      }
      d[base + u * stride] = out;
    }
  }
}

template <typename T, ReduceOp Op, bool Scale>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    reduceKernel(const __grid_constant__ ReduceParams p) {
  using A = typename AccumOf<T>::type;
  constexpr int kLanes = Vec16<T>::kLanes;
  constexpr int kUnroll = UnrollOf<T>::value;

  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const A factor = static_cast<A>(p.factor);

  // Body: 16-byte vectors (every pointer + head is 16-byte aligned, checked by the host), in
  // tiles of nthreads * kUnroll vectors; only the last, partial tile tests bounds.
  const size_t tile = nthreads * kUnroll;
  const size_t fullTiles = p.nvec / tile;
  size_t base = tid;
  for (size_t t = 0; t < fullTiles; ++t, base += tile) {
    reduceVectors<T, Op, Scale, false>(p, base, nthreads, factor);
  }
  if (base < p.nvec) reduceVectors<T, Op, Scale, true>(p, base, nthreads, factor);

  // Head and tail (and everything, when the buffers are not mutually aligned): one element per
  // thread and iteration.
  T* dst = static_cast<T*>(p.dst);
  const size_t bodyEnd = p.head + p.nvec * kLanes;
  const size_t nscalar = p.head + (p.count - bodyEnd);
  for (size_t j = tid; j < nscalar; j += nthreads) {
    const size_t i = j < p.head ? j : bodyEnd + (j - p.head);
    A a = toAccum(static_cast<const T*>(p.srcs[0])[i]);
#pragma unroll 1
    for (int s = 1; s < p.nsrcs; ++s) {
      a = applyOp<Op>(a, toAccum(static_cast<const T*>(p.srcs[s])[i]));
    }
    dst[i] = fromAccum<T>(Scale ? static_cast<A>(a * factor) : a);
  }
}

template <typename T, ReduceOp Op, bool Scale>
void launchReduceKernel(const ReduceParams& p, cudaStream_t stream) {
  // Occupancy depends only on the kernel and the architecture: ask once per instantiation.
  static const int blocksPerSm = [] {
    int n = 0;
    check(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, reduceKernel<T, Op, Scale>, kThreads, 0),
        "reduce (occupancy query)");
    return n;
  }();
  const size_t vecWork = (p.nvec + UnrollOf<T>::value - 1) / UnrollOf<T>::value;
  const size_t scalarWork = p.count - p.nvec * Vec16<T>::kLanes;
  const unsigned grid = gridFor(vecWork > scalarWork ? vecWork : scalarWork, blocksPerSm);
  reduceKernel<T, Op, Scale><<<grid, kThreads, 0, stream>>>(p);
  checkLaunch("reduce (kernel launch)");
}

template <typename T>
void launchReduce(const ReduceParams& p, ReduceOp op, cudaStream_t stream) {
  switch (op) {
    case ReduceOp::kSum:
      return launchReduceKernel<T, ReduceOp::kSum, false>(p, stream);
    case ReduceOp::kProd:
      return launchReduceKernel<T, ReduceOp::kProd, false>(p, stream);
    case ReduceOp::kMin:
      return launchReduceKernel<T, ReduceOp::kMin, false>(p, stream);
    case ReduceOp::kMax:
      return launchReduceKernel<T, ReduceOp::kMax, false>(p, stream);
    case ReduceOp::kAvg:
      if constexpr (std::is_floating_point_v<typename AccumOf<T>::type>) {
        return launchReduceKernel<T, ReduceOp::kSum, true>(p, stream);
      }
      break;
  }
  throw InvalidArgument("op: not supported for this dtype by the CUDA reduce kernel");
}

}  // namespace fourd::cuda::detail
