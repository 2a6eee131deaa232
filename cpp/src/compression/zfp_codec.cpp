// zfp:reversible, zfp:rate=R, zfp:tol=T: ZFP 1.0 on float32/float64, as one 1D field per message
// (blocks of 4 values), serial execution, no ZFP header in the stream (the receiver knows count,
// dtype and mode).
//
// Format: the ZFP bit stream of the whole message, in whole 64-bit words. zfp:rate=R writes
// exactly ceil(ceil(count / 4) * 4R / 64) words; the other modes vary. 0 elements encode to 0
// bytes. Two kinds of input the lossy modes cannot take as they are:
//   - Inf and NaN (ZFP's block-floating-point conversion has no code for them): a message that
//     holds any encodes to 0 bytes, which decodes to NaN everywhere, so a non-finite value is
//     never silently made finite;
//   - blocks whose largest magnitude is below 2^-98 (float32) or 2^-962 (float64): ZFP's scale
//     factor 2^(P - emax) overflows for them (the conversion to integers is then undefined), so
//     they are set to zero on a copy of the input first (an error below 2^-98 or 2^-962).
// zfp:reversible keeps every bit pattern, Inf, NaN and -0.0 included.
//
// Error bounds (roundTripBound; the derivation is in docs/compression.md). With emax the
// exponent of a block's largest magnitude (2^(emax-1) <= max|x| < 2^emax), ZFP scales the block
// to integers in units u = 2^(emax - P) (P = 30 for float32, 62 for float64), decorrelates them
// with a lifting transform and codes the coefficients' negabinary bits plane by plane from the
// top. When the coefficients are off by at most t units (every plane above the error exact),
// a decoded value is off by at most
//     u * (1 + 3.25 + 3.75 * t)
// (1: the truncation to integers; 3.25: the rounding of the lifting steps, forward and inverse;
// 3.75: the inverse transform's largest absolute row sum), plus the float rounding of the result
// (2^-24 or 2^-53 relative).
//   zfp:rate=R: maxbits = 4R bits a block, 9 (float32) or 12 (float64) of them the header; the
//     embedded coder spends at most 4p + 3 bits on p whole bit planes, so the top
//     p = floor((maxbits - header - 3) / 4) planes are always exact and t <= 2^(intprec - p) - 1.
//   zfp:tol=T: the planes down to ZFP's minimum exponent m = floor(log2 T) are coded whole and
//     the rest zeroed, t <= (2/3) 2^K with K the planes dropped; the formula stays below T
//     except where T is below the format's precision (about 2^-22 max|x| for float32), so the
//     bound is max(T, the formula).
#include <zfp.h>

#include <algorithm>
#include <cfloat>
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

namespace fourd::detail {

namespace {

constexpr size_t kWordBytes = 8;  // ZFP's bit stream word (uint64)

// The constants of the error analysis for one scalar type.
struct ZfpTraits {
  int intprec;        // bits of ZFP's integer type (bit planes)
  int scaleBits;      // P: values are scaled to integers in units 2^(emax - P)
  int headerBits;     // per block: the nonzero flag and the exponent
  double eps;         // unit roundoff of the scalar type
  double minNormal;   // the smallest normal: the exponent of a subnormal block is clamped there
  double halfDenorm;  // the largest rounding error of a subnormal result
  double flush;       // blocks whose largest magnitude is below this are flushed to zero
};

constexpr ZfpTraits kFloatTraits{32, 30, 9, 0x1p-24, FLT_MIN, 0x1p-150, 0x1p-98};
constexpr ZfpTraits kDoubleTraits{64, 62, 12, 0x1p-53, DBL_MIN, 0x1p-1074, 0x1p-962};

// Largest |sum of d_j (-2)^j| over j < k with d_j in {0, 1}: the error of zeroing k negabinary
// bits (the larger of the sums of the even and of the odd powers).
double negabinaryTail(int k) {
  double even = 0.0, odd = 0.0;
  for (int j = 0; j < k; ++j) (j % 2 ? odd : even) += std::ldexp(1.0, j);
  return std::max(even, odd);
}

// The error of one block whose exponent is emax when the planes above bit k are exact and the
// coefficients are off by at most t below them, before the final float rounding.
double blockError(const ZfpTraits& tr, int emax, double t) {
  return std::ldexp(1.0, emax - tr.scaleBits) * (1.0 + 3.25 + 3.75 * t);
}

int exponentOf(const ZfpTraits& tr, double absmax) {
  int e = 0;
  std::frexp(std::max(absmax, tr.minNormal), &e);
  return e;
}

// One pass over the input: the largest magnitude (as bits: NaN and Inf sort above every finite
// value) and whether any nonzero value lies below `tiny` (a block of such values must be
// flushed, see flushTinyBlocks).
struct Scan {
  bool finite;
  bool tiny;
};
template <typename U>
FOURD_CLONES Scan scanBits(const U* u, size_t n, U absMask, U infBits, U tinyBits) {
  U m = 0;
  U small = 0;
  for (size_t i = 0; i < n; ++i) {
    const U a = u[i] & absMask;
    m = std::max(m, a);
    small |= (a != 0 && a < tinyBits) ? U{1} : U{0};
  }
  return Scan{m < infBits, small != 0};
}

// ZFP scales a block by 2^(P - emax), which overflows when the block's largest magnitude is
// below 2^-98 (float32; 2^-962 for float64): the scaled values become Inf and their conversion to
// integers is undefined. Such blocks are set to zero (an error below 2^-98 or 2^-962).
template <typename T>
void flushTinyBlocks(T* x, size_t n, T tiny) {
  for (size_t b = 0; b < n; b += 4) {
    const size_t e = std::min(n, b + 4);
    T m = 0;
    for (size_t i = b; i < e; ++i) m = std::max(m, std::fabs(x[i]));
    if (m < tiny) std::fill(x + b, x + e, T(0));
  }
}

[[noreturn]] void corrupt(const std::string& what) {
  throw BackendError("compression: corrupt zfp message: " + what, 0);
}

struct BitstreamClose {
  void operator()(bitstream* s) const noexcept { stream_close(s); }
};

class ZfpCodec final : public Codec {
 public:
  ZfpCodec(const CodecSpec& spec, DataType t)
      : spec_(spec),
        dtype_(t),
        type_(t == DataType::kFloat32 ? zfp_type_float : zfp_type_double),
        tr_(t == DataType::kFloat32 ? kFloatTraits : kDoubleTraits) {
    if (spec_.kind == CodecKind::kZfpRate) {
      zfp_stream zs = stream();
      maxbits_ = zs.maxbits;
      spec_.param = static_cast<double>(maxbits_) / 4.0;  // the rate ZFP applies
    }
  }
  const CodecSpec& spec() const noexcept override { return spec_; }
  DataType dtype() const noexcept override { return dtype_; }

  size_t maxEncodedBytes(size_t count) const noexcept override {
    if (count == 0) return 0;
    zfp_stream zs = stream();
    zfp_field f = field(nullptr, count);
    return zfp_stream_maximum_size(&zs, &f);
  }

  size_t encode(const void* src, size_t count, void* dst) const override {
    if (count == 0) return 0;
    std::vector<uint64_t> flushed;  // a copy of src, made only to flush tiny blocks
    if (spec_.kind != CodecKind::kZfpReversible) {
      const Scan sc = scan(src, count);
      if (!sc.finite) return 0;
      if (sc.tiny) src = flushedCopy(src, count, flushed);
    }
    const size_t cap = maxEncodedBytes(count);
    if (reinterpret_cast<uintptr_t>(dst) % kWordBytes == 0) return compress(src, count, dst, cap);
    std::vector<uint64_t> tmp((cap + kWordBytes - 1) / kWordBytes);
    const size_t n = compress(src, count, tmp.data(), cap);
    std::memcpy(dst, tmp.data(), n);
    return n;
  }

  void decode(const void* src, size_t bytes, size_t count, void* dst) const override {
    if (count == 0) {
      if (bytes != 0) corrupt(std::to_string(bytes) + " bytes for 0 elements");
      return;
    }
    if (bytes == 0 && spec_.kind != CodecKind::kZfpReversible) {
      fillNaN(dst, count);  // the message held Inf or NaN
      return;
    }
    checkLength(bytes, count);
    const size_t cap = maxEncodedBytes(count);
    // A corrupt variable-length stream can make ZFP read past its end (ZFP does not check), but
    // never past maxEncodedBytes: decode from a copy of that size unless src is known to hold
    // exactly what ZFP reads (fixed rate) and is word-aligned.
    const bool direct =
        spec_.kind == CodecKind::kZfpRate && reinterpret_cast<uintptr_t>(src) % kWordBytes == 0;
    std::unique_ptr<uint64_t[]> tmp;
    const void* in = src;
    if (!direct) {
      const size_t words = (cap + kWordBytes - 1) / kWordBytes;
      tmp.reset(new uint64_t[words]);
      std::memcpy(tmp.get(), src, bytes);
      std::memset(reinterpret_cast<char*>(tmp.get()) + bytes, 0, words * kWordBytes - bytes);
      in = tmp.get();
    }
    const size_t used = decompress(in, direct ? bytes : cap, count, dst);
    if (used != bytes) {
      corrupt(std::to_string(bytes) + " bytes, of which ZFP decoded " + std::to_string(used) +
              " for " + std::to_string(count) + " elements");
    }
  }

  double roundTripBound(double absmax) const noexcept override {
    switch (spec_.kind) {
      case CodecKind::kZfpRate:
        return rateBound(absmax);
      case CodecKind::kZfpTol:
        return tolBound(absmax);
      default:
        return 0.0;
    }
  }

 private:
  zfp_stream stream() const noexcept {
    zfp_stream zs{};
    zfp_stream_set_execution(&zs, zfp_exec_serial);
    if (spec_.kind == CodecKind::kZfpRate) {
      zfp_stream_set_rate(&zs, spec_.param, type_, 1, zfp_false);
    } else if (spec_.kind == CodecKind::kZfpTol) {
      zfp_stream_set_accuracy(&zs, spec_.param);
    } else {
      zfp_stream_set_reversible(&zs);
    }
    return zs;
  }

  zfp_field field(const void* data, size_t count) const noexcept {
    zfp_field f{};
    zfp_field_set_type(&f, type_);
    zfp_field_set_size_1d(&f, count);
    zfp_field_set_pointer(&f, const_cast<void*>(data));
    return f;
  }

  Scan scan(const void* src, size_t count) const {
    if (dtype_ == DataType::kFloat32) {
      return scanBits<uint32_t>(static_cast<const uint32_t*>(src), count, 0x7fffffffu, 0x7f800000u,
                                (127u - 98u) << 23);
    }
    return scanBits<uint64_t>(static_cast<const uint64_t*>(src), count,
                              uint64_t{0x7fffffffffffffff}, uint64_t{0x7ff0000000000000},
                              uint64_t{1023 - 962} << 52);
  }

  const void* flushedCopy(const void* src, size_t count, std::vector<uint64_t>& buf) const {
    const size_t es = dataTypeSize(dtype_);
    buf.resize((count * es + 7) / 8);
    std::memcpy(buf.data(), src, count * es);
    if (dtype_ == DataType::kFloat32) {
      flushTinyBlocks(reinterpret_cast<float*>(buf.data()), count, 0x1p-98f);
    } else {
      flushTinyBlocks(reinterpret_cast<double*>(buf.data()), count, 0x1p-962);
    }
    return buf.data();
  }

  void fillNaN(void* dst, size_t count) const {
    if (dtype_ == DataType::kFloat32) {
      std::fill_n(static_cast<float*>(dst), count, std::numeric_limits<float>::quiet_NaN());
    } else {
      std::fill_n(static_cast<double*>(dst), count, std::numeric_limits<double>::quiet_NaN());
    }
  }

  void checkLength(size_t bytes, size_t count) const {
    if (spec_.kind == CodecKind::kZfpRate) {
      const size_t blocks = (count + 3) / 4;
      const size_t words = (blocks * maxbits_ + 63) / 64;
      if (bytes != words * kWordBytes) {
        corrupt(std::to_string(bytes) + " bytes where " + spec_.text() + " writes " +
                std::to_string(words * kWordBytes) + " for " + std::to_string(count) + " elements");
      }
    } else if (bytes % kWordBytes != 0 || bytes > maxEncodedBytes(count)) {
      corrupt(std::to_string(bytes) + " bytes for " + std::to_string(count) +
              " elements: not whole 8-byte words, or more than the " +
              std::to_string(maxEncodedBytes(count)) + " bytes ZFP writes at most");
    }
  }

  size_t compress(const void* src, size_t count, void* dst, size_t cap) const {
    std::unique_ptr<bitstream, BitstreamClose> bs(stream_open(dst, cap));
    if (!bs) throw BackendError("compression: zfp stream_open failed", 0);
    zfp_stream zs = stream();
    zfp_stream_set_bit_stream(&zs, bs.get());
    zfp_stream_rewind(&zs);
    zfp_field f = field(src, count);
    const size_t n = zfp_compress(&zs, &f);
    if (n == 0) throw BackendError("compression: zfp_compress failed", 0);
    return n;
  }

  size_t decompress(const void* src, size_t avail, size_t count, void* dst) const {
    std::unique_ptr<bitstream, BitstreamClose> bs(stream_open(const_cast<void*>(src), avail));
    if (!bs) throw BackendError("compression: zfp stream_open failed", 0);
    zfp_stream zs = stream();
    zfp_stream_set_bit_stream(&zs, bs.get());
    zfp_stream_rewind(&zs);
    zfp_field f = field(dst, count);
    return zfp_decompress(&zs, &f);
  }

  // The float rounding of the decoded value (and the absolute error of a subnormal result), or
  // the error of a flushed block where that is larger.
  double finish(double absmax, double e) const noexcept {
    return std::max(e + tr_.eps * (absmax + e) + tr_.halfDenorm, std::min(absmax, tr_.flush));
  }

  double rateBound(double absmax) const noexcept {
    if (!std::isfinite(absmax)) return std::numeric_limits<double>::infinity();
    const int budget = static_cast<int>(maxbits_) - tr_.headerBits - 3;
    const int planes = std::clamp(budget / 4, 0, tr_.intprec);
    const int k = tr_.intprec - planes;
    const double t = k == 0 ? 0.0 : std::ldexp(1.0, k) - 1.0;
    return finish(absmax, blockError(tr_, exponentOf(tr_, absmax), t));
  }

  double tolBound(double absmax) const noexcept {
    if (!std::isfinite(absmax)) return std::numeric_limits<double>::infinity();
    int m = 0;
    std::frexp(spec_.param, &m);
    --m;  // ZFP's minexp: 2^m <= T < 2^(m+1)
    const int top = exponentOf(tr_, absmax);
    double worst = 0.0;
    // Every exponent a block may have; below top - intprec - 8 the terms only shrink.
    for (int emax = top; emax >= top - tr_.intprec - 8; --emax) {
      const int planes = std::clamp(emax - m + 4, 0, tr_.intprec);
      const double e = planes == 0 ? std::ldexp(1.0, emax)  // an empty (all-zero) block
                                   : blockError(tr_, emax, negabinaryTail(tr_.intprec - planes));
      worst = std::max(worst, e);
    }
    return std::max(spec_.param, finish(absmax, worst));
  }

  CodecSpec spec_;
  DataType dtype_;
  zfp_type type_;
  ZfpTraits tr_;
  unsigned maxbits_ = 0;
};

}  // namespace

std::unique_ptr<Codec> makeZfpCodec(const CodecSpec& spec, DataType t) {
  return std::make_unique<ZfpCodec>(spec, t);
}

}  // namespace fourd::detail
