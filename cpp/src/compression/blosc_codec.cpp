// lossless, lossless:lz4, lossless:zstd: C-Blosc2 (byte shuffle with the element size as type
// size, then LZ4 or Zstd), any dtype, bit-exact.
//
// Format: the message is one or more Blosc2 chunks back to back. A chunk holds at most
// kLosslessChunkBytes (1 GiB) of raw data, below Blosc2's limit of 2^31 - 1 - 32 bytes per chunk:
// chunk j holds raw bytes [j * chunk, (j + 1) * chunk). Each chunk's header carries its compressed
// and raw sizes, so no length prefix is needed; decode checks both against the count it is given.
// 0 elements encode to 0 bytes.
//
// Parameters (docs/compression.md: 16 MiB of float32, normal, bfloat16-valued and 70 % zeros):
// LZ4 at level 5 and Zstd at level 1 (higher Zstd levels are several times slower for no better
// ratio). Byte shuffle, not bitshuffle: bitshuffle gains a few percent on dense floats and loses
// most of the ratio on sparse data. One thread per call (the collective runs calls of its own in
// parallel); the contexts are made per call, which costs microseconds against the milliseconds a
// segment of 1 MiB takes.
#include <blosc2.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "fourd/error.hpp"
#include "internal/codec.hpp"

namespace fourd::detail {

namespace {

constexpr int kLz4Level = 5;
constexpr int kZstdLevel = 1;

// blosc2_init once, thread-safe (a static local); blosc2_destroy is never called, so contexts
// of other threads stay valid until the process ends.
void initBlosc() {
  static const bool once = [] {
    blosc2_init();
    return true;
  }();
  (void)once;
}

struct CtxFree {
  void operator()(blosc2_context* c) const noexcept { blosc2_free_ctx(c); }
};
using Ctx = std::unique_ptr<blosc2_context, CtxFree>;

[[noreturn]] void corrupt(const std::string& what, int code = 0) {
  throw BackendError("compression: corrupt lossless message: " + what, code);
}

class BloscCodec final : public Codec {
 public:
  BloscCodec(const CodecSpec& spec, DataType t, size_t chunkBytes) : spec_(spec), dtype_(t) {
    initBlosc();
    es_ = dataTypeSize(t);
    chunk_ = std::max(es_, std::min(chunkBytes, kLosslessChunkBytes) / es_ * es_);
    zstd_ = spec.compressor == "zstd";
  }
  const CodecSpec& spec() const noexcept override { return spec_; }
  DataType dtype() const noexcept override { return dtype_; }
  double roundTripBound(double) const noexcept override { return 0.0; }

  size_t maxEncodedBytes(size_t count) const noexcept override {
    const size_t raw = count * es_;
    const size_t chunks = (raw + chunk_ - 1) / chunk_;
    return raw + chunks * BLOSC2_MAX_OVERHEAD;
  }

  size_t encode(const void* src, size_t count, void* dst) const override {
    const size_t raw = count * es_;
    if (raw == 0) return 0;
    blosc2_cparams cp = BLOSC2_CPARAMS_DEFAULTS;
    cp.compcode = zstd_ ? BLOSC_ZSTD : BLOSC_LZ4;
    cp.clevel = zstd_ ? kZstdLevel : kLz4Level;
    cp.typesize = static_cast<int32_t>(es_);
    cp.nthreads = 1;
    Ctx ctx(blosc2_create_cctx(cp));
    if (!ctx) throw BackendError("compression: blosc2_create_cctx failed", 0);
    const char* in = static_cast<const char*>(src);
    char* out = static_cast<char*>(dst);
    size_t written = 0;
    for (size_t off = 0; off < raw; off += chunk_) {
      const size_t n = std::min(chunk_, raw - off);
      const int r = blosc2_compress_ctx(ctx.get(), in + off, static_cast<int32_t>(n), out + written,
                                        static_cast<int32_t>(n + BLOSC2_MAX_OVERHEAD));
      if (r <= 0) {
        throw BackendError("compression: blosc2_compress_ctx failed with code " +
                               std::to_string(r) + " on " + std::to_string(n) + " bytes",
                           r);
      }
      written += static_cast<size_t>(r);
    }
    return written;
  }

  void decode(const void* src, size_t bytes, size_t count, void* dst) const override {
    const size_t raw = count * es_;
    if (raw == 0) {
      if (bytes != 0) corrupt(std::to_string(bytes) + " bytes for 0 elements");
      return;
    }
    Ctx ctx(blosc2_create_dctx(BLOSC2_DPARAMS_DEFAULTS));
    if (!ctx) throw BackendError("compression: blosc2_create_dctx failed", 0);
    const char* in = static_cast<const char*>(src);
    size_t used = 0;
    for (size_t off = 0; off < raw; off += chunk_) {
      const size_t n = std::min(chunk_, raw - off);
      used += decodeChunk(ctx.get(), in + used, bytes - used, n, static_cast<char*>(dst) + off);
    }
    if (used != bytes) {
      corrupt(std::to_string(bytes) + " bytes, of which the chunks for " + std::to_string(count) +
              " elements use " + std::to_string(used));
    }
  }

 private:
  // Decodes one chunk of n raw bytes from `avail` bytes at `in`; returns its compressed size.
  static size_t decodeChunk(blosc2_context* ctx, const char* in, size_t avail, size_t n,
                            char* out) {
    int32_t nbytes = 0, cbytes = 0, blocksize = 0;
    if (avail < BLOSC_MIN_HEADER_LENGTH ||
        blosc2_cbuffer_sizes(in, &nbytes, &cbytes, &blocksize) < 0) {
      corrupt("no chunk header where one was expected (" + std::to_string(avail) + " bytes left)");
    }
    if (static_cast<size_t>(nbytes) != n || cbytes <= 0 || static_cast<size_t>(cbytes) > avail) {
      corrupt("a chunk of " + std::to_string(nbytes) + " raw and " + std::to_string(cbytes) +
              " compressed bytes where " + std::to_string(n) + " raw bytes in at most " +
              std::to_string(avail) + " were expected");
    }
    const int r = blosc2_decompress_ctx(ctx, in, cbytes, out, static_cast<int32_t>(n));
    if (r < 0 || static_cast<size_t>(r) != n) {
      corrupt("blosc2_decompress_ctx returned " + std::to_string(r) + " for " + std::to_string(n) +
                  " bytes",
              r);
    }
    return static_cast<size_t>(cbytes);
  }

  CodecSpec spec_;
  DataType dtype_;
  size_t es_ = 1;
  size_t chunk_ = kLosslessChunkBytes;
  bool zstd_ = false;
};

}  // namespace

std::unique_ptr<Codec> makeLosslessCodec(const CodecSpec& spec, DataType t, size_t chunkBytes) {
  return std::make_unique<BloscCodec>(spec, t, chunkBytes);
}

}  // namespace fourd::detail
