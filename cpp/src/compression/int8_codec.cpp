// int8, int8:block=B: block-scaled 8-bit quantisation (ZeRO++'s), float32/float64/float16/
// bfloat16. Each block of B values (256 by default; the last block may be shorter) stores
// scale = absmax / 127 as a float32 and q = round(x / scale), clamped to [-127, 127], as int8;
// decode is q * scale.
//
// Format: the ceil(count / B) float32 scales, then the count int8 values (count + 4 * ceil(count
// / B) bytes). 0 elements encode to 0 bytes. A block holding Inf or NaN (or, from float64, a
// scale beyond float32's range) stores a NaN scale and decodes to NaN, so a non-finite gradient
// is never silently made finite. float16/bfloat16 are widened to float32 (exactly) on encode and
// rounded back (RNE) on decode, with the kernels of reduce_kernels.cpp.
//
// Error: a block's values are within half a step, scale / 2 = absmax_block / 254, plus the
// float32 rounding of scale, 1 / scale, x / scale and q * scale (a few units of 2^-24
// absmax_block) and, for float16/bfloat16, the final rounding to 11 or 8 significant bits.
//
// Speed: the loops over a block are branch-free, so the compiler vectorises them, and they are
// compiled for AVX-512, AVX2 and baseline x86-64 (picked at load time, as reduce_kernels.cpp).
// Rounding to the nearest integer adds and subtracts 1.5 * 2^23 (exact for |v| < 2^22), which
// vectorises without SSE4.1's round instruction.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fourd/error.hpp"
#include "internal/codec.hpp"
#include "internal/cpu_dispatch.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

namespace {

constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23

inline float rint127(float v) {
  const float r = (v + kRoundMagic) - kRoundMagic;  // RNE for |v| < 2^22
  return std::min(127.0f, std::max(-127.0f, r));
}

// Largest |x| of a block as float bits: an integer max, so NaN (above Inf) is never lost.
inline uint32_t absmaxBits(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    m = std::max(m, u & 0x7fffffffu);
  }
  return m;
}

inline uint64_t absmaxBits(const double* x, size_t n) {
  uint64_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t u;
    std::memcpy(&u, &x[i], 8);
    m = std::max(m, u & uint64_t{0x7fffffffffffffff});
  }
  return m;
}

// A block's scale (float32); NaN for a block that holds Inf/NaN or whose scale overflows.
inline float scaleOf(float absmax) {
  return std::isfinite(absmax) ? absmax / 127.0f : std::numeric_limits<float>::quiet_NaN();
}
inline float scaleOf(double absmax) {
  const float s = std::isfinite(absmax) ? static_cast<float>(absmax / 127.0) : INFINITY;
  return std::isfinite(s) ? s : std::numeric_limits<float>::quiet_NaN();
}

// q = round(x / s). A normal scale has a finite inverse in float32; a subnormal or zero one
// (blocks below about 1e-36) is handled in float64, where nothing overflows.
template <typename T>
inline void quantize(const T* x, size_t n, float s, int8_t* q) {
  if (!(s >= 0x1p-126f)) {
    const double inv = s > 0.0f ? 1.0 / static_cast<double>(s) : 0.0;  // 0 for NaN, 0
    for (size_t i = 0; i < n; ++i) {
      const double v = std::nearbyint(static_cast<double>(x[i]) * inv);
      q[i] = static_cast<int8_t>(std::min(127.0, std::max(-127.0, v)));
    }
    return;
  }
  if constexpr (sizeof(T) == 4) {
    const float inv = 1.0f / s;
    for (size_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(rint127(x[i] * inv));
  } else {
    const double inv = 1.0 / static_cast<double>(s);
    for (size_t i = 0; i < n; ++i) {
      q[i] = static_cast<int8_t>(rint127(static_cast<float>(x[i] * inv)));
    }
  }
}

template <typename T>
FOURD_CLONES void encodeBlocks(const T* x, size_t count, size_t block, float* scales, int8_t* q) {
  for (size_t b = 0, off = 0; off < count; ++b, off += block) {
    const size_t n = std::min(block, count - off);
    const auto m = absmaxBits(x + off, n);
    T absmax;
    std::memcpy(&absmax, &m, sizeof(T));
    const float s = scaleOf(absmax);
    scales[b] = s;
    quantize(x + off, n, s, q + off);
  }
}

template <typename T>
FOURD_CLONES void decodeBlocks(const float* scales, const int8_t* q, size_t count, size_t block,
                               T* y) {
  for (size_t b = 0, off = 0; off < count; ++b, off += block) {
    const size_t n = std::min(block, count - off);
    const T s = static_cast<T>(scales[b]);
    for (size_t i = 0; i < n; ++i) y[off + i] = static_cast<T>(q[off + i]) * s;
  }
}

class Int8Codec final : public Codec {
 public:
  Int8Codec(const CodecSpec& spec, DataType t)
      : spec_(spec), dtype_(t), block_(static_cast<size_t>(spec.param)) {}
  const CodecSpec& spec() const noexcept override { return spec_; }
  DataType dtype() const noexcept override { return dtype_; }

  size_t maxEncodedBytes(size_t count) const noexcept override { return count + 4 * blocks(count); }

  size_t encode(const void* src, size_t count, void* dst) const override {
    char* out = static_cast<char*>(dst);
    const size_t nb = blocks(count);
    // The scales go through a float32 array of their own: dst need not be 4-aligned.
    std::vector<float> scales(nb);
    int8_t* q = reinterpret_cast<int8_t*>(out + 4 * nb);
    if (dtype_ == DataType::kFloat32) {
      encodeBlocks(static_cast<const float*>(src), count, block_, scales.data(), q);
    } else if (dtype_ == DataType::kFloat64) {
      encodeBlocks(static_cast<const double*>(src), count, block_, scales.data(), q);
    } else {
      encode16(src, count, scales.data(), q);
    }
    if (nb) std::memcpy(out, scales.data(), 4 * nb);
    return maxEncodedBytes(count);
  }

  void decode(const void* src, size_t bytes, size_t count, void* dst) const override {
    if (bytes != maxEncodedBytes(count)) {
      throw BackendError("compression: corrupt int8 message: " + std::to_string(bytes) +
                             " bytes for " + std::to_string(count) + " elements (expected " +
                             std::to_string(maxEncodedBytes(count)) + ")",
                         0);
    }
    const char* in = static_cast<const char*>(src);
    const size_t nb = blocks(count);
    std::vector<float> scales(nb);
    if (nb) std::memcpy(scales.data(), in, 4 * nb);
    const int8_t* q = reinterpret_cast<const int8_t*>(in + 4 * nb);
    if (dtype_ == DataType::kFloat32) {
      decodeBlocks(scales.data(), q, count, block_, static_cast<float*>(dst));
    } else if (dtype_ == DataType::kFloat64) {
      decodeBlocks(scales.data(), q, count, block_, static_cast<double*>(dst));
    } else {
      decode16(scales.data(), q, count, dst);
    }
  }

  double roundTripBound(double absmax) const noexcept override;

 private:
  size_t blocks(size_t count) const noexcept { return (count + block_ - 1) / block_; }

  // float16/bfloat16: through float32, one block at a time.
  void encode16(const void* src, size_t count, float* scales, int8_t* q) const {
    std::vector<float> tmp(std::min(block_, count));
    const char* in = static_cast<const char*>(src);
    for (size_t b = 0, off = 0; off < count; ++b, off += block_) {
      const size_t n = std::min(block_, count - off);
      toFloat32(tmp.data(), in + 2 * off, n, dtype_);
      encodeBlocks(tmp.data(), n, block_, scales + b, q + off);
    }
  }
  void decode16(const float* scales, const int8_t* q, size_t count, void* dst) const {
    std::vector<float> tmp(std::min(block_, count));
    char* out = static_cast<char*>(dst);
    for (size_t b = 0, off = 0; off < count; ++b, off += block_) {
      const size_t n = std::min(block_, count - off);
      decodeBlocks(scales + b, q + off, n, block_, tmp.data());
      fromFloat32(out + 2 * off, tmp.data(), n, dtype_);
    }
  }

  CodecSpec spec_;
  DataType dtype_;
  size_t block_;
};

double Int8Codec::roundTripBound(double absmax) const noexcept {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double eps = 0x1p-24;
  // The stored scale, at most: absmax / 127 rounded up to float32, or a subnormal's error.
  const double s = absmax / 127.0 * (1.0 + eps) + 0x1p-149;
  if (!(s < static_cast<double>(std::numeric_limits<float>::max()))) return kInf;
  // Half a step; x / s off by 2 roundings moves q by one only within 254 eps of a tie; q * s
  // rounds once more; a subnormal scale adds at most 127 of its units.
  double b = s * (0.5 + 256.0 * eps) + eps * (absmax + s) + 0x1p-142;
  if (dtype_ == DataType::kFloat16) {
    if (!(absmax + b < 65520.0)) return kInf;
    b += 0x1p-11 * (absmax + b) + 0x1p-25;
  } else if (dtype_ == DataType::kBFloat16) {
    if (!(absmax + b < 0x1.ffp127)) return kInf;
    b += 0x1p-8 * (absmax + b) + 0x1p-134;
  }
  return b;
}

}  // namespace

std::unique_ptr<Codec> makeInt8Codec(const CodecSpec& spec, DataType t) {
  return std::make_unique<Int8Codec>(spec, t);
}

}  // namespace fourd::detail
