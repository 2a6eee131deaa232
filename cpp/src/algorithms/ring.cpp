// "ring": bandwidth-optimal ring over point-to-point messages (Patarasuk & Yuan; NCCL's ring).
//
// p ranks in a ring (right = r+1, left = r-1), n bytes (nccl-tests sizes), blocks of n/p bytes
// (uneven when the count is not divisible by p: the first count % p blocks hold one more
// element), alpha/beta/gamma as in docs/algorithms.md.
//
//   reduce_scatter  p-1 steps. Step s: send block (r-s-1) to the right, receive block (r-s-2)
//                   from the left and reduce it with my input block; the last step lands my own
//                   block r in the output. Per rank: p-1 messages, (p-1)/p * n bytes sent and
//                   received, (p-1)/p * n bytes reduced.
//                   T = (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma.
//   all_gather      p-1 steps. Step s: forward block (r-s) to the right, receive block (r-s-1)
//                   straight into the output. (p-1)/p * n bytes each way, no reduction.
//                   T = (p-1) alpha + (p-1)/p n beta.
//   all_reduce      reduce_scatter then all_gather on the output, in place.
//                   T = 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma.
//
// Overlap: each block is cut into segments (FOURD_RING_SEGMENT_BYTES, 1 MiB by default). Every
// receive of the next step is posted before the current step's reductions, and each segment is
// forwarded to the right as soon as it is reduced, so the neighbour reduces segment j while this
// rank reduces segment j+1 (a pipelined ring). The all-gather posts all of its receives up front:
// they land in distinct places of the output. Scratch: three rotating receive buffers of one
// block (reduce-scatter only).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "algorithms/levels.hpp"
#include "algorithms/whole_group.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

namespace {

// Segments of a block of `count` elements: at least one (possibly empty), so both ends of a
// message agree on how many messages a block takes.
struct Segs {
  size_t count, per;
  int n;
  Segs(size_t c, size_t es) : count(c) {
    per = std::max<size_t>(1, ringSegmentBytes() / es);
    n = count == 0 ? 1 : static_cast<int>((count + per - 1) / per);
  }
  size_t off(int j) const { return std::min(count, per * static_cast<size_t>(j)); }
  size_t len(int j) const { return std::min(count, off(j) + per) - off(j); }
};

inline int mod(long a, int p) { return static_cast<int>(((a % p) + p) % p); }

}  // namespace

size_t ringSegmentBytes() {
  static const size_t bytes = [] {
    size_t v = size_t(1) << 20;
    if (const char* e = std::getenv("FOURD_RING_SEGMENT_BYTES")) {
      const long long x = std::atoll(e);
      if (x >= 64) v = static_cast<size_t>(x);
    }
    return v;
  }();
  return bytes;
}

size_t ringReduceScatterScratch(const Blocks& blocks, size_t elemSize) {
  return 3 * std::max<size_t>(1, blocks.maxCount()) * elemSize;
}

void ringReduceScatter(Schedule& s, const void* inV, void* outV, const Blocks& B, DataType t,
                       ReduceOp op, void* scratch) {
  const int p = s.size(), r = s.rank();
  const size_t es = dataTypeSize(t);
  const char* in = static_cast<const char*>(inV);
  char* out = static_cast<char*>(outV);
  if (oneRankReduceScatter(s, in, out, B, es)) return;
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  char* R[3];
  for (int i = 0; i < 3; ++i) R[i] = static_cast<char*>(scratch) + i * B.maxCount() * es;
  auto sendBlock = [&](int step) { return mod(static_cast<long>(r) - step - 1, p); };
  // Block received (and reduced) at step `st` is the block sent at step st + 1.
  const int last = p - 2;
  std::vector<Schedule::Handle> sendFirst(p), recvFirst(p);

  // Step 0: receive into R[0], send my raw input block.
  {
    const int rb = sendBlock(1);
    Segs g(B.count(rb), es);
    recvFirst[0] = s.handles();
    for (int j = 0; j < g.n; ++j) s.recv(R[0] + g.off(j) * es, g.len(j) * es, left);
    const int sb = sendBlock(0);
    Segs h(B.count(sb), es);
    sendFirst[0] = s.handles();
    for (int j = 0; j < h.n; ++j) s.send(in + (B.offset(sb) + h.off(j)) * es, h.len(j) * es, right);
  }
  for (int st = 0; st <= last; ++st) {
    const int rb = sendBlock(st + 1);
    char* cur = R[st % 3];
    Segs g(B.count(rb), es);
    if (st + 1 <= last) {
      // R[(st+1)%3] was last sent from at step st-1: that send must be done before reuse.
      if (st - 1 >= 1) {
        Segs prev(B.count(sendBlock(st - 1)), es);
        s.wait(sendFirst[st - 1], sendFirst[st - 1] + prev.n);
      }
      const int nb = sendBlock(st + 2);
      Segs h(B.count(nb), es);
      recvFirst[st + 1] = s.handles();
      for (int j = 0; j < h.n; ++j) s.recv(R[(st + 1) % 3] + h.off(j) * es, h.len(j) * es, left);
    }
    const char* mine = in + B.offset(rb) * es;
    const bool final = st == last;  // rb == r
    if (!final) sendFirst[st + 1] = -1;
    for (int j = 0; j < g.n; ++j) {
      s.wait(recvFirst[st] + j);
      const size_t o = g.off(j) * es, n = g.len(j);
      char* dst = final ? out + o : cur + o;
      char* src = cur + o;
      s.compute([=] { reduce2(dst, mine + o, src, n, t, op); });
      if (!final) {
        const auto h = s.send(cur + o, n * es, right);
        if (j == 0) sendFirst[st + 1] = h;
      }
    }
  }
  s.waitAll();
}

void ringAllGather(Schedule& s, void* bufV, const Blocks& B, DataType t, const void* mineV) {
  const int p = s.size(), r = s.rank();
  const size_t es = dataTypeSize(t);
  char* buf = static_cast<char*>(bufV);
  const OwnBlock own(buf, B, r, es, mineV);
  if (p == 1) return own.place(s);
  // My block is only sent (step 0), never forwarded by me: send it from where it is.
  const char* first = own.source();
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  // Step st sends block (r - st) and receives block (r - st - 1); every receive lands in its
  // own place of the output, so all are posted at once.
  std::vector<Schedule::Handle> recvFirst(p);
  for (int st = 0; st < p - 1; ++st) {
    const int rb = mod(static_cast<long>(r) - st - 1, p);
    Segs g(B.count(rb), es);
    recvFirst[st] = s.handles();
    for (int j = 0; j < g.n; ++j) s.recv(buf + (B.offset(rb) + g.off(j)) * es, g.len(j) * es, left);
  }
  {
    Segs g(B.count(r), es);
    for (int j = 0; j < g.n; ++j) s.send(first + g.off(j) * es, g.len(j) * es, right);
  }
  own.place(s);
  for (int st = 0; st + 1 < p - 1; ++st) {
    const int rb = mod(static_cast<long>(r) - st - 1, p);  // forwarded at step st + 1
    Segs g(B.count(rb), es);
    for (int j = 0; j < g.n; ++j) {
      s.wait(recvFirst[st] + j);
      s.send(buf + (B.offset(rb) + g.off(j)) * es, g.len(j) * es, right);
    }
  }
  s.waitAll();
}

size_t ringAllReduceScratch(size_t count, int p, size_t elemSize) {
  return ringReduceScatterScratch(Blocks::even(count, p), elemSize);
}

void ringAllReduce(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                   void* scratch) {
  const int p = s.size(), r = s.rank();
  const size_t es = dataTypeSize(t);
  if (oneRankAllReduce(s, in, out, count * es)) return;
  const Blocks B = Blocks::even(count, p);
  ringReduceScatter(s, in, static_cast<char*>(out) + B.offset(r) * es, B, t, op, scratch);
  ringAllGather(s, out, B, t);
}

// ---- the "ring" algorithm on the whole group ----

constexpr LevelCollectives kRingLevel = {ringAllReduceScratch, ringAllReduce, ringAllGather,
                                         ringReduceScatterScratch, ringReduceScatter};

extern const AlgorithmImpl kRingAlgorithm =
    wholeGroupAlgorithm<kRingLevel>(Algorithm::kRing, "ring");

}  // namespace fourd::detail
