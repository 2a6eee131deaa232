// Compressed ring collectives: the ring of ring.cpp with a codec (internal/codec.hpp) on every
// message. They run on a level whose link is slow (the rail level of "hierarchical"), or on the
// whole group when a call asks for a codec with a one-level algorithm.
//
// Messages. Each block is cut into segments (FOURD_RING_SEGMENT_BYTES of raw data, 1 MiB by
// default); each segment is encoded on its own into a length-prefixed message (8 bytes of
// payload length, then the payload, Schedule::sendMessage), so the receiver of a
// variable-length codec posts the largest message and learns the length from the header.
//
//   all_gather      every rank encodes its block once; the messages are forwarded around the
//                   ring unchanged and decoded where they land (one application of the codec,
//                   whatever the group size). A lossy codec's owner decodes its own message
//                   too, so every rank holds the same values.
//   reduce_scatter  step s receives the partial sum of a block, decodes it, adds its own input
//                   and encodes the new partial for the right neighbour: p-1 applications
//                   along each block's chain; the last receiver adds without re-encoding.
//   all_reduce      reduce_scatter, then all_gather of the reduced blocks (one more
//                   application): composedBound() below gives the total error bound.
//
// Scratch (caller-owned): the encoded messages of every step have slots of their own, so no
// slot is reused while a send from it may be in flight, plus one raw segment to decode into.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "algorithms/levels.hpp"
#include "internal/compression.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

namespace {

constexpr size_t kHeader = sizeof(uint64_t);

size_t align64(size_t b) { return (b + 63) / 64 * 64; }
inline int mod(long a, int p) { return static_cast<int>(((a % p) + p) % p); }

// The segments of a block of `count` elements (at least one, possibly empty, so both ends
// agree on the number of messages) and the slot of each encoded segment.
struct Segments {
  size_t count, per;
  int n;
  Segments(size_t c, size_t es) : count(c) {
    per = std::max<size_t>(1, ringSegmentBytes() / es);
    // Whole int8 and ZFP blocks per segment (256 and 4 values divide this).
    if (per > 1024) per = per / 1024 * 1024;
    n = count == 0 ? 1 : static_cast<int>((count + per - 1) / per);
  }
  size_t off(int j) const { return std::min(count, per * static_cast<size_t>(j)); }
  size_t len(int j) const { return std::min(count, off(j) + per) - off(j); }
};

// Bytes of the message slot of `count` elements.
size_t slotBytes(const Codec& c, size_t count) {
  return align64(kHeader + c.maxEncodedBytes(count));
}
// Bytes of the slots of every segment of a block.
size_t blockSlots(const Codec& c, size_t count, size_t es) {
  const Segments g(count, es);
  size_t b = 0;
  for (int j = 0; j < g.n; ++j) b += slotBytes(c, g.len(j));
  return b;
}

// A block's message slots, laid out from `base`.
struct Slots {
  std::vector<char*> at;
  Slots(const Codec& c, char* base, size_t count, size_t es) {
    const Segments g(count, es);
    for (int j = 0; j < g.n; ++j) {
      at.push_back(base);
      base += slotBytes(c, g.len(j));
    }
  }
};

// Encodes n elements into a message (header + payload).
void encodeMessage(const Codec& c, const void* src, size_t n, char* msg) {
  const uint64_t len = c.encode(src, n, msg + kHeader);
  std::memcpy(msg, &len, kHeader);
}
void decodeMessage(const Codec& c, const char* msg, size_t n, void* dst) {
  uint64_t len;
  std::memcpy(&len, msg, kHeader);
  c.decode(msg + kHeader, static_cast<size_t>(len), n, dst);
}

}  // namespace

size_t codecRingAllGatherScratch(const Codec& c, const Blocks& B, size_t es) {
  size_t b = 0;
  for (int i = 0; i < B.size(); ++i) b += blockSlots(c, B.count(i), es);
  return std::max<size_t>(64, b);
}

void codecRingAllGather(Schedule& s, const Codec& c, void* bufV, const Blocks& B, DataType t,
                        void* scratch) {
  const int p = s.size(), r = s.rank();
  if (p == 1) return;
  const size_t es = dataTypeSize(t);
  char* buf = static_cast<char*>(bufV);
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  std::vector<Slots> slots;
  char* base = static_cast<char*>(scratch);
  for (int i = 0; i < p; ++i) {
    slots.emplace_back(c, base, B.count(i), es);
    base += blockSlots(c, B.count(i), es);
  }
  const Codec* cp = &c;
  const bool lossy = c.spec().lossy();
  // My block: encoded once; with a lossy codec I keep what the others will decode.
  {
    const Segments g(B.count(r), es);
    for (int j = 0; j < g.n; ++j) {
      char* blk = buf + (B.offset(r) + g.off(j)) * es;
      char* msg = slots[r].at[j];
      const size_t n = g.len(j);
      s.compute([=] {
        encodeMessage(*cp, blk, n, msg);
        if (lossy) decodeMessage(*cp, msg, n, blk);
      });
    }
  }
  std::vector<Schedule::Handle> recvFirst(p);
  for (int st = 0; st < p - 1; ++st) {
    const int rb = mod(static_cast<long>(r) - st - 1, p);
    const Segments g(B.count(rb), es);
    recvFirst[st] = s.handles();
    for (int j = 0; j < g.n; ++j) s.recv(slots[rb].at[j], slotBytes(c, g.len(j)), left);
  }
  {
    const Segments g(B.count(r), es);
    for (int j = 0; j < g.n; ++j) s.sendMessage(slots[r].at[j], right);
  }
  for (int st = 0; st < p - 1; ++st) {
    const int rb = mod(static_cast<long>(r) - st - 1, p);
    const Segments g(B.count(rb), es);
    for (int j = 0; j < g.n; ++j) {
      s.wait(recvFirst[st] + j);
      const char* msg = slots[rb].at[j];
      if (st + 1 < p - 1) s.sendMessage(msg, right);
      char* dst = buf + (B.offset(rb) + g.off(j)) * es;
      const size_t n = g.len(j);
      s.compute([=] { decodeMessage(*cp, msg, n, dst); });
    }
  }
  s.waitAll();
}

size_t codecRingReduceScatterScratch(const Codec& c, const Blocks& B, size_t es) {
  const int p = B.size();
  const size_t perStep = blockSlots(c, B.maxCount(), es);
  const size_t raw = align64(std::max<size_t>(1, Segments(B.maxCount(), es).per) * es);
  return std::max<size_t>(64, 2 * static_cast<size_t>(std::max(1, p - 1)) * perStep + raw);
}

void codecRingReduceScatter(Schedule& s, const Codec& c, const void* inV, void* outV,
                            const Blocks& B, DataType t, ReduceOp op, void* scratch) {
  const int p = s.size(), r = s.rank();
  const size_t es = dataTypeSize(t);
  const char* in = static_cast<const char*>(inV);
  char* out = static_cast<char*>(outV);
  if (oneRankReduceScatter(s, in, out, B, es)) return;
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  const int steps = p - 1;
  const size_t perStep = blockSlots(c, B.maxCount(), es);
  char* base = static_cast<char*>(scratch);
  // recvd[st]: the partials received at step st; sent[st]: the partials sent at step st.
  std::vector<Slots> recvd, sent;
  auto sendBlock = [&](int step) { return mod(static_cast<long>(r) - step - 1, p); };
  for (int st = 0; st < steps; ++st) {
    recvd.emplace_back(c, base + st * perStep, B.count(sendBlock(st + 1)), es);
    sent.emplace_back(c, base + (steps + st) * perStep, B.count(sendBlock(st)), es);
  }
  char* raw = base + 2 * static_cast<size_t>(steps) * perStep;
  const Codec* cp = &c;
  std::vector<Schedule::Handle> recvFirst(steps);
  for (int st = 0; st < steps; ++st) {
    const Segments g(B.count(sendBlock(st + 1)), es);
    recvFirst[st] = s.handles();
    for (int j = 0; j < g.n; ++j) s.recv(recvd[st].at[j], slotBytes(c, g.len(j)), left);
  }
  {  // Step 0: my raw input block, encoded.
    const int sb = sendBlock(0);
    const Segments g(B.count(sb), es);
    for (int j = 0; j < g.n; ++j) {
      const char* src = in + (B.offset(sb) + g.off(j)) * es;
      char* msg = sent[0].at[j];
      const size_t n = g.len(j);
      s.compute([=] { encodeMessage(*cp, src, n, msg); });
      s.sendMessage(msg, right);
    }
  }
  for (int st = 0; st < steps; ++st) {
    const int rb = sendBlock(st + 1);
    const bool final = st == steps - 1;  // rb == r
    const Segments g(B.count(rb), es);
    for (int j = 0; j < g.n; ++j) {
      s.wait(recvFirst[st] + j);
      const size_t o = g.off(j) * es, n = g.len(j);
      const char* msg = recvd[st].at[j];
      const char* mine = in + B.offset(rb) * es + o;
      char* dst = final ? out + o : raw;
      char* next = final ? nullptr : sent[st + 1].at[j];
      s.compute([=] {
        decodeMessage(*cp, msg, n, raw);
        reduce2(dst, mine, raw, n, t, op);
        if (next) encodeMessage(*cp, raw, n, next);
      });
      if (!final) s.sendMessage(next, right);
    }
  }
  s.waitAll();
}

size_t codecRingAllReduceScratch(const Codec& c, size_t count, int p, size_t es) {
  const Blocks B = Blocks::even(count, p);
  return std::max(codecRingReduceScatterScratch(c, B, es), codecRingAllGatherScratch(c, B, es));
}

void codecRingAllReduce(Schedule& s, const Codec& c, const void* in, void* out, size_t count,
                        DataType t, ReduceOp op, void* scratch) {
  const int p = s.size(), r = s.rank();
  const size_t es = dataTypeSize(t);
  if (oneRankAllReduce(s, in, out, count * es)) return;
  const Blocks B = Blocks::even(count, p);
  // In place, my reduced block lands on my block of the input: the reduce-scatter reads that
  // block only at its last step (the chain of block r ends here), in the same pass that writes
  // it, and the all-gather starts after the reduce-scatter has completed.
  codecRingReduceScatter(s, c, in, static_cast<char*>(out) + B.offset(r) * es, B, t, op, scratch);
  codecRingAllGather(s, c, out, B, t, scratch);
}

double composedBound(const Codec& c, int chain, double absmax, bool gatherAfter) {
  // Partial sums of h inputs pass the codec at hops h = 1..chain: E_h = E_{h-1} + b(h A +
  // E_{h-1}); an all_gather after encodes the whole sum (chain + 1 inputs) once more.
  double e = 0.0;
  for (int h = 1; h <= chain; ++h) e += c.roundTripBound(h * absmax + e);
  if (gatherAfter) e += c.roundTripBound((chain + 1) * absmax + e);
  return e;
}

}  // namespace fourd::detail
