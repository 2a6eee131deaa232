// bf16: float32/float64 rounded to bfloat16 (8 significant bits), round to nearest even, and
// widened back on decode.
//
// Format: count little-endian bfloat16 values (2 * count bytes). NaN stays NaN (quiet), Inf stays
// Inf, -0.0 stays -0.0; magnitudes of (2 - 2^-8) * 2^127 and above become Inf (RNE overflow).
//
// float64 is rounded to bfloat16 in one correctly rounded step: first to float32 with
// round-to-odd (truncate, then set the last bit when inexact), then to bfloat16 with RNE. Going
// through float32 with RNE instead would round twice and could miss the nearest bfloat16 by one
// unit on ties; round-to-odd at 24 bits is exact for a final rounding to 8 bits (24 >= 8 + 2).
//
// Error: |decode(encode(x)) - x| <= 2^-8 |x| for |x| >= 2^-126 (half a unit in the last of 8
// significant bits), <= 2^-134 below (half the spacing of bfloat16's subnormals).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "fourd/error.hpp"
#include "internal/codec.hpp"
#include "internal/cpu_dispatch.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

namespace {

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float64 -> float32 rounded to odd: the nearest float32 toward zero, with its last bit set when
// the conversion was inexact. NaN and Inf pass unchanged; overflow gives FLT_MAX (odd).
inline float toFloatOdd(double d) {
  const float f = static_cast<float>(d);  // RNE
  uint32_t u = bitsOf(f);
  const double back = static_cast<double>(f);
  const bool inexact = back != d && d == d;
  u -= (inexact && std::fabs(back) > std::fabs(d)) ? 1u : 0u;  // step back toward zero
  u |= inexact ? 1u : 0u;
  return floatOf(u);
}

FOURD_CLONES void encode64(const double* x, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = floatToBf16(toFloatOdd(x[i]));
}
FOURD_CLONES void decode64(const uint16_t* h, size_t n, double* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(floatOf(uint32_t{h[i]} << 16));
}

class Bf16Codec final : public Codec {
 public:
  Bf16Codec(const CodecSpec& spec, DataType t) : spec_(spec), dtype_(t) {}
  const CodecSpec& spec() const noexcept override { return spec_; }
  DataType dtype() const noexcept override { return dtype_; }
  size_t maxEncodedBytes(size_t count) const noexcept override { return 2 * count; }

  size_t encode(const void* src, size_t count, void* dst) const override {
    uint16_t* out = static_cast<uint16_t*>(dst);
    if (dtype_ == DataType::kFloat32) {
      fromFloat32(out, static_cast<const float*>(src), count, DataType::kBFloat16);
    } else {
      encode64(static_cast<const double*>(src), count, out);
    }
    return 2 * count;
  }

  void decode(const void* src, size_t bytes, size_t count, void* dst) const override {
    if (bytes != 2 * count) {
      throw BackendError("compression: corrupt bf16 message: " + std::to_string(bytes) +
                             " bytes for " + std::to_string(count) + " elements (expected " +
                             std::to_string(2 * count) + ")",
                         0);
    }
    if (dtype_ == DataType::kFloat32) {
      toFloat32(static_cast<float*>(dst), src, count, DataType::kBFloat16);
    } else {
      decode64(static_cast<const uint16_t*>(src), count, static_cast<double*>(dst));
    }
  }

  double roundTripBound(double absmax) const noexcept override {
    // RNE overflows to Inf from the midpoint between bfloat16's largest finite value and 2^128.
    constexpr double kOverflow = 0x1.ffp127;  // (2 - 2^-8) * 2^127
    if (!(absmax < kOverflow)) return std::numeric_limits<double>::infinity();
    return std::max(absmax * 0x1p-8, 0x1p-134);
  }

 private:
  CodecSpec spec_;
  DataType dtype_;
};

}  // namespace

std::unique_ptr<Codec> makeBf16Codec(const CodecSpec& spec, DataType t) {
  return std::make_unique<Bf16Codec>(spec, t);
}

}  // namespace fourd::detail
