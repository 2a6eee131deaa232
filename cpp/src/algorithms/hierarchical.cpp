// "hierarchical": two levels from the group's topology (PCCL's phase order, the collectives
// notes section 1): k group ranks on each of N >= 2 nodes. The intra level is the members on my
// node (Group::intra, rank = my local index); the rail level is the members with my local
// index on every node (Group::rail, rank = my node index), so the k rails of a node run at
// once and every NIC carries traffic. Both levels are Groups with backends of their own, split
// from the group's: the same code runs over MPI and over NCCL.
//
// n bytes (nccl-tests sizes), alpha_i/beta_i inside a node, alpha_e/beta_e per rail between
// nodes (a rail gets about Be/k of the node's injection Be), gamma per reduced byte:
//
//   all_reduce      RS_intra(n) -> AR_rail(n/k) on my 1/k shard -> AG_intra(n).
//                   Per rank: 2(k-1)/k n bytes inside the node, 2(N-1)/N n/k bytes on the rail
//                   (node total 2(N-1)/N n: the network lower bound).
//                   T = 2[(k-1) alpha_i + (k-1)/k n beta_i]
//                       + 2(N-1) alpha_e + 2(N-1)/N (n/k) beta_e
//                       + [(k-1)/k n + (N-1)/N n/k] gamma          (ring levels; rhd: log2 steps)
//   all_gather      AG_rail(n/p per rank, N of them) -> AG_intra(N n/p per rank) -> permute the
//                   blocks into group-rank order (group ranks on a node need not be
//                   consecutive). T = (N-1) alpha_e + (N-1)/N (n/k) beta_e + (k-1) alpha_i
//                   + (k-1)/k n beta_i + n/memcpy.
//   reduce_scatter  permute the input so that local rank l's intra block holds the blocks of
//                   the group ranks with local index l on every node, in node order ->
//                   RS_intra(n) -> RS_rail(n/k). Same cost plus gamma terms.
//
// Each level picks its own algorithm: on host memory, ring or rhd from the cost model and the
// machine profile (or shm for the intra level when the node's ranks share memory;
// FOURD_HIERARCHICAL_INTRA / FOURD_HIERARCHICAL_INTER force one: ring, rhd, shm, auto); on GPU
// memory, the level backend's own collective (NCCL's). The backend's reduce-scatter takes equal
// blocks, so with such an intra level the all_reduce runs the largest part divisible by k
// through the levels and the last count % k elements (fewer than k) with one flat all_reduce
// of the whole group.
//
// Overlap: the buffer is cut into C chunks (MachineProfile::hierarchicalChunks, or
// FOURD_HIERARCHICAL_CHUNKS; fewer for small buffers, at least 2 MiB a chunk). The intra
// level and the rail level are two schedules advanced together (runConcurrently): the rail
// stage of chunk i runs while the intra stage of chunk i+1 runs; for all_reduce the intra
// order is RS(0) RS(1) AG(0) RS(2) AG(1) ... With ring levels the time tends to
// sum_l t_l(n/C) + (C-1) max_l t_l(n/C).
//
// On one node the rails have one member each: asked for by name, the algorithm runs its intra
// level alone (so code written for a cluster runs unchanged on one machine); the cost model
// leaves it out of auto's candidates there. With one rank per node (and no codec on the
// rails) it runs its rail level alone. Either way the level's algorithm runs on the group as
// itself (oneLevel): the same messages as the two-level path, without its second schedule,
// its staging copies and its pipeline chunks. Not supported (supports() says why, and an
// explicit request raises InvalidArgument): nodes holding different numbers of the group's
// ranks (the rails would differ in size).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "algorithms/levels.hpp"
#include "fourd/error.hpp"

namespace fourd::detail {

namespace {

constexpr size_t kMinChunkBytes = 2 * 1024 * 1024;

bool supports(Collective c, const Group& g, std::string* reason) {
  // One node: the rails have one member each and the intra level is the whole group, so the
  // algorithm runs its intra level alone (code written for a cluster runs unchanged on one
  // machine). Uneven nodes (rails of different sizes): the cost model says so in the words
  // explain() shows.
  if (g.topology().numNodes == 1) return true;
  return shapeSupports(c, Algorithm::kHierarchical, g, reason);
}

// "ring" / "rhd" / "shm" / "auto" from an environment variable; nullptr-safe.
bool envLevel(const char* var, LevelAlgo* out) {
  const char* e = std::getenv(var);
  if (!e || !*e) return false;
  const std::string v(e);
  if (v == "auto") return false;
  if (v == "ring")
    *out = LevelAlgo::kRing;
  else if (v == "rhd")
    *out = LevelAlgo::kRhd;
  else if (v == "shm")
    *out = LevelAlgo::kShm;
  else
    throw InvalidArgument(std::string(var) + ": expected ring, rhd, shm or auto; found '" + v +
                          "'");
  return true;
}

// The level's algorithm: the backend's own on GPU memory; else forced by the environment, else
// the cheapest in the cost model.
LevelAlgo chooseLevelNow(const Group& g, const Group& level, Collective c, bool intraLevel,
                         size_t bytes, DataType t, bool shmOk) {
  if (!level.backend().hostMemory()) return LevelAlgo::kFlat;
  const int size = level.size();
  LevelAlgo forced;
  if (envLevel(intraLevel ? "FOURD_HIERARCHICAL_INTRA" : "FOURD_HIERARCHICAL_INTER", &forced)) {
    if (forced == LevelAlgo::kShm && (!intraLevel || !shmOk)) return LevelAlgo::kRing;
    return forced;
  }
  if (size <= 1 || bytes == 0) return LevelAlgo::kRing;
  GroupShape shape;
  shape.size = size;
  shape.nodes = intraLevel ? 1 : size;
  shape.ranksPerNode = intraLevel ? size : 1;
  shape.uniform = true;
  const auto profile = g.profile();
  const MachineProfile& prof = *profile;
  LevelAlgo best = LevelAlgo::kRing;
  double bestT = predict(c, Algorithm::kRing, bytes, t, shape, prof);
  const double rhd = predict(c, Algorithm::kRhd, bytes, t, shape, prof);
  if (rhd < bestT) {
    best = LevelAlgo::kRhd;
    bestT = rhd;
  }
  if (intraLevel && shmOk) {
    const double shm = predict(c, Algorithm::kShm, bytes, t, shape, prof);
    if (shm < bestT) best = LevelAlgo::kShm;
  }
  return best;
}

// chooseLevelNow, remembered per group for the profile it was priced with: every call asks
// (twice for two levels), and pricing a level reads the environment and walks the profile's
// measured corrections. The FOURD_HIERARCHICAL_* settings are agreed at init and stay put.
struct LevelMemo {
  std::shared_ptr<const MachineProfile> profile;
  std::map<std::tuple<int, size_t, int, bool, bool, int>, LevelAlgo> chosen;
};

LevelAlgo chooseLevel(Group& g, const Group& level, Collective c, bool intraLevel, size_t bytes,
                      DataType t, bool shmOk) {
  auto& slot = g.state()["hierarchical.levels"];
  if (!slot) slot = std::make_shared<LevelMemo>();
  auto* memo = static_cast<LevelMemo*>(slot.get());
  auto profile = g.profile();
  if (memo->profile != profile) {
    memo->chosen.clear();
    memo->profile = std::move(profile);
  }
  const auto key = std::make_tuple(static_cast<int>(c), bytes, static_cast<int>(t), intraLevel,
                                   shmOk, level.size());
  auto it = memo->chosen.find(key);
  if (it == memo->chosen.end()) {
    if (memo->chosen.size() >= 4096) memo->chosen.clear();
    it = memo->chosen.emplace(key, chooseLevelNow(g, level, c, intraLevel, bytes, t, shmOk)).first;
  }
  return it->second;
}

// Chunks of the pipeline: FOURD_HIERARCHICAL_CHUNKS exactly when set (tests use it to force
// several), else the profile's hierarchicalChunks, fewer for small buffers (each chunk pays a
// synchronisation per level, which costs more than it overlaps below ~2 MiB on an
// oversubscribed node).
int chunkCount(const Group& g, size_t totalBytes) {
  if (const char* e = std::getenv("FOURD_HIERARCHICAL_CHUNKS")) {
    const int v = std::atoi(e);
    if (v >= 1) return std::min(v, 64);
  }
  const int c = std::min(std::max(1, g.profile()->hierarchicalChunks), 64);
  const size_t bySize = std::max<size_t>(1, totalBytes / kMinChunkBytes);
  return static_cast<int>(std::min<size_t>(static_cast<size_t>(c), bySize));
}

size_t align64(size_t b) { return (b + 63) / 64 * 64; }

// ---- one level, any algorithm ----

size_t levelRSScratch(LevelAlgo a, const Blocks& B, size_t es) {
  switch (a) {
    case LevelAlgo::kRing:
      return ringReduceScatterScratch(B, es);
    case LevelAlgo::kRhd:
      return rhdReduceScatterScratch(B, es);
    default:
      return 0;
  }
}

size_t levelARScratch(LevelAlgo a, size_t count, int p, size_t es) {
  switch (a) {
    case LevelAlgo::kRing:
      return ringAllReduceScratch(count, p, es);
    case LevelAlgo::kRhd:
      return rhdAllReduceScratch(count, p, es);
    default:
      return 0;
  }
}

// `B` is uniform whenever `a` is kFlat (the callers make it so).
void levelRS(Schedule& s, LevelAlgo a, ShmWindow* w, const void* in, void* out, const Blocks& B,
             DataType t, ReduceOp op, void* scratch) {
  switch (a) {
    case LevelAlgo::kRing:
      ringReduceScatter(s, in, out, B, t, op, scratch);
      break;
    case LevelAlgo::kRhd:
      rhdReduceScatter(s, in, out, B, t, op, scratch);
      break;
    case LevelAlgo::kShm:
      shmReduceScatter(s, *w, in, out, B, t, op);
      break;
    case LevelAlgo::kFlat:
      flatReduceScatter(s, in, out, B.count(0), t, op);
      break;
  }
}

void levelAG(Schedule& s, LevelAlgo a, ShmWindow* w, void* buf, const Blocks& B, DataType t,
             const void* mine = nullptr) {
  switch (a) {
    case LevelAlgo::kRing:
      ringAllGather(s, buf, B, t, mine);
      break;
    case LevelAlgo::kRhd:
      rhdAllGather(s, buf, B, t, mine);
      break;
    case LevelAlgo::kShm:
      shmAllGather(s, *w, buf, B, t);
      break;
    case LevelAlgo::kFlat:
      flatAllGather(s, buf, B.count(0), t);
      break;
  }
}

void levelAR(Schedule& s, LevelAlgo a, const void* in, void* out, size_t count, DataType t,
             ReduceOp op, void* scratch) {
  switch (a) {
    case LevelAlgo::kRhd:
      rhdAllReduce(s, in, out, count, t, op, scratch);
      break;
    case LevelAlgo::kFlat:
      flatAllReduce(s, in, out, count, t, op);
      break;
    default:
      ringAllReduce(s, in, out, count, t, op, scratch);
      break;
  }
}

// The algorithm that runs a level's choice on a whole group.
const AlgorithmImpl* implOf(LevelAlgo a) {
  switch (a) {
    case LevelAlgo::kShm:
      return algorithmImpl(Algorithm::kShm);
    case LevelAlgo::kRhd:
      return algorithmImpl(Algorithm::kRhd);
    case LevelAlgo::kFlat:
      return algorithmImpl(Algorithm::kFlat);
    case LevelAlgo::kRing:
      break;
  }
  return algorithmImpl(Algorithm::kRing);
}

// A group with one level of work: one rank per node (the rails are the whole group; without a
// codec on them) or one node (the intra level is the whole group). The level's algorithm then
// runs on the group itself, as ring/rhd/shm/flat would: no second schedule, no staging copies
// into rail order, no pipeline chunks. Data-parallel groups of a grid whose tensor-parallel
// axes fill the nodes have one rank per node, so this is the usual case there. Null when both
// levels have work.
const AlgorithmImpl* oneLevel(Group& g, Collective c, size_t bytes, DataType t, OpContext& ctx) {
  const GroupTopology& topo = g.topology();
  if (topo.k == 1 && topo.numNodes > 1 && !ctx.codec)
    return implOf(chooseLevel(g, g, c, false, bytes, t, false));
  if (topo.numNodes == 1 && topo.k > 1)
    return implOf(chooseLevel(g, g, c, true, bytes, t, shmAvailable(g.intra(ctx), ctx)));
  return nullptr;
}

// Everything the three collectives share: the two levels, their algorithms, the flags that
// order the two schedules.
struct Levels {
  Group& g;
  const GroupTopology& topo;
  int k, N, l, node;
  Group* intra;
  Group* rail;
  LevelAlgo ia = LevelAlgo::kRing, ea = LevelAlgo::kRing;
  ShmWindow* w = nullptr;
  const Codec* codec;                    // the rail level's codec (null: uncompressed)
  std::vector<std::vector<int>> member;  // member[node][local] = group rank

  Levels(Group& group, OpContext& ctx) : g(group), topo(group.topology()), codec(ctx.codec) {
    k = topo.k;
    N = topo.numNodes;
    const int me = g.rank();
    l = topo.localIndex[me];
    node = topo.nodeIndex[me];
    intra = &g.intra(ctx);
    rail = &g.rail(ctx);
    member.assign(N, std::vector<int>(k, -1));
    for (int r = 0; r < topo.size; ++r) member[topo.nodeIndex[r]][topo.localIndex[r]] = r;
  }

  // Picks both levels; `intraBytes` is what one intra-level collective moves.
  void choose(Collective intraColl, size_t intraBytes, Collective railColl, size_t railBytes,
              DataType t, size_t shmBytesPerRank, OpContext& ctx) {
    const bool shmOk = k > 1 && shmAvailable(*intra, ctx);
    ia = chooseLevel(g, *intra, intraColl, true, intraBytes, t, shmOk);
    ea = chooseLevel(g, *rail, railColl, false, railBytes, t, false);
    if (ia == LevelAlgo::kShm) {
      w = shmWindow(*intra, shmBytesPerRank, ctx);
      if (!w) ia = LevelAlgo::kRing;
    }
  }

  // Local copies, on the group's memory (host or device).
  void copy(void* dst, const void* src, size_t bytes) const { g.backend().copy(dst, src, bytes); }

  void run(Schedule& si, Schedule& sr, OpContext& ctx) {
    markShmRunning(w, true);
    runConcurrently({&si, &sr}, ctx);
    markShmRunning(w, false);
  }
};

std::function<std::string()> laggingLevel(const char* what, int chunk) {
  return [what, chunk] {
    return std::string("the ") + what + " of chunk " + std::to_string(chunk) + " (on this rank)";
  };
}

// The chunks of an all_reduce of `count` elements: even (the host levels take uneven blocks),
// or, when the intra level is the backend's own collective (equal blocks only), multiples of k
// over the first count - count % k elements.
Blocks allReduceChunks(const Levels& L, size_t count, int C) {
  if (L.ia != LevelAlgo::kFlat) return Blocks::even(count, C);
  Blocks b = Blocks::even(count / L.k, C);
  for (auto& o : b.off) o *= static_cast<size_t>(L.k);
  return b;
}

void allReduce(Group& g, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  if (auto* one = oneLevel(g, Collective::kAllReduce, in.bytes(), in.dtype, ctx))
    return one->allReduce(g, in, out, op, ctx);
  Levels L(g, ctx);
  const DataType t = in.dtype;
  const size_t es = dataTypeSize(t);
  const size_t count = in.count;
  const int C = chunkCount(g, in.bytes());
  const size_t evenMax = Blocks::even(count, C).maxCount();
  L.choose(Collective::kAllReduce, evenMax * es, Collective::kAllReduce,
           (evenMax + L.k - 1) / L.k * es, t, evenMax * es, ctx);
  const Blocks chunks = allReduceChunks(L, count, C);
  const size_t maxChunk = chunks.maxCount();
  const size_t maxShard = (maxChunk + L.k - 1) / L.k;
  char* scratchI = static_cast<char*>(
      g.scratch(0, std::max<size_t>(64, levelRSScratch(L.ia, Blocks::even(maxChunk, L.k), es))));
  const size_t railScratch = L.codec ? codecRingAllReduceScratch(*L.codec, maxShard, L.N, es)
                                     : levelARScratch(L.ea, maxShard, L.N, es);
  char* scratchE = static_cast<char*>(g.scratch(1, std::max<size_t>(64, railScratch)));

  Schedule si(L.intra->backend(), laneTag(ctx, 1)), sr(L.rail->backend(), laneTag(ctx, 2));
  std::vector<char> rsDone(C, 0), arDone(C, 0);
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  auto agIntra = [&](int c) {
    const Blocks ib = Blocks::even(chunks.count(c), L.k);
    char* chunk = dst + chunks.offset(c) * es;
    si.waitUntil([&arDone, c] { return arDone[c] != 0; }, laggingLevel("rail all_reduce", c));
    levelAG(si, L.ia, L.w, chunk, ib, t);
  };
  for (int c = 0; c < C; ++c) {
    const size_t c0 = chunks.offset(c);
    const Blocks ib = Blocks::even(chunks.count(c), L.k);
    char* shard = dst + (c0 + ib.offset(L.l)) * es;
    const size_t sn = ib.count(L.l);
    // Intra reduce-scatter of chunk c: my shard lands in place in the output.
    levelRS(si, L.ia, L.w, src + c0 * es, shard, ib, t, op, scratchI);
    si.compute([&rsDone, c] { rsDone[c] = 1; });
    // Rail all-reduce of my shard, as soon as it is ready.
    sr.waitUntil([&rsDone, c] { return rsDone[c] != 0; }, laggingLevel("intra reduce_scatter", c));
    if (L.codec)
      codecRingAllReduce(sr, *L.codec, shard, shard, sn, t, op, scratchE);
    else
      levelAR(sr, L.ea, shard, shard, sn, t, op, scratchE);
    sr.compute([&arDone, c] { arDone[c] = 1; });
    if (c >= 1) agIntra(c - 1);
  }
  agIntra(C - 1);
  L.run(si, sr, ctx);
  const size_t body = chunks.total();
  if (body < count) {  // fewer than k elements the equal-block levels cannot split
    g.backend().allReduce(in.slice(body, count - body), out.slice(body, count - body), op, ctx);
  }
}

void allGather(Group& g, const Buffer& in, const Buffer& out, OpContext& ctx) {
  if (auto* one = oneLevel(g, Collective::kAllGather, out.bytes(), in.dtype, ctx))
    return one->allGather(g, in, out, ctx);
  Levels L(g, ctx);
  const DataType t = in.dtype;
  const size_t es = dataTypeSize(t);
  const size_t m = in.count;
  const int p = g.size();
  const int C = chunkCount(g, out.bytes());
  const Blocks chunks = Blocks::even(m, C);
  const size_t maxChunk = chunks.maxCount();
  L.choose(Collective::kAllGather, maxChunk * p * es, Collective::kAllGather, maxChunk * L.N * es,
           t, maxChunk * L.N * es, ctx);
  // T: chunk c occupies p * chunk elements at p * offset(c), laid out [local][node] x chunk.
  char* T = static_cast<char*>(g.scratch(0, std::max<size_t>(64, static_cast<size_t>(p) * m * es)));
  char* scratchE =
      L.codec ? static_cast<char*>(g.scratch(
                    1, codecRingAllGatherScratch(*L.codec, Blocks::uniform(maxChunk, L.N), es)))
              : nullptr;
  Schedule si(L.intra->backend(), laneTag(ctx, 1)), sr(L.rail->backend(), laneTag(ctx, 2));
  std::vector<char> railDone(C, 0);
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  const int k = L.k, N = L.N;
  const Levels* lv = &L;
  for (int c = 0; c < C; ++c) {
    const size_t c0 = chunks.offset(c), cm = chunks.count(c);
    char* Tc = T + static_cast<size_t>(p) * c0 * es;
    char* myRail = Tc + static_cast<size_t>(L.l) * N * cm * es;
    char* myBlock = myRail + static_cast<size_t>(L.node) * cm * es;
    if (!L.codec && (L.ea == LevelAlgo::kRing || L.ea == LevelAlgo::kRhd)) {
      // My block goes out from my input and is copied into T meanwhile (levels.hpp,
      // ringAllGather: not the copy it has just written).
      levelAG(sr, L.ea, L.w, myRail, Blocks::uniform(cm, N), t, src + c0 * es);
    } else {
      sr.compute([=] { lv->copy(myBlock, src + c0 * es, cm * es); });
      if (L.codec)
        codecRingAllGather(sr, *L.codec, myRail, Blocks::uniform(cm, N), t, scratchE);
      else
        levelAG(sr, L.ea, L.w, myRail, Blocks::uniform(cm, N), t);
    }
    sr.compute([&railDone, c] { railDone[c] = 1; });
    si.waitUntil([&railDone, c] { return railDone[c] != 0; }, laggingLevel("rail all_gather", c));
    levelAG(si, L.ia, L.w, Tc, Blocks::uniform(static_cast<size_t>(N) * cm, k), t);
    si.compute([=] {
      for (int ll = 0; ll < k; ++ll)
        for (int nn = 0; nn < N; ++nn) {
          const size_t r = static_cast<size_t>(lv->member[nn][ll]);
          lv->copy(dst + (r * m + c0) * es, Tc + (static_cast<size_t>(ll) * N + nn) * cm * es,
                   cm * es);
        }
    });
  }
  L.run(si, sr, ctx);
}

// In place (the output is my block of the input): chunk c of every rank's block is staged into
// T before the rail level writes chunk c of my output, and later chunks read other elements, so
// the two-level path takes the alias as it is; a level algorithm run alone that cannot
// (reduceScatterInPlace) reduces into scratch and the result is copied over.
void reduceScatter(Group& g, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  if (auto* one = oneLevel(g, Collective::kReduceScatter, in.bytes(), in.dtype, ctx)) {
    const bool aliased =
        out.count > 0 && out.data == in.slice(out.count * g.rank(), out.count).data;
    return intoOrThroughScratch(g, out, aliased && !one->reduceScatterInPlace,
                                [&](const Buffer& o) { one->reduceScatter(g, in, o, op, ctx); });
  }
  Levels L(g, ctx);
  const DataType t = in.dtype;
  const size_t es = dataTypeSize(t);
  const size_t m = out.count;
  const int p = g.size();
  const int k = L.k, N = L.N;
  const int C = chunkCount(g, in.bytes());
  const Blocks chunks = Blocks::even(m, C);
  const size_t maxChunk = chunks.maxCount();
  L.choose(Collective::kReduceScatter, maxChunk * p * es, Collective::kReduceScatter,
           maxChunk * N * es, t, maxChunk * p * es, ctx);
  // Slot 0: T (the permuted input, p*m), U (the intra results, N*m), the intra level's scratch.
  const size_t tBytes = align64(static_cast<size_t>(p) * m * es);
  const size_t uBytes = align64(static_cast<size_t>(N) * m * es);
  const size_t iBytes =
      levelRSScratch(L.ia, Blocks::uniform(static_cast<size_t>(N) * maxChunk, k), es);
  char* T = static_cast<char*>(g.scratch(0, tBytes + uBytes + std::max<size_t>(64, iBytes)));
  char* U = T + tBytes;
  char* scratchI = U + uBytes;
  const Blocks railBlocks = Blocks::uniform(maxChunk, N);
  const size_t railScratch = L.codec ? codecRingReduceScatterScratch(*L.codec, railBlocks, es)
                                     : levelRSScratch(L.ea, railBlocks, es);
  char* scratchE = static_cast<char*>(g.scratch(1, std::max<size_t>(64, railScratch)));
  Schedule si(L.intra->backend(), laneTag(ctx, 1)), sr(L.rail->backend(), laneTag(ctx, 2));
  std::vector<char> intraDone(C, 0);
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  const Levels* lv = &L;
  for (int c = 0; c < C; ++c) {
    const size_t c0 = chunks.offset(c), cm = chunks.count(c);
    char* Tc = T + static_cast<size_t>(p) * c0 * es;
    char* Uc = U + static_cast<size_t>(N) * c0 * es;
    // Local rank ll's intra block = the chunks of the group ranks (node nn, local ll), node order.
    si.compute([=] {
      for (int ll = 0; ll < k; ++ll)
        for (int nn = 0; nn < N; ++nn) {
          const size_t r = static_cast<size_t>(lv->member[nn][ll]);
          lv->copy(Tc + (static_cast<size_t>(ll) * N + nn) * cm * es, src + (r * m + c0) * es,
                   cm * es);
        }
    });
    levelRS(si, L.ia, L.w, Tc, Uc, Blocks::uniform(static_cast<size_t>(N) * cm, k), t, op,
            scratchI);
    si.compute([&intraDone, c] { intraDone[c] = 1; });
    sr.waitUntil([&intraDone, c] { return intraDone[c] != 0; },
                 laggingLevel("intra reduce_scatter", c));
    if (L.codec)
      codecRingReduceScatter(sr, *L.codec, Uc, dst + c0 * es, Blocks::uniform(cm, N), t, op,
                             scratchE);
    else
      levelRS(sr, L.ea, L.w, Uc, dst + c0 * es, Blocks::uniform(cm, N), t, op, scratchE);
  }
  L.run(si, sr, ctx);
}

}  // namespace

extern const AlgorithmImpl kHierarchicalAlgorithm = {
    Algorithm::kHierarchical,     "hierarchical", supports, allReduce, allGather, reduceScatter,
    /*reduceScatterInPlace=*/true};

}  // namespace fourd::detail
