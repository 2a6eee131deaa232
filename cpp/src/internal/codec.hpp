// Codecs for compressed collectives: what a message is turned into before it crosses a slow
// level, and back. A codec is named by a string ("zfp:rate=8", "int8", "lossless", ...), parsed
// once into a CodecSpec, validated against the buffer's dtype before any communication, and
// made into a Codec for that dtype.
//
//   none          no codec
//   lossless      byte shuffle + LZ4 (C-Blosc2); "lossless:zstd" for zstd, any dtype; exact
//   zfp:reversible  ZFP's reversible (lossless) mode, float32/float64; exact
//   zfp:rate=R    ZFP fixed rate, R bits per value (0 < R <= 64), float32/float64
//   zfp:tol=T     ZFP fixed accuracy, |error| <= T per value (T > 0), float32/float64
//   int8          block-scaled int8 (ZeRO++): blocks of 256 values, one float32 scale per block
//                 (absmax / 127); "int8:block=B" for another block; float32/float64/bf16/fp16
//   bf16          cast to bfloat16, round to nearest even; float32/float64
//   auto          a lossless codec where the cost model predicts it pays, else none (the
//                 communicator decides; makeCodec never sees it)
//
// Encoded messages are self-describing in length only: encode returns the bytes written, at
// most maxEncodedBytes(count), and decode receives exactly those bytes and the element count.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "fourd/data_type.hpp"

namespace fourd::detail {

enum class CodecKind { kNone, kLossless, kZfpReversible, kZfpRate, kZfpTol, kInt8, kBf16, kAuto };

struct CodecSpec {
  CodecKind kind = CodecKind::kNone;
  /// zfp:rate: bits per value; zfp:tol: the absolute tolerance; int8: values per block.
  double param = 0.0;
  /// lossless: the Blosc2 compressor, "lz4" or "zstd".
  std::string compressor = "lz4";

  bool none() const noexcept { return kind == CodecKind::kNone; }
  /// True for the codecs whose round trip may change values.
  bool lossy() const noexcept;
  /// The canonical spelling ("zfp:rate=8", "int8:block=256", "lossless:lz4"): what explain
  /// shows and what ranks compare.
  std::string text() const;
};

/// Parses a codec string (above; case-insensitive, surrounding spaces ignored). Throws
/// InvalidArgument naming `argName`, the text and what was expected (an unknown codec, a rate
/// outside (0, 64], a tolerance that is not a positive finite number, a block size that is not
/// an integer in [8, 65536], an unknown option).
CodecSpec parseCodec(const std::string& text, const char* argName = "compression");

/// Throws InvalidArgument when `spec` cannot encode elements of `t` (ZFP and bf16 on integers,
/// for instance), naming the codec, the dtype and the dtypes it takes.
void checkCodecDtype(const CodecSpec& spec, DataType t, const char* argName = "compression");

/// One codec for one dtype. Thread-safe: encode and decode keep no state between calls (each
/// call may run on any thread, several at once).
class Codec {
 public:
  virtual ~Codec() = default;
  virtual const CodecSpec& spec() const noexcept = 0;
  virtual DataType dtype() const noexcept = 0;
  /// The most bytes encode writes for `count` elements.
  virtual size_t maxEncodedBytes(size_t count) const noexcept = 0;
  /// Encodes `count` elements of src into dst (at least maxEncodedBytes(count) bytes); returns
  /// the bytes written. count may be 0 (0 bytes). A zfp:rate or zfp:tol message that holds Inf
  /// or NaN encodes to 0 bytes and decodes to NaN (docs/compression.md, "zfp").
  virtual size_t encode(const void* src, size_t count, void* dst) const = 0;
  /// Decodes `bytes` written by encode for `count` elements into dst. Throws BackendError on a
  /// corrupt message.
  virtual void decode(const void* src, size_t bytes, size_t count, void* dst) const = 0;
  /// The largest |decode(encode(x)) - x| over elements of x when max |x| <= absmax (0 for the
  /// lossless codecs): the bound of one application, which docs/compression.md composes over
  /// the steps of a collective.
  virtual double roundTripBound(double absmax) const noexcept = 0;
};

/// The codec `spec` for elements of `t` (checkCodecDtype first). spec must not be none or auto.
std::unique_ptr<Codec> makeCodec(const CodecSpec& spec, DataType t);

// One factory per codec family (cpp/src/compression/{blosc,zfp,int8,bf16}_codec.cpp), called by
// makeCodec once spec and dtype are checked. The codec's spec() is the one it applies: zfp:rate=R
// carries the rate that ZFP uses, a multiple of 1/4 bit (R rounded to the nearest, at least 9/4 for
// float32 and 3 for float64).
/// Lossless messages are Blosc2 chunks of at most this many raw bytes each (Blosc2's limit is
/// 2^31 - 33); a smaller `chunkBytes` (rounded down to whole elements) serves tests.
inline constexpr size_t kLosslessChunkBytes = size_t{1} << 30;
std::unique_ptr<Codec> makeLosslessCodec(const CodecSpec& spec, DataType t,
                                         size_t chunkBytes = kLosslessChunkBytes);
std::unique_ptr<Codec> makeZfpCodec(const CodecSpec& spec, DataType t);
std::unique_ptr<Codec> makeInt8Codec(const CodecSpec& spec, DataType t);
std::unique_ptr<Codec> makeBf16Codec(const CodecSpec& spec, DataType t);

}  // namespace fourd::detail
