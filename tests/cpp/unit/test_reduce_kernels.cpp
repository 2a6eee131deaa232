// Reduction kernels against scalar references, every dtype and op, with counts that exercise
// vector tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fourd/data_type.hpp"
#include "fourd/error.hpp"
#include "internal/reduce_kernels.hpp"

using namespace fourd;
using namespace fourd::detail;

namespace {

template <typename T>
T ref(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<T>(a + b);
    case ReduceOp::kProd:
      return static_cast<T>(a * b);
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return a;
}

template <typename T>
void checkNative(DataType dt) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(33), size_t(1000), size_t(4099)}) {
      std::vector<T> a(n), b(n), c(n);
      for (size_t i = 0; i < n; ++i) {
        a[i] = static_cast<T>(i % 5) - (std::is_signed<T>::value ? 2 : 0);
        b[i] = static_cast<T>((i * 7) % 3);
      }
      reduce2(c.data(), a.data(), b.data(), n, dt, op);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(c[i], ref<T>(a[i], b[i], op)) << toString(dt);
      std::vector<T> d = a;
      reduceInto(d.data(), b.data(), n, dt, op);
      EXPECT_EQ(d, c);
      // reduceMany over 4 sources equals a fold of reduce2.
      std::vector<T> e(n), f = a;
      const void* srcs[4] = {a.data(), b.data(), a.data(), b.data()};
      reduceMany(e.data(), srcs, 4, n, dt, op);
      for (int s = 1; s < 4; ++s) reduceInto(f.data(), srcs[s], n, dt, op);
      EXPECT_EQ(e, f) << toString(dt) << " " << toString(op) << " n=" << n;
    }
  }
}

}  // namespace

TEST(ReduceKernels, NativeTypes) {
  checkNative<float>(DataType::kFloat32);
  checkNative<double>(DataType::kFloat64);
  checkNative<int8_t>(DataType::kInt8);
  checkNative<uint8_t>(DataType::kUInt8);
  checkNative<int32_t>(DataType::kInt32);
  checkNative<int64_t>(DataType::kInt64);
}

TEST(ReduceKernels, IntegerSumWrapsLikeTwosComplement) {
  int8_t a = 127, b = 1, c = 0;
  reduce2(&c, &a, &b, 1, DataType::kInt8, ReduceOp::kSum);
  EXPECT_EQ(c, -128);
}

TEST(ReduceKernels, SixteenBitConversionsExactOnIntegersAndRoundToNearestEven) {
  for (int i = -2048; i <= 2048; ++i) {
    EXPECT_EQ(halfToFloat(floatToHalf(static_cast<float>(i))), static_cast<float>(i));
  }
  for (int i = -256; i <= 256; ++i) {
    EXPECT_EQ(bf16ToFloat(floatToBf16(static_cast<float>(i))), static_cast<float>(i));
  }
  // 257 is halfway between bf16 neighbours 256 and 258: ties to even (256).
  EXPECT_EQ(bf16ToFloat(floatToBf16(257.0f)), 256.0f);
  EXPECT_EQ(bf16ToFloat(floatToBf16(259.0f)), 260.0f);
  // half: 2049 -> 2048 (tie to even), 2051 -> 2052.
  EXPECT_EQ(halfToFloat(floatToHalf(2049.0f)), 2048.0f);
  EXPECT_EQ(halfToFloat(floatToHalf(2051.0f)), 2052.0f);
  EXPECT_TRUE(std::isinf(halfToFloat(floatToHalf(1e6f))));
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(std::nanf("")))));
  // Subnormal half.
  const float tiny = std::ldexp(1.0f, -20);
  EXPECT_EQ(halfToFloat(floatToHalf(tiny)), tiny);
}

TEST(ReduceKernels, SixteenBitReduceManyAccumulatesInFloat32) {
  // bf16 has 8 bits of mantissa: 256 + 1 + 1 rounded after every step stays 256, but
  // accumulated in float32 and rounded once it is 258.
  const size_t n = 3;
  std::vector<uint16_t> a(n, floatToBf16(256.f)), one(n, floatToBf16(1.f)), out(n);
  const void* srcs[3] = {a.data(), one.data(), one.data()};
  reduceMany(out.data(), srcs, 3, n, DataType::kBFloat16, ReduceOp::kSum);
  for (auto v : out) EXPECT_EQ(bf16ToFloat(v), 258.f);
  std::vector<uint16_t> step = a;
  reduceInto(step.data(), one.data(), n, DataType::kBFloat16, ReduceOp::kSum);
  reduceInto(step.data(), one.data(), n, DataType::kBFloat16, ReduceOp::kSum);
  for (auto v : step) EXPECT_EQ(bf16ToFloat(v), 256.f);
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<uint16_t> x(1001), y(1001), z(1001);
      auto conv = dt == DataType::kFloat16 ? floatToHalf : floatToBf16;
      auto back = dt == DataType::kFloat16 ? halfToFloat : bf16ToFloat;
      for (int i = 0; i < 1001; ++i) {
        x[i] = conv(static_cast<float>(i % 9 - 4));
        y[i] = conv(static_cast<float>(i % 4));
      }
      reduce2(z.data(), x.data(), y.data(), 1001, dt, op);
      for (int i = 0; i < 1001; ++i) ASSERT_EQ(back(z[i]), ref<float>(back(x[i]), back(y[i]), op));
    }
  }
}

TEST(ReduceKernels, ScaleAndWidening) {
  std::vector<float> f = {2, 4, 6};
  scaleInPlace(f.data(), 3, DataType::kFloat32, 0.5);
  EXPECT_EQ(f, (std::vector<float>{1, 2, 3}));
  std::vector<uint16_t> h = {floatToBf16(3.f), floatToBf16(-8.f)};
  std::vector<float> w(2);
  toFloat32(w.data(), h.data(), 2, DataType::kBFloat16);
  EXPECT_EQ(w, (std::vector<float>{3.f, -8.f}));
  std::vector<uint16_t> back(2);
  fromFloat32(back.data(), w.data(), 2, DataType::kBFloat16);
  EXPECT_EQ(back, h);
  std::vector<int32_t> i = {1};
  EXPECT_THROW(scaleInPlace(i.data(), 1, DataType::kInt32, 0.5), InvalidArgument);
}

TEST(DataType, NamesParseAndAvgNeedsFloats) {
  for (int t = 0; t < kNumDataTypes; ++t) {
    auto dt = static_cast<DataType>(t);
    EXPECT_EQ(parseDataType(toString(dt)), dt);
  }
  EXPECT_EQ(parseDataType("bf16"), DataType::kBFloat16);
  EXPECT_EQ(parseDataType("half"), DataType::kFloat16);
  EXPECT_THROW(parseDataType("complex64"), InvalidArgument);
  EXPECT_EQ(parseReduceOp("product"), ReduceOp::kProd);
  EXPECT_THROW(parseReduceOp("xor"), InvalidArgument);
  EXPECT_THROW(checkOpSupported(ReduceOp::kAvg, DataType::kInt32), InvalidArgument);
  EXPECT_NO_THROW(checkOpSupported(ReduceOp::kAvg, DataType::kBFloat16));
}
