// "rhd": recursive halving / doubling, log depth (Thakur, Rabenseifner & Gropp 2005).
//
// p ranks, pof2 = the largest power of two <= p, rem = p - pof2, n bytes; alpha/beta/gamma as
// in docs/algorithms.md. Non-powers of two fold the rem extra ranks in first: even ranks
// r < 2 rem hand their data to r + 1 and sit out; the pof2 remaining ranks (virtual rank
// v = r/2 for odd r < 2 rem, r - rem above) run the power-of-two algorithm, and the result is
// handed back at the end. A virtual rank owns the real blocks of the ranks it stands for (two
// for a folded pair), so its range of blocks is contiguous and every exchange is one message.
//
//   reduce_scatter  (halving) fold: n bytes to the partner and n reduced. Then log2 pof2 steps
//                   at distance pof2/2, pof2/4, ..., 1: send the half of my current range that
//                   the partner keeps, receive mine, reduce (n/2, n/4, ... bytes). Unfold: the
//                   folded partner's block back (n/p).
//                   T = log2 p alpha + (p-1)/p n (beta + gamma)          (p a power of two)
//   all_gather      (doubling) fold: my block to the partner (n/p). log2 pof2 steps at distance
//                   1, 2, ..., pof2/2 exchanging the range gathered so far (n/p ... n/2 bytes).
//                   Unfold: the whole result to the partner (n).
//                   T = log2 p alpha + (p-1)/p n beta
//   all_reduce      large (>= 32 KiB): Rabenseifner = halving reduce-scatter + doubling
//                   all-gather over pof2 even blocks, fold / unfold n bytes each.
//                   T = 2 log2 p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
//                   small: recursive doubling, log2 pof2 exchanges of the whole buffer.
//                   T = log2 p (alpha + n beta + n gamma)
//
// Every exchange is a pair of non-blocking messages followed by one deadline-aware wait; a
// folded-out rank waits for its send before receiving into a buffer that overlaps it.
// Scratch: an accumulator of n bytes and a receive buffer of n bytes.
#include <algorithm>
#include <cstring>

#include "algorithms/levels.hpp"
#include "algorithms/whole_group.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

namespace {

struct Fold {
  int p, r, pof2, rem;
  int v;  // my virtual rank, -1 when folded out
  Fold(int size, int rank) : p(size), r(rank) {
    pof2 = 1;
    while (pof2 * 2 <= p) pof2 *= 2;
    rem = p - pof2;
    if (r < 2 * rem)
      v = (r % 2 == 1) ? r / 2 : -1;
    else
      v = r - rem;
  }
  bool foldedOut() const { return v < 0; }
  bool hasPartner() const { return v >= 0 && r < 2 * rem; }  // odd rank holding a folded pair
  int real(int vr) const { return vr < rem ? 2 * vr + 1 : vr + rem; }
  // First real block owned by virtual rank vr (vr == pof2 gives p).
  int lo(int vr) const { return vr < rem ? 2 * vr : vr + rem; }
};

// Recursive halving over the virtual ranks: log2 pof2 steps at distance pof2/2, ..., 1, each
// sending the half of my current range that the partner keeps and reducing the other half with
// what the partner sends. offset(vr) is the first element owned by virtual rank vr (offset(pof2)
// is the end). `src` holds the whole buffer (my input or `acc`); each step reduces into `acc` at
// the range's offset, except the last, which reduces my own range into `last` when given.
template <class Offset>
void halvingReduceScatter(Schedule& s, const Fold& f, const Offset& offset, const char* src,
                          char* acc, char* tmp, char* last, size_t es, DataType t, ReduceOp op) {
  int vlo = 0, vhi = f.pof2;  // my range of virtual ranks shrinks to [v, v + 1)
  for (int d = f.pof2 / 2; d >= 1; d /= 2) {
    const int partner = f.real(f.v ^ d);
    const bool upper = (f.v & d) != 0;
    const int mlo = upper ? vlo + d : vlo, mhi = upper ? vhi : vlo + d;
    const int olo = upper ? vlo : vlo + d, ohi = upper ? vlo + d : vhi;
    const size_t mo = offset(mlo), mn = offset(mhi) - mo;
    const size_t oo = offset(olo), on = offset(ohi) - oo;
    s.recv(tmp, mn * es, partner);
    s.send(src + oo * es, on * es, partner);
    s.waitAll();
    const char* a = src + mo * es;
    char* dst = (d == 1 && last != nullptr) ? last : acc + mo * es;
    s.compute([=] { reduce2(dst, a, tmp, mn, t, op); });
    src = acc;
    vlo = mlo;
    vhi = mhi;
  }
}

// Recursive doubling over the virtual ranks, in place in `buf`: log2 pof2 steps at distance
// 1, 2, ..., pof2/2 exchanging the range gathered so far. offset() as for halvingReduceScatter.
// `first`, where given, holds the bytes of my range for the first step (my own block, not yet
// in `buf`), and `place` copies them into `buf` once that step's messages are posted.
template <class Offset, class Place>
void doublingAllGather(Schedule& s, const Fold& f, const Offset& offset, char* buf, size_t es,
                       const char* first, const Place& place) {
  for (int d = 1; d < f.pof2; d *= 2) {
    const int pv = f.v ^ d;
    const int mlo = f.v & ~(d - 1), olo = pv & ~(d - 1);
    const size_t mo = offset(mlo), mn = offset(mlo + d) - mo;
    const size_t oo = offset(olo), on = offset(olo + d) - oo;
    s.recv(buf + oo * es, on * es, f.real(pv));
    s.send(d == 1 && first ? first : buf + mo * es, mn * es, f.real(pv));
    if (d == 1 && first) place();
    s.waitAll();
  }
}

}  // namespace

size_t rhdDoublingThreshold() { return 32 * 1024; }

size_t rhdReduceScatterScratch(const Blocks& B, size_t es) {
  return 2 * std::max<size_t>(1, B.total()) * es;
}

void rhdReduceScatter(Schedule& s, const void* inV, void* outV, const Blocks& B, DataType t,
                      ReduceOp op, void* scratch) {
  const int p = s.size(), r = s.rank();
  const size_t es = dataTypeSize(t);
  const char* in = static_cast<const char*>(inV);
  char* out = static_cast<char*>(outV);
  if (oneRankReduceScatter(s, in, out, B, es)) return;
  const Fold f(p, r);
  const size_t total = B.total();
  if (f.foldedOut()) {
    // Hand everything to r + 1; my block comes back reduced.
    s.send(in, total * es, r + 1);
    s.waitAll();
    s.recv(out, B.count(r) * es, r + 1);
    s.waitAll();
    return;
  }
  char* acc = static_cast<char*>(scratch);
  char* tmp = acc + total * es;
  const char* src = in;
  if (f.hasPartner()) {
    s.recv(acc, total * es, r - 1);
    s.waitAll();
    s.compute([=] { reduceInto(acc, in, total, t, op); });
    src = acc;
  }
  // Real blocks are grouped by virtual rank; the last step reduces straight into the output
  // when my range is exactly my block (no folded partner).
  const auto offset = [&](int vr) { return B.offset(f.lo(vr)); };
  halvingReduceScatter(s, f, offset, src, acc, tmp, f.hasPartner() ? nullptr : out, es, t, op);
  if (f.hasPartner()) {
    // My range holds blocks r - 1 (the folded partner's) and r.
    s.send(acc + B.offset(r - 1) * es, B.count(r - 1) * es, r - 1);
    const char* mine = acc + B.offset(r) * es;
    const size_t n = B.count(r);
    s.compute([=] { copyCached(out, mine, n * es); });
    s.waitAll();
  }
}

void rhdAllGather(Schedule& s, void* bufV, const Blocks& B, DataType t, const void* mineV) {
  const int p = s.size(), r = s.rank();
  const size_t es = dataTypeSize(t);
  char* buf = static_cast<char*>(bufV);
  const OwnBlock own(buf, B, r, es, mineV);
  const auto place = [&s, &own] { own.place(s); };
  if (p == 1) return place();
  const Fold f(p, r);
  const size_t total = B.total();
  if (f.foldedOut()) {
    // The whole result comes back, my block included: no copy of it.
    s.send(own.source(), own.bytes, r + 1);
    s.waitAll();
    s.recv(buf, total * es, r + 1);
    s.waitAll();
    return;
  }
  // The first doubling step sends my range: my block, from where it is, unless the range holds
  // the partner's block too (then it is sent from buf, my block placed there first).
  const char* first = own.mine;
  if (f.hasPartner()) {
    s.recv(buf + B.offset(r - 1) * es, B.count(r - 1) * es, r - 1);
    place();
    s.waitAll();
    first = nullptr;
  }
  doublingAllGather(s, f, [&](int vr) { return B.offset(f.lo(vr)); }, buf, es, first, place);
  if (f.hasPartner()) {
    s.send(buf, total * es, r - 1);
    s.waitAll();
  }
}

size_t rhdAllReduceScratch(size_t count, int p, size_t es) {
  return 2 * std::max<size_t>(1, count) * es;
}

void rhdAllReduce(Schedule& s, const void* inV, void* outV, size_t count, DataType t, ReduceOp op,
                  void* scratch) {
  const int p = s.size(), r = s.rank();
  const size_t es = dataTypeSize(t);
  const char* in = static_cast<const char*>(inV);
  char* out = static_cast<char*>(outV);
  if (oneRankAllReduce(s, in, out, count * es)) return;
  const Fold f(p, r);
  const size_t n = count * es;
  if (f.foldedOut()) {
    s.send(in, n, r + 1);
    s.waitAll();
    s.recv(out, n, r + 1);
    s.waitAll();
    return;
  }
  char* acc = static_cast<char*>(scratch);
  char* tmp = acc + n;
  const bool doubling = n < rhdDoublingThreshold() || count < static_cast<size_t>(f.pof2);
  if (doubling) {
    // Recursive doubling on the whole buffer, accumulated in `out`.
    if (f.hasPartner()) {
      s.recv(tmp, n, r - 1);
      s.waitAll();
      s.compute([=] { reduce2(out, in, tmp, count, t, op); });
    } else if (in != out) {
      s.compute([=] { copyCached(out, in, n); });
    }
    for (int d = 1; d < f.pof2; d *= 2) {
      const int partner = f.real(f.v ^ d);
      s.recv(tmp, n, partner);
      s.send(out, n, partner);
      s.waitAll();
      s.compute([=] { reduceInto(out, tmp, count, t, op); });
    }
  } else {
    // Rabenseifner over pof2 even blocks, one per virtual rank.
    const Blocks V = Blocks::even(count, f.pof2);
    const char* src = in;
    if (f.hasPartner()) {
      s.recv(acc, n, r - 1);
      s.waitAll();
      s.compute([=] { reduceInto(acc, in, count, t, op); });
      src = acc;
    }
    const auto offset = [&](int vr) { return V.offset(vr); };
    // The last step leaves my virtual block reduced in place in `out`.
    halvingReduceScatter(s, f, offset, src, acc, tmp, out + V.offset(f.v) * es, es, t, op);
    // Doubling all-gather of the virtual blocks, in place in `out`.
    doublingAllGather(s, f, offset, out, es, nullptr, [] {});
  }
  if (f.hasPartner()) {
    s.send(out, n, r - 1);
    s.waitAll();
  }
}

// ---- the "rhd" algorithm on the whole group ----

constexpr LevelCollectives kRhdLevel = {rhdAllReduceScratch, rhdAllReduce, rhdAllGather,
                                        rhdReduceScatterScratch, rhdReduceScatter};

extern const AlgorithmImpl kRhdAlgorithm = wholeGroupAlgorithm<kRhdLevel>(Algorithm::kRhd, "rhd");

}  // namespace fourd::detail
