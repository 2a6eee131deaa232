// Collectives on CUDA buffers: the NCCL backend and the MPI backend with CUDA buffers. The
// contract (backend choice, stream ordering, deadlines) is in internal/cuda_path.hpp.
//
// NCCL (one GPU per rank):
//   flat          ncclAllReduce / ncclAllGather / ncclReduceScatter / ncclBroadcast on the
//                 group's communicator (avg: ncclAvg).
//   hierarchical  k ranks on each of N >= 2 nodes (uniform topology): intra and rail
//                 communicators from ncclCommSplit (color = node index / local index, key =
//                 local index / node index, so intra rank = local index, rail rank = node).
//                 all_reduce:     RS(intra) -> AR(rail) on my 1/k shard -> AG(intra), in the
//                                 output buffer (counts not divisible by k run flat).
//                 all_gather:     AG(rail) -> AG(intra) into scratch -> permuteBlocks into
//                                 group-rank order.
//                 reduce_scatter: permuteBlocks of the input into scratch (local l's intra block
//                                 = the blocks of the ranks with local index l, node order)
//                                 -> RS(intra) -> RS(rail).
//                 avg runs as a sum and is scaled once at the end (cuda::scale).
//   auto          hierarchical when it applies, else flat. Any other algorithm is refused with
//                 InvalidArgument ("cannot run on CUDA buffers with NCCL: ...").
// Every communicator is created non-blocking (ncclConfig_t::blocking = 0); creation, splits
// and calls are completed by polling ncclCommGetAsyncError against the operation's deadline.
//
// MPI with CUDA buffers (several ranks on one GPU, or FOURD_CUDA_BACKEND=mpi):
//   CUDA-aware MPI on every rank, and no host-side reduction needed (not float16/bfloat16
//   reductions, no accumulate_fp32, algorithm flat or auto): device pointers go to the MPI
//   library's collectives (avg scaled by cuda::scale, in-place reduce_scatter through device
//   scratch).
//   Otherwise: staging through pinned host buffers kept per communicator. all_reduce is cut into
//   4 MiB chunks over two pinned buffers: the copy to the host of chunk i+1 overlaps the host
//   collective on chunk i, and the copy back of chunk i overlaps the next. Other collectives
//   stage the whole input and output once. The host part is fourd's CPU path (any algorithm).
#ifdef FOURD_HAVE_CUDA

#include "internal/cuda_path.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#if defined(OPEN_MPI) && OPEN_MPI && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fourd/error.hpp"
#include "fourd_cuda.hpp"
#include "internal/comm_state.hpp"

namespace fourd::detail {

namespace {

thread_local void* tCallerStream = nullptr;

void checkCuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw cuda::CudaError(std::string("fourd: ") + what + " failed: " + cudaGetErrorName(rc) +
                              ": " + cudaGetErrorString(rc),
                          static_cast<int>(rc));
  }
}

[[noreturn]] void throwNccl(ncclResult_t rc, const char* what, ncclComm_t comm) {
  std::string msg = std::string("fourd: ") + what + " failed: " + ncclGetErrorString(rc);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) msg += std::string(" (") + last + ")";
  }
  throw cuda::CudaError(msg, static_cast<int>(rc));
}

std::string envLower(const char* name) {
  const char* v = std::getenv(name);
  std::string s = v ? v : "";
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Restores the calling thread's current device (runCudaOp may run inline on the caller).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    checkCuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) checkCuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { checkCuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() {
    if (e) (void)cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

ncclDataType_t ncclType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
  }
  throw InvalidArgument("dtype: unknown fourd dtype code " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw InvalidArgument("op: unknown fourd op code " + std::to_string(static_cast<int>(op)));
}

// ---- per-communicator GPU state (kept in CommState::cache) ------------------------------------

struct DeviceMem {
  void* p = nullptr;
  size_t bytes = 0;
  bool pinned = false;
  void release() noexcept {
    if (p) (void)(pinned ? cudaFreeHost(p) : cudaFree(p));
    p = nullptr;
    bytes = 0;
  }
  void* get(size_t n, bool pinnedHost) {
    if (n <= bytes && p) return p;
    release();
    pinned = pinnedHost;
    size_t cap = std::max<size_t>(n, 256);
    if (pinned) checkCuda(cudaMallocHost(&p, cap), "cudaMallocHost (staging buffer)");
    else checkCuda(cudaMalloc(&p, cap), "cudaMalloc (scratch)");
    bytes = cap;
    return p;
  }
  ~DeviceMem() { release(); }
};

enum class Backend { kUndecided, kNccl, kMpiCudaAware, kMpiStaged };

struct GpuState {
  Backend backend = Backend::kUndecided;
  std::string why;  // why this backend (for error messages)
  int device = -1;
  cudaStream_t stream = nullptr;
  ncclComm_t world = nullptr, intra = nullptr, rail = nullptr;
  DeviceMem scratch[2];  // device scratch (hierarchical, in-place reduce_scatter)
  DeviceMem pinned[4];   // pinned host staging: 0-1 all_reduce chunks, 2 input, 3 output

  void abortAll() noexcept {
    for (ncclComm_t* c : {&intra, &rail, &world}) {
      if (*c) (void)ncclCommAbort(*c);
      *c = nullptr;
    }
  }
  ~GpuState() {
    // Destructors never throw nor hang: every operation has completed (the Work waited for its
    // end event), so ncclCommAbort only frees the resources, and unlike ncclCommDestroy on a
    // non-blocking communicator it never waits for peers that may already be gone.
    abortAll();
    for (auto& m : scratch) m.release();
    for (auto& m : pinned) m.release();
    if (stream) (void)cudaStreamDestroy(stream);
  }
};

GpuState& gpuState(CommState& s) {
  auto& slot = s.cache["cuda"];
  if (!slot) slot = std::make_shared<GpuState>();
  return *static_cast<GpuState*>(slot.get());
}

// Polls until `comm` has no operation in progress (non-blocking NCCL) or the deadline passes.
void ncclSettle(GpuState& g, ncclComm_t comm, const char* what, OpContext& ctx) {
  Backoff backoff;
  unsigned polls = 0;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) throwNccl(rc, "ncclCommGetAsyncError", comm);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) throwNccl(state, what, comm);
    if (Clock::now() >= ctx.deadline) {
      g.abortAll();
      throw TimeoutError("fourd: " + ctx.describe() + " timed out after " +
                         std::to_string(ctx.timeoutSeconds) + " s in " + what +
                         " (NCCL communicators aborted)");
    }
    if ((++polls & 1023u) == 0 && interruptRequested()) {
      g.abortAll();
      throw AbortedError("fourd: interrupted in " + std::string(what) + " during " +
                         ctx.describe());
    }
    backoff.pause();
  }
}

void ncclCall(GpuState& g, ncclResult_t rc, ncclComm_t comm, const char* what, OpContext& ctx) {
  if (rc == ncclSuccess) return;
  if (rc == ncclInProgress) return ncclSettle(g, comm, what, ctx);
  throwNccl(rc, what, comm);
}

ncclConfig_t nonBlockingConfig() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

// Waits for `ev` with the deadline, watching the NCCL communicators for asynchronous errors.
void waitEvent(GpuState& g, cudaEvent_t ev, const char* what, OpContext& ctx) {
  Backoff backoff;
  unsigned polls = 0;
  for (;;) {
    cudaError_t rc = cudaEventQuery(ev);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) checkCuda(rc, what);
    for (ncclComm_t c : {g.world, g.intra, g.rail}) {
      if (!c) continue;
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(c, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        g.abortAll();
        throwNccl(state, what, nullptr);
      }
    }
    if (Clock::now() >= ctx.deadline) {
      g.abortAll();
      throw TimeoutError("fourd: " + ctx.describe() + " timed out after " +
                         std::to_string(ctx.timeoutSeconds) + " s waiting for " + what +
                         " on the GPU (NCCL communicators aborted)");
    }
    if ((++polls & 1023u) == 0 && interruptRequested()) {
      g.abortAll();
      throw AbortedError("fourd: interrupted while waiting for " + std::string(what) + " during " +
                         ctx.describe());
    }
    backoff.pause();
  }
}

// ---- backend choice ---------------------------------------------------------------------------

bool localCudaAwareMpi() {
  const std::string env = envLower("FOURD_CUDA_AWARE_MPI");
  if (env == "0" || env == "false" || env == "no") return false;
  if (env == "1" || env == "true" || env == "yes") return true;
#if defined(MPIX_GPU_SUPPORT_CUDA) || (defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

void decideBackend(CommState& s, GpuState& g, int device, OpContext& ctx) {
  struct Report {
    unsigned char uuid[16];
    int32_t wantMpi;
    int32_t cudaAware;
  };
  Report mine{};
  cudaDeviceProp prop{};
  checkCuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::memcpy(mine.uuid, &prop.uuid, sizeof(mine.uuid));
  const std::string want = envLower("FOURD_CUDA_BACKEND");
  if (!want.empty() && want != "auto" && want != "nccl" && want != "mpi") {
    throw InvalidArgument("FOURD_CUDA_BACKEND: expected auto, nccl or mpi, found '" + want + "'");
  }
  mine.wantMpi = want == "mpi";
  mine.cudaAware = localCudaAwareMpi();
  std::vector<Report> all(s.size());
  s.mpi->allGatherBytes(&mine, sizeof(mine), all.data(), ctx);
  bool anyMpi = false, allAware = true, shared = false;
  for (size_t i = 0; i < all.size(); ++i) {
    anyMpi = anyMpi || all[i].wantMpi;
    allAware = allAware && all[i].cudaAware;
    for (size_t j = 0; j < i; ++j)
      shared = shared || std::memcmp(all[i].uuid, all[j].uuid, sizeof(all[i].uuid)) == 0;
  }
  if (anyMpi || shared) {
    g.backend = allAware ? Backend::kMpiCudaAware : Backend::kMpiStaged;
    g.why = anyMpi ? "FOURD_CUDA_BACKEND=mpi" : "several ranks of the group share one GPU";
    if (want == "nccl" && shared) {
      throw InvalidArgument("FOURD_CUDA_BACKEND=nccl: NCCL needs one GPU per rank, but ranks of "
                            "axis '" + s.name + "' share a GPU");
    }
  } else {
    g.backend = Backend::kNccl;
    g.why = "one GPU per rank";
  }
  g.device = device;
}

// ---- NCCL ---------------------------------------------------------------------------------------

void ensureNcclWorld(CommState& s, GpuState& g, OpContext& ctx) {
  if (g.world) return;
  ncclUniqueId id{};
  if (s.rank() == 0) {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) throwNccl(rc, "ncclGetUniqueId", nullptr);
  }
  Buffer idBuf(&id, sizeof(id), DataType::kUInt8);
  s.mpi->broadcast(idBuf, 0, ctx);
  ncclConfig_t cfg = nonBlockingConfig();
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, s.size(), id, s.rank(), &cfg);
  if (rc != ncclSuccess && rc != ncclInProgress) throwNccl(rc, "ncclCommInitRankConfig", comm);
  g.world = comm;
  ncclSettle(g, comm, "ncclCommInitRankConfig", ctx);
}

void ensureNcclLevels(CommState& s, GpuState& g, OpContext& ctx) {
  if (g.intra && g.rail) return;
  const int me = s.rank();
  const int node = s.topo.nodeIndex[me], local = s.topo.localIndex[me];
  ncclConfig_t cfg = nonBlockingConfig();
  // Both splits are collective over the whole group, in the same order on every rank.
  ncclComm_t intra = nullptr, rail = nullptr;
  ncclCall(g, ncclCommSplit(g.world, node, local, &intra, &cfg), g.world, "ncclCommSplit (intra)",
           ctx);
  g.intra = intra;
  if (intra) ncclSettle(g, intra, "ncclCommSplit (intra)", ctx);
  cfg = nonBlockingConfig();
  ncclCall(g, ncclCommSplit(g.world, local, node, &rail, &cfg), g.world, "ncclCommSplit (rail)",
           ctx);
  g.rail = rail;
  if (rail) ncclSettle(g, rail, "ncclCommSplit (rail)", ctx);
}

bool hierarchicalApplies(const CommState& s, std::string* why) {
  const auto& t = s.topo;
  if (!t.uniform) {
    if (why) *why = "nodes hold different numbers of the group's ranks (" + t.describe() + ")";
    return false;
  }
  if (t.numNodes < 2) {
    if (why) *why = "the group is on one node (" + t.describe() + "): no inter-node level";
    return false;
  }
  if (t.k < 2) {
    if (why) *why = "one rank per node (" + t.describe() + "): no intra-node level";
    return false;
  }
  return true;
}

void runNccl(CommState& s, GpuState& g, const CudaOp& op, OpContext& ctx) {
  bool hier = false;
  std::string why;
  // One rank: every algorithm is the flat one (as resolveAlgorithm does for CPU buffers).
  switch (s.size() == 1 ? Algorithm::kFlat : op.requested) {
    case Algorithm::kAuto:
      hier = op.coll != Collective::kBroadcast && hierarchicalApplies(s, nullptr);
      break;
    case Algorithm::kFlat: break;
    case Algorithm::kHierarchical:
      if (op.coll == Collective::kBroadcast) break;
      if (!hierarchicalApplies(s, &why)) {
        throw InvalidArgument(std::string("algorithm: 'hierarchical' cannot run ") + op.opName +
                              " on CUDA buffers with NCCL on axis '" + s.name + "': " + why);
      }
      hier = true;
      break;
    default:
      throw InvalidArgument(std::string("algorithm: '") + algorithmName(op.requested) +
                            "' cannot run on CUDA buffers with NCCL: NCCL runs 'flat' and "
                            "'hierarchical' (or 'auto'); set FOURD_CUDA_BACKEND=mpi for fourd's "
                            "CPU algorithms over staged host memory");
  }
  ctx.algorithm = hier ? "hierarchical (nccl)" : "flat (nccl)";
  ensureNcclWorld(s, g, ctx);
  const int p = s.size();
  const size_t esize = dataTypeSize(op.in.dtype);
  const ncclDataType_t dt = ncclType(op.in.dtype);
  cudaStream_t st = g.stream;

  if (!hier) {
    switch (op.coll) {
      case Collective::kAllReduce:
        ncclCall(g, ncclAllReduce(op.in.data, op.out.data, op.in.count, dt, ncclOp(op.op), g.world, st),
                 g.world, "ncclAllReduce", ctx);
        break;
      case Collective::kAllGather:
        ncclCall(g, ncclAllGather(op.in.data, op.out.data, op.in.count, dt, g.world, st), g.world,
                 "ncclAllGather", ctx);
        break;
      case Collective::kReduceScatter:
        // In place (out = my block of in) is NCCL's own in-place layout.
        ncclCall(g, ncclReduceScatter(op.in.data, op.out.data, op.out.count, dt, ncclOp(op.op),
                                      g.world, st),
                 g.world, "ncclReduceScatter", ctx);
        break;
      case Collective::kBroadcast:
        ncclCall(g, ncclBroadcast(op.out.data, op.out.data, op.out.count, dt, op.root, g.world, st),
                 g.world, "ncclBroadcast", ctx);
        break;
    }
    return;
  }

  ensureNcclLevels(s, g, ctx);
  const auto& t = s.topo;
  const int k = t.k, nodes = t.numNodes;
  const int me = s.rank();
  const int local = t.localIndex[me];
  const ncclRedOp_t sum = op.op == ReduceOp::kAvg ? ncclSum : ncclOp(op.op);
  char* out = static_cast<char*>(op.out.data);
  switch (op.coll) {
    case Collective::kAllReduce: {
      const size_t n = op.in.count;
      if (n % static_cast<size_t>(k) != 0) {
        // Not divisible by the intra level: the flat collective (same on every rank).
        ncclCall(g, ncclAllReduce(op.in.data, op.out.data, n, dt, ncclOp(op.op), g.world, st),
                 g.world, "ncclAllReduce", ctx);
        return;
      }
      const size_t shard = n / k;
      char* mine = out + static_cast<size_t>(local) * shard * esize;
      ncclCall(g, ncclReduceScatter(op.in.data, mine, shard, dt, sum, g.intra, st), g.intra,
               "ncclReduceScatter (intra)", ctx);
      ncclCall(g, ncclAllReduce(mine, mine, shard, dt, sum, g.rail, st), g.rail,
               "ncclAllReduce (rail)", ctx);
      ncclCall(g, ncclAllGather(mine, out, shard, dt, g.intra, st), g.intra,
               "ncclAllGather (intra)", ctx);
      break;
    }
    case Collective::kAllGather: {
      const size_t c = op.in.count;
      char* a = static_cast<char*>(g.scratch[0].get(c * nodes * esize, false));
      char* b = static_cast<char*>(g.scratch[1].get(c * p * esize, false));
      ncclCall(g, ncclAllGather(op.in.data, a, c, dt, g.rail, st), g.rail, "ncclAllGather (rail)",
               ctx);
      ncclCall(g, ncclAllGather(a, b, c * nodes, dt, g.intra, st), g.intra,
               "ncclAllGather (intra)", ctx);
      std::vector<int> perm(p);
      for (int r = 0; r < p; ++r) perm[r] = t.localIndex[r] * nodes + t.nodeIndex[r];
      cuda::permuteBlocks(out, b, c * esize, perm.data(), p, st);
      break;
    }
    case Collective::kReduceScatter: {
      const size_t c = op.out.count;
      char* a = static_cast<char*>(g.scratch[0].get(c * p * esize, false));
      char* b = static_cast<char*>(g.scratch[1].get(c * nodes * esize, false));
      std::vector<int> perm(p);
      for (int l = 0; l < k; ++l)
        for (int n = 0; n < nodes; ++n) perm[l * nodes + n] = t.memberAt(n, l);
      cuda::permuteBlocks(a, op.in.data, c * esize, perm.data(), p, st);
      ncclCall(g, ncclReduceScatter(a, b, c * nodes, dt, sum, g.intra, st), g.intra,
               "ncclReduceScatter (intra)", ctx);
      ncclCall(g, ncclReduceScatter(b, out, c, dt, sum, g.rail, st), g.rail,
               "ncclReduceScatter (rail)", ctx);
      break;
    }
    case Collective::kBroadcast: break;
  }
  if (op.hasOp && op.op == ReduceOp::kAvg) {
    cuda::scale(op.out.data, op.out.data, op.out.count, op.out.dtype, 1.0 / p, st);
  }
}

// ---- MPI with CUDA buffers ---------------------------------------------------------------------

void syncStream(GpuState& g, const char* what, OpContext& ctx) {
  Event ev;
  checkCuda(cudaEventRecord(ev.e, g.stream), "cudaEventRecord");
  waitEvent(g, ev.e, what, ctx);
}

void copyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t st) {
  if (bytes) checkCuda(cudaMemcpyAsync(dst, src, bytes, kind, st), "cudaMemcpyAsync (staging)");
}

bool cudaAwareCanRun(const CudaOp& op) {
  if (op.requested != Algorithm::kAuto && op.requested != Algorithm::kFlat) return false;
  if (!op.hasOp) return true;
  // fourd's MPI operators for 16-bit floats and the fp32 widening run on the host.
  return !op.accumulateFp32 && op.in.dtype != DataType::kFloat16 &&
         op.in.dtype != DataType::kBFloat16;
}

void runMpiCudaAware(CommState& s, GpuState& g, const CudaOp& op, OpContext& ctx) {
  ctx.algorithm = "flat (CUDA-aware MPI)";
  // The MPI library reads device memory outside any stream: finish the ordering first.
  syncStream(g, "the caller's stream before CUDA-aware MPI", ctx);
  Buffer in = op.in, out = op.out;
  switch (op.coll) {
    case Collective::kAllReduce: s.mpi->allReduce(in, out, op.op, ctx); break;
    case Collective::kAllGather: s.mpi->allGather(in, out, ctx); break;
    case Collective::kReduceScatter:
      if (op.inPlace) out.data = g.scratch[0].get(out.bytes(), false);
      s.mpi->reduceScatter(in, out, op.op, ctx);
      if (op.inPlace) copyAsync(op.out.data, out.data, out.bytes(), cudaMemcpyDeviceToDevice, g.stream);
      break;
    case Collective::kBroadcast: s.mpi->broadcast(out, op.root, ctx); break;
  }
  if (op.hasOp && op.op == ReduceOp::kAvg)
    cuda::scale(op.out.data, op.out.data, op.out.count, op.out.dtype, 1.0 / s.size(), g.stream);
}

constexpr size_t kChunkBytes = size_t(4) << 20;

void runMpiStaged(GpuState& g, const CudaOp& op, OpContext& ctx, const HostRunner& runOnHost) {
  ctx.algorithm = "staged through host memory";
  cudaStream_t st = g.stream;
  const size_t esize = dataTypeSize(op.in.dtype);
  if (op.coll == Collective::kAllReduce) {
    // Two pinned chunk buffers; every copy is on the communicator's one stream, so copies run
    // in issue order. Step i (buffer b = i % 2): wait for D2H(i) on the host; enqueue D2H(i+1)
    // into the other buffer (ordered after H2D(i-1), which read it); run the host all_reduce on
    // chunk i while D2H(i+1) and H2D(i-1) proceed; enqueue H2D(i).
    const size_t per = std::max<size_t>(1, kChunkBytes / esize);
    const size_t n = op.in.count;
    const size_t chunks = (n + per - 1) / per;
    char* host[2] = {static_cast<char*>(g.pinned[0].get(std::min(n, per) * esize, true)),
                     static_cast<char*>(chunks > 1 ? g.pinned[1].get(per * esize, true) : nullptr)};
    Event d2h[2];
    auto issueD2H = [&](size_t i) {
      const int b = static_cast<int>(i & 1);
      const size_t off = i * per, cnt = std::min(per, n - off);
      copyAsync(host[b], static_cast<const char*>(op.in.data) + off * esize, cnt * esize,
                cudaMemcpyDeviceToHost, st);
      checkCuda(cudaEventRecord(d2h[b].e, st), "cudaEventRecord");
    };
    if (chunks) issueD2H(0);
    for (size_t i = 0; i < chunks; ++i) {
      const int b = static_cast<int>(i & 1);
      const size_t off = i * per, cnt = std::min(per, n - off);
      waitEvent(g, d2h[b].e, "a device-to-host staging copy", ctx);
      if (i + 1 < chunks) issueD2H(i + 1);
      Buffer hb(host[b], cnt, op.in.dtype);
      runOnHost(hb, hb, op.requested);
      copyAsync(static_cast<char*>(op.out.data) + off * esize, host[b], cnt * esize,
                cudaMemcpyHostToDevice, st);
    }
    return;
  }
  const bool bcast = op.coll == Collective::kBroadcast;
  char* hin = static_cast<char*>(g.pinned[2].get(op.in.bytes(), true));
  char* hout = bcast ? hin : static_cast<char*>(g.pinned[3].get(op.out.bytes(), true));
  copyAsync(hin, op.in.data, op.in.bytes(), cudaMemcpyDeviceToHost, st);
  syncStream(g, "a device-to-host staging copy", ctx);
  runOnHost(Buffer(hin, op.in.count, op.in.dtype), Buffer(hout, op.out.count, op.out.dtype),
            op.requested);
  copyAsync(op.out.data, hout, op.out.bytes(), cudaMemcpyHostToDevice, st);
}

}  // namespace

void setCallerStream(void* stream) noexcept { tCallerStream = stream; }

void* takeCallerStream() noexcept {
  void* s = tCallerStream;
  tCallerStream = nullptr;
  return s;
}

void runCudaOp(CommState& s, const CudaOp& op, OpContext& ctx, const HostRunner& runOnHost) {
  const Buffer& any = op.in.device == DeviceType::kCuda ? op.in : op.out;
  if (op.in.device != op.out.device ||
      (op.in.count && op.out.count && op.in.deviceIndex != op.out.deviceIndex)) {
    throw InvalidArgument("output: expected a tensor on the input's device (cuda:" +
                          std::to_string(op.in.deviceIndex) + "), found another device");
  }
  const int device = any.deviceIndex;
  DeviceGuard guard(device);
  GpuState& g = gpuState(s);
  if (g.backend == Backend::kUndecided) decideBackend(s, g, device, ctx);
  if (device != g.device) {
    throw InvalidArgument("tensor: axis '" + s.name + "' runs its CUDA collectives on cuda:" +
                          std::to_string(g.device) + " (its first CUDA call), found a tensor on "
                          "cuda:" + std::to_string(device));
  }
  if (!g.stream) checkCuda(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking),
                           "cudaStreamCreateWithFlags");
  // Order after the caller's stream.
  cudaStream_t caller = static_cast<cudaStream_t>(op.stream);
  {
    Event start;
    checkCuda(cudaEventRecord(start.e, caller), "cudaEventRecord (caller's stream)");
    checkCuda(cudaStreamWaitEvent(g.stream, start.e, 0), "cudaStreamWaitEvent");
  }
  // Nothing to move (the same on every rank): only the stream ordering below. The host
  // algorithms take counts > 0.
  const bool empty = (op.coll == Collective::kAllGather ? op.in.count : op.out.count) == 0;
  if (!empty && g.backend == Backend::kNccl) {
    runNccl(s, g, op, ctx);
  } else if (!empty && g.backend == Backend::kMpiCudaAware && cudaAwareCanRun(op)) {
    runMpiCudaAware(s, g, op, ctx);
  } else if (!empty) {
    runMpiStaged(g, op, ctx, runOnHost);
  }
  Event end;
  checkCuda(cudaEventRecord(end.e, g.stream), "cudaEventRecord (end of operation)");
  // Later work on the caller's stream sees the result even before the host learns of it.
  checkCuda(cudaStreamWaitEvent(caller, end.e, 0), "cudaStreamWaitEvent (caller's stream)");
  waitEvent(g, end.e, ctx.op.c_str(), ctx);
}

}  // namespace fourd::detail

#endif  // FOURD_HAVE_CUDA
