// CPU reduction kernels: every op and dtype, written so the compiler vectorises them.
// float16 and bfloat16 are converted to float32, reduced, and rounded to nearest even once per
// call (reduceMany accumulates all of its sources in float32 before rounding once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fourd/data_type.hpp"

namespace fourd::detail {

/// dst[i] = dst[i] (op) src[i] for i < count. ReduceOp::kAvg reduces as a sum (the caller
/// scales once at the end with scaleInPlace).
void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

/// dst[i] = a[i] (op) b[i]; dst may alias a or b.
void reduce2(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

/// dst[i] = srcs[0][i] (op) ... (op) srcs[n-1][i]; dst may alias any source. 16-bit floats
/// accumulate in float32 across all n sources and round once.
void reduceMany(void* dst, const void* const* srcs, int n, size_t count, DataType dtype,
                ReduceOp op);

/// memcpy for the collectives' bulk copies, without glibc's `rep movsb`: on this kind of VM
/// (AMD EPYC) glibc copies 8 KiB-1 MiB with it, which runs at 2.2 GB/s when the destination
/// sits 8 bytes past the source's 64-byte alignment (26-30 GB/s at 16 or 48 bytes, 38-79
/// aligned). Unaligned AVX2 loads and stores (SSE2 without AVX2) copy 31-50 GB/s at every
/// alignment; below 4 KiB, memcpy.
void copyCached(void* dst, const void* src, size_t bytes);
/// memmove through copyCached where the two ranges do not overlap.
inline void moveBytes(void* dst, const void* src, size_t bytes) {
  const char* d = static_cast<const char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (d + bytes <= s || s + bytes <= d) {
    copyCached(dst, src, bytes);
  } else if (dst != src) {
    std::memmove(dst, src, bytes);
  }
}
/// memcpy for a large destination that is not read again soon (a collective's output larger than
/// the caches): non-temporal stores on x86-64, which skip reading the destination's lines into
/// the cache before writing them (a third of a cached copy's memory traffic). 64 MiB in 512 KiB
/// pieces on this kind of VM (EPYC, 32 MiB L3): 17 GB/s against memcpy's 10.5. memcpy elsewhere.
void streamCopy(void* dst, const void* src, size_t bytes);
/// buf[i] *= factor (floating types only; used to finish ReduceOp::kAvg).
void scaleInPlace(void* buf, size_t count, DataType dtype, double factor);

/// Widening and narrowing for the float32-accumulation option (float16/bfloat16 <-> float32).
void toFloat32(float* dst, const void* src, size_t count, DataType dtype);
void fromFloat32(void* dst, const float* src, size_t count, DataType dtype);

/// Scalar conversions (exposed for tests).
float bf16ToFloat(uint16_t h) noexcept;
uint16_t floatToBf16(float f) noexcept;
float halfToFloat(uint16_t h) noexcept;
uint16_t floatToHalf(float f) noexcept;

}  // namespace fourd::detail
