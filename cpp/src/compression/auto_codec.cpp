// "auto" compression: the lossless codec where the cost model predicts that the link time it
// saves exceeds its own time (internal/compression.hpp).
#include <algorithm>
#include <chrono>
#include <vector>

#include "internal/compression.hpp"
#include "internal/group.hpp"

namespace fourd::detail {

namespace {

// The codec "auto" may choose: lossless only (a lossy codec changes results, so it is used only
// when named).
CodecSpec losslessSpec() { return parseCodec("lossless"); }

struct Sample {
  double invRatio = 1.0;   // encoded / raw bytes
  double encodeSpB = 0.0;  // seconds per raw byte
  double decodeSpB = 0.0;
};

// Up to 4 slices of 256 KiB spread over the input, encoded and decoded once each.
Sample sampleInput(const Codec& c, const Buffer& in) {
  using Clock = std::chrono::steady_clock;
  const size_t es = dataTypeSize(in.dtype);
  const size_t slice = std::min<size_t>(in.count, (256 * 1024) / es);
  const int n = in.count >= 4 * slice ? 4 : 1;
  std::vector<char> enc(c.maxEncodedBytes(slice)), dec(slice * es);
  size_t raw = 0, coded = 0;
  double te = 0, td = 0;
  for (int i = 0; i < n && slice > 0; ++i) {
    const size_t off = (in.count - slice) / std::max(1, n - 1) * i;
    const char* src = static_cast<const char*>(in.data) + off * es;
    const auto t0 = Clock::now();
    const size_t b = c.encode(src, slice, enc.data());
    const auto t1 = Clock::now();
    c.decode(enc.data(), b, slice, dec.data());
    const auto t2 = Clock::now();
    te += std::chrono::duration<double>(t1 - t0).count();
    td += std::chrono::duration<double>(t2 - t1).count();
    raw += slice * es;
    coded += b;
  }
  Sample s;
  if (raw == 0) return s;
  s.invRatio = static_cast<double>(coded) / static_cast<double>(raw);
  s.encodeSpB = te / static_cast<double>(raw);
  s.decodeSpB = td / static_cast<double>(raw);
  return s;
}

// Bytes one rank sends over the codec's level, and that level's bandwidth per rank.
void linkOf(const Group& g, Collective coll, size_t nbytes, bool rail, double* wire, double* bw) {
  const auto profile = g.profile();
  const GroupTopology& t = g.topology();
  const int k = std::max(1, t.k);
  const bool across = t.numNodes > 1;
  const double perRank = across ? profile->nodeInjectionBw() / k : profile->intraBw;
  const int p = rail ? t.numNodes : g.size();
  const double n = rail ? static_cast<double>(nbytes) / k : static_cast<double>(nbytes);
  const double steps = static_cast<double>(p - 1) / p;
  *wire = (coll == Collective::kAllReduce ? 2.0 : 1.0) * steps * n;
  *bw = perRank;
}

}  // namespace

CodecSpec decideAutoCodec(Group& g, Collective coll, const Buffer& in, size_t nbytes, bool rail,
                          OpContext& ctx) {
  const CodecSpec lossless = losslessSpec();
  const auto codec = makeCodec(lossless, in.dtype);
  const Codec& c = *codec;
  const Sample mine = sampleInput(c, in);
  double v[3] = {mine.invRatio, mine.encodeSpB, mine.decodeSpB}, worst[3];
  g.backend().allReduce(Buffer(v, 3, DataType::kFloat64), Buffer(worst, 3, DataType::kFloat64),
                        ReduceOp::kMax, ctx);
  double wire = 0, bw = 1;
  linkOf(g, coll, nbytes, rail, &wire, &bw);
  const double saved = wire * (1.0 - worst[0]) / bw;
  const double cost = wire * (worst[1] + worst[2]);
  // A 25% margin: the prediction's error must not turn a predicted win into a loss.
  return saved > 1.25 * cost ? lossless : CodecSpec{};
}

}  // namespace fourd::detail
