// CPU reduction kernels: every op and dtype, written so the compiler vectorises them.
// float16 and bfloat16 are converted to float32, reduced, and rounded to nearest even once per
// call (reduceMany accumulates all of its sources in float32 before rounding once).
#pragma once

#include <cstddef>
#include <cstdint>

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
