// CPU reduction kernels. Plain loops over restrict pointers: GCC and Clang vectorise them at -O3
// (integer wrap-around is done in unsigned arithmetic, so no undefined behaviour blocks it).
// float16 / bfloat16 use branch-light bit conversions that also vectorise.
#include "internal/reduce_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "fourd/error.hpp"
#include "internal/cpu_dispatch.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fourd::detail {

namespace {

FOURD_INLINE uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
FOURD_INLINE float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

FOURD_INLINE float bf16ToF(uint16_t h) { return fromBits(static_cast<uint32_t>(h) << 16); }

FOURD_INLINE uint16_t fToBf16(float f) {
  uint32_t u = bits(f);
  // NaN stays a (quiet) NaN; everything else rounds to nearest, ties to even.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half <-> float, after F. Giesen's branch-light conversions (round to nearest even).
FOURD_INLINE float halfToF(uint16_t h) {
  const uint32_t shiftedExp = 0x7c00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = shiftedExp & o;
  o += (127u - 15u) << 23;
  float f;
  if (exp == shiftedExp) {
    o += (128u - 16u) << 23;  // Inf / NaN
    f = fromBits(o);
  } else if (exp == 0) {
    o += 1u << 23;  // subnormal: renormalise
    f = fromBits(o) - fromBits(113u << 23);
  } else {
    f = fromBits(o);
  }
  return fromBits(bits(f) | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

FOURD_INLINE uint16_t fToHalf(float ff) {
  const uint32_t f32infty = 255u << 23;
  const uint32_t f16max = (127u + 16u) << 23;
  const uint32_t denormMagicU = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = bits(ff);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t o;
  if (u >= f16max) {
    o = (u > f32infty) ? 0x7e00 : 0x7c00;
  } else if (u < (113u << 23)) {
    const float f = fromBits(u) + fromBits(denormMagicU);
    o = static_cast<uint16_t>(bits(f) - denormMagicU);
  } else {
    const uint32_t mantOdd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    u += mantOdd;
    o = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

// ---- element-wise binary ops --------------------------------------------------------------
template <typename T>
struct Wide {
  using type = T;  // arithmetic type used for sum/prod
};
// Integer sums and products wrap like two's-complement machines do, without UB.
template <>
struct Wide<int8_t> {
  using type = uint8_t;
};
template <>
struct Wide<int32_t> {
  using type = uint32_t;
};
template <>
struct Wide<int64_t> {
  using type = uint64_t;
};

template <typename T, ReduceOp Op>
FOURD_INLINE T apply(T a, T b) {
  using W = typename Wide<T>::type;
  if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) {
    return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
  } else if constexpr (Op == ReduceOp::kProd) {
    return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
  } else if constexpr (Op == ReduceOp::kMin) {
    return b < a ? b : a;
  } else {
    return a < b ? b : a;
  }
}

template <typename T, ReduceOp Op>
FOURD_CLONES void binaryNative(void* dstV, const void* aV, const void* bV, size_t n) {
  T* FOURD_RESTRICT dst = static_cast<T*>(dstV);
  const T* a = static_cast<const T*>(aV);
  const T* b = static_cast<const T*>(bV);
  if (dst == a) {
    const T* FOURD_RESTRICT bb = b;
    for (size_t i = 0; i < n; ++i) dst[i] = apply<T, Op>(dst[i], bb[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = apply<T, Op>(a[i], b[i]);
  }
}

template <bool IsBf16>
FOURD_INLINE float load16(uint16_t h) {
  if constexpr (IsBf16)
    return bf16ToF(h);
  else
    return halfToF(h);
}
template <bool IsBf16>
FOURD_INLINE uint16_t store16(float f) {
  if constexpr (IsBf16)
    return fToBf16(f);
  else
    return fToHalf(f);
}

template <bool IsBf16, ReduceOp Op>
FOURD_CLONES void binary16(void* dstV, const void* aV, const void* bV, size_t n) {
  uint16_t* dst = static_cast<uint16_t*>(dstV);
  const uint16_t* a = static_cast<const uint16_t*>(aV);
  const uint16_t* b = static_cast<const uint16_t*>(bV);
  for (size_t i = 0; i < n; ++i)
    dst[i] = store16<IsBf16>(apply<float, Op>(load16<IsBf16>(a[i]), load16<IsBf16>(b[i])));
}

using BinaryFn = void (*)(void*, const void*, const void*, size_t);

template <ReduceOp Op>
BinaryFn pickBinary(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return binaryNative<float, Op>;
    case DataType::kFloat64:
      return binaryNative<double, Op>;
    case DataType::kFloat16:
      return binary16<false, Op>;
    case DataType::kBFloat16:
      return binary16<true, Op>;
    case DataType::kInt8:
      return binaryNative<int8_t, Op>;
    case DataType::kUInt8:
      return binaryNative<uint8_t, Op>;
    case DataType::kInt32:
      return binaryNative<int32_t, Op>;
    case DataType::kInt64:
      return binaryNative<int64_t, Op>;
  }
  throw InvalidArgument("dtype: unknown data type");
}

BinaryFn binaryFor(DataType t, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return pickBinary<ReduceOp::kSum>(t);
    case ReduceOp::kProd:
      return pickBinary<ReduceOp::kProd>(t);
    case ReduceOp::kMin:
      return pickBinary<ReduceOp::kMin>(t);
    case ReduceOp::kMax:
      return pickBinary<ReduceOp::kMax>(t);
  }
  throw InvalidArgument("op: unknown reduce op");
}

// Elements per tile for the float32-accumulating 16-bit path (fits in L1 with the sources).
constexpr size_t kTile = 2048;

template <bool IsBf16, ReduceOp Op>
FOURD_CLONES void many16(void* dstV, const void* const* srcs, int n, size_t count) {
  float acc[kTile];
  uint16_t* dst = static_cast<uint16_t*>(dstV);
  for (size_t base = 0; base < count; base += kTile) {
    const size_t m = std::min(kTile, count - base);
    const uint16_t* s0 = static_cast<const uint16_t*>(srcs[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = load16<IsBf16>(s0[i]);
    for (int s = 1; s < n; ++s) {
      const uint16_t* src = static_cast<const uint16_t*>(srcs[s]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = apply<float, Op>(acc[i], load16<IsBf16>(src[i]));
    }
    for (size_t i = 0; i < m; ++i) dst[base + i] = store16<IsBf16>(acc[i]);
  }
}

template <ReduceOp Op>
void many16Dispatch(DataType t, void* dst, const void* const* srcs, int n, size_t count) {
  if (t == DataType::kBFloat16)
    many16<true, Op>(dst, srcs, n, count);
  else
    many16<false, Op>(dst, srcs, n, count);
}

}  // namespace

float bf16ToFloat(uint16_t h) noexcept { return bf16ToF(h); }
uint16_t floatToBf16(float f) noexcept { return fToBf16(f); }
float halfToFloat(uint16_t h) noexcept { return halfToF(h); }
uint16_t floatToHalf(float f) noexcept { return fToHalf(f); }

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  binaryFor(dtype, op)(dst, dst, src, count);
}

void reduce2(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  binaryFor(dtype, op)(dst, a, b, count);
}

void reduceMany(void* dst, const void* const* srcs, int n, size_t count, DataType dtype,
                ReduceOp op) {
  if (count == 0 || n <= 0) return;
  if (n == 1) {
    if (dst != srcs[0]) moveBytes(dst, srcs[0], count * dataTypeSize(dtype));
    return;
  }
  if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return many16Dispatch<ReduceOp::kSum>(dtype, dst, srcs, n, count);
      case ReduceOp::kProd:
        return many16Dispatch<ReduceOp::kProd>(dtype, dst, srcs, n, count);
      case ReduceOp::kMin:
        return many16Dispatch<ReduceOp::kMin>(dtype, dst, srcs, n, count);
      case ReduceOp::kMax:
        return many16Dispatch<ReduceOp::kMax>(dtype, dst, srcs, n, count);
    }
  }
  // Native types: pairwise in cache-sized tiles so dst stays hot. The first step writes dst
  // before sources 2.. are read, so a source that dst aliases must come first (all the ops are
  // commutative and associative on these types, up to floating-point rounding order).
  for (int s = 2; s < n; ++s) {
    if (srcs[s] == dst) {
      std::vector<const void*> reordered(srcs, srcs + n);
      std::swap(reordered[0], reordered[s]);
      return reduceMany(dst, reordered.data(), n, count, dtype, op);
    }
  }
  const BinaryFn f = binaryFor(dtype, op);
  const size_t es = dataTypeSize(dtype);
  const size_t tile = std::max<size_t>(1, (32 * 1024) / es);
  for (size_t base = 0; base < count; base += tile) {
    const size_t m = std::min(tile, count - base);
    char* d = static_cast<char*>(dst) + base * es;
    f(d, static_cast<const char*>(srcs[0]) + base * es,
      static_cast<const char*>(srcs[1]) + base * es, m);
    for (int s = 2; s < n; ++s) f(d, d, static_cast<const char*>(srcs[s]) + base * es, m);
  }
}

void scaleInPlace(void* buf, size_t count, DataType dtype, double factor) {
  switch (dtype) {
    case DataType::kFloat32: {
      float* p = static_cast<float*>(buf);
      const float s = static_cast<float>(factor);
      for (size_t i = 0; i < count; ++i) p[i] *= s;
      return;
    }
    case DataType::kFloat64: {
      double* p = static_cast<double*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] *= factor;
      return;
    }
    case DataType::kBFloat16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      const float s = static_cast<float>(factor);
      for (size_t i = 0; i < count; ++i) p[i] = fToBf16(bf16ToF(p[i]) * s);
      return;
    }
    case DataType::kFloat16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      const float s = static_cast<float>(factor);
      for (size_t i = 0; i < count; ++i) p[i] = fToHalf(halfToF(p[i]) * s);
      return;
    }
    default:
      throw InvalidArgument("op: 'avg' needs a floating dtype; found " + toString(dtype));
  }
}

void toFloat32(float* dst, const void* src, size_t count, DataType dtype) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (dtype == DataType::kBFloat16) {
    for (size_t i = 0; i < count; ++i) dst[i] = bf16ToF(s[i]);
  } else if (dtype == DataType::kFloat16) {
    for (size_t i = 0; i < count; ++i) dst[i] = halfToF(s[i]);
  } else {
    throw InvalidArgument("dtype: float32 accumulation applies to float16/bfloat16; found " +
                          toString(dtype));
  }
}

void fromFloat32(void* dst, const float* src, size_t count, DataType dtype) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dtype == DataType::kBFloat16) {
    for (size_t i = 0; i < count; ++i) d[i] = fToBf16(src[i]);
  } else if (dtype == DataType::kFloat16) {
    for (size_t i = 0; i < count; ++i) d[i] = fToHalf(src[i]);
  } else {
    throw InvalidArgument("dtype: float32 accumulation applies to float16/bfloat16; found " +
                          toString(dtype));
  }
}

#if defined(__x86_64__)
namespace {

// 128 bytes a step: unaligned AVX2 loads and stores, the rest by memcpy.
__attribute__((target("avx2"))) void copyAvx2(char* FOURD_RESTRICT d, const char* FOURD_RESTRICT s,
                                              size_t bytes) {
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    for (size_t k = 0; k < 128; k += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + k), v);
    }
  }
  std::memcpy(d + i, s + i, bytes - i);
}

// 64 bytes a step: unaligned SSE2 loads, stores through the cache or streamed (kStream: d is
// 16-byte aligned), the rest by memcpy.
template <bool kStream>
void copySse2(char* FOURD_RESTRICT d, const char* FOURD_RESTRICT s, size_t bytes) {
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    for (size_t k = 0; k < 64; k += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + k));
      if constexpr (kStream) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + k), v);
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + k), v);
      }
    }
  }
  std::memcpy(d + i, s + i, bytes - i);
}

}  // namespace
#endif

void copyCached(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (bytes >= 4096 && dst != src) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    return avx2 ? copyAvx2(d, s, bytes) : copySse2<false>(d, s, bytes);
  }
#endif
  if (bytes) std::memcpy(dst, src, bytes);
}

void streamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);  // up to the destination's first 16-byte boundary
  copySse2<true>(d + head, s + head, bytes - head);
  _mm_sfence();  // the streamed stores are ordered before whatever signals that they are done
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace fourd::detail
