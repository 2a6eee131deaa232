// "shm": collectives inside one node through an MPI-3 shared-memory window.
//
// k ranks on one node, n bytes (nccl-tests sizes); c = memcpy time per byte, gamma = reduction
// time per byte of one input, s = one flag barrier (each rank stores its counter and reads the
// k counters). The window (the backend's SharedSegment: MPI_Win_allocate_shared for MPI, kept
// in the node level's state) gives each rank a segment of three buffers of B bytes; B grows with
// the messages up to 512 KiB (1 MiB when the machine's ranks outnumber its cores;
// FOURD_SHM_BUFFER_BYTES overrides), and larger messages are pipelined through it in chunks of
// B bytes, one barrier per chunk (see "Buffer discipline" below).
//
//   all_reduce      per chunk: copy my chunk into my segment except my own 1/k slice, barrier,
//                   reduce my slice from the k-1 segments and my private input straight into
//                   my output (32 KiB tiles), storing each tile into my segment while it is in
//                   the cache, barrier, copy the other k-1 reduced slices out.
//                   Per rank: (k-1)/k n copied in, (k-1)/k n copied out, n/k stored from the
//                   cache, (k-1)/k n reduced.
//                   T = 2(k-1)/k n c + (k-1)/k n gamma + (chunks + 1) s.
//   reduce_scatter  per chunk: copy the pieces of the other k-1 blocks into my segment, barrier,
//                   reduce my block's piece from the k-1 segments and my input into the output.
//                   T = (k-1)/k n c + (k-1)/k n gamma + chunks s.
//   all_gather      per chunk: copy my block's piece into my segment, barrier, copy the other
//                   k-1 pieces out. T = n/k c + (k-1)/k n c + chunks s.
// From 64 KiB per rank for all_reduce and 32 KiB for the others (FOURD_SHM_CMA; kCmaMinBytes
// below), where the node's ranks may read each other's memory
// (process_vm_readv; probed when the window is made, agreed by all), the three collectives
// read the peers' buffers directly instead, one copy per byte and two barriers per operation
// (three for all_reduce) whatever the size ("single copy" below):
//   all_gather      read the other k-1 blocks from the peers' outputs (in place) or inputs
//                   (out of place, copying my own block meanwhile). T = (k-1)/k n c' + 2 s.
//   reduce_scatter  read my block of each peer's input, a tile at a time, and reduce.
//                   T = (k-1)/k n c' + (k-1)/k n gamma + 2 s.
//   all_reduce      reduce_scatter into my slice of the output, then all_gather of the slices.
//                   T = 2(k-1)/k n c' + (k-1)/k n gamma + 3 s.
// c' is the kernel's copy time per byte, about the same as memcpy's within the caches on this
// kind of machine and twice it beyond them; what the direct reads save is the barrier per
// chunk, which costs context switches when ranks outnumber cores, and (all_gather) the copy
// into the window. all_gather reads directly only below 512 KiB per rank (up to 16 MiB of
// output where ranks outnumber cores) or where every rank calls it in place (agreed at one extra
// barrier), and from 16 MiB of output its copies through the window are streamed (gatherPath,
// streamMinBytes, shmAllGather). The bulk copies are copyCached's, not glibc's memcpy
// (reduce_kernels.hpp). The cost model (cost_model.cpp) prices these phases (one chunk's
// barriers; the n/k store of my reduced slice counted as a copy); calibration
// (python/fourd/profile/fit.py) fits shmBw to the all-reduce formula.
//
// No message crosses MPI: the only synchronisation is the flag barrier. It polls without
// yielding for up to 50 us when every rank of the machine has a core of its own (a yield could
// hand the core to another process for a whole time slice); where ranks outnumber cores, up to
// twice, it spins only for the budget its communicator learned (SpinHint, op_context.hpp: the
// peer we wait for may need our core), then yields, and beyond that it yields at once; and it
// has the op's deadline like every other wait. Every rank reduces a different slice, so results are
// identical on all ranks; 16-bit floats accumulate all k inputs in float32 and round once.
//
// Buffer discipline. The barrier counter g of the window counts barriers since it was made. A
// chunk is named by the barrier that ends its copy-in, so chunk g uses buffer g % 3 and is
// touched only between barriers g-1 and g+2: copy-in before barrier g, reduction between g
// and g+1, copy-out between g+1 and g+2. Chunk g+3, the next user of that buffer, starts after
// barrier g+2. This holds across operations too (a new operation's first chunk takes the next
// barrier's number), so one barrier per chunk is enough and no barrier closes an operation.
//
// Supported when the group is on one node, in host memory, and its ranks share memory (the
// first operation asks the backend, MPI_COMM_TYPE_SHARED for MPI; if they do not, it runs the
// ring instead and reports shm unsupported from then on). "hierarchical" uses the same
// building blocks as its intra-node level.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <sys/uio.h>
#include <unistd.h>

#include "algorithms/levels.hpp"
#include "algorithms/whole_group.hpp"
#include "fourd/error.hpp"
#include "internal/op_context.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

struct ShmWindow {
  // The control area of each rank, in 64-bit words: the barrier counter (word 0, its own
  // cache line), the process id and the segment's address in that process (words 8 and 9),
  // and what an operation publishes for single-copy reads (words 16 and 17).
  static constexpr size_t kCtrl = 256;
  static constexpr int kPidWord = 8, kSelfWord = 9, kPubWord = 16;
  std::unique_ptr<SharedSegment> seg;
  std::vector<pid_t> pids;  // of the node's members, for single-copy reads
  bool cma = false;         // every member may read every other's memory (process_vm_readv)
  const std::vector<int>* worldRanks = nullptr;  // of the node's members, for messages
  int k = 0, me = 0;
  size_t bufBytes = 0;      // bytes per buffer; each rank has three
  size_t cap = 0;           // the most bufBytes may grow to
  uint64_t bars = 0;        // barriers this rank has passed
  bool clean = true;        // false while an operation runs or after one failed
  double spinMicros = 0.0;  // barrier spin before yielding: > 0 only with a core per rank

  uint64_t* counter(int j) const { return reinterpret_cast<uint64_t*>(seg->base(j)); }
  uint64_t* word(int j, int i) const { return reinterpret_cast<uint64_t*>(seg->base(j)) + i; }
  char* buffer(int j, uint64_t chunk) const {
    return seg->base(j) + kCtrl + (chunk % 3) * bufBytes;
  }

  ~ShmWindow() { release(); }
  void release() noexcept {
    if (seg) seg->release(clean);
    seg.reset();
  }
};

namespace {

constexpr const char* kWindowKey = "shm.window";
constexpr size_t kTileBytes = 32 * 1024;
constexpr const char* kUnavailableKey = "shm.unavailable";
constexpr const char* kSharesKey = "shm.shares";

// Bytes per buffer (each rank has three). Small buffers keep a chunk in the caches between its
// copy-in and its copy-out; larger ones need fewer barriers, which matters when the node's ranks
// outnumber its cores (each barrier then waits for context switches). Measured on a 2-core VM,
// float32 all-reduce 1-64 MiB: 256 KiB-1 MiB buffers run 1.1-2.8x faster than MPICH's own
// all-reduce at 2 and 4 ranks, 4 MiB buffers up to 1.4x slower than 1 MiB ones.
// FOURD_SHM_BUFFER_BYTES overrides (the same value on every rank).
// The machine's online cores, read once: sysconf reads /sys/devices/system/cpu/online on
// every call (an open, a read and a close, 15-20 us on this kind of VM), and every operation
// asks for its buffer cap.
long onlineCores() {
  static const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores;
}

size_t bufferCap(int k) {
  static const long long env = [] {
    const char* e = std::getenv("FOURD_SHM_BUFFER_BYTES");
    return e ? std::atoll(e) : 0LL;
  }();
  size_t v = env >= 4096 ? static_cast<size_t>(env) : 0;
  if (v == 0) {
    const long cores = onlineCores();
    v = (detail::oversubscribed() || (cores > 0 && k > cores)) ? size_t(1) << 20
                                                               : size_t(512) << 10;
  }
  return (v + 63) / 64 * 64;
}

// A barrier over the window's ranks: each stores the barrier's number into its counter, then
// waits until every counter has reached it.
void arrive(ShmWindow* w) {
  ++w->bars;
  w->seg->sync();
  __atomic_store_n(w->counter(w->me), w->bars, __ATOMIC_RELEASE);
}
bool everyoneArrived(ShmWindow* w) {
  for (int j = 0; j < w->k; ++j)
    if (__atomic_load_n(w->counter(j), __ATOMIC_ACQUIRE) < w->bars) return false;
  w->seg->sync();
  return true;
}
std::string laggards(const ShmWindow* w) {
  std::ostringstream os;
  os << "shared-memory peers at barrier " << w->bars << ": world ranks [";
  bool first = true;
  for (int j = 0; j < w->k; ++j) {
    if (__atomic_load_n(w->counter(j), __ATOMIC_ACQUIRE) < w->bars) {
      os << (first ? "" : ", ") << w->worldRanks->at(j);
      first = false;
    }
  }
  os << "] never arrived";
  return os.str();
}

// Appends a barrier to a schedule. With `skip`, a barrier that every rank passes or skips
// alike: by the time it runs, *skip holds the same value on every rank (it was decided from
// what all of them published before an earlier barrier), and a skipped barrier is not counted.
void barrier(Schedule& s, ShmWindow* w, std::shared_ptr<const bool> skip = nullptr) {
  s.compute([w, skip] {
    if (!(skip && *skip)) arrive(w);
  });
  s.waitUntil([w, skip] { return (skip && *skip) || everyoneArrived(w); },
              [w] { return laggards(w); }, w->spinMicros);
}

// The same barrier, passed now (the one-chunk paths, which run without a schedule).
void barrierNow(ShmWindow* w, OpContext& ctx) {
  arrive(w);
  waitUntil([w] { return everyoneArrived(w); }, [w] { return laggards(w); }, ctx, w->spinMicros);
}

size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Rounds over the blocks of B, `per` elements of each block a round: round i handles elements
// [i per, (i+1) per) of every block (at least one round, so every rank meets the same barriers).
struct Rounds {
  Blocks B;
  size_t per;
  int n;
  Rounds(const Blocks& b, size_t p)
      : B(b), per(p), n(static_cast<int>(std::max<size_t>(1, ceilDiv(b.maxCount(), p)))) {}
  // (first element, element count) of block j's piece in round i.
  std::pair<size_t, size_t> piece(int j, int i) const {
    const size_t a = std::min(B.count(j), per * i);
    return std::make_pair(a, std::min(B.count(j), a + per) - a);
  }
};

}  // namespace

bool shmAvailable(Group& node, OpContext& ctx) {
  auto& st = node.state();
  auto it = st.find(kSharesKey);
  if (it == st.end()) {
    const bool shares = node.backend().hostMemory() && node.backend().sharesMemory(ctx);
    it = st.emplace(kSharesKey, std::make_shared<bool>(shares)).first;
  }
  return *static_cast<bool*>(it->second.get());
}

namespace {

// Every rank asks for the same size (collectives have equal counts); the agreement makes a
// missing rank time out here instead of hanging in the collective window calls, makes sure no
// peer still reads the old window, and has every rank take the smallest size asked (the
// buffer arithmetic needs one).
size_t agreedBytes(Group& node, size_t want, OpContext& ctx) {
  int64_t mine = static_cast<int64_t>(want), all = 0;
  node.backend().allReduce(Buffer(&mine, 1, DataType::kInt64), Buffer(&all, 1, DataType::kInt64),
                           ReduceOp::kMin, ctx);
  return static_cast<size_t>(all);
}

// Whether this machine's ranks (all of them: virtual nodes share the cores too, and so do the
// other groups of the grid) outnumber its cores, as the grid found at init. The group's k
// alone said "spin" to two groups of 2 ranks on 2 cores: a spinning waiter then held the core
// its peer needed, and 4 KiB all-reduces took 145 us instead of 25.
double barrierSpin(int k) {
  const long cores = onlineCores();
  return (!detail::oversubscribed() && cores > 0 && k <= cores) ? 50.0 : 0.0;
}

// FOURD_SHM_CMA: "off" (or 0) never reads a peer's memory directly, "on" (or 1) does so for
// every all_gather, reduce_scatter and all_reduce of the shm paths and fails when the ranks
// cannot, "auto" (the default) from kCmaMinBytes per rank where they can. Read once per
// process; the same on every rank (the grid checks: the two paths pass different barriers).
enum class CmaMode { kOff, kAuto, kOn };
CmaMode cmaMode() {
  static const CmaMode m = [] {
    const char* e = std::getenv("FOURD_SHM_CMA");
    std::string v = e ? e : "";
    for (auto& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (v == "0" || v == "off") return CmaMode::kOff;
    if (v == "1" || v == "on") return CmaMode::kOn;
    return CmaMode::kAuto;
  }();
  return m;
}

// Copies n bytes at address `remote` of member j's process into `local` (process_vm_readv: the
// kernel copies straight from the peer's pages, one copy per byte).
void cmaRead(const ShmWindow& w, int j, void* local, uint64_t remote, size_t n) {
  char* l = static_cast<char*>(local);
  while (n > 0) {
    struct iovec li = {l, n};
    struct iovec ri = {reinterpret_cast<void*>(remote), n};
    const ssize_t got = process_vm_readv(w.pids[j], &li, 1, &ri, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : EIO;
      throw BackendError("fourd: shm: reading " + std::to_string(n) + " bytes of world rank " +
                             std::to_string(w.worldRanks->at(j)) + "'s memory failed: " +
                             std::strerror(err) + " (FOURD_SHM_CMA=off avoids direct reads)",
                         err);
    }
    l += got;
    remote += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

// Whether every member can read every other's memory: each reads, through process_vm_readv,
// the process id word of each peer's control area and compares it with what the window shows
// (a different pid namespace, a ptrace policy or a seccomp filter makes this fail), and all
// agree (the paths differ in their barriers).
bool cmaAgreed(Group& node, ShmWindow& w, OpContext& ctx) {
  if (cmaMode() == CmaMode::kOff) return false;
  w.pids.assign(w.k, 0);
  int64_t ok = 1;
  for (int j = 0; j < w.k; ++j) {
    w.pids[j] = static_cast<pid_t>(*w.word(j, ShmWindow::kPidWord));
    if (j == w.me) continue;
    uint64_t seen = 0;
    struct iovec li = {&seen, sizeof seen};
    struct iovec ri = {
        reinterpret_cast<void*>(*w.word(j, ShmWindow::kSelfWord) + ShmWindow::kPidWord * 8),
        sizeof seen};
    if (process_vm_readv(w.pids[j], &li, 1, &ri, 1, 0) != static_cast<ssize_t>(sizeof seen) ||
        seen != *w.word(j, ShmWindow::kPidWord))
      ok = 0;
  }
  int64_t all = 0;
  node.backend().allReduce(Buffer(&ok, 1, DataType::kInt64), Buffer(&all, 1, DataType::kInt64),
                           ReduceOp::kMin, ctx);
  if (all != 1 && cmaMode() == CmaMode::kOn) {
    throw BackendError(
        "fourd: FOURD_SHM_CMA=on, but the ranks of this node cannot read each other's memory "
        "(process_vm_readv failed on " +
            std::string(ok ? "a peer" : "this rank") +
            ": a ptrace policy, separate pid namespaces or a seccomp filter); use auto or off",
        EPERM);
  }
  return all == 1;
}

std::shared_ptr<ShmWindow> newWindow(Group& node, size_t want, size_t cap, OpContext& ctx) {
  auto nw = std::make_shared<ShmWindow>();
  nw->k = node.size();
  nw->me = node.rank();
  nw->worldRanks = &node.backend().worldRanks();
  nw->bufBytes = want;
  nw->cap = cap;
  nw->spinMicros = barrierSpin(nw->k);
  const size_t bytes = ShmWindow::kCtrl + 3 * want;
  nw->seg = node.backend().sharedSegment(bytes, ctx);
  if (!nw->seg) return nullptr;
  // Fault every page in now: my segment by writing it, the peers' by reading one byte a page
  // (each process maps the window separately). Otherwise the first operations through each
  // buffer pay a page fault per 4 KiB, several times the copy itself.
  std::memset(nw->seg->base(nw->me), 0, bytes);
  *nw->word(nw->me, ShmWindow::kPidWord) = static_cast<uint64_t>(getpid());
  *nw->word(nw->me, ShmWindow::kSelfWord) = reinterpret_cast<uint64_t>(nw->seg->base(nw->me));
  __atomic_store_n(nw->counter(nw->me), uint64_t(0), __ATOMIC_RELEASE);
  nw->seg->sync();
  node.backend().barrier(ctx);
  volatile char sink = 0;
  for (int j = 0; j < nw->k; ++j)
    for (size_t off = 0; off < bytes; off += 4096) sink = sink + nw->seg->base(j)[off];
  (void)sink;
  nw->cma = cmaAgreed(node, *nw, ctx);
  return nw;
}

}  // namespace

ShmWindow* shmWindow(Group& node, size_t bytesPerRank, OpContext& ctx) {
  if (!shmAvailable(node, ctx)) return nullptr;
  const size_t cap = bufferCap(node.size());
  size_t want = 64 * 1024;
  while (want < bytesPerRank && want < cap) want *= 2;
  want = std::min(want, cap);
  auto& st = node.state();
  auto it = st.find(kWindowKey);
  ShmWindow* w = it == st.end() ? nullptr : static_cast<ShmWindow*>(it->second.get());
  if (w && (w->bufBytes >= want || w->bufBytes >= w->cap)) return w;
  want = agreedBytes(node, want, ctx);
  if (w) {
    w->release();
    st.erase(kWindowKey);
  }
  auto nw = newWindow(node, want, cap, ctx);
  if (!nw) return nullptr;
  ShmWindow* raw = nw.get();
  st[kWindowKey] = std::move(nw);
  return raw;
}

namespace {

// ---- single copy (the costs: the file's header) ----
//
// An operation publishes the addresses of its buffers in the control area, passes a barrier,
// reads what it needs from each peer, and passes a last barrier before it returns, since a
// peer may still be reading its buffers. Reads start at the next rank and go round, so the
// ranks do not all read one peer.

// Per-rank bytes from which "auto" reads directly (below it, the two-copy path's one barrier
// per chunk and its cached buffers cost less than two barriers and the system calls): for
// all_reduce, whose direct path has three barriers, 64 KiB; for all_gather and reduce_scatter
// (two), 32 KiB. 2 ranks on this project's 2-core VM, in place and out of place, 32 KiB a
// rank: the direct reads took 7.3-8.3 us against 7.3-8.3 through the window in a fast hour,
// 8.0-10.2 against 19.7-21.8 in a slow one (the copies through the window slow down in the VM's
// slow hours, the reads do not); at 16 KiB a rank 6.2-6.7 against 5.1-5.7 in a fast hour.
constexpr size_t kCmaMinBytes = 64 * 1024;
constexpr size_t kCmaMinBlockBytes = 32 * 1024;
// all_gather reads the peers' blocks directly only below this many bytes per
// rank where every rank has a core: from 512 KiB, copying through the window (my piece into my
// output on the way) ran faster, 2 ranks of the VM: 1 MiB of output 1.83x MPI's call against
// 1.49x, 4 MiB 1.02-1.20x against 0.84-0.91x; 256 KiB 1.71x against 2.00x. Where ranks
// outnumber cores a barrier per chunk costs context switches, and the 4-rank default benchmark
// ran 1 and 4 MiB through the window at 0.73x MPI's call: there the direct reads go on up to the
// streamed size. FOURD_SHM_CMA=on reads directly at every size.
constexpr size_t kCmaMaxGatherFromBytes = 512 * 1024;

// From this many bytes of output (FOURD_SHM_STREAM_BYTES, the same on every rank; 16 MiB, half
// the last-level cache of this kind of VM, whose guest reports 320 MiB to sysconf and 32 to
// lscpu, so it is not read from the system), an out-of-place all_gather copies through the
// window with streamCopy (non-temporal stores): an output that size leaves the caches anyway,
// and then memory traffic sets the time. A copy into a line not in the cache first reads it
// (write-allocate), so cached copies move 3 bytes of memory traffic per byte written where
// streamed stores move 2 (a 64 MiB copy: 17 GB/s against memcpy's 10.5). Below that size the
// output may stay in the cache between calls, which streamed stores would throw away: 8 MiB on
// 2 ranks of the VM ran 0.69-0.79x MPI's call streamed. 64 MiB: 1.3-1.75x MPI's call.
size_t streamMinBytes() {
  static const size_t v = [] {
    const char* e = std::getenv("FOURD_SHM_STREAM_BYTES");
    const long long x = e ? std::atoll(e) : 0LL;
    return x > 0 ? static_cast<size_t>(x) : size_t(16) << 20;
  }();
  return v;
}
bool streamed(size_t outputBytes) { return outputBytes >= streamMinBytes(); }

bool useCma(const ShmWindow& w, size_t bytesPerRank, size_t minBytes = kCmaMinBytes) {
  if (!w.cma) return false;
  const CmaMode m = cmaMode();
  return m == CmaMode::kOn || (m == CmaMode::kAuto && bytesPerRank >= minBytes);
}

// How all_gather moves the blocks: kDirect, every rank reads its peers' blocks directly; kWindow,
// every rank copies through the window; kAgree, every rank publishes its placement first, then
// all read directly where all are in place and all go through the window otherwise. Decided from
// what every member's call shares (block and output sizes, the window's probe, FOURD_SHM_CMA),
// never from its own placement alone, since members may call in place and out of place in the
// same operation and the paths pass different barriers (the direct reads of either placement
// pass the same two).
enum class GatherPath { kDirect, kWindow, kAgree };
GatherPath gatherPath(const ShmWindow& w, size_t blockBytes, size_t outputBytes) {
  const bool direct =
      cmaMode() == CmaMode::kOn ||
      (!streamed(outputBytes) && (blockBytes < kCmaMaxGatherFromBytes || detail::oversubscribed()));
  if (direct) {
    return useCma(w, blockBytes, kCmaMinBlockBytes) ? GatherPath::kDirect : GatherPath::kWindow;
  }
  return useCma(w, blockBytes, 0) ? GatherPath::kAgree : GatherPath::kWindow;
}

// Appends the publication of this rank's two words for an operation's peers: its buffers'
// addresses for their direct reads (addressOf), or all_gather's placement.
void publish(Schedule& s, ShmWindow* w, uint64_t a, uint64_t b) {
  s.compute([w, a, b] {
    *w->word(w->me, ShmWindow::kPubWord) = a;
    *w->word(w->me, ShmWindow::kPubWord + 1) = b;
  });
}
uint64_t addressOf(const void* p) { return reinterpret_cast<uint64_t>(p); }

uint64_t published(const ShmWindow* w, int j, int which) {
  return *w->word(j, ShmWindow::kPubWord + which);
}

// The bytes of one direct read of a peer's tile: the peers' tiles together stay within
// kCmaScratchBytes (the caches), and each is as large as that allows, between kCmaMinTile and
// kCmaMaxTile, since every read is a system call that pins the peer's pages. Against 64 KiB
// tiles, on this 2-core VM: 64 MiB float32 all_reduce on 2 ranks (1 MiB tiles) 14.6-15.6 ms
// against 17.1-19.0; on 4 ranks (341 KiB tiles) 37.7-41.7 ms against 38.8-42.3, and 64 MiB
// reduce_scatter 19.1-20.6 ms against 23.9-25.1.
constexpr size_t kCmaScratchBytes = size_t(1) << 20;
constexpr size_t kCmaMinTile = 64 * 1024;
constexpr size_t kCmaMaxTile = size_t(1) << 20;

size_t cmaTileBytes(int k) {
  return std::clamp(kCmaScratchBytes / static_cast<size_t>(std::max(1, k - 1)), kCmaMinTile,
                    kCmaMaxTile);
}

// My block of the reduction, [B.offset(me), +B.count(me)) of every member's `which` buffer,
// reduced into out, a tile at a time through a cache-sized scratch per peer (kept by the
// thread: it is written before it is read, so it needs no zeroing).
void cmaReduceMine(const ShmWindow* w, int which, const char* in, char* out, const Blocks& B,
                   DataType t, ReduceOp op) {
  const size_t es = dataTypeSize(t);
  const int k = w->k, me = w->me;
  const size_t tile = std::max<size_t>(1, cmaTileBytes(k) / es);
  thread_local std::vector<char> scratch;
  if (scratch.size() < static_cast<size_t>(k - 1) * tile * es)
    scratch.resize(static_cast<size_t>(k - 1) * tile * es);
  std::vector<const void*> srcs(k);
  const size_t first = B.offset(me), count = B.count(me);
  for (size_t o = 0; o < count; o += tile) {
    const size_t n = std::min(tile, count - o);
    const uint64_t off = (first + o) * es;
    srcs[0] = in + off;  // my own input first: the output may alias it
    for (int d = 1; d < k; ++d) {
      const int j = (me + d) % k;
      char* dst = scratch.data() + static_cast<size_t>(d - 1) * tile * es;
      cmaRead(*w, j, dst, published(w, j, which) + off, n * es);
      srcs[d] = dst;
    }
    reduceMany(out + o * es, srcs.data(), k, n, t, op);
  }
}

// Every peer's block j of its `which` buffer into block j of buf.
void cmaGatherOthers(const ShmWindow* w, int which, char* buf, const Blocks& B, size_t es) {
  for (int d = 1; d < w->k; ++d) {
    const int j = (w->me + d) % w->k;
    const uint64_t off = B.offset(j) * es;
    cmaRead(*w, j, buf + off, published(w, j, which) + off, B.count(j) * es);
  }
}

void cmaAllGather(Schedule& s, ShmWindow* w, char* buf, const Blocks& B, size_t es) {
  publish(s, w, addressOf(buf), 0);
  barrier(s, w);
  s.compute([=] { cmaGatherOthers(w, 0, buf, B, es); });
  barrier(s, w);
}

// Out of place: the peers read my block from my input, published as if it were block `me` of
// a whole buffer (an address only: the integer arithmetic never forms a pointer), and I copy it
// into my output meanwhile. Had they read it from my output, my copy would rewrite, call after
// call, lines a peer's last read left in its cache, which costs far more than the copy: 1 MiB
// on 2 ranks, copy then in-place all_gather 71 us against 42 with the same copy into the other
// block, and MPI's own out-of-place call pays it too (bench/README.md).
void cmaAllGatherFrom(Schedule& s, ShmWindow* w, const char* in, char* out, const Blocks& B,
                      size_t es) {
  publish(s, w, addressOf(in) - B.offset(w->me) * es, 0);
  barrier(s, w);
  s.compute([=] {
    copyCached(out + B.offset(w->me) * es, in, B.count(w->me) * es);
    cmaGatherOthers(w, 0, out, B, es);
  });
  barrier(s, w);
}

void cmaReduceScatter(Schedule& s, ShmWindow* w, const char* in, char* out, const Blocks& B,
                      DataType t, ReduceOp op) {
  publish(s, w, addressOf(in), 0);
  barrier(s, w);
  s.compute([=] { cmaReduceMine(w, 0, in, out, B, t, op); });
  barrier(s, w);
}

// reduce_scatter into my slice of out, then all_gather of the slices from the peers' outputs.
// In place is safe: a peer reads slice j of my input only while I write slice me, and reads
// my output's slice me only after the barrier that ends every reduction.
void cmaAllReduce(Schedule& s, ShmWindow* w, const char* in, char* out, size_t count, DataType t,
                  ReduceOp op) {
  const size_t es = dataTypeSize(t);
  const Blocks B = Blocks::even(count, w->k);
  publish(s, w, addressOf(in), addressOf(out));
  barrier(s, w);
  s.compute([=] { cmaReduceMine(w, 0, in, out + B.offset(w->me) * es, B, t, op); });
  barrier(s, w);
  s.compute([=] { cmaGatherOthers(w, 1, out, B, es); });
  barrier(s, w);
}

}  // namespace

void shmAllReduce(Schedule& s, ShmWindow& wr, const void* inV, void* outV, size_t count, DataType t,
                  ReduceOp op) {
  ShmWindow* w = &wr;
  if (useCma(*w, count * dataTypeSize(t) / w->k)) {
    return cmaAllReduce(s, w, static_cast<const char*>(inV), static_cast<char*>(outV), count, t,
                        op);
  }
  const size_t es = dataTypeSize(t);
  const char* in = static_cast<const char*>(inV);
  char* out = static_cast<char*>(outV);
  const int k = w->k, me = w->me;
  const size_t ce = std::max<size_t>(1, w->bufBytes / es);
  const int m = static_cast<int>(std::max<size_t>(1, ceilDiv(count, ce)));
  auto chunk = [=](int i, size_t* c0, size_t* cn) {
    *c0 = ce * static_cast<size_t>(i);
    *cn = std::min(ce, count - *c0);
  };
  auto copyIn = [&](int i) {
    size_t c0, cn;
    chunk(i, &c0, &cn);
    s.compute([=] {
      const Blocks sl = Blocks::even(cn, k);
      char* dst = w->buffer(me, w->bars + 1);
      const char* src = in + c0 * es;
      // My own slice is reduced from my private input: no need to share it.
      copyCached(dst, src, sl.offset(me) * es);
      copyCached(dst + sl.offset(me + 1) * es, src + sl.offset(me + 1) * es,
                 (cn - sl.offset(me + 1)) * es);
    });
  };
  auto reduce = [&](int i) {
    size_t c0, cn;
    chunk(i, &c0, &cn);
    s.compute([=] {
      const Blocks sl = Blocks::even(cn, k);
      const uint64_t id = w->bars;
      const size_t so = sl.offset(me), sn = sl.count(me);
      // Reduce my slice straight into my output, a cache-sized tile at a time, and store each
      // tile into my segment while it is hot (the peers copy it out from there). My own input
      // comes first: the output may alias it (in place).
      const size_t tile = std::max<size_t>(1, kTileBytes / es);
      std::vector<const void*> srcs(k);
      for (size_t o = 0; o < sn; o += tile) {
        const size_t n = std::min(tile, sn - o);
        char* dst = out + (c0 + so + o) * es;
        srcs[0] = in + (c0 + so + o) * es;
        for (int j = 0, q = 1; j < k; ++j)
          if (j != me) srcs[q++] = w->buffer(j, id) + (so + o) * es;
        reduceMany(dst, srcs.data(), k, n, t, op);
        copyCached(w->buffer(me, id) + (so + o) * es, dst, n * es);
      }
    });
  };
  auto copyOut = [&](int i) {
    size_t c0, cn;
    chunk(i, &c0, &cn);
    s.compute([=] {
      const Blocks sl = Blocks::even(cn, k);
      const uint64_t id = w->bars - 1;
      for (int j = 0; j < k; ++j) {
        if (j == me) continue;  // written by my reduction already
        copyCached(out + (c0 + sl.offset(j)) * es, w->buffer(j, id) + sl.offset(j) * es,
                   sl.count(j) * es);
      }
    });
  };
  copyIn(0);
  barrier(s, w);
  for (int i = 1; i < m; ++i) {
    if (i >= 2) copyOut(i - 2);
    reduce(i - 1);
    copyIn(i);
    barrier(s, w);
  }
  if (m >= 2) copyOut(m - 2);
  reduce(m - 1);
  barrier(s, w);
  copyOut(m - 1);
}

void shmReduceScatter(Schedule& s, ShmWindow& wr, const void* inV, void* outV, const Blocks& B,
                      DataType t, ReduceOp op) {
  ShmWindow* w = &wr;
  const size_t es = dataTypeSize(t);
  if (useCma(*w, B.maxCount() * es, kCmaMinBlockBytes)) {
    return cmaReduceScatter(s, w, static_cast<const char*>(inV), static_cast<char*>(outV), B, t,
                            op);
  }
  const char* in = static_cast<const char*>(inV);
  char* out = static_cast<char*>(outV);
  const int k = w->k, me = w->me;
  // Round i handles piece i of every block: elements [i P, (i+1) P) of each, at j P in the buffer.
  // reduceScatterOneChunk restates round 0 of this layout for one-chunk calls: a change to the
  // slots or the piece offsets here must be made there too.
  const size_t P = std::max<size_t>(1, w->bufBytes / es / k);
  const Rounds R(B, P);
  const int m = R.n;
  auto copyIn = [&](int i) {
    s.compute([=] {
      char* dst = w->buffer(me, w->bars + 1);
      for (int j = 0; j < k; ++j) {
        if (j == me) continue;
        const auto [a, n] = R.piece(j, i);
        copyCached(dst + j * P * es, in + (B.offset(j) + a) * es, n * es);
      }
    });
  };
  auto reduce = [&](int i) {
    s.compute([=] {
      const uint64_t id = w->bars;
      const auto [a, n] = R.piece(me, i);
      // My own input first: the output may alias it (in place).
      std::vector<const void*> srcs(k);
      srcs[0] = in + (B.offset(me) + a) * es;
      for (int j = 0, q = 1; j < k; ++j)
        if (j != me) srcs[q++] = w->buffer(j, id) + me * P * es;
      reduceMany(out + a * es, srcs.data(), k, n, t, op);
    });
  };
  copyIn(0);
  barrier(s, w);
  for (int i = 1; i < m; ++i) {
    reduce(i - 1);
    copyIn(i);
    barrier(s, w);
  }
  reduce(m - 1);
}

// allGatherOneChunk restates this schedule's first round (copy in to my slot, barrier, copy
// every peer's slot out) for one-chunk calls: a change to the window's slots here must be made
// there too.
void shmAllGather(Schedule& s, ShmWindow& wr, void* bufV, const Blocks& B, DataType t,
                  const void* mineV) {
  ShmWindow* w = &wr;
  const size_t es = dataTypeSize(t);
  const bool stream = streamed(B.total() * es);
  char* buf = static_cast<char*>(bufV);
  char* const own = buf + B.offset(w->me) * es;
  const char* mine = mineV ? static_cast<const char*>(mineV) : own;
  const GatherPath path = gatherPath(*w, B.maxCount() * es, B.total() * es);
  if (path == GatherPath::kDirect) {
    return mine == own ? cmaAllGather(s, w, buf, B, es) : cmaAllGatherFrom(s, w, mine, buf, B, es);
  }
  const auto copy = stream ? streamCopy : copyCached;
  const int k = w->k, me = w->me;
  const size_t P = std::max<size_t>(1, w->bufBytes / es);
  const Rounds R(B, P);
  const int m = R.n;
  // Out of place, my piece goes into my block of the output here too, while it is in the cache.
  // Streamed, the copy into the window is streamed too: a peer read those lines three barriers
  // ago, and storing into them through the cache first takes them back from its core, which on
  // this kind of VM ran at a third of the speed by turns (64 MiB on 2 ranks: 5.2-6.8 ms every
  // time against 7-8 or 20-22 ms, while MPI's call took 8.7-9.5).
  //
  // In place on every rank, the window's two copies per byte lose to one. Streamed: 16 MiB on 2
  // ranks of the VM ran 0.43-0.54x MPI's in-place call (which copies each byte once) through
  // the window, 0.92x reading the peers' outputs directly; 64 MiB 0.60x against 0.89x. Below
  // that, from 512 KiB per rank, the window ran 1.26-1.46x MPI's call at 1-4 MiB in most runs,
  // but 0.08-0.18x in the VM's slow phases, where copies between cores ran ten times slower and
  // MPI's single copy did not (direct reads: 1.0-1.06x, and 1.10x at 256 KiB in a slow phase).
  // Every rank publishes its placement first; where all are in place, all read directly and
  // skip the window's steps (`direct`, the same on every rank after the first barrier), and
  // otherwise all go through the window, so mixed placements stay consistent.
  std::shared_ptr<bool> direct;
  if (path == GatherPath::kAgree) {
    direct = std::make_shared<bool>(false);
    publish(s, w, addressOf(buf), mine == own ? 1 : 0);
    barrier(s, w);
    s.compute([w, direct, buf, B, es] {
      bool all = true;
      for (int j = 0; j < w->k; ++j) all = all && published(w, j, 1) == 1;
      *direct = all;
      if (all) cmaGatherOthers(w, 0, buf, B, es);
    });
  }
  const std::shared_ptr<const bool> skip = direct;
  auto copyIn = [&](int i) {
    s.compute([=] {
      if (skip && *skip) return;
      const auto [a, n] = R.piece(me, i);
      copy(w->buffer(me, w->bars + 1), mine + a * es, n * es);
      if (mine != own) copy(own + a * es, mine + a * es, n * es);
    });
  };
  auto copyOut = [&](int i) {
    s.compute([=] {
      if (skip && *skip) return;
      const uint64_t id = w->bars;
      for (int j = 0; j < k; ++j) {
        if (j == me) continue;
        const auto [a, n] = R.piece(j, i);
        copy(buf + (B.offset(j) + a) * es, w->buffer(j, id), n * es);
      }
    });
  };
  // Read directly, the first barrier below ends the reads (no peer returns while another may
  // still read its output); the others are skipped.
  copyIn(0);
  barrier(s, w);
  for (int i = 1; i < m; ++i) {
    copyOut(i - 1);
    copyIn(i);
    barrier(s, w, skip);
  }
  copyOut(m - 1);
}

const char* levelAlgoName(LevelAlgo a) {
  switch (a) {
    case LevelAlgo::kRing:
      return "ring";
    case LevelAlgo::kRhd:
      return "rhd";
    case LevelAlgo::kShm:
      return "shm";
    case LevelAlgo::kFlat:
      return "flat";
  }
  return "?";
}

// ---- the "shm" algorithm on a one-node group ----

namespace {

bool supports(Collective c, const Group& g, std::string* reason) {
  if (!shapeSupports(c, Algorithm::kShm, g, reason)) return false;  // spans nodes
  if (!onHostMemory(g, reason)) return false;
  if (g.state().count(kUnavailableKey)) {
    if (reason) {
      *reason = "the ranks of the group do not share memory (MPI_COMM_TYPE_SHARED splits them)";
    }
    return false;
  }
  return true;
}

// The window of a one-node group (on its intra level: the same members, its own
// communicator), or null when its ranks turn out not to share memory: checked collectively,
// so all agree; the caller runs the ring this time and supports() reports shm unavailable
// from then on.
ShmWindow* windowOf(Group& g, size_t bytes, OpContext& ctx) {
  ShmWindow* w = shmWindow(g.intra(ctx), bytes, ctx);
  if (!w) g.state()[kUnavailableKey] = std::make_shared<int>(1);
  return w;
}

// Runs `build` on the window's schedule; marks the window unclean if anything throws.
template <class F>
void runOnWindow(Group& g, ShmWindow& w, OpContext& ctx, F&& build) {
  Schedule s(g.intra(ctx).backend(), ctx.tag);
  build(s);
  w.clean = false;
  s.run(ctx);
  w.clean = true;
}

void allReduce(Group& g, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  ShmWindow* w = windowOf(g, in.bytes(), ctx);
  if (!w) return algorithmImpl(Algorithm::kRing)->allReduce(g, in, out, op, ctx);
  runOnWindow(g, *w, ctx,
              [&](Schedule& s) { shmAllReduce(s, *w, in.data, out.data, in.count, in.dtype, op); });
}

// One chunk through the window, passed now: what shmAllGather and shmReduceScatter run where
// every block fits one buffer and the window is the path (copy in, one barrier, copy out or
// reduce), without a schedule. The schedule's closures and block tables cost a small call more
// than its copies: a loop of 1 KiB all_gathers from Python, 2 ranks of the VM, one per core,
// took 2.8 us a call through the schedule and 2.2 here (4 KiB: 3.9 and 3.2; reduce_scatter
// 2.9 and 2.3), against 3.6-3.7 for MPI's blocking call and 2.7-2.8 for its persistent
// request (mpi4py; bench/README.md, "Small calls through shared memory").
bool allGatherOneChunk(ShmWindow& w, const Buffer& in, const Buffer& out, OpContext& ctx) {
  const size_t es = dataTypeSize(in.dtype);
  const size_t block = in.count * es;
  if (in.count > std::max<size_t>(1, w.bufBytes / es) || streamed(out.bytes()) ||
      gatherPath(w, block, out.bytes()) != GatherPath::kWindow)
    return false;
  char* const buf = static_cast<char*>(out.data);
  char* const own = buf + static_cast<size_t>(w.me) * block;
  const char* const mine = static_cast<const char*>(in.data);
  w.clean = false;
  copyCached(w.buffer(w.me, w.bars + 1), mine, block);
  if (mine != own) copyCached(own, mine, block);
  barrierNow(&w, ctx);
  for (int j = 0; j < w.k; ++j)
    if (j != w.me) copyCached(buf + static_cast<size_t>(j) * block, w.buffer(j, w.bars), block);
  w.clean = true;
  return true;
}

bool reduceScatterOneChunk(ShmWindow& w, const Buffer& in, const Buffer& out, ReduceOp op,
                           OpContext& ctx) {
  const size_t es = dataTypeSize(out.dtype);
  const size_t n = out.count, block = n * es;
  const size_t P = std::max<size_t>(1, w.bufBytes / es / w.k);  // as shmReduceScatter's
  if (n > P || useCma(w, block, kCmaMinBlockBytes)) return false;
  const char* const src = static_cast<const char*>(in.data);
  w.clean = false;
  char* const dst = w.buffer(w.me, w.bars + 1);
  for (int j = 0; j < w.k; ++j)
    if (j != w.me) copyCached(dst + j * P * es, src + j * block, block);
  barrierNow(&w, ctx);
  // My own input first: the output may alias it (in place).
  const void* few[16];
  std::vector<const void*> many(w.k <= 16 ? 0 : w.k);
  const void** srcs = w.k <= 16 ? few : many.data();
  srcs[0] = src + static_cast<size_t>(w.me) * block;
  for (int j = 0, q = 1; j < w.k; ++j)
    if (j != w.me) srcs[q++] = w.buffer(j, w.bars) + w.me * P * es;
  reduceMany(out.data, srcs, w.k, n, out.dtype, op);
  w.clean = true;
  return true;
}

void allGather(Group& g, const Buffer& in, const Buffer& out, OpContext& ctx) {
  ShmWindow* w = windowOf(g, in.bytes(), ctx);
  if (!w) return algorithmImpl(Algorithm::kRing)->allGather(g, in, out, ctx);
  if (allGatherOneChunk(*w, in, out, ctx)) return;
  const Blocks B = Blocks::uniform(in.count, g.size());
  runOnWindow(g, *w, ctx,
              [&](Schedule& s) { shmAllGather(s, *w, out.data, B, in.dtype, in.data); });
}

void reduceScatter(Group& g, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  ShmWindow* w = windowOf(g, in.bytes(), ctx);
  if (!w) return algorithmImpl(Algorithm::kRing)->reduceScatter(g, in, out, op, ctx);
  if (reduceScatterOneChunk(*w, in, out, op, ctx)) return;
  runOnWindow(g, *w, ctx, [&](Schedule& s) {
    shmReduceScatter(s, *w, in.data, out.data, Blocks::uniform(out.count, g.size()), in.dtype, op);
  });
}

}  // namespace

void markShmRunning(ShmWindow* w, bool running) {
  if (w) w->clean = !running;
}

// In place, reduce_scatter's output is my block of the input: peers read only their own blocks
// of it, and my reduction takes my block as its first source (reduceMany allows that alias).
extern const AlgorithmImpl kShmAlgorithm = {Algorithm::kShm,
                                            "shm",
                                            supports,
                                            allReduce,
                                            allGather,
                                            reduceScatter,
                                            /*reduceScatterInPlace=*/true};

}  // namespace fourd::detail
