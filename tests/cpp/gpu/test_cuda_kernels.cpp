// GoogleTest checks of fourd's CUDA kernels against a CPU oracle.
//
// Every reduce op x dtype x source count x size x alignment is compared bit for bit with a host
// reference that performs the same operations in the same order and precision (float16/bfloat16
// accumulate in float32 and round to nearest even once per launch; integer sum/prod wrap). The
// inputs are integer-valued, so floating sums are exact anyway. The half/bfloat16 conversions
// here are written independently of the kernels and of the core's CPU kernels on purpose.
//
// Without a usable GPU the device tests skip with CUDA's reason; the argument checks, which
// throw before anything touches the device, and the NCCL link check still run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "fourd_cuda.hpp"

namespace {

using fourd::DataType;
using fourd::ReduceOp;
namespace fc = fourd::cuda;

// Asserts a CUDA call succeeded (evaluates it once).
#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    const cudaError_t err_ = (expr);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

// ---- host conversions (round to nearest even) --------------------------------------------------
uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float bf16ToFloat(uint16_t h) { return floatOf(static_cast<uint32_t>(h) << 16); }
uint16_t floatToBf16(float f) {
  uint32_t u = bitsOf(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) ? 1u : 0u;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), exp - 25);
  }
  return sign ? -v : v;
}
uint16_t floatToHalf(float f) {
  const uint32_t x = bitsOf(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;               // NaN
  if (ax >= 0x47800000u) return sign | 0x7c00u;              // >= 65536: Inf
  if (ax < 0x38800000u) {                                    // below 2^-14: subnormal or zero
    const float a = floatOf(ax) * 16777216.0f;               // exact: scale by 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(a));  // default rounding: to even
  }
  uint32_t h = ((((ax >> 23) - 127u + 15u) << 10) | ((ax & 0x7fffffu) >> 13));
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into Inf: correct
  return sign | static_cast<uint16_t>(h);
}

// ---- host model of one dtype: storage S, accumulation A ---------------------------------------
template <DataType D>
struct Model;
#define FOURD_NATIVE_MODEL(D, T)      \
  template <>                         \
  struct Model<D> {                   \
    using S = T;                      \
    using A = T;                      \
    static A toA(S s) { return s; }   \
    static S fromA(A a) { return a; } \
  };
FOURD_NATIVE_MODEL(DataType::kFloat32, float)
FOURD_NATIVE_MODEL(DataType::kFloat64, double)
FOURD_NATIVE_MODEL(DataType::kInt8, int8_t)
FOURD_NATIVE_MODEL(DataType::kUInt8, uint8_t)
FOURD_NATIVE_MODEL(DataType::kInt32, int32_t)
FOURD_NATIVE_MODEL(DataType::kInt64, int64_t)
#undef FOURD_NATIVE_MODEL
template <>
struct Model<DataType::kFloat16> {
  using S = uint16_t;
  using A = float;
  static A toA(S s) { return halfToFloat(s); }
  static S fromA(A a) { return floatToHalf(a); }
};
template <>
struct Model<DataType::kBFloat16> {
  using S = uint16_t;
  using A = float;
  static A toA(S s) { return bf16ToFloat(s); }
  static S fromA(A a) { return floatToBf16(a); }
};

// Integer sum and product in the unsigned type of the same width: wrap-around without UB.
template <typename A, bool = std::is_integral_v<A>>
struct WrapOf {
  using type = A;
};
template <typename A>
struct WrapOf<A, true> {
  using type = std::make_unsigned_t<A>;
};

template <typename A>
A applyOp(ReduceOp op, A a, A b) {
  using W = typename WrapOf<A>::type;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<A>(static_cast<W>(a) + static_cast<W>(b));
    case ReduceOp::kProd:
      return static_cast<A>(static_cast<W>(a) * static_cast<W>(b));
    case ReduceOp::kMin:
      return b < a ? b : a;
    case ReduceOp::kMax:
      return a < b ? b : a;
  }
  return a;
}

// The reference: the same launches the implementation makes (kMaxReduceSources per launch, later
// launches fold dst first), each accumulating in A and rounding to S once.
template <DataType D>
std::vector<uint8_t> referenceReduce(const std::vector<std::vector<uint8_t>>& srcs, size_t count,
                                     ReduceOp op, double factor) {
  using M = Model<D>;
  using S = typename M::S;
  using A = typename M::A;
  const int n = static_cast<int>(srcs.size());
  std::vector<S> out(count);
  auto src = [&](int s, size_t i) {
    S v;
    std::memcpy(&v, srcs.at(static_cast<size_t>(s)).data() + i * sizeof(S), sizeof(S));
    return v;
  };
  int done = 0;
  while (done < n) {
    const bool first = done == 0;
    const int take = std::min(fc::kMaxReduceSources - (first ? 0 : 1), n - done);
    const bool last = done + take == n;
    for (size_t i = 0; i < count; ++i) {
      int s = done;
      A a = first ? M::toA(src(s++, i)) : M::toA(out[i]);
      for (; s < done + take; ++s) a = applyOp<A>(op, a, M::toA(src(s, i)));
      if constexpr (std::is_floating_point_v<A>) {
        if (op == ReduceOp::kAvg && last) a = static_cast<A>(a * static_cast<A>(factor));
      }
      out[i] = M::fromA(a);
    }
    done += take;
  }
  std::vector<uint8_t> bytes(count * sizeof(S));
  std::memcpy(bytes.data(), out.data(), bytes.size());
  return bytes;
}

std::vector<uint8_t> reference(DataType t, const std::vector<std::vector<uint8_t>>& srcs,
                               size_t count, ReduceOp op, double factor) {
  switch (t) {
    case DataType::kFloat32:
      return referenceReduce<DataType::kFloat32>(srcs, count, op, factor);
    case DataType::kFloat64:
      return referenceReduce<DataType::kFloat64>(srcs, count, op, factor);
    case DataType::kFloat16:
      return referenceReduce<DataType::kFloat16>(srcs, count, op, factor);
    case DataType::kBFloat16:
      return referenceReduce<DataType::kBFloat16>(srcs, count, op, factor);
    case DataType::kInt8:
      return referenceReduce<DataType::kInt8>(srcs, count, op, factor);
    case DataType::kUInt8:
      return referenceReduce<DataType::kUInt8>(srcs, count, op, factor);
    case DataType::kInt32:
      return referenceReduce<DataType::kInt32>(srcs, count, op, factor);
    case DataType::kInt64:
      return referenceReduce<DataType::kInt64>(srcs, count, op, factor);
  }
  return {};
}

const DataType kAllTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                              DataType::kInt32,    DataType::kInt64};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kAvg};

const char* name(DataType t) {
  const char* n = fourd::detail::dataTypeName(t);
  return n != nullptr ? n : "?";
}
const char* name(ReduceOp op) {
  const char* n = fourd::detail::reduceOpName(op);
  return n != nullptr ? n : "?";
}

// Integer-valued data: small magnitudes for prod (products stay exact or overflow the same way on
// both sides), wider for the others; integer dtypes use every bit pattern (wrap-around checked).
std::vector<uint8_t> makeData(DataType t, ReduceOp op, size_t count, uint64_t seed) {
  const size_t es = fc::elementSize(t);
  std::vector<uint8_t> out(count * es);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
  auto next = [&]() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const int span = op == ReduceOp::kProd ? 2 : (t == DataType::kBFloat16 ? 16 : 50);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = next();
    const float v = static_cast<float>(static_cast<int>(r % (2 * span + 1)) - span);
    uint8_t* p = out.data() + i * es;
    switch (t) {
      case DataType::kFloat32:
        std::memcpy(p, &v, 4);
        break;
      case DataType::kFloat64: {
        const double d = v;
        std::memcpy(p, &d, 8);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t h = floatToHalf(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t h = floatToBf16(v);
        std::memcpy(p, &h, 2);
        break;
      }
      default:
        std::memcpy(p, &r, es);
        break;  // every bit pattern
    }
  }
  return out;
}

// NaN payloads differ between the GPU (canonical NaN) and the host: any NaN equals any NaN.
bool isNaN(DataType t, const uint8_t* p) {
  switch (t) {
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return std::isnan(d);
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return t == DataType::kFloat16 ? std::isnan(halfToFloat(h)) : std::isnan(bf16ToFloat(h));
    }
    default:
      return false;
  }
}

// A device allocation with `slack` spare bytes before the buffer, to place it at any offset.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&base_, bytes + 64) != cudaSuccess) base_ = nullptr;
  }
  ~DeviceBuffer() {
    if (base_ != nullptr) cudaFree(base_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  bool ok() const { return base_ != nullptr; }
  char* at(size_t offset) const { return static_cast<char*>(base_) + offset; }

 private:
  void* base_ = nullptr;
};

struct Layout {
  size_t dstOffset = 0;   // bytes, added to the (256-aligned) allocation
  size_t srcOffset = 0;   // bytes, for every source
  size_t src1Offset = 0;  // extra bytes for source 1 only (breaks mutual alignment)
  bool inPlace = false;   // dst is source 0
};

// Runs one reduce on the device and compares with the reference; returns a failure message or
// "" on success.
std::string runCase(DataType t, ReduceOp op, int nsrcs, size_t count, const Layout& lay,
                    double avgFactor, cudaStream_t stream) {
  const size_t es = fc::elementSize(t);
  std::vector<std::vector<uint8_t>> host;
  std::vector<std::unique_ptr<DeviceBuffer>> dev;
  std::vector<const void*> srcPtrs;
  for (int s = 0; s < nsrcs; ++s) {
    host.push_back(makeData(t, op, count, static_cast<uint64_t>(s + 1) * 7919 + count));
    dev.push_back(std::make_unique<DeviceBuffer>(count * es));
    if (!dev.back()->ok()) return "cudaMalloc failed";
    const size_t off = lay.srcOffset + (s == 1 ? lay.src1Offset : 0);
    char* p = dev.back()->at(off);
    if (cudaMemcpy(p, host.back().data(), count * es, cudaMemcpyHostToDevice) != cudaSuccess) {
      return "cudaMemcpy H2D failed";
    }
    srcPtrs.push_back(p);
  }
  DeviceBuffer dstBuf(count * es);
  if (!dstBuf.ok()) return "cudaMalloc failed";
  // The copies above ran on the legacy default stream and may still be in flight (a pageable
  // host-to-device cudaMemcpy can return before its DMA lands); `stream` is non-blocking and
  // does not wait for that stream by itself.
  if (cudaDeviceSynchronize() != cudaSuccess) return "cudaDeviceSynchronize failed";
  void* dst = lay.inPlace ? const_cast<void*>(srcPtrs[0]) : dstBuf.at(lay.dstOffset);
  const double factor = avgFactor > 0 ? avgFactor : 1.0 / nsrcs;
  fc::reduce(dst, srcPtrs.data(), nsrcs, count, t, op, stream, avgFactor);
  std::vector<uint8_t> got(count * es);
  if (cudaStreamSynchronize(stream) != cudaSuccess) return "kernel failed";
  if (cudaMemcpy(got.data(), dst, count * es, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return "cudaMemcpy D2H failed";
  }
  const std::vector<uint8_t> want = reference(t, host, count, op, factor);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0 &&
        !(isNaN(t, got.data() + i * es) && isNaN(t, want.data() + i * es))) {
      std::string hexGot, hexWant;
      char b[4];
      for (size_t k = es; k-- > 0;) {
        std::snprintf(b, sizeof(b), "%02x", got[i * es + k]);
        hexGot += b;
        std::snprintf(b, sizeof(b), "%02x", want[i * es + k]);
        hexWant += b;
      }
      return std::string(name(op)) + " " + name(t) + " nsrcs=" + std::to_string(nsrcs) +
             " count=" + std::to_string(count) + ": element " + std::to_string(i) + " is 0x" +
             hexGot + ", expected 0x" + hexWant;
    }
  }
  return "";
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (fc::deviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// ---- reductions ---------------------------------------------------------------------------------
TEST_F(CudaKernels, EveryOpAndDtypeMatchesCpu) {
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (op == ReduceOp::kAvg && !fourd::isFloating(t)) continue;
      for (int nsrcs : {1, 2, 3, 5}) {
        for (size_t count : {size_t(1), size_t(7), size_t(1003), size_t(1) << 18}) {
          const std::string err = runCase(t, op, nsrcs, count, Layout{}, 0.0, stream_);
          ASSERT_EQ(err, "");
        }
      }
    }
  }
}

TEST_F(CudaKernels, LargeBufferEveryDtype) {
  // Many full grid-stride iterations, plus a tail.
  for (DataType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      ASSERT_EQ(runCase(t, op, 2, (size_t(1) << 22) + 5, Layout{}, 0.0, stream_), "");
    }
  }
}

TEST_F(CudaKernels, AlignmentVariants) {
  for (DataType t : kAllTypes) {
    const size_t es = fc::elementSize(t);
    Layout sameOffset;  // everything shifted by one element: peeled head, vector body, tail
    sameOffset.dstOffset = es;
    sameOffset.srcOffset = es;
    Layout dstOnly;  // dst shifted only: scalar path
    dstOnly.dstOffset = es;
    Layout oneSrc;  // source 1 shifted only: scalar path
    oneSrc.src1Offset = es;
    for (const Layout& lay : {sameOffset, dstOnly, oneSrc}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin}) {
        for (size_t count : {size_t(1), size_t(5), size_t(4099)}) {
          ASSERT_EQ(runCase(t, op, 3, count, lay, 0.0, stream_), "")
              << "dstOffset=" << lay.dstOffset << " srcOffset=" << lay.srcOffset
              << " src1Offset=" << lay.src1Offset;
        }
      }
    }
  }
}

TEST_F(CudaKernels, InPlace) {
  Layout lay;
  lay.inPlace = true;
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (op == ReduceOp::kAvg && !fourd::isFloating(t)) continue;
      ASSERT_EQ(runCase(t, op, 3, 10007, lay, 0.0, stream_), "");
    }
  }
}

TEST_F(CudaKernels, AvgWithExplicitFactor) {
  for (DataType t :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    for (double f : {0.25, 1.0 / 3.0, 1.0 / 12.0}) {
      ASSERT_EQ(runCase(t, ReduceOp::kAvg, 4, 4099, Layout{}, f, stream_), "") << "factor " << f;
    }
  }
}

TEST_F(CudaKernels, MoreSourcesThanOneLaunch) {
  const int n = fc::kMaxReduceSources + 6;
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16, DataType::kInt32,
                     DataType::kUInt8}) {
    for (ReduceOp op : kAllOps) {
      if (op == ReduceOp::kAvg && !fourd::isFloating(t)) continue;
      ASSERT_EQ(runCase(t, op, n, 1031, Layout{}, 0.0, stream_), "");
    }
  }
}

TEST_F(CudaKernels, MoreSourcesInPlaceAliasMovesFirst) {
  // dst aliases a source beyond the first launch: it must be read before it is overwritten.
  const int n = fc::kMaxReduceSources + 3;
  const size_t count = 999;
  std::vector<std::unique_ptr<DeviceBuffer>> dev;
  std::vector<const void*> ptrs;
  std::vector<int32_t> want(count, 0);
  for (int s = 0; s < n; ++s) {
    std::vector<int32_t> h(count);
    for (size_t i = 0; i < count; ++i) h[i] = static_cast<int32_t>(i % 97) + s;
    for (size_t i = 0; i < count; ++i) want[i] += h[i];
    dev.push_back(std::make_unique<DeviceBuffer>(count * 4));
    ASSERT_TRUE(dev.back()->ok());
    CUDA_OK(cudaMemcpy(dev.back()->at(0), h.data(), count * 4, cudaMemcpyHostToDevice));
    ptrs.push_back(dev.back()->at(0));
  }
  CUDA_OK(cudaDeviceSynchronize());  // the legacy-stream copies, before the non-blocking stream
  void* dst = const_cast<void*>(ptrs[static_cast<size_t>(n - 2)]);
  fc::reduce(dst, ptrs.data(), n, count, DataType::kInt32, ReduceOp::kSum, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  std::vector<int32_t> got(count);
  CUDA_OK(cudaMemcpy(got.data(), dst, count * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want);
}

TEST_F(CudaKernels, ScaleFloatingTypes) {
  for (DataType t :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    const size_t count = 3001;
    const size_t es = fc::elementSize(t);
    const auto h = makeData(t, ReduceOp::kSum, count, 42);
    DeviceBuffer a(count * es), b(count * es);
    ASSERT_TRUE(a.ok() && b.ok());
    CUDA_OK(cudaMemcpy(a.at(0), h.data(), count * es, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    fc::scale(b.at(0), a.at(0), count, t, 1.0 / 3.0, stream_);
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<uint8_t> got(count * es);
    CUDA_OK(cudaMemcpy(got.data(), b.at(0), count * es, cudaMemcpyDeviceToHost));
    // scale == a one-source avg with that factor.
    EXPECT_EQ(got, reference(t, {h}, count, ReduceOp::kAvg, 1.0 / 3.0)) << name(t);
  }
}

TEST_F(CudaKernels, ZeroCountEnqueuesNothing) {
  const void* srcs[2] = {nullptr, nullptr};
  EXPECT_NO_THROW(fc::reduce(nullptr, srcs, 2, 0, DataType::kFloat32, ReduceOp::kSum, stream_));
  EXPECT_NO_THROW(fc::permuteBlocks(nullptr, nullptr, 16, nullptr, 0, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
}

TEST_F(CudaKernels, DefaultStream) {
  ASSERT_EQ(runCase(DataType::kFloat32, ReduceOp::kSum, 2, 4096, Layout{}, 0.0, nullptr), "");
}

// ---- block permutation and batched copies ----------------------------------------------------
void checkPermute(size_t blockBytes, int nblocks, size_t dstOffset, size_t srcOffset,
                  fc::CopyMethod method, cudaStream_t stream) {
  const size_t total = blockBytes * static_cast<size_t>(nblocks);
  std::vector<uint8_t> src(total);
  for (size_t i = 0; i < total; ++i) src[i] = static_cast<uint8_t>((i * 131 + 7) ^ (i >> 8));
  std::vector<int> perm(static_cast<size_t>(nblocks));
  for (int i = 0; i < nblocks; ++i) {
    // A permutation mixed with repeats (a gather): reverse order, every 7th block repeats block 0.
    perm[static_cast<size_t>(i)] = (i % 7 == 3) ? 0 : nblocks - 1 - i;
  }
  DeviceBuffer s(total), d(total);
  ASSERT_TRUE(s.ok() && d.ok());
  CUDA_OK(cudaMemcpy(s.at(srcOffset), src.data(), total, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d.at(0), 0xee, total + dstOffset));
  // cudaMemset is asynchronous on the legacy default stream, and `stream` is non-blocking: without
  // this the poison could land after the permutation (seen on an H200 with 1 MiB blocks).
  CUDA_OK(cudaDeviceSynchronize());
  fc::permuteBlocks(d.at(dstOffset), s.at(srcOffset), blockBytes, perm.data(), nblocks, stream,
                    method);
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint8_t> got(total);
  CUDA_OK(cudaMemcpy(got.data(), d.at(dstOffset), total, cudaMemcpyDeviceToHost));
  for (int i = 0; i < nblocks; ++i) {
    const size_t from = static_cast<size_t>(perm[static_cast<size_t>(i)]) * blockBytes;
    ASSERT_EQ(std::memcmp(got.data() + static_cast<size_t>(i) * blockBytes, src.data() + from,
                          blockBytes),
              0)
        << "block " << i << " of " << nblocks << ", blockBytes " << blockBytes << ", method "
        << static_cast<int>(method) << ", offsets " << dstOffset << "/" << srcOffset;
  }
}

TEST_F(CudaKernels, PermuteBlocks) {
  for (fc::CopyMethod m :
       {fc::CopyMethod::kAuto, fc::CopyMethod::kKernel, fc::CopyMethod::kMemcpy}) {
    for (size_t bb : {size_t(1), size_t(3), size_t(16), size_t(4100), size_t(1) << 20}) {
      for (int nb : {1, 5, fc::kMaxRegionsPerLaunch + 2, 300}) {
        if (bb * static_cast<size_t>(nb) > (size_t(64) << 20)) continue;
        if (m == fc::CopyMethod::kMemcpy && nb > 130 && bb < 16) continue;  // slow, no new path
        checkPermute(bb, nb, 0, 0, m, stream_);
        if (HasFatalFailure()) return;
      }
    }
  }
  // Misaligned bases: 8-, 4- and 1-byte access paths.
  for (size_t off : {size_t(8), size_t(4), size_t(1)}) {
    checkPermute(4096, 9, off, 0, fc::CopyMethod::kKernel, stream_);
    checkPermute(4096, 9, 0, off, fc::CopyMethod::kKernel, stream_);
    checkPermute(4096 + off, 9, off, off, fc::CopyMethod::kKernel, stream_);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaKernels, CopyRegionsUnequalSizes) {
  // The shape of a reduce-scatter with a count that does not divide: unequal blocks, one empty,
  // gathered from scattered places into a packed buffer.
  const std::vector<size_t> sizes = {1000, 1000, 999, 0, 12345, 16, 1};
  size_t total = 0;
  for (size_t s : sizes) total += s;
  std::vector<uint8_t> src(2 * total + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 1);
  std::vector<fc::CopyRegion> regions;
  size_t d = 0, s = 2 * total;
  for (size_t sz : sizes) {
    s -= sz + 3;  // scattered, back to front, odd gaps
    regions.push_back(fc::CopyRegion{d, s, sz});
    d += sz;
  }
  DeviceBuffer ds(src.size()), dd(total);
  ASSERT_TRUE(ds.ok() && dd.ok());
  CUDA_OK(cudaMemcpy(ds.at(0), src.data(), src.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  fc::copyRegions(dd.at(0), ds.at(0), regions.data(), static_cast<int>(regions.size()), stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  std::vector<uint8_t> got(total);
  CUDA_OK(cudaMemcpy(got.data(), dd.at(0), total, cudaMemcpyDeviceToHost));
  for (const auto& r : regions) {
    ASSERT_EQ(std::memcmp(got.data() + r.dstOffset, src.data() + r.srcOffset, r.bytes), 0)
        << "region at dst " << r.dstOffset;
  }
}

// ---- argument checks: they throw before touching the device, so they run everywhere ---------
TEST(CudaKernelArguments, ReduceRejectsBadArguments) {
  int dummy[4] = {};
  const void* srcs[2] = {dummy, dummy + 2};
  EXPECT_THROW(fc::reduce(dummy, srcs, 2, 2, DataType::kInt32, ReduceOp::kAvg, nullptr),
               fourd::InvalidArgument);
  EXPECT_THROW(fc::reduce(dummy, srcs, 0, 2, DataType::kInt32, ReduceOp::kSum, nullptr),
               fourd::InvalidArgument);
  EXPECT_THROW(fc::reduce(nullptr, srcs, 2, 2, DataType::kInt32, ReduceOp::kSum, nullptr),
               fourd::InvalidArgument);
  const void* withNull[2] = {dummy, nullptr};
  EXPECT_THROW(fc::reduce(dummy, withNull, 2, 2, DataType::kInt32, ReduceOp::kSum, nullptr),
               fourd::InvalidArgument);
  EXPECT_THROW(fc::reduce(dummy, srcs, 2, 2, static_cast<DataType>(99), ReduceOp::kSum, nullptr),
               fourd::InvalidArgument);
  EXPECT_THROW(fc::reduce(dummy, srcs, 2, 2, DataType::kInt32, static_cast<ReduceOp>(9), nullptr),
               fourd::InvalidArgument);
  EXPECT_THROW(fc::scale(dummy, dummy, 2, DataType::kInt8, 0.5, nullptr), fourd::InvalidArgument);
  // A float32 pointer one byte off: refused before it can fault on the device.
  const void* odd = reinterpret_cast<const char*>(dummy) + 1;
  const void* oddSrcs[2] = {odd, dummy};
  EXPECT_THROW(fc::reduce(dummy, oddSrcs, 2, 2, DataType::kFloat32, ReduceOp::kSum, nullptr),
               fourd::InvalidArgument);
  EXPECT_THROW(fc::scale(const_cast<void*>(odd), dummy, 2, DataType::kFloat32, 0.5, nullptr),
               fourd::InvalidArgument);
  try {
    fc::reduce(dummy, srcs, 2, 2, DataType::kUInt8, ReduceOp::kAvg, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const fourd::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("uint8"), std::string::npos) << e.what();
  }
}

TEST(CudaKernelArguments, CopyRejectsOverlapAndBadPermutation) {
  alignas(16) char buf[256] = {};
  const int perm[3] = {0, 3, 1};
  EXPECT_THROW(fc::permuteBlocks(buf, buf + 128, 16, perm, 3, nullptr), fourd::InvalidArgument);
  const int negative[2] = {1, -1};
  EXPECT_THROW(fc::permuteBlocks(buf, buf + 128, 16, negative, 2, nullptr), fourd::InvalidArgument);
  const int ok[2] = {1, 0};
  // Destination blocks [0, 64) and source blocks [32, 96) overlap.
  EXPECT_THROW(fc::permuteBlocks(buf, buf + 32, 32, ok, 2, nullptr), fourd::InvalidArgument);
  const fc::CopyRegion regions[2] = {{0, 100, 10}, {10, 5, 10}};  // dst [10,20) vs src [5,15)
  EXPECT_THROW(fc::copyRegions(buf, buf, regions, 2, nullptr), fourd::InvalidArgument);
  EXPECT_THROW(fc::copyRegions(buf, buf + 128, regions, -1, nullptr), fourd::InvalidArgument);
}

TEST(CudaRuntime, DeviceCountNeverThrows) {
  std::string why;
  const int n = fc::deviceCount(&why);
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(why.empty());
  }
}

TEST(CudaRuntime, NcclIsLinked) {
  // ncclGetVersion needs no device: this checks that the library resolves and loads.
  const int v = fc::ncclVersion();
  EXPECT_GE(v, 21000) << "NCCL version code " << v;
}

TEST(CudaRuntime, ErrorsCarryCudaStrings) {
  const fc::CudaError e("CUDA error in x: cudaErrorInvalidValue: invalid argument", 1);
  EXPECT_EQ(e.code(), 1);
  const fourd::BackendError& base = e;  // the binding maps BackendError to fourd.BackendError
  EXPECT_NE(std::string(base.what()).find("invalid argument"), std::string::npos);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
