// The alpha-beta-gamma cost model of every collective and algorithm (cost_model.hpp).
//
// Notation (after Chan et al., CCPE 2007): p ranks in the group, N nodes, k group
// ranks per node, R = profile.ranksPerNode ranks per node of the machine, n bytes (nccl-tests
// sizes: the all-reduce buffer, the gathered all-gather output, the reduce-scatter input, the
// broadcast buffer), alpha_i / alpha_e intra- and inter-node latency, Bi the per-rank intra-node
// bandwidth, Be = nicBw * nicsPerNode the node injection bandwidth, gamma = 1/reduceBw.
//
// Assumptions, each one a choice documented in docs/planner.md ("The collective model"):
//
//  1. Concurrency. Every group of an axis runs its collective at the same time (as in 4D
//     training, and as fourd.bench times an axis), so a node's NICs are shared by all R of its
//     ranks, not only by the k members of one group:
//       - a step in which every rank sends over the network (a recursive-halving/doubling step
//         between nodes, a rail of the hierarchical algorithm) gives each rank
//         bRank = min(nicBw, Be / max(R, k));
//       - a node-contiguous ring crosses each node boundary once per direction, so a node
//         carries R/k crossing flows (one per group): each gets Be * k / max(R, k). fourd's ring
//         is one point-to-point ring, so its flow also stays on one NIC: min(nicBw, Be*k/R).
//         The library's own ring (NCCL channels) stripes over the NICs: no nicBw cap.
//     With Be = 100 GB/s and R = 4 (Perlmutter) the ring gets 25, 50, 100 GB/s for k = 1, 2, 4
//     (before efficiency), the shape of AxoNN's measured table (20 / 40 / 80 GB/s).
//  2. Ring steps are synchronous: a ring spanning nodes pays alpha_e and the slowest link on
//     every one of its steps.
//  3. Recursive halving/doubling pairs ranks r and r xor d, in the textbook order: the
//     reduce-scatter halves from d = p/2 down (n/2 bytes at d = p/2, n/4 at p/4, ...), the
//     all-gather doubles from d = 1 up (n/p at d = 1 ... n/2 at d = p/2), the all-reduce is
//     Rabenseifner's RS + AG. So the large messages cross the largest distance: on a
//     node-contiguous group every rank sends n(N-1)/N bytes between nodes, k times what the
//     hierarchical schedule sends. A step stays inside a node when k is a multiple of 2d
//     (exact for powers of two). A non-power-of-two p folds the extra ranks onto partners
//     first (one step of n bytes, or n/p for the all-gather's fold) and unfolds at the end.
//     The broadcast is van de Geijn's binomial scatter + all-gather.
//  4. Flat (the MPI or NCCL library's own collective): the best of the ring and the recursive
//     algorithms (and recursive doubling for a short all-reduce, binomial tree for a short
//     broadcast), except all-gather and reduce-scatter across nodes with k > 1, where NCCL and
//     RCCL offer only rings; the result is divided by flatEfficiency (flatEfficiency16 for a
//     float16 / bfloat16 reduction when set: the library runs those with a user-defined
//     operator, measured 1.5-3x slower than its float32 path on the 2-core VM).
//  5. Hierarchical (k ranks on each of N >= 2 nodes): AR = RS_intra(n) + AR_rail(n/k) +
//     AG_intra(n); AG = AG_rail(n/k) + AG_intra(n) + a local permute of n bytes (priced
//     alpha_i + n/memcpyBw: one more launch or synchronisation and a copy); RS = permute +
//     RS_intra(n) + RS_rail(n/k); broadcast = scatter_intra + broadcast_rail(n/k) + AG_intra.
//     Each level takes the cheaper of ring and recursive; intra levels price Bi and alpha_i,
//     rails bRank and alpha_e. With hierarchicalChunks = C > 1 the levels are pipelined over C
//     chunks: T = sum_l t_l(n/C) + (C-1) * max_l t_l(n/C).
//  6. Shared memory (one node, k = p ranks), as shm.cpp runs it, copies at shmBw (memcpyBw
//     when 0; on GPU nodes the window is host memory behind the host-device link): AR = copy
//     in (k-1)/k n + reduce (k-1)/k n + copy out (k-1)/k n + my reduced n/k stored into my
//     segment, two barriers; AG = copy in n/k + copy out (k-1)/k n, one barrier; RS = copy in
//     (k-1)/k n + reduce (k-1)/k n (into the output), one barrier; broadcast = copy in n +
//     copy out n, two barriers. A barrier costs ceil(log2 p) alpha_i.
//  7. Gamma: reduceBw is bytes of float32 input reduced per second (a streaming figure, see
//     8). float16 and bfloat16 are widened to float32, added and rounded back, which costs
//     instructions on top of the memory traffic: reduceBw16 (default reduceBw / 2, the
//     float32 element rate) is their rate with the data in the cache, and once the data
//     stream they also pay the stall the float32 kernel pays beyond its in-cache time:
//     gamma16 = 1/reduceBw16 + (s - 1/cacheBwGain)/reduceBw (s of 8; 0 without a cache tier).
//     shm reduces them with its own k-input kernel at shmReduceBw16 (default reduceBw16). The
//     rates are the kernels' own, measured, with the node's ranks sharing its cores: on the
//     2-core VM the 16-bit kernels run 2-3x below the float32 one in the cache. Other types
//     use reduceBw as is. All-gather and broadcast have no gamma.
//  8. The cache tier (CPU nodes; off when cacheBytes == 0). On a CPU node every intra-node
//     transfer is a memory copy, and a copy whose data sit in the last-level cache runs
//     cacheBwGain times faster than one that streams from DRAM (measured: 2.0x on the 2-core
//     VM of bench/results). The profile's intraBw, shmBw, memcpyBw and reduceBw are the
//     streaming figures. Each rank touches W = its input + output bytes (all-reduce 2n,
//     all-gather and reduce-scatter n + n/p, broadcast n), every rank of the node at once
//     (assumption 1), so the node's working set is max(R, k) W; the fraction
//     f = min(1, cacheBytes / (max(R, k) W)) stays resident and those terms take
//     1 - f (1 - 1/cacheBwGain) of their streaming time (memoryTimeScale). shm pipelines
//     every message through its window (three buffers of at most 1 MiB per rank, which stay
//     in the cache): half the bytes of each of its copies and reductions are window bytes
//     (scaled as a working set of min(W, 4 MiB) per rank), half private input or output
//     (scaled as W), so its scale is the mean of the two. Network (NIC) terms are not scaled.
//  9. p == 1 or n == 0: nothing moves, every supported algorithm predicts 0.
// 10. Measured corrections (MachineProfile::corrections, written by the init calibration):
//     where the profile holds points for a call's collective, algorithm, group size, node
//     count, dtype class (16-bit or not) and placement (in place or not), the prediction is
//     multiplied by measured / predicted, interpolated linearly in log(n) between the
//     measured sizes, and held below the smallest and above the largest (an algorithm the
//     calibration stopped timing, more than 1.25x slower than the best at 4 MiB, keeps its
//     last factor). Points of the other float width, then of the other placement, stand in
//     when the call's own have none. The fitted figures above
//     get the shape right; the 10-30% effects they miss (how the ranks of a node share its
//     cores and cache in each algorithm's access pattern) decide between shm, ring and rhd on
//     one node, and how a network carries each algorithm's pattern of concurrent transfers
//     (measured on the rails: one rank per node) decides between ring and rhd across nodes.
#include "fourd/cost_model.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fourd/error.hpp"

namespace fourd {

// ---- names --------------------------------------------------------------------------------

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kBroadcast:
      return "broadcast";
  }
  return "?";
}

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kFlat:
      return "flat";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kRhd:
      return "rhd";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kShm:
      return "shm";
  }
  return "?";
}

namespace {

std::string normalized(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch == '_' || ch == '-' || ch == ' ') continue;
    out += static_cast<char>(std::tolower(ch));
  }
  return out;
}

}  // namespace

Collective parseCollective(const std::string& s, const char* argName) {
  const std::string n = normalized(s);
  if (n == "allreduce") return Collective::kAllReduce;
  if (n == "allgather") return Collective::kAllGather;
  if (n == "reducescatter") return Collective::kReduceScatter;
  if (n == "broadcast" || n == "bcast") return Collective::kBroadcast;
  throw InvalidArgument(std::string(argName) +
                        ": expected one of all_reduce, all_gather, reduce_scatter, broadcast; "
                        "found '" +
                        s + "'");
}

Algorithm parseAlgorithm(const std::string& s, const char* argName) {
  const std::string n = normalized(s);
  if (n == "auto") return Algorithm::kAuto;
  if (n == "flat") return Algorithm::kFlat;
  if (n == "ring") return Algorithm::kRing;
  if (n == "rhd") return Algorithm::kRhd;
  if (n == "hierarchical" || n == "hier") return Algorithm::kHierarchical;
  if (n == "shm") return Algorithm::kShm;
  throw InvalidArgument(std::string(argName) +
                        ": expected one of auto, flat, ring, rhd, hierarchical, shm; found '" + s +
                        "'");
}

// ---- the model ----------------------------------------------------------------------------

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// A priced phase: seconds plus a short description for Prediction::reason.
struct Cost {
  double seconds = 0.0;
  std::string note;
};

Cost better(Cost a, Cost b) { return b.seconds < a.seconds ? b : a; }

/// How one group sits on the machine, with the per-message costs that follow from it.
struct Links {
  int p = 1;                 // ranks in the group
  int nodes = 1;             // N
  int k = 1;                 // group ranks per node (floor(p/N) when not uniform)
  double alphaIntra = 0.0;   // alpha_i
  double bwIntra = 1.0;      // Bi, reduced for a mesh when the group uses few of its links
  double alphaInter = 0.0;   // alpha_e
  double bwRingCross = 1.0;  // fourd's ring: one flow per node boundary, on one NIC
  double bwLibCross = 1.0;   // the library's ring: the group's share of Be over all NICs
  double bwRank = 1.0;       // one rank's share of Be when every rank of the node sends
  double gamma = 0.0;        // seconds per byte reduced
  double shmGamma = 0.0;     // the same for shm's k-input kernel
  bool half16 = false;       // float16 / bfloat16 (the library reduces them with a user op)
  double memcpyBw = 1.0;
  double shmBw = 1.0;  // copies into / out of the shared-memory window

  bool spans() const { return nodes > 1; }
  /// A pairwise step at distance d stays inside a node for every pair.
  bool intraDistance(long d) const { return nodes == 1 || (k % (2 * d) == 0); }
  /// One pairwise step at distance d carrying `bytes` (each rank sends and receives them).
  double step(long d, double bytes) const {
    return intraDistance(d) ? alphaIntra + bytes / bwIntra : alphaInter + bytes / bwRank;
  }
};

int floorLog2(long v) {
  int l = 0;
  while ((2L << l) <= v) ++l;
  return l;
}

int ceilLog2(long v) {
  int l = 0;
  while ((1L << l) < v) ++l;
  return l;
}

// -- ring --

/// Ring (or, for broadcast, a pipelined chain with the optimal segment count). `cross` is the
/// bandwidth of the flow that crosses a node boundary.
Cost ringCost(Collective c, double n, const Links& L, double cross) {
  const int p = L.p;
  if (p <= 1) return {0.0, "single rank"};
  const double alpha = L.spans() ? L.alphaInter : L.alphaIntra;
  double bw = L.bwIntra;
  if (L.spans()) bw = L.k > 1 ? std::min(L.bwIntra, cross) : cross;
  const double frac = double(p - 1) / p;
  Cost out;
  switch (c) {
    case Collective::kAllReduce:
      out.seconds = 2.0 * (p - 1) * (alpha + n / p / bw) + frac * n * L.gamma;
      out.note = std::to_string(2 * (p - 1)) + " ring steps";
      break;
    case Collective::kAllGather:
      out.seconds = (p - 1) * (alpha + n / p / bw);
      out.note = std::to_string(p - 1) + " ring steps";
      break;
    case Collective::kReduceScatter:
      out.seconds = (p - 1) * (alpha + n / p / bw) + frac * n * L.gamma;
      out.note = std::to_string(p - 1) + " ring steps";
      break;
    case Collective::kBroadcast: {
      // (p - 2 + S) steps of (alpha + n/(S bw)) for S segments; the best S >= 1 is
      // sqrt((p-2) n / (alpha bw)), which gives (sqrt((p-2) alpha) + sqrt(n/bw))^2.
      const double best = alpha > 0.0 ? std::sqrt((p - 2) * n / (alpha * bw)) : n;
      const double segments = std::max(1.0, std::min(best, std::max(1.0, n)));
      out.seconds = (p - 2 + segments) * (alpha + n / segments / bw);
      out.note = "pipelined chain";
      break;
    }
  }
  return out;
}

// -- recursive halving / doubling --

/// Reduce-scatter core on pof2 = 2^levels ranks: step i (1..levels) at distance pof2/2^i
/// exchanges and reduces n/2^i bytes.
double rhdReduceScatterCore(double n, int levels, const Links& L) {
  double t = 0.0;
  for (int i = 1; i <= levels; ++i) {
    const double bytes = n / double(1L << i);
    t += L.step(1L << (levels - i), bytes) + bytes * L.gamma;
  }
  return t;
}

/// All-gather core: the mirror of the reduce-scatter core (distance 1 first, n/2 bytes last).
double rhdAllGatherCore(double n, int levels, const Links& L) {
  double t = 0.0;
  for (int i = levels; i >= 1; --i) t += L.step(1L << (levels - i), n / double(1L << i));
  return t;
}

Cost rhdCost(Collective c, double n, const Links& L) {
  const int p = L.p;
  if (p <= 1) return {0.0, "single rank"};
  const int levels = floorLog2(p);
  const bool folded = (1L << levels) != p;
  double t = 0.0;
  switch (c) {
    case Collective::kAllReduce:
      if (folded) t += L.step(1, n) + n * L.gamma + L.step(1, n);
      t += rhdReduceScatterCore(n, levels, L) + rhdAllGatherCore(n, levels, L);
      break;
    case Collective::kReduceScatter:
      if (folded) t += L.step(1, n) + n * L.gamma + L.step(1, n / p);
      t += rhdReduceScatterCore(n, levels, L);
      break;
    case Collective::kAllGather:
      if (folded) t += L.step(1, n / p) + L.step(1, n);
      t += rhdAllGatherCore(n, levels, L);
      break;
    case Collective::kBroadcast:
      // Binomial scatter far-first (distance d carries n*d/pof2), then the all-gather core.
      for (int i = 1; i <= levels; ++i) t += L.step(1L << (levels - i), n / double(1L << i));
      t += rhdAllGatherCore(n, levels, L);
      if (folded) t += L.step(1, n);
      break;
  }
  std::string note = std::to_string(levels) + " halving/doubling levels";
  if (folded) note += " + fold/unfold";
  return {t, note};
}

/// Recursive-doubling all-reduce (short messages): log2 p steps of the whole buffer.
Cost recursiveDoublingAllReduce(double n, const Links& L) {
  const int levels = floorLog2(L.p);
  double t = 0.0;
  if ((1L << levels) != L.p) t += L.step(1, n) + n * L.gamma + L.step(1, n);
  for (int i = 0; i < levels; ++i) t += L.step(1L << i, n) + n * L.gamma;
  return {t, "recursive doubling"};
}

/// Binomial-tree broadcast, far-first: ceil(log2 p) steps of the whole buffer.
Cost binomialBroadcast(double n, const Links& L) {
  const int levels = ceilLog2(L.p);
  double t = 0.0;
  for (int i = levels - 1; i >= 0; --i) t += L.step(1L << i, n);
  return {t, "binomial tree"};
}

/// Binomial scatter of n bytes inside a node (the first level of a hierarchical broadcast).
double binomialScatter(double n, const Links& L) {
  const int levels = ceilLog2(L.p);
  double t = 0.0;
  for (int i = 1; i <= levels; ++i) t += L.step(1L << (levels - i), n / double(1L << i));
  return t;
}

/// The cheaper of ring and recursive for one level of the hierarchy.
Cost bestLevel(Collective c, double n, const Links& L) {
  if (L.p <= 1) return {0.0, "-"};
  Cost ring = ringCost(c, n, L, L.bwRingCross);
  ring.note = "ring";
  Cost rhd = rhdCost(c, n, L);
  rhd.note = "rhd";
  return better(ring, rhd);
}

// -- flat --

Cost flatCost(Collective c, double n, const Links& L, double efficiency) {
  Cost libRing = ringCost(c, n, L, L.bwLibCross);
  libRing.note = "ring";
  Cost rhd = rhdCost(c, n, L);
  rhd.note = "recursive halving/doubling";
  Cost best;
  switch (c) {
    case Collective::kAllReduce:
      best = better(better(libRing, rhd), recursiveDoublingAllReduce(n, L));
      break;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      // NCCL/RCCL run only rings for AG/RS with several GPUs per node (PAT needs 1 per node).
      best = (L.spans() && L.k > 1) ? libRing : better(libRing, rhd);
      break;
    case Collective::kBroadcast:
      best = better(better(libRing, rhd), binomialBroadcast(n, L));
      break;
  }
  best.seconds /= efficiency;
  best.note = "library (modelled as " + best.note + ")";
  return best;
}

// -- hierarchical --

/// One level of a hierarchical schedule: a sub-collective on `links` over bytes * n.
struct Level {
  enum Kind { kCollective, kScatter, kBroadcastRail } kind = kCollective;
  Collective collective = Collective::kAllReduce;
  const Links* links = nullptr;
  double fraction = 1.0;
  const char* label = "";
};

Cost levelCost(const Level& lv, double n) {
  const double bytes = n * lv.fraction;
  switch (lv.kind) {
    case Level::kScatter:
      return {binomialScatter(bytes, *lv.links), "binomial"};
    case Level::kBroadcastRail: {
      Cost chain = ringCost(Collective::kBroadcast, bytes, *lv.links, lv.links->bwRingCross);
      chain.note = "chain";
      Cost vdg = rhdCost(Collective::kBroadcast, bytes, *lv.links);
      vdg.note = "scatter+allgather";
      return better(chain, vdg);
    }
    case Level::kCollective:
      break;
  }
  return bestLevel(lv.collective, bytes, *lv.links);
}

Cost hierarchicalCost(Collective c, double n, const Links& L, const MachineProfile& prof) {
  Links intra = L;
  intra.p = L.k;
  intra.nodes = 1;
  Links rail = L;
  rail.p = L.nodes;
  rail.k = 1;
  rail.bwRingCross = L.bwRank;  // every rank of the node drives its own rail
  rail.bwLibCross = L.bwRank;

  const double perNode = 1.0 / L.k;
  std::vector<Level> levels;
  double local = 0.0;  // the on-device permute, not pipelined
  switch (c) {
    case Collective::kAllReduce:
      levels = {{Level::kCollective, Collective::kReduceScatter, &intra, 1.0, "RS intra"},
                {Level::kCollective, Collective::kAllReduce, &rail, perNode, "AR rail"},
                {Level::kCollective, Collective::kAllGather, &intra, 1.0, "AG intra"}};
      break;
    case Collective::kAllGather:
      levels = {{Level::kCollective, Collective::kAllGather, &rail, perNode, "AG rail"},
                {Level::kCollective, Collective::kAllGather, &intra, 1.0, "AG intra"}};
      if (L.k > 1) local = L.alphaIntra + n / L.memcpyBw;
      break;
    case Collective::kReduceScatter:
      levels = {{Level::kCollective, Collective::kReduceScatter, &intra, 1.0, "RS intra"},
                {Level::kCollective, Collective::kReduceScatter, &rail, perNode, "RS rail"}};
      if (L.k > 1) local = L.alphaIntra + n / L.memcpyBw;
      break;
    case Collective::kBroadcast:
      levels = {{Level::kScatter, Collective::kBroadcast, &intra, 1.0, "scatter intra"},
                {Level::kBroadcastRail, Collective::kBroadcast, &rail, perNode, "bcast rail"},
                {Level::kCollective, Collective::kAllGather, &intra, 1.0, "AG intra"}};
      break;
  }
  const int chunks = std::max(1, prof.hierarchicalChunks);
  double sum = 0.0, slowest = 0.0;
  std::string note;
  for (const Level& lv : levels) {
    const Cost lc = levelCost(lv, n / chunks);
    sum += lc.seconds;
    slowest = std::max(slowest, lc.seconds);
    if (!note.empty()) note += " + ";
    note += std::string(lv.label) + " (" + lc.note + ")";
  }
  if (local > 0.0) note += " + permute";
  if (chunks > 1) note += ", " + std::to_string(chunks) + " chunks pipelined";
  return {sum + (chunks - 1) * slowest + local, note};
}

// -- shared memory --

Cost shmCost(Collective c, double n, const Links& L) {
  // As shm.cpp runs them (k = p): a rank never copies its own slice in, reduces it straight
  // into its output (storing it into its segment from the cache), and copies only the others'.
  const double barrier = ceilLog2(L.p) * L.alphaIntra;
  const double copy = n / L.shmBw;
  const double others = (L.p - 1.0) / L.p;  // (k-1)/k
  switch (c) {
    case Collective::kAllReduce:
      return {(2.0 * others + 1.0 / L.p) * copy + others * n * L.shmGamma + 2.0 * barrier,
              "copy in, reduce my slice from every segment, copy out"};
    case Collective::kAllGather:
      return {copy + barrier, "copy in my block, copy out the others"};
    case Collective::kReduceScatter:
      return {others * copy + others * n * L.shmGamma + barrier,
              "copy in, reduce my block from every segment"};
    case Collective::kBroadcast:
      return {2.0 * copy + 2.0 * barrier, "copy in, copy out"};
  }
  return {kInf, ""};
}

// -- validation and setup --

// Every call checks its group's shape (shapeSupports): the message is built only on failure.
void checkShape(const GroupShape& s) {
  auto found = [&] {
    std::ostringstream os;
    os << "size=" << s.size << ", nodes=" << s.nodes << ", ranksPerNode=" << s.ranksPerNode
       << ", uniform=" << (s.uniform ? "true" : "false");
    return os.str();
  };
  if (s.size < 1 || s.nodes < 1 || s.nodes > s.size) {
    throw InvalidArgument("shape: expected size >= 1 and 1 <= nodes <= size; found " + found());
  }
  if (s.uniform && (s.ranksPerNode < 1 || s.ranksPerNode * s.nodes != s.size)) {
    throw InvalidArgument("shape: a uniform group needs size == nodes * ranksPerNode; found " +
                          found());
  }
}

void checkProfileFields(const MachineProfile& m) {
  // Named as in C++ and as in profile files and Python (profileFields()).
  auto fail = [&](const char* field, const char* fileName, const std::string& expected,
                  double value) {
    std::ostringstream os;
    os << "profile." << field << " (" << fileName << "): expected " << expected << "; found "
       << value << " (profile '" << m.name << "')";
    throw InvalidArgument(os.str());
  };
  if (m.ranksPerNode < 1) fail("ranksPerNode", "ranks_per_node", ">= 1", m.ranksPerNode);
  if (m.nicsPerNode < 1) fail("nicsPerNode", "nics_per_node", ">= 1", m.nicsPerNode);
  if (m.hierarchicalChunks < 1)
    fail("hierarchicalChunks", "hierarchical_chunks", ">= 1", m.hierarchicalChunks);
  if (!(m.intraAlpha >= 0)) fail("intraAlpha", "intra_alpha", ">= 0 seconds", m.intraAlpha);
  if (!(m.interAlpha >= 0)) fail("interAlpha", "inter_alpha", ">= 0 seconds", m.interAlpha);
  if (!(m.intraBw > 0)) fail("intraBw", "intra_bw", "> 0 bytes/s", m.intraBw);
  if (!(m.nicBw > 0)) fail("nicBw", "nic_bw", "> 0 bytes/s", m.nicBw);
  if (!(m.reduceBw > 0)) fail("reduceBw", "reduce_bw", "> 0 bytes/s", m.reduceBw);
  if (!(m.memcpyBw > 0)) fail("memcpyBw", "memcpy_bw", "> 0 bytes/s", m.memcpyBw);
  if (!(m.flatEfficiency > 0)) fail("flatEfficiency", "flat_efficiency", "> 0", m.flatEfficiency);
  if (!(m.flatEfficiency16 >= 0)) {
    fail("flatEfficiency16", "flat_efficiency_16", ">= 0 (0: flat_efficiency)", m.flatEfficiency16);
  }
  if (!(m.shmBw >= 0)) fail("shmBw", "shm_bw", ">= 0 bytes/s (0: memcpy_bw)", m.shmBw);
  if (!(m.reduceBw16 >= 0))
    fail("reduceBw16", "reduce_bw_16", ">= 0 bytes/s (0: reduce_bw / 2)", m.reduceBw16);
  if (!(m.shmReduceBw16 >= 0)) {
    fail("shmReduceBw16", "shm_reduce_bw_16", ">= 0 bytes/s (0: reduce_bw_16)", m.shmReduceBw16);
  }
  if (!(m.cacheBytes >= 0))
    fail("cacheBytes", "cache_bytes", ">= 0 bytes (0: no cache tier)", m.cacheBytes);
  if (!(m.cacheBwGain >= 1) || std::isinf(m.cacheBwGain)) {
    fail("cacheBwGain", "cache_bw_gain", "a finite ratio >= 1", m.cacheBwGain);
  }
  // Every prediction checks its profile (a calibrated one holds hundreds of corrections):
  // the names are built only on failure.
  for (size_t i = 0; i < m.corrections.size(); ++i) {
    const Correction& c = m.corrections[i];
    auto check = [&](bool ok, const char* field, const char* fileName, const char* expected,
                     double value) {
      if (ok) return;
      const std::string at = "corrections[" + std::to_string(i) + "].";
      fail((at + field).c_str(), (at + fileName).c_str(), expected, value);
    };
    const int ci = static_cast<int>(c.collective), ai = static_cast<int>(c.algorithm);
    check(ci >= 0 && ci < kNumCollectives, "collective", "collective", "0..3", ci);
    check(ai >= 1 && ai < kNumAlgorithms, "algorithm", "algorithm", "a concrete algorithm", ai);
    check(c.groupSize >= 1, "groupSize", "group_size", ">= 1", c.groupSize);
    check(c.nodes >= 1 && c.nodes <= c.groupSize, "nodes", "nodes", "1..group_size", c.nodes);
    check(c.nbytes > 0 && !std::isinf(c.nbytes), "nbytes", "nbytes", "> 0 bytes", c.nbytes);
    check(c.factor > 0 && !std::isinf(c.factor), "factor", "factor", "a finite ratio > 0",
          c.factor);
  }
}

/// Interpolates log(factor) linearly in log(nbytes) between the matching points of the
/// profile and holds the end factors beyond them. Fading the factor back to the plain model
/// above the largest point (as an earlier version did on one node) let the model alone choose
/// at 64 MiB, where it was wrong by 2x: it priced MPICH's bfloat16 all-reduce, measured at
/// 4 MiB only (pruned above), at 47 ms on 2 ranks, and auto ran it at 88 ms against ring's
/// 21 ms. Points of the call's own float width and placement match first; when there are none,
/// those of the other width, then of the other placement (the calibration measures all_gather
/// and reduce_scatter in float32 only, an all-gather moving bytes whatever their type and a
/// 16-bit reduce-scatter's own reduction rate being in the model already; and across nodes,
/// where the network decides, out of place only). 1 when none match.
double interpolatedCorrection(const MachineProfile& m, Collective c, Algorithm a,
                              const GroupShape& s, bool half, bool inPlace, double n) {
  const Correction* below = nullptr;  // the largest point at or below n
  const Correction* above = nullptr;  // the smallest point above n
  // The call's own width and placement first; then the other width, the other placement, both.
  const bool prefs[4][2] = {{half, inPlace}, {!half, inPlace}, {half, !inPlace}, {!half, !inPlace}};
  for (const auto& pref : prefs) {
    for (const Correction& x : m.corrections) {
      if (x.collective != c || x.algorithm != a || x.groupSize != s.size || x.nodes != s.nodes ||
          x.half16 != pref[0] || x.inPlace != pref[1]) {
        continue;
      }
      if (x.nbytes <= n) {
        if (!below || x.nbytes > below->nbytes) below = &x;
      } else if (!above || x.nbytes < above->nbytes) {
        above = &x;
      }
    }
    if (below || above) break;
  }
  if (!below && !above) return 1.0;
  if (!below) return above->factor;
  if (!above || below->nbytes == n) return below->factor;
  const double t = std::log(n / below->nbytes) / std::log(above->nbytes / below->nbytes);
  return std::exp((1.0 - t) * std::log(below->factor) + t * std::log(above->factor));
}

bool isHalf(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }

/// The factor for one call of a validated profile (1 when nothing moves or nothing matches).
double factorFor(const MachineProfile& m, Collective c, Algorithm a, const GroupShape& s,
                 DataType t, bool inPlace, size_t nbytes) {
  if (nbytes == 0 || s.size <= 1 || m.corrections.empty()) return 1.0;
  return interpolatedCorrection(m, c, a, s, isHalf(t), inPlace, static_cast<double>(nbytes));
}

double timeScale(const MachineProfile& m, double nodeBytes) {
  if (m.cacheBytes <= 0.0 || m.cacheBwGain <= 1.0) return 1.0;
  const double resident = nodeBytes <= m.cacheBytes ? 1.0 : m.cacheBytes / nodeBytes;
  return 1.0 - resident * (1.0 - 1.0 / m.cacheBwGain);
}

/// The most one rank touches between two barriers of shm: its three window buffers of up to
/// 1 MiB and the tile it reduces (shm.cpp).
constexpr double kShmWindowBytes = 4.0 * (1 << 20);

/// Bytes one rank touches: its input plus its output (nccl-tests sizes, p ranks).
double rankWorkingSet(Collective c, double n, int p) {
  switch (c) {
    case Collective::kAllReduce:
      return 2.0 * n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return n + n / p;
    case Collective::kBroadcast:
      return n;
  }
  return n;
}

Links makeLinks(Collective c, size_t nbytes, const GroupShape& s, DataType dtype,
                const MachineProfile& m) {
  Links L;
  L.p = s.size;
  L.nodes = s.nodes;
  L.k = s.uniform ? s.ranksPerNode : std::max(1, s.size / s.nodes);
  const int r = std::max(m.ranksPerNode, L.k);  // ranks of the node sharing its NICs
  const double be = m.nodeInjectionBw();
  L.alphaIntra = m.intraAlpha;
  L.alphaInter = m.interAlpha;
  L.bwIntra = m.intraBw;
  if (m.intraMesh && r > 1 && L.k >= 2) L.bwIntra = m.intraBw * double(L.k - 1) / (r - 1);
  L.bwLibCross = be * L.k / r;
  L.bwRingCross = std::min(m.nicBw, L.bwLibCross);
  L.bwRank = std::min(m.nicBw, be / r);
  // Memory-bound terms of the node: faster while the node's working set stays in its cache.
  const double scale = timeScale(m, r * rankWorkingSet(c, double(nbytes), std::max(1, L.p)));
  L.bwIntra /= scale;
  // 16-bit reductions: their in-cache rate plus the memory stall the float32 kernel suffers
  // beyond its in-cache time once the data stream (0 without a cache tier).
  const bool half = isHalf(dtype);
  L.half16 = half;
  const double rate16 = m.reduceBw16 > 0.0 ? m.reduceBw16 : m.reduceBw / 2.0;
  const double resident = m.cacheBytes > 0.0 && m.cacheBwGain > 1.0 ? 1.0 / m.cacheBwGain : 1.0;
  L.gamma = half ? 1.0 / rate16 + (scale - resident) / m.reduceBw : scale / m.reduceBw;
  L.memcpyBw = m.memcpyBw / scale;
  // shm pipelines every message through its window (three buffers of at most 1 MiB per rank,
  // which stay in the cache): each copy and reduction moves half its bytes between the window
  // and the private buffers, which stream like every other algorithm's.
  const double window = timeScale(
      m, r * std::min(rankWorkingSet(c, double(nbytes), std::max(1, L.p)), kShmWindowBytes));
  const double shmScale = 0.5 * (scale + window);
  L.shmBw = (m.shmBw > 0.0 ? m.shmBw : m.memcpyBw) / shmScale;
  const double shmRate16 = m.shmReduceBw16 > 0.0 ? m.shmReduceBw16 : rate16;
  L.shmGamma = half ? 1.0 / shmRate16 + (shmScale - resident) / m.reduceBw : shmScale / m.reduceBw;
  return L;
}

bool supportedNoThrow(Collective c, Algorithm a, const GroupShape& s, std::string* reason) {
  switch (a) {
    case Algorithm::kAuto:
    case Algorithm::kFlat:
    case Algorithm::kRing:
    case Algorithm::kRhd:
      return true;
    case Algorithm::kHierarchical:
      if (s.nodes == 1) {
        if (reason) *reason = "the group is on one node: no inter-node level";
        return false;
      }
      if (!s.uniform) {
        if (reason) *reason = "nodes hold different numbers of the group's ranks";
        return false;
      }
      return true;
    case Algorithm::kShm:
      if (s.nodes != 1) {
        if (reason) {
          *reason =
              "the group spans " + std::to_string(s.nodes) + " nodes; shared memory needs one node";
        }
        return false;
      }
      return true;
  }
  if (reason) *reason = "unknown algorithm";
  return false;
}

Cost concreteCost(Collective c, Algorithm a, size_t nbytes, const Links& L,
                  const MachineProfile& m) {
  const double n = static_cast<double>(nbytes);
  if (L.p <= 1 || nbytes == 0) return {0.0, "nothing to move"};
  switch (a) {
    case Algorithm::kFlat:
      return flatCost(c, n, L,
                      L.half16 && m.flatEfficiency16 > 0.0 && c != Collective::kAllGather &&
                              c != Collective::kBroadcast
                          ? m.flatEfficiency16
                          : m.flatEfficiency);
    case Algorithm::kRing:
      return ringCost(c, n, L, L.bwRingCross);
    case Algorithm::kRhd:
      return rhdCost(c, n, L);
    case Algorithm::kHierarchical:
      return hierarchicalCost(c, n, L, m);
    case Algorithm::kShm:
      return shmCost(c, n, L);
    case Algorithm::kAuto:
      break;
  }
  return {kInf, "auto is not a concrete algorithm"};
}

void checkEnums(Collective c, Algorithm a) {
  const int ci = static_cast<int>(c), ai = static_cast<int>(a);
  if (ci < 0 || ci > 3) {
    throw InvalidArgument("collective: expected 0..3 (all_reduce .. broadcast); found " +
                          std::to_string(ci));
  }
  if (ai < 0 || ai >= kNumAlgorithms) {
    throw InvalidArgument("algorithm: expected 0.." + std::to_string(kNumAlgorithms - 1) +
                          " (auto .. shm); found " + std::to_string(ai));
  }
}

}  // namespace

void checkProfile(const MachineProfile& profile) { checkProfileFields(profile); }

const std::vector<ProfileField>& profileFields() {
  using M = MachineProfile;
  static const std::vector<ProfileField> fields = {
      {"name", &M::name, "a label"},
      {"ranks_per_node", &M::ranksPerNode, "GPUs (or MPI ranks) per node"},
      {"intra_alpha", &M::intraAlpha, "latency of one intra-node message, s"},
      {"intra_bw", &M::intraBw, "per-rank intra-node bandwidth, B/s"},
      {"inter_alpha", &M::interAlpha, "latency of one inter-node message, s"},
      {"nic_bw", &M::nicBw, "bandwidth of one NIC, B/s"},
      {"nics_per_node", &M::nicsPerNode, "NICs per node (node injection = nic_bw * nics_per_node)"},
      {"reduce_bw", &M::reduceBw, "bytes of float32 input reduced per second by one rank"},
      {"memcpy_bw", &M::memcpyBw, "local copy bandwidth per rank, B/s"},
      {"flat_efficiency", &M::flatEfficiency,
       "the MPI library's own collective relative to the ring model"},
      {"compute_flops", &M::computeFlops, "dense matmul throughput per rank (planner only)"},
      {"memory_bytes", &M::memoryBytes, "memory per rank (planner only)"},
      {"intra_mesh", &M::intraMesh, "direct rank-to-rank links inside a node (no switch)"},
      {"hierarchical_chunks", &M::hierarchicalChunks,
       "chunks the hierarchical levels are pipelined over"},
      {"shm_bw", &M::shmBw, "copy bandwidth through a shared-memory window, B/s (0: memcpy_bw)"},
      {"reduce_bw_16", &M::reduceBw16,
       "float16/bfloat16 bytes reduced per second, pairwise kernel (0: reduce_bw / 2)"},
      {"shm_reduce_bw_16", &M::shmReduceBw16,
       "the same with shm's k-input kernel (0: reduce_bw_16)"},
      {"flat_efficiency_16", &M::flatEfficiency16,
       "flat_efficiency of 16-bit reductions (0: flat_efficiency)"},
      {"cache_bytes", &M::cacheBytes, "last-level cache shared by a node's ranks (0: no tier)"},
      {"cache_bw_gain", &M::cacheBwGain, "cache-resident / streaming bandwidth, >= 1"},
      {"corrections", &M::corrections, "measured / predicted time of calibrated calls"},
  };
  return fields;
}

bool isSupported(Collective collective, Algorithm algorithm, const GroupShape& shape,
                 std::string* reason) {
  checkEnums(collective, algorithm);
  checkShape(shape);
  return supportedNoThrow(collective, algorithm, shape, reason);
}

double correctionFactor(const MachineProfile& profile, Collective collective, Algorithm algorithm,
                        const GroupShape& shape, DataType dtype, bool inPlace, size_t nbytes) {
  checkEnums(collective, algorithm);
  checkShape(shape);
  checkProfileFields(profile);
  return factorFor(profile, collective, algorithm, shape, dtype, inPlace, nbytes);
}

std::vector<Prediction> candidates(Collective collective, size_t nbytes, DataType dtype,
                                   const GroupShape& shape, const MachineProfile& profile,
                                   bool inPlace) {
  checkEnums(collective, Algorithm::kFlat);
  checkShape(shape);
  checkProfileFields(profile);
  const Links links = makeLinks(collective, nbytes, shape, dtype, profile);
  std::vector<Prediction> out;
  out.reserve(kNumAlgorithms - 1);
  for (int i = 1; i < kNumAlgorithms; ++i) {
    Prediction pr;
    pr.algorithm = static_cast<Algorithm>(i);
    pr.supported = supportedNoThrow(collective, pr.algorithm, shape, &pr.reason);
    if (pr.supported) {
      Cost c = concreteCost(collective, pr.algorithm, nbytes, links, profile);
      pr.seconds = c.seconds;
      pr.reason = std::move(c.note);
      pr.correction = factorFor(profile, collective, pr.algorithm, shape, dtype, inPlace, nbytes);
      if (pr.correction != 1.0) {
        pr.seconds *= pr.correction;
        std::ostringstream os;
        os.precision(3);
        os << "; x" << pr.correction << " measured";
        pr.reason += os.str();
      }
    } else {
      pr.seconds = kInf;
    }
    out.push_back(std::move(pr));
  }
  return out;
}

Algorithm choose(Collective collective, size_t nbytes, DataType dtype, const GroupShape& shape,
                 const MachineProfile& profile, bool inPlace) {
  Algorithm best = Algorithm::kFlat;
  double bestSeconds = kInf;
  for (const Prediction& pr : candidates(collective, nbytes, dtype, shape, profile, inPlace)) {
    if (pr.supported && pr.seconds < bestSeconds) {
      best = pr.algorithm;
      bestSeconds = pr.seconds;
    }
  }
  return best;
}

double predict(Collective collective, Algorithm algorithm, size_t nbytes, DataType dtype,
               const GroupShape& shape, const MachineProfile& profile, bool inPlace) {
  checkEnums(collective, algorithm);
  checkShape(shape);
  checkProfileFields(profile);
  if (algorithm == Algorithm::kAuto) {
    algorithm = choose(collective, nbytes, dtype, shape, profile, inPlace);
  }
  if (!supportedNoThrow(collective, algorithm, shape, nullptr)) return kInf;
  return concreteCost(collective, algorithm, nbytes,
                      makeLinks(collective, nbytes, shape, dtype, profile), profile)
             .seconds *
         factorFor(profile, collective, algorithm, shape, dtype, inPlace, nbytes);
}

double memoryTimeScale(const MachineProfile& profile, double nodeWorkingSetBytes) {
  checkProfileFields(profile);
  if (!(nodeWorkingSetBytes >= 0)) {
    std::ostringstream os;
    os << "nodeWorkingSetBytes: expected >= 0 bytes; found " << nodeWorkingSetBytes;
    throw InvalidArgument(os.str());
  }
  return timeScale(profile, nodeWorkingSetBytes);
}

}  // namespace fourd
