// The codecs of internal/codec.hpp: names (parse, canonical text, errors), the dtypes each takes,
// round trips of every codec and dtype over counts and data kinds (lossless codecs bit-exact,
// lossy ones within roundTripBound per element), encoded sizes, corrupt messages, non-finite
// values, and (printed, not asserted) encode/decode speed on float32 normal data (2 MiB in the
// suite; FOURD_CODEC_SPEED_MIB=16 for the figures docs/compression.md quotes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fourd/error.hpp"
#include "internal/codec.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {
namespace {

using Bytes = std::vector<unsigned char>;

// ---- data ------------------------------------------------------------------------------------

enum class Kind {
  kIntegers,
  kUniform,
  kNormalOutliers,
  kConstant,
  kZeros,
  kAlternating,
  kTiny,
  kHuge
};
const Kind kAllKinds[] = {Kind::kIntegers, Kind::kUniform, Kind::kNormalOutliers,
                          Kind::kConstant, Kind::kZeros,   Kind::kAlternating,
                          Kind::kTiny,     Kind::kHuge};
const char* kindName(Kind k) {
  const char* names[] = {
      "integers", "uniform", "normal+outliers", "constant", "zeros", "alternating", "tiny", "huge"};
  return names[static_cast<int>(k)];
}

const size_t kCounts[] = {0, 1, 3, 4, 5, 255, 256, 257, 1000003};

// Values of one kind; `scale` brings tiny/huge into the dtype's range (float16 has no 1e30).
std::vector<double> values(Kind kind, size_t n, unsigned seed, double tiny, double huge) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (kind) {
      case Kind::kIntegers:
        v[i] = static_cast<double>(static_cast<int>(rng() % 2001) - 1000);
        break;
      case Kind::kUniform:
        v[i] = uni(rng);
        break;
      case Kind::kNormalOutliers:
        v[i] = normal(rng) * (rng() % 97 == 0 ? 1000.0 : 1.0);
        break;
      case Kind::kConstant:
        v[i] = 3.14159;
        break;
      case Kind::kZeros:
        v[i] = 0.0;
        break;
      case Kind::kAlternating:
        v[i] = (i % 2 ? -1.0 : 1.0) * (1.0 + 0.5 * uni(rng));
        break;
      case Kind::kTiny:
        v[i] = tiny * normal(rng);
        break;
      case Kind::kHuge:
        v[i] = huge * normal(rng);
        break;
    }
  }
  return v;
}

// A buffer of one dtype and its elements as doubles (exactly: every dtype here widens exactly).
Bytes pack(const std::vector<double>& v, DataType t) {
  Bytes b(v.size() * dataTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DataType::kFloat64) {
      std::memcpy(&b[8 * i], &v[i], 8);
    } else if (t == DataType::kFloat32) {
      const float f = static_cast<float>(v[i]);
      std::memcpy(&b[4 * i], &f, 4);
    } else if (t == DataType::kFloat16 || t == DataType::kBFloat16) {
      const float f = static_cast<float>(v[i]);
      const uint16_t h = t == DataType::kFloat16 ? floatToHalf(f) : floatToBf16(f);
      std::memcpy(&b[2 * i], &h, 2);
    } else {  // integer dtypes: the low bytes of the value's bit pattern (any bytes will do)
      uint64_t x;
      std::memcpy(&x, &v[i], 8);
      x ^= x >> 29;
      std::memcpy(&b[dataTypeSize(t) * i], &x, dataTypeSize(t));
    }
  }
  return b;
}

double at(const Bytes& b, size_t i, DataType t) {
  switch (t) {
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, &b[8 * i], 8);
      return d;
    }
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, &b[4 * i], 4);
      return f;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, &b[2 * i], 2);
      return t == DataType::kFloat16 ? halfToFloat(h) : bf16ToFloat(h);
    }
    default:
      return 0.0;
  }
}

std::vector<double> kindValues(Kind k, size_t n, DataType t, unsigned seed) {
  const bool half = t == DataType::kFloat16;
  return values(k, n, seed, half ? 1e-4 : 1e-30, half ? 6e3 : 1e30);
}

// ---- round trips -----------------------------------------------------------------------------

struct RoundTrip {
  size_t bytes = 0;
  Bytes out;
};

constexpr size_t kGuard = 64;  // bytes past the end that encode and decode must leave alone

RoundTrip roundTrip(const Codec& c, const Bytes& in, size_t count) {
  const size_t es = dataTypeSize(c.dtype());
  const size_t max = c.maxEncodedBytes(count);
  Bytes enc(max + kGuard, 0xA5);
  RoundTrip r;
  r.bytes = c.encode(in.data(), count, enc.data());
  EXPECT_LE(r.bytes, max) << c.spec().text() << " count " << count;
  for (size_t i = max; i < enc.size(); ++i) {
    if (enc[i] != 0xA5) {
      ADD_FAILURE() << c.spec().text() << ": encode wrote past maxEncodedBytes(" << count << ")";
      break;
    }
  }
  r.out.assign(count * es + kGuard, 0x5A);
  c.decode(enc.data(), r.bytes, count, r.out.data());
  for (size_t i = count * es; i < r.out.size(); ++i) {
    if (r.out[i] != 0x5A) {
      ADD_FAILURE() << c.spec().text() << ": decode wrote past " << count << " elements";
      break;
    }
  }
  r.out.resize(count * es);
  return r;
}

double absmaxOf(const Bytes& b, size_t n, DataType t) {
  double m = 0.0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(at(b, i, t)));
  return m;
}

// Checks one round trip: exact for a lossless codec, else within the bound at every element.
void checkRoundTrip(const Codec& c, const Bytes& in, size_t count, const std::string& what) {
  const RoundTrip r = roundTrip(c, in, count);
  const DataType t = c.dtype();
  if (!c.spec().lossy()) {
    ASSERT_EQ(0, std::memcmp(in.data(), r.out.data(), in.size())) << what << ": not bit-exact";
    return;
  }
  const double bound = c.roundTripBound(absmaxOf(in, count, t));
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < count; ++i) {
    const double x = at(in, i, t), y = at(r.out, i, t);
    const double e = std::fabs(y - x);
    if (!(e <= bound)) {
      if (bad++ == 0) first = i;
    }
    if (e > worst) worst = e;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements beyond the bound " << bound
                     << ", the first at " << first << " (" << at(in, first, t) << " -> "
                     << at(r.out, first, t) << "); worst error " << worst;
}

struct Case {
  const char* spec;
  std::vector<DataType> dtypes;
};

const std::vector<Case>& allCases() {
  static const std::vector<Case> cases = {
      {"lossless:lz4",
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
        DataType::kInt8, DataType::kUInt8, DataType::kInt32, DataType::kInt64}},
      {"lossless:zstd", {DataType::kFloat32, DataType::kFloat64, DataType::kInt32}},
      {"zfp:reversible", {DataType::kFloat32, DataType::kFloat64}},
      {"zfp:rate=8", {DataType::kFloat32, DataType::kFloat64}},
      {"zfp:rate=16", {DataType::kFloat32, DataType::kFloat64}},
      {"zfp:rate=4.5", {DataType::kFloat32}},
      {"zfp:tol=1e-3", {DataType::kFloat32, DataType::kFloat64}},
      {"zfp:tol=1e-9", {DataType::kFloat32, DataType::kFloat64}},
      {"int8", {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}},
      {"int8:block=8", {DataType::kFloat32, DataType::kFloat64}},
      {"int8:block=1000", {DataType::kFloat32, DataType::kBFloat16}},
      {"bf16", {DataType::kFloat32, DataType::kFloat64}},
  };
  return cases;
}

TEST(CodecRoundTrip, EveryCodecDtypeCountAndKind) {
  for (const Case& cs : allCases()) {
    const bool zfp = std::string(cs.spec).rfind("zfp", 0) == 0;
    for (DataType t : cs.dtypes) {
      auto c = makeCodec(parseCodec(cs.spec), t);
      for (size_t listed : kCounts) {
        // The largest count with three kinds only, and for ZFP (100-200 MB/s a core) a tenth
        // of it, still 25 000 of its 4-value blocks: the suite stays quick.
        const bool big = listed > 100000;
        const size_t count = big && zfp ? 100003 : listed;
        for (Kind k : kAllKinds) {
          if (big && k != Kind::kNormalOutliers && k != Kind::kAlternating && k != Kind::kHuge) {
            continue;
          }
          const std::string what = std::string(cs.spec) + " " + dataTypeName(t) + " count " +
                                   std::to_string(count) + " " + kindName(k);
          Bytes in = pack(kindValues(k, count, t, 17u + static_cast<unsigned>(count)), t);
          ASSERT_NO_FATAL_FAILURE(checkRoundTrip(*c, in, count, what));
        }
      }
    }
  }
}

// ---- sizes -----------------------------------------------------------------------------------

size_t encodedSize(const Codec& c, const Bytes& in, size_t count) {
  Bytes enc(c.maxEncodedBytes(count));
  return c.encode(in.data(), count, enc.data());
}

TEST(CodecSize, Int8IsCountPlusFourBytesPerBlock) {
  for (int block : {8, 256, 1000}) {
    auto c = makeCodec(parseCodec("int8:block=" + std::to_string(block)), DataType::kFloat32);
    for (size_t count : kCounts) {
      Bytes in = pack(kindValues(Kind::kUniform, count, DataType::kFloat32, 3), DataType::kFloat32);
      const size_t blocks = (count + block - 1) / block;
      EXPECT_EQ(encodedSize(*c, in, count), count + 4 * blocks) << block << " " << count;
    }
  }
}

TEST(CodecSize, ZfpRateIsRateBitsPerValueInWholeWords) {
  for (double rate : {2.25, 4.0, 8.0, 12.5, 16.0, 32.0, 64.0}) {
    for (DataType t : {DataType::kFloat32, DataType::kFloat64}) {
      if (t == DataType::kFloat64 && rate < 3) continue;
      CodecSpec s = parseCodec("zfp:rate=" + std::to_string(rate));
      auto c = makeCodec(s, t);
      for (size_t count : kCounts) {
        Bytes in = pack(kindValues(Kind::kNormalOutliers, count, t, 5), t);
        const size_t bits = static_cast<size_t>(4 * rate) * ((count + 3) / 4);
        EXPECT_EQ(encodedSize(*c, in, count), (bits + 63) / 64 * 8)
            << rate << " " << dataTypeName(t) << " " << count;
      }
      EXPECT_EQ(c->spec().param, rate);
    }
  }
}

TEST(CodecSize, ZfpRateReportsTheRateZfpUses) {
  // ZFP codes whole bits per block of 4: rates are multiples of 1/4, at least 9/4 (float32) or
  // 3 (float64) bits per value (the block header).
  EXPECT_EQ(makeCodec(parseCodec("zfp:rate=8.1"), DataType::kFloat32)->spec().param, 8.0);
  EXPECT_EQ(makeCodec(parseCodec("zfp:rate=8.2"), DataType::kFloat32)->spec().param, 8.25);
  EXPECT_EQ(makeCodec(parseCodec("zfp:rate=1"), DataType::kFloat32)->spec().param, 2.25);
  EXPECT_EQ(makeCodec(parseCodec("zfp:rate=1"), DataType::kFloat64)->spec().param, 3.0);
  EXPECT_EQ(makeCodec(parseCodec("zfp:rate=8.1"), DataType::kFloat32)->spec().text(), "zfp:rate=8");
}

TEST(CodecSize, Bf16IsTwoBytesPerValueAndLosslessCompressesZeros) {
  auto b = makeCodec(parseCodec("bf16"), DataType::kFloat64);
  Bytes in = pack(kindValues(Kind::kUniform, 1000, DataType::kFloat64, 1), DataType::kFloat64);
  EXPECT_EQ(encodedSize(*b, in, 1000), 2000u);
  auto l = makeCodec(parseCodec("lossless"), DataType::kFloat32);
  Bytes zeros(4 * 100000, 0);
  EXPECT_LT(encodedSize(*l, zeros, 100000), 4000u);
  EXPECT_EQ(encodedSize(*l, zeros, 0), 0u);
}

// ---- names -----------------------------------------------------------------------------------

TEST(CodecParse, CanonicalSpellings) {
  const std::pair<const char*, const char*> cases[] = {
      {"none", "none"},
      {"  None ", "none"},
      {"lossless", "lossless:lz4"},
      {"LOSSLESS:LZ4", "lossless:lz4"},
      {"lossless:zstd", "lossless:zstd"},
      {"zfp:reversible", "zfp:reversible"},
      {"zfp:rate=8", "zfp:rate=8"},
      {"ZFP:Rate=12.5", "zfp:rate=12.5"},
      {"zfp:rate=64", "zfp:rate=64"},
      {"zfp:tol=1e-3", "zfp:tol=0.001"},
      {"zfp:accuracy=2.5e-7", "zfp:tol=2.5e-07"},
      {"int8", "int8:block=256"},
      {"int8:block=8", "int8:block=8"},
      {"int8:block=65536", "int8:block=65536"},
      {"bf16", "bf16"},
      {"auto", "auto"},
  };
  for (const auto& [text, canonical] : cases) {
    const CodecSpec s = parseCodec(text);
    EXPECT_EQ(s.text(), canonical) << text;
    const CodecSpec again = parseCodec(s.text());
    EXPECT_EQ(again.text(), s.text());
    EXPECT_EQ(again.kind, s.kind);
    EXPECT_EQ(again.param, s.param);
  }
  EXPECT_TRUE(parseCodec("none").none());
  EXPECT_EQ(parseCodec("zfp:rate=8").param, 8.0);
  EXPECT_EQ(parseCodec("zfp:tol=1e-3").param, 1e-3);
  EXPECT_EQ(parseCodec("int8:block=512").param, 512.0);
  EXPECT_EQ(parseCodec("lossless:zstd").compressor, "zstd");
}

TEST(CodecParse, WhichCodecsAreLossy) {
  for (const char* t : {"zfp:rate=8", "zfp:tol=1", "int8", "bf16"}) {
    EXPECT_TRUE(parseCodec(t).lossy()) << t;
  }
  for (const char* t : {"none", "lossless", "lossless:zstd", "zfp:reversible", "auto"}) {
    EXPECT_FALSE(parseCodec(t).lossy()) << t;
  }
}

TEST(CodecParse, ErrorsNameTheArgumentAndWhatWasFound) {
  const std::pair<const char*, const char*> cases[] = {
      {"foo", "unknown codec \"foo\""},
      {"", "unknown codec \"\""},
      {"zfp", "zfp needs a mode"},
      {"zfp:fast", "found \"zfp:fast\""},
      {"zfp:rate=0", "zfp rate must be in (0, 64]; found 0"},
      {"zfp:rate=-1", "found -1"},
      {"zfp:rate=64.5", "found 64.5"},
      {"zfp:rate=abc", "found \"abc\""},
      {"zfp:rate=", "found \"\""},
      {"zfp:rate=8x", "found \"8x\""},
      {"zfp:rate=0x10", "found \"0x10\""},
      {"zfp:rate=nan", "found nan"},
      {"zfp:tol=0", "positive finite number; found \"0\""},
      {"zfp:tol=-1e-3", "found \"-1e-3\""},
      {"zfp:tol=inf", "found \"inf\""},
      {"zfp:tol=nan", "found \"nan\""},
      {"int8:block=7", "integer in [8, 65536]; found \"7\""},
      {"int8:block=65537", "found \"65537\""},
      {"int8:block=256.5", "found \"256.5\""},
      {"int8:block=", "found \"\""},
      {"int8:foo=3", "unknown option \"foo=3\" for int8"},
      {"lossless:gzip", "unknown compressor \"gzip\""},
      {"lossless:", "nothing after ':'"},
      {"bf16:x", "bf16 takes no option; found \"bf16:x\""},
      {"none:1", "none takes no option"},
      {"auto:lossless", "auto takes no option"},
  };
  for (const auto& [text, found] : cases) {
    try {
      parseCodec(text, "my_arg");
      ADD_FAILURE() << "parseCodec(\"" << text << "\") did not throw";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("my_arg: ", 0), 0u) << m;
      EXPECT_NE(m.find(found), std::string::npos) << "\"" << m << "\" lacks \"" << found << "\"";
    }
  }
}

TEST(CodecDtype, EachCodecTakesItsDtypes) {
  const DataType all[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                          DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                          DataType::kInt32,    DataType::kInt64};
  const std::pair<const char*, std::vector<DataType>> takes[] = {
      {"lossless", {all, all + 8}},
      {"zfp:reversible", {DataType::kFloat32, DataType::kFloat64}},
      {"zfp:rate=8", {DataType::kFloat32, DataType::kFloat64}},
      {"zfp:tol=1e-3", {DataType::kFloat32, DataType::kFloat64}},
      {"bf16", {DataType::kFloat32, DataType::kFloat64}},
      {"int8", {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}},
  };
  for (const auto& [text, ok] : takes) {
    const CodecSpec s = parseCodec(text);
    for (DataType t : all) {
      const bool expected = std::find(ok.begin(), ok.end(), t) != ok.end();
      if (expected) {
        EXPECT_NO_THROW(checkCodecDtype(s, t)) << text << " " << dataTypeName(t);
        EXPECT_NO_THROW(makeCodec(s, t)) << text << " " << dataTypeName(t);
        continue;
      }
      try {
        checkCodecDtype(s, t, "compression");
        ADD_FAILURE() << text << " took " << dataTypeName(t);
      } catch (const InvalidArgument& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(std::string("dtype ") + dataTypeName(t)), std::string::npos) << m;
        EXPECT_NE(m.find("it takes float32, float64"), std::string::npos) << m;
        EXPECT_NE(m.find(s.text()), std::string::npos) << m;
      }
      EXPECT_THROW(makeCodec(s, t), InvalidArgument) << text << " " << dataTypeName(t);
    }
  }
  CodecSpec bad;
  bad.kind = CodecKind::kInt8;
  bad.param = 0;  // built by hand, not parsed: makeCodec checks it all the same
  EXPECT_THROW(makeCodec(bad, DataType::kFloat32), InvalidArgument);
  bad.kind = CodecKind::kLossless;
  bad.compressor = "gzip";
  EXPECT_THROW(makeCodec(bad, DataType::kFloat32), InvalidArgument);
  EXPECT_THROW(makeCodec(parseCodec("none"), DataType::kFloat32), InvalidArgument);
  EXPECT_THROW(makeCodec(parseCodec("auto"), DataType::kFloat32), InvalidArgument);
}

// ---- special values and exact rounding ----------------------------------------------------------

float f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Bytes floats(const std::vector<float>& v) {
  Bytes b(4 * v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(CodecSpecial, LosslessCodecsKeepEveryBitPattern) {
  const std::vector<float> v = {-0.0f,     0.0f,   f32(0x7fc00001), f32(0xffa00000), INFINITY,
                                -INFINITY, f32(1), f32(0x807fffff), FLT_MAX,         -FLT_MIN,
                                1.0f,      3.0f};
  Bytes in = floats(v);
  for (const char* spec : {"lossless:lz4", "lossless:zstd", "zfp:reversible"}) {
    auto c = makeCodec(parseCodec(spec), DataType::kFloat32);
    const RoundTrip r = roundTrip(*c, in, v.size());
    EXPECT_EQ(0, std::memcmp(in.data(), r.out.data(), in.size())) << spec;
  }
}

TEST(CodecSpecial, Bf16RoundsToNearestEvenOnce) {
  auto c32 = makeCodec(parseCodec("bf16"), DataType::kFloat32);
  auto c64 = makeCodec(parseCodec("bf16"), DataType::kFloat64);
  const double u = std::ldexp(1.0, -8);  // half a bfloat16 unit at 1
  const std::pair<double, double> cases[] = {
      {1.0 + u, 1.0},              // tie: to the even neighbour 1
      {1.0 + 3 * u, 1.0 + 4 * u},  // tie: to the even neighbour 1 + 2^-6
      {-(1.0 + u), -1.0},          // ties are symmetric
      {1.0 + u + std::ldexp(1.0, -20), 1.0 + 2 * u},
      {1.0 + u + std::ldexp(1.0, -30), 1.0 + 2 * u},  // float64 only: rounding via float32
                                                      // RNE would first make this a tie
      {0x1.fep127, 0x1.fep127},                       // the largest finite bfloat16
  };
  for (const auto& [x, want] : cases) {
    Bytes in(8);
    std::memcpy(in.data(), &x, 8);
    EXPECT_EQ(at(roundTrip(*c64, in, 1).out, 0, DataType::kFloat64), want) << x;
    if (static_cast<double>(static_cast<float>(x)) == x) {
      Bytes in32 = floats({static_cast<float>(x)});
      EXPECT_EQ(at(roundTrip(*c32, in32, 1).out, 0, DataType::kFloat32), want) << x;
    }
  }
  // NaN stays NaN, infinities and -0.0 stay, overflow goes to Inf.
  Bytes in = floats({f32(0x7fc00001), f32(0xff800001), INFINITY, -INFINITY, -0.0f, FLT_MAX});
  const RoundTrip r = roundTrip(*c32, in, 6);
  EXPECT_TRUE(std::isnan(at(r.out, 0, DataType::kFloat32)));
  EXPECT_TRUE(std::isnan(at(r.out, 1, DataType::kFloat32)));
  EXPECT_EQ(at(r.out, 2, DataType::kFloat32), INFINITY);
  EXPECT_EQ(at(r.out, 3, DataType::kFloat32), -INFINITY);
  EXPECT_TRUE(std::signbit(at(r.out, 4, DataType::kFloat32)));
  EXPECT_EQ(at(r.out, 5, DataType::kFloat32), INFINITY);
  EXPECT_EQ(c32->roundTripBound(1.0), std::ldexp(1.0, -8));
  EXPECT_EQ(c32->roundTripBound(FLT_MAX), std::numeric_limits<double>::infinity());
}

TEST(CodecSpecial, Int8MakesABlockWithInfOrNanNan) {
  auto c = makeCodec(parseCodec("int8:block=8"), DataType::kFloat32);
  std::vector<float> v(24, 0.5f);
  v[3] = NAN;
  v[17] = -INFINITY;
  Bytes in = floats(v);
  const RoundTrip r = roundTrip(*c, in, v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double y = at(r.out, i, DataType::kFloat32);
    if (i < 8 || i >= 16) {
      EXPECT_TRUE(std::isnan(y)) << i;
    } else {
      EXPECT_EQ(y, 0.5) << i;  // 0.5 is the block's absmax: q = 127, exactly back
    }
  }
  // The scales come first: block 1's is 0.5 / 127.
  Bytes enc(c->maxEncodedBytes(24));
  c->encode(in.data(), 24, enc.data());
  float s1;
  std::memcpy(&s1, &enc[4], 4);
  EXPECT_EQ(s1, 0.5f / 127.0f);
}

TEST(CodecSpecial, LossyZfpTurnsAMessageWithInfOrNanToNan) {
  for (const char* spec : {"zfp:rate=8", "zfp:tol=1e-3"}) {
    auto c = makeCodec(parseCodec(spec), DataType::kFloat32);
    std::vector<float> v(100, 1.0f);
    v[42] = INFINITY;
    Bytes in = floats(v);
    const RoundTrip r = roundTrip(*c, in, v.size());
    EXPECT_EQ(r.bytes, 0u) << spec;
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_TRUE(std::isnan(at(r.out, i, DataType::kFloat32))) << spec << " " << i;
    }
  }
}

TEST(CodecSpecial, BoundsAreTightWhereTheyShouldBe) {
  // The bounds are what the docs promise in the ordinary regime, not something looser.
  auto i8 = makeCodec(parseCodec("int8"), DataType::kFloat32);
  EXPECT_LT(i8->roundTripBound(1.0), 1.0 / 254 * 1.001);
  EXPECT_GE(i8->roundTripBound(1.0), 1.0 / 254);
  auto tol = makeCodec(parseCodec("zfp:tol=1e-3"), DataType::kFloat32);
  EXPECT_EQ(tol->roundTripBound(1.0), 1e-3);
  EXPECT_EQ(tol->roundTripBound(1000.0), 1e-3);
  // Below float32's precision the tolerance cannot hold; the bound says so.
  auto tiny = makeCodec(parseCodec("zfp:tol=1e-12"), DataType::kFloat32);
  EXPECT_GT(tiny->roundTripBound(1.0), 1e-12);
  EXPECT_LT(tiny->roundTripBound(1.0), 1e-6);
  // The tolerance holds as promised from 2^-21 A (float32) and 2^-50 A (float64) up.
  for (double a : {1.0, 1.3, 1.99, 3e-20, 7e10}) {
    for (double f : {1.0, 1.5, 10.0, 1e5}) {
      for (auto [t, rel] :
           {std::pair{DataType::kFloat32, 0x1p-21}, {DataType::kFloat64, 0x1p-50}}) {
        CodecSpec s;
        s.kind = CodecKind::kZfpTol;
        s.param = rel * a * f;
        EXPECT_EQ(makeCodec(s, t)->roundTripBound(a), s.param) << dataTypeName(t) << " " << a;
      }
    }
  }
  auto r16 = makeCodec(parseCodec("zfp:rate=16"), DataType::kFloat32);
  EXPECT_LT(r16->roundTripBound(1.0), 0.01);
  EXPECT_EQ(makeCodec(parseCodec("zfp:reversible"), DataType::kFloat32)->roundTripBound(1.0), 0.0);
  EXPECT_EQ(makeCodec(parseCodec("lossless"), DataType::kFloat32)->roundTripBound(1.0), 0.0);
}

// ---- ZFP on adversarial blocks -----------------------------------------------------------------

// Blocks of 4 built to stress ZFP: signs alternating at full scale, one large value with small
// ones (the small lose precision to the block's exponent), magnitudes just below a power of two
// (the largest unit for the magnitude), random exponents, random signs.
std::vector<double> adversarial(size_t blocks, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<double> v;
  const double below2 = std::nextafter(2.0f, 0.0f);  // just below a power of two
  for (size_t b = 0; b < blocks; ++b) {
    const double a = (b % 3 == 0) ? below2 : 1.0 + uni(rng);
    const double sgn = rng() % 2 ? 1.0 : -1.0;
    switch (b % 8) {
      case 0:
        v.insert(v.end(), {a, -a, a, -a});
        break;
      case 1:
        v.insert(v.end(), {a, a, -a, -a});
        break;
      case 2:
        v.insert(v.end(), {a, -a / 3, a / 3, -a});
        break;
      case 3:
        v.insert(v.end(), {sgn * a, 1e-7, -3e-8, 2e-9});
        break;
      case 4:
        v.insert(v.end(), {-a, a, a, -a});
        break;
      default:
        for (int i = 0; i < 4; ++i) {
          const double s = rng() % 2 ? 1.0 : -1.0;
          v.push_back(s * a * std::ldexp(uni(rng), -static_cast<int>(rng() % 24)));
        }
        v[v.size() - 1 - rng() % 4] = sgn * a;
    }
  }
  return v;
}

// The largest error / bound over blocks, each block against the bound of its own absmax.
double worstRatio(const Codec& c, const std::vector<double>& v) {
  const DataType t = c.dtype();
  Bytes in = pack(v, t);
  const RoundTrip r = roundTrip(c, in, v.size());
  double worst = 0.0;
  for (size_t b = 0; b + 4 <= v.size(); b += 4) {
    double a = 0.0, e = 0.0;
    for (size_t i = b; i < b + 4; ++i) {
      a = std::max(a, std::fabs(at(in, i, t)));
      e = std::max(e, std::fabs(at(r.out, i, t) - at(in, i, t)));
    }
    const double bound = c.roundTripBound(a);
    EXPECT_LE(e, bound) << c.spec().text() << " block " << b / 4 << " absmax " << a;
    worst = std::max(worst, e / bound);
  }
  return worst;
}

TEST(CodecZfp, RateAndToleranceBoundsHoldOnAdversarialBlocks) {
  const std::vector<double> v = adversarial(20000, 7);
  for (DataType t : {DataType::kFloat32, DataType::kFloat64}) {
    for (const char* spec :
         {"zfp:rate=2.25", "zfp:rate=4", "zfp:rate=8", "zfp:rate=12", "zfp:rate=16", "zfp:rate=24",
          "zfp:rate=32", "zfp:rate=48", "zfp:rate=64", "zfp:tol=0.1", "zfp:tol=1e-3",
          "zfp:tol=1e-6", "zfp:tol=1e-9", "zfp:tol=1e-13"}) {
      auto c = makeCodec(parseCodec(spec), t);
      const double ratio = worstRatio(*c, v);
      std::printf("[ zfp bound ] %-8s %-14s bound(1) %-10.3g worst error/bound %.3g\n",
                  dataTypeName(t), c->spec().text().c_str(), c->roundTripBound(1.0), ratio);
    }
  }
}

// ---- corrupt messages --------------------------------------------------------------------------

TEST(CodecCorrupt, DecodeRejectsWrongLengthsAndGarbage) {
  const size_t n = 1000;
  Bytes in = pack(kindValues(Kind::kNormalOutliers, n, DataType::kFloat32, 9), DataType::kFloat32);
  for (const char* spec : {"lossless:lz4", "lossless:zstd", "zfp:rate=8", "zfp:tol=1e-3",
                           "zfp:reversible", "int8", "bf16"}) {
    auto c = makeCodec(parseCodec(spec), DataType::kFloat32);
    Bytes enc(c->maxEncodedBytes(n) + 64);
    const size_t bytes = c->encode(in.data(), n, enc.data());
    std::vector<float> out(n + 1);
    EXPECT_THROW(c->decode(enc.data(), bytes - 8, n, out.data()), BackendError) << spec;
    EXPECT_THROW(c->decode(enc.data(), bytes + 8, n, out.data()), BackendError) << spec;
    EXPECT_THROW(c->decode(enc.data(), bytes, 0, out.data()), BackendError) << spec;
    EXPECT_NO_THROW(c->decode(enc.data(), 0, 0, out.data())) << spec;
  }
  auto l = makeCodec(parseCodec("lossless"), DataType::kFloat32);
  Bytes junk(4096);
  std::mt19937 rng(3);
  for (auto& b : junk) b = static_cast<unsigned char>(rng());
  std::vector<float> out(n);
  EXPECT_THROW(l->decode(junk.data(), junk.size(), n, out.data()), BackendError);
  EXPECT_THROW(l->decode(junk.data(), 0, n, out.data()), BackendError);
  auto rev = makeCodec(parseCodec("zfp:reversible"), DataType::kFloat32);
  EXPECT_THROW(rev->decode(junk.data(), 0, n, out.data()), BackendError);
  EXPECT_THROW(rev->decode(junk.data(), 12, n, out.data()), BackendError);
}

// ---- threads and large messages ----------------------------------------------------------------

TEST(CodecThreads, OneCodecServesSeveralThreadsAtOnce) {
  const size_t n = 100003;
  for (const char* spec : {"lossless:lz4", "lossless:zstd", "zfp:rate=8", "zfp:tol=1e-3", "int8"}) {
    auto c = makeCodec(parseCodec(spec), DataType::kFloat32);
    std::vector<Bytes> in(4);
    std::vector<RoundTrip> out(4);
    for (unsigned i = 0; i < 4; ++i) {
      in[i] = pack(kindValues(Kind::kNormalOutliers, n, DataType::kFloat32, 100 + i),
                   DataType::kFloat32);
    }
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] {
        for (int rep = 0; rep < 3; ++rep) out[i] = roundTrip(*c, in[i], n);
      });
    }
    for (auto& th : threads) th.join();
    for (unsigned i = 0; i < 4; ++i) {
      // Each thread's result is the one a lone call gives.
      const RoundTrip alone = roundTrip(*c, in[i], n);
      EXPECT_EQ(out[i].bytes, alone.bytes) << spec;
      EXPECT_EQ(out[i].out, alone.out) << spec;
    }
  }
}

TEST(CodecLarge, LosslessSplitsLargeMessagesIntoChunks) {
  // Messages above kLosslessChunkBytes (1 GiB) are several Blosc2 chunks; the same code runs
  // here with chunks of 4 KiB (and 4 KiB - 4 for float64: whole elements only).
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kUInt8}) {
    for (size_t count : {size_t{1}, size_t{1024}, size_t{4096}, size_t{100003}}) {
      Bytes in = pack(kindValues(Kind::kIntegers, count, t, 11), t);
      auto c = makeLosslessCodec(parseCodec("lossless:zstd"), t, 4096);
      const std::string what = std::string(dataTypeName(t)) + " " + std::to_string(count);
      ASSERT_NO_FATAL_FAILURE(checkRoundTrip(*c, in, count, what));
      const size_t raw = count * dataTypeSize(t);
      const size_t chunk = 4096 / dataTypeSize(t) * dataTypeSize(t);
      EXPECT_EQ(c->maxEncodedBytes(count), raw + (raw + chunk - 1) / chunk * 32) << what;
      if (count < 4096) continue;
      // One chunk short, or one element short of the last chunk: refused.
      Bytes enc(c->maxEncodedBytes(count));
      const size_t bytes = c->encode(in.data(), count, enc.data());
      Bytes out(raw);
      EXPECT_THROW(c->decode(enc.data(), bytes, count - 1, out.data()), BackendError) << what;
      EXPECT_THROW(c->decode(enc.data(), bytes, count + chunk, out.data()), BackendError) << what;
    }
  }
  EXPECT_EQ(makeCodec(parseCodec("lossless"), DataType::kFloat32)->maxEncodedBytes(1000),
            4000u + 32u);
}

// ---- speed (printed) ---------------------------------------------------------------------------

template <typename F>
double bestSeconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;
    best = std::min(best, d.count());
  }
  return best;
}

TEST(CodecSpeed, PrintsEncodeAndDecodeThroughputOnFloat32Normal) {
  const char* env = std::getenv("FOURD_CODEC_SPEED_MIB");
  const size_t mib = env != nullptr && std::atoi(env) > 0 ? static_cast<size_t>(std::atoi(env)) : 2;
  const size_t n = (mib << 20) / 4;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& f : x) f = normal(rng);
  std::vector<float> y(n);
  std::printf(
      "[ codec speed ] %zu MiB float32 normal(0, 1), one thread, best of 3; MB = 1e6 B "
      "of raw data\n",
      mib);
  for (const char* spec : {"lossless:lz4", "lossless:zstd", "zfp:reversible", "zfp:rate=8",
                           "zfp:rate=16", "zfp:tol=1e-3", "int8", "bf16"}) {
    auto c = makeCodec(parseCodec(spec), DataType::kFloat32);
    Bytes enc(c->maxEncodedBytes(n));
    size_t bytes = 0;
    const double te = bestSeconds(3, [&] { bytes = c->encode(x.data(), n, enc.data()); });
    const double td = bestSeconds(3, [&] { c->decode(enc.data(), bytes, n, y.data()); });
    std::printf("[ codec speed ] %-15s ratio %6.2f  encode %8.0f MB/s  decode %8.0f MB/s\n", spec,
                4.0 * n / bytes, 4.0 * n / te / 1e6, 4.0 * n / td / 1e6);
  }
}

}  // namespace
}  // namespace fourd::detail
