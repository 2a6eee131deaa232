// The MPI backend (internal/mpi_backend.hpp): requests, the shared-memory segment of MPI-3
// windows, and the backend itself.
#include "internal/mpi_backend.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>

#include "fourd/error.hpp"
#include "internal/host_memory.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

void checkMpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw BackendError(std::string("fourd: ") + what + " failed with MPI error " +
                         std::to_string(rc) + ": " + std::string(msg, len),
                     rc);
}

namespace {

MPI_Datatype mpiType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kFloat16:
      return MPI_UINT16_T;
    case DataType::kBFloat16:
      return MPI_UINT16_T;
    case DataType::kInt8:
      return MPI_INT8_T;
    case DataType::kUInt8:
      return MPI_UINT8_T;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
  }
  throw InvalidArgument("dtype: unknown data type");
}

// User-defined MPI operators for the 16-bit floats: inout = in (op) inout.
template <DataType T, ReduceOp Op>
void userOp16(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce2(inout, in, inout, static_cast<size_t>(*len), T, Op);
}

struct Ops16 {
  MPI_Op op[2][4];  // [bf16?][sum, prod, min, max]
};

Ops16* ops16() {
  static Ops16 ops;
  static std::once_flag once;
  std::call_once(once, [] {
    using D = DataType;
    using R = ReduceOp;
    MPI_User_function* fns[2][4] = {
        {userOp16<D::kFloat16, R::kSum>, userOp16<D::kFloat16, R::kProd>,
         userOp16<D::kFloat16, R::kMin>, userOp16<D::kFloat16, R::kMax>},
        {userOp16<D::kBFloat16, R::kSum>, userOp16<D::kBFloat16, R::kProd>,
         userOp16<D::kBFloat16, R::kMin>, userOp16<D::kBFloat16, R::kMax>}};
    for (int b = 0; b < 2; ++b)
      for (int o = 0; o < 4; ++o)
        checkMpi(MPI_Op_create(fns[b][o], 1, &ops.op[b][o]), "MPI_Op_create");
  });
  return &ops;
}

// MPI operator for (dtype, op). Avg maps to sum (callers scale).
MPI_Op mpiOp(DataType t, ReduceOp op) {
  if (t == DataType::kFloat16 || t == DataType::kBFloat16) {
    const int b = t == DataType::kBFloat16 ? 1 : 0;
    const int o = op == ReduceOp::kAvg ? 0 : static_cast<int>(op);
    return ops16()->op[b][o];
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  throw InvalidArgument("op: unknown reduce op");
}

constexpr size_t kMaxPiece = size_t(1) << 30;

int checkedCount(size_t count, const char* what) {
  if (count > static_cast<size_t>(INT_MAX)) {
    throw InvalidArgument(std::string(what) +
                          ": the MPI library's collectives take at most "
                          "2^31-1 elements per call; found " +
                          std::to_string(count));
  }
  return static_cast<int>(count);
}

// The message of an operation that timed out; `missing`: the world ranks known not to have
// arrived (none known for a collective of the MPI library).
std::string timeoutText(const OpContext& ctx, const std::vector<int>& missing) {
  std::ostringstream os;
  os << "fourd: " << ctx.describe() << " timed out after " << ctx.elapsed() << " s (timeout "
     << ctx.timeoutSeconds << " s)";
  if (!missing.empty()) {
    os << "; peers that never arrived: world ranks [";
    for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
    os << "]";
  } else {
    os << "; the ranks that did not arrive are not known (the MPI library's collective did "
          "not complete; set FOURD_DEBUG=1 to compare the calls of every rank)";
  }
  return os.str();
}

// ---- requests ----------------------------------------------------------------------------------

// A vector whose first N elements live in the object: most operations post one to four
// requests, and a small call's whole budget is a few microseconds (no allocation for them).
// MPI keeps no pointer to a request variable, so moving them to the heap as it grows is safe.
template <class T, size_t N>
class InlineVec {
 public:
  size_t size() const noexcept { return size_; }
  T* data() noexcept { return heap_.empty() ? inline_ : heap_.data(); }
  const T* data() const noexcept { return heap_.empty() ? inline_ : heap_.data(); }
  T& operator[](size_t i) noexcept { return data()[i]; }
  const T& operator[](size_t i) const noexcept { return data()[i]; }
  T& back() noexcept { return data()[size_ - 1]; }
  void push_back(const T& v) {
    if (heap_.empty() && size_ < N) {
      inline_[size_++] = v;
      return;
    }
    if (heap_.empty()) heap_.assign(inline_, inline_ + size_);
    heap_.push_back(v);
    ++size_;
  }
  /// Makes at least `n` elements addressable (their values unspecified).
  void reserveAtLeast(size_t n) {
    if (n > N && heap_.size() < n) {
      if (heap_.empty()) heap_.assign(inline_, inline_ + size_);
      heap_.resize(n);
    }
    if (size_ < n) size_ = n;
  }

 private:
  T inline_[N];
  std::vector<T> heap_;
  size_t size_ = 0;
};

class MpiRequests final : public Requests {
 public:
  enum class Kind : char { kSend, kRecv, kCollective };

  explicit MpiRequests(const std::vector<int>* worldRanks) : worldRanks_(worldRanks) {}
  ~MpiRequests() override { release(); }

  size_t size() const noexcept override { return reqs_.size(); }

  /// `peer` is a rank of the communicator (-1 for a collective).
  MPI_Request* add(Kind kind, int peer) {
    reqs_.push_back(MPI_REQUEST_NULL);
    kinds_.push_back(kind);
    peers_.push_back(peer);
    return &reqs_.back();
  }

  bool test(size_t begin, size_t end) override {
    if (begin == end) return true;
    const int n = static_cast<int>(end - begin);
    statuses_.reserveAtLeast(static_cast<size_t>(n));
    int flag = 0;
    const int rc = MPI_Testall(n, reqs_.data() + begin, &flag, statuses_.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (int i = 0; i < n; ++i) {
        const int e = statuses_[i].MPI_ERROR;
        if (e != MPI_SUCCESS && e != MPI_ERR_PENDING) checkMpi(e, describe(begin + i).c_str());
      }
    }
    checkMpi(rc, "MPI_Testall");
    return flag != 0;
  }

  void wait(size_t begin, size_t end, OpContext& ctx) override {
    if (begin == end) return;
    Backoff backoff(ctx.spin);
    WaitWatch watch(ctx);
    while (!test(begin, end)) {
      if (watch.expired()) throwTimeout(begin, end, ctx);
      backoff.pause();
    }
  }

  std::vector<int> pendingPeers(size_t begin, size_t end) override {
    std::vector<int> missing;
    for (size_t i = begin; i < end; ++i) {
      int flag = 1;
      if (reqs_[i] != MPI_REQUEST_NULL) MPI_Test(&reqs_[i], &flag, MPI_STATUS_IGNORE);
      if (!flag && peers_[i] >= 0) {
        const int w = worldRanks_->at(peers_[i]);
        if (std::find(missing.begin(), missing.end(), w) == missing.end()) missing.push_back(w);
      }
    }
    return missing;
  }

  bool abandon(double seconds) noexcept override {
    bool pending = false;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (reqs_[i] == MPI_REQUEST_NULL) continue;
      pending = true;
      // A receive not yet matched is cancelled; a send only reads its buffer; a collective
      // cannot be cancelled (MPI) and may still write its output: we can only wait for it.
      if (kinds_[i] == Kind::kRecv) (void)MPI_Cancel(&reqs_[i]);
    }
    if (!pending) return true;
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(seconds));
    Backoff backoff;
    do {
      int flag = 0;
      if (MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE) !=
          MPI_SUCCESS) {
        return false;
      }
      if (flag) return true;
      backoff.pause();
    } while (Clock::now() < until);
    return false;
  }

 private:
  std::string describe(size_t i) const {
    const char* what = kinds_[i] == Kind::kSend   ? "MPI_Isend"
                       : kinds_[i] == Kind::kRecv ? "MPI_Irecv"
                                                  : "a non-blocking MPI collective";
    std::string s = what;
    if (peers_[i] >= 0) s += " with world rank " + std::to_string(worldRanks_->at(peers_[i]));
    return s;
  }

  [[noreturn]] void throwTimeout(size_t begin, size_t end, OpContext& ctx) {
    throw TimeoutError(timeoutText(ctx, pendingPeers(begin, end)));
  }

  // Requests still pending at destruction: point-to-point ones are freed (MPI completes them
  // on its own), collectives cannot be and are left to the library.
  void release() noexcept {
    if (!abandon(0.0)) {
      for (size_t i = 0; i < reqs_.size(); ++i)
        if (reqs_[i] != MPI_REQUEST_NULL && kinds_[i] != Kind::kCollective)
          (void)MPI_Request_free(&reqs_[i]);
    }
  }

  const std::vector<int>* worldRanks_;
  InlineVec<MPI_Request, 4> reqs_;
  InlineVec<Kind, 4> kinds_;
  InlineVec<int, 4> peers_;
  InlineVec<MPI_Status, 4> statuses_;
};

// ---- shared memory -----------------------------------------------------------------------------

class MpiSegment final : public SharedSegment {
 public:
  MpiSegment(MPI_Comm comm, MPI_Win win, std::vector<char*> bases, size_t bytes, int me,
             double releaseSeconds)
      : comm_(comm),
        win_(win),
        bases_(std::move(bases)),
        bytes_(bytes),
        me_(me),
        releaseSeconds_(releaseSeconds) {}
  ~MpiSegment() override { release(true); }

  int rank() const noexcept override { return me_; }
  int size() const noexcept override { return static_cast<int>(bases_.size()); }
  size_t bytesPerRank() const noexcept override { return bytes_; }
  char* base(int j) const noexcept override { return bases_[j]; }
  void sync() noexcept override { MPI_Win_sync(win_); }

  void release(bool clean) noexcept override {
    if (win_ == MPI_WIN_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    // MPI_Win_free is collective: after a failed operation the peers may never arrive, so the
    // window is leaked rather than risk a hang at exit. Before it, a deadline-aware barrier:
    // a peer that never frees its window makes this rank leak it instead of hanging, and (seen
    // with MPICH 5 at 8 ranks on 2 cores) a rank that leaves MPI_Win_free early and goes on to
    // other MPI calls could leave its peers spinning inside MPI_Win_free for good.
    if (!finalized && clean && together()) {
      MPI_Win_unlock_all(win_);
      MPI_Win_free(&win_);
    }
    win_ = MPI_WIN_NULL;
  }

 private:
  bool together() noexcept {
    OpContext ctx;
    ctx.op = "free of a shared-memory window";
    ctx.axis = "intra";
    ctx.start = Clock::now();
    ctx.timeoutSeconds = releaseSeconds_;
    ctx.deadline = std::min(deadlineAfter(ctx.start, releaseSeconds_), teardownDeadline());
    try {
      enterBlockingCall(comm_, ctx);
      return true;
    } catch (...) {
      return false;
    }
  }

  MPI_Comm comm_;
  MPI_Win win_;
  std::vector<char*> bases_;
  size_t bytes_;
  int me_;
  double releaseSeconds_;
};

// ---- persistent requests of small blocking collectives ------------------------------------------

// MPICH runs a small collective through a persistent request (MPI-4: MPI_Allreduce_init once,
// MPI_Start every call) in about half the time of its non-blocking call, which builds a new
// schedule every call. 1 KiB on 2 ranks of the VM, a loop of calls: all_gather 1.8 us against 3.6
// non-blocking (3.4 for MPI's blocking call), all_reduce 2.0 against 3.9 (5.3), reduce_scatter 1.9
// against 4.0 (3.6). A persistent request is bound to its buffers and its creation is collective,
// so every member must create one at the same call: the decision may depend only on what every
// member's call shares (collective, count, dtype, op, in the order MPI already requires), never on
// the caller's addresses. So each (collective, count, dtype, op) gets a request on buffers of its
// own, made at its first call, and a call copies its input in and its result out. Those copies set
// kMaxBytes: through fourd (the bench, 2 ranks), flat ran 1-8 KiB at 0.93-1.42x the MPI library's
// blocking call this way against 0.81-1.15x without, but at 16 KiB in place the copies cost more
// than the request saves (all_gather 7.25 us against 6.17 without). At most kSlots per
// communicator; the least recently used is freed first, the same one on every member. A call that
// fails (timeout, interrupt) leaves its request active, and MPI may still write its buffers: the
// slot is dropped with its request and buffers kept for good.
// FOURD_MPI_PERSISTENT=0 (the same on every rank) posts every call as a non-blocking one.
class PersistentCalls {
 public:
  static constexpr size_t kMaxBytes = 8 * 1024;  // the largest buffer of the call
  static constexpr size_t kSlots = 32;
  enum class Kind : char { kAllReduce, kAllGather, kReduceScatter };

  PersistentCalls() = default;
  PersistentCalls(const PersistentCalls&) = delete;
  PersistentCalls& operator=(const PersistentCalls&) = delete;
  ~PersistentCalls() { clear(); }

  static bool enabled() {
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    static const bool on = [] {
      const char* e = std::getenv("FOURD_MPI_PERSISTENT");
      return !(e && std::string(e) == "0");
    }();
    return on;
#else
    return false;  // persistent collectives came with MPI-4
#endif
  }

  /// Frees every request (inactive: each call completed) while MPI still runs.
  void clear() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (Slot& x : slots_)
      if (!finalized && x.req != MPI_REQUEST_NULL) (void)MPI_Request_free(&x.req);
    slots_.clear();
  }

  /// Runs the blocking call `kind` through its persistent request: `count` elements per
  /// block, `blocks` blocks in its larger buffer (1 for all_reduce, the group's size for the
  /// others), this rank's block `rank`. False (nothing done) when the call is not one for a
  /// persistent request.
  bool run(MPI_Comm comm, int rank, int blocks, Kind kind, const Buffer& in, const Buffer& out,
           size_t count, MPI_Datatype type, MPI_Op op, OpContext& ctx) {
    const size_t es = dataTypeSize(out.dtype);
    const size_t block = count * es;
    const size_t whole = block * static_cast<size_t>(blocks);
    if (!enabled() || count == 0 || whole > kMaxBytes) return false;
    if (in.device != DeviceType::kCpu || out.device != DeviceType::kCpu) return false;
    std::lock_guard<std::mutex> lock(mu_);
    Slot& x = slot(comm, kind, count, type, op, whole, block);
    char* stage = static_cast<char*>(x.stage.get());
    switch (kind) {
      case Kind::kAllReduce:
        std::memcpy(stage, in.data, block);
        break;
      case Kind::kAllGather:
        std::memcpy(stage + block * static_cast<size_t>(rank), in.data, block);
        break;
      case Kind::kReduceScatter:
        std::memcpy(stage, in.data, whole);
        break;
    }
    checkMpi(MPI_Start(&x.req), "MPI_Start");
    try {
      wait(x.req, ctx);
    } catch (...) {
      drop(x);
      throw;
    }
    switch (kind) {
      case Kind::kAllReduce:
        std::memcpy(out.data, stage, block);
        break;
      case Kind::kAllGather:
        std::memcpy(out.data, stage, whole);
        break;
      case Kind::kReduceScatter:
        std::memcpy(out.data, stage + whole, block);
        break;
    }
    return true;
  }

 private:
  struct Slot {
    Kind kind;
    size_t count;
    MPI_Datatype type;
    MPI_Op op;
    std::shared_ptr<void> stage;
    MPI_Request req = MPI_REQUEST_NULL;
    uint64_t used = 0;
  };

  // The slot of the call, made (collectively) at its first call; the least recently used one
  // freed first when all are taken.
  Slot& slot(MPI_Comm comm, Kind kind, size_t count, MPI_Datatype type, MPI_Op op, size_t whole,
             size_t block) {
    ++clock_;
    for (Slot& x : slots_) {
      if (x.kind == kind && x.count == count && x.type == type && x.op == op) {
        x.used = clock_;
        return x;
      }
    }
    if (slots_.size() >= kSlots) {
      auto lru = std::min_element(slots_.begin(), slots_.end(),
                                  [](const Slot& a, const Slot& b) { return a.used < b.used; });
      (void)MPI_Request_free(&lru->req);
      slots_.erase(lru);
    }
    Slot x{kind, count, type, op, nullptr, MPI_REQUEST_NULL, clock_};
    const int n = static_cast<int>(count);
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    switch (kind) {
      case Kind::kAllReduce:
        x.stage = allocateHost(block);
        checkMpi(MPI_Allreduce_init(MPI_IN_PLACE, x.stage.get(), n, type, op, comm, MPI_INFO_NULL,
                                    &x.req),
                 "MPI_Allreduce_init");
        break;
      case Kind::kAllGather:
        x.stage = allocateHost(whole);
        checkMpi(MPI_Allgather_init(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x.stage.get(), n, type,
                                    comm, MPI_INFO_NULL, &x.req),
                 "MPI_Allgather_init");
        break;
      case Kind::kReduceScatter: {
        x.stage = allocateHost(whole + block);
        char* b = static_cast<char*>(x.stage.get());
        checkMpi(
            MPI_Reduce_scatter_block_init(b, b + whole, n, type, op, comm, MPI_INFO_NULL, &x.req),
            "MPI_Reduce_scatter_block_init");
        break;
      }
    }
#else
    (void)comm, (void)n, (void)whole, (void)block;  // unreachable: enabled() is false
#endif
    slots_.push_back(std::move(x));
    return slots_.back();
  }

  // Completes a started request within ctx's deadline. MPI_Test, not MPI_Testall: MPICH 5's
  // MPI_Testall fails with MPI_ERR_IN_STATUS on a completed persistent collective request.
  static void wait(MPI_Request& req, OpContext& ctx) {
    Backoff backoff(ctx.spin);
    WaitWatch watch(ctx);
    int flag = 0;
    for (;;) {
      checkMpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (flag) return;
      if (watch.expired()) throw TimeoutError(timeoutText(ctx, {}));
      backoff.pause();
    }
  }

  // A failed call: MPI may still complete its request and write its buffers, so both are kept
  // for the rest of the process and the slot is forgotten.
  void drop(Slot& x) {
    static std::mutex leakMu;
    static std::vector<std::shared_ptr<void>>* leaked = new std::vector<std::shared_ptr<void>>();
    {
      std::lock_guard<std::mutex> lock(leakMu);
      leaked->push_back(x.stage);
    }
    const Slot* p = &x;
    slots_.erase(
        std::find_if(slots_.begin(), slots_.end(), [p](const Slot& y) { return &y == p; }));
  }

  std::mutex mu_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

// ---- the backend -------------------------------------------------------------------------------

class MpiBackend final : public Backend {
 public:
  MpiBackend(MPI_Comm comm, bool owned, std::vector<int> worldRanks)
      : comm_(comm), owned_(owned), worldRanks_(std::move(worldRanks)) {
    checkMpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    checkMpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    // Errors come back as codes (turned into fourd exceptions), never abort the job.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiBackend() override {
    persistent_.clear();  // its requests go before their communicator
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  MPI_Comm handle() const noexcept { return comm_; }
  std::string kind() const override { return "mpi"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  const std::vector<int>& worldRanks() const noexcept override { return worldRanks_; }
  DeviceType device() const noexcept override { return DeviceType::kCpu; }
  size_t maxCount() const noexcept override { return static_cast<size_t>(INT_MAX); }
  std::unique_ptr<Requests> requests() override {
    return std::make_unique<MpiRequests>(&worldRanks_);
  }

  void iallReduce(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) override {
    const int n = checkedCount(out.count, "count");
    const void* send = in.data == out.data ? MPI_IN_PLACE : in.data;
    checkMpi(MPI_Iallreduce(send, out.data, n, mpiType(out.dtype), mpiOp(out.dtype, op), comm_,
                            collective(r)),
             "MPI_Iallreduce");
  }
  void iallGather(const Buffer& in, const Buffer& out, Requests& r) override {
    const int n = checkedCount(in.count, "count");
    const char* myBlock = static_cast<const char*>(out.data) + in.bytes() * rank_;
    const void* send = in.data == myBlock ? MPI_IN_PLACE : in.data;
    checkMpi(MPI_Iallgather(send, n, mpiType(in.dtype), out.data, n, mpiType(out.dtype), comm_,
                            collective(r)),
             "MPI_Iallgather");
  }
  void ireduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) override {
    const int n = checkedCount(out.count, "count");
    checkedCount(in.count, "count");
    checkMpi(MPI_Ireduce_scatter_block(in.data, out.data, n, mpiType(out.dtype),
                                       mpiOp(out.dtype, op), comm_, collective(r)),
             "MPI_Ireduce_scatter_block");
  }
  // Blocking forms: small calls through persistent requests (PersistentCalls), the others
  // posted and waited for.
  void allReduce(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) override {
    if (!persistent_.run(comm_, rank_, 1, PersistentCalls::Kind::kAllReduce, in, out, out.count,
                         mpiType(out.dtype), mpiOp(out.dtype, op), ctx))
      Backend::allReduce(in, out, op, ctx);
  }
  void allGather(const Buffer& in, const Buffer& out, OpContext& ctx) override {
    if (!persistent_.run(comm_, rank_, size_, PersistentCalls::Kind::kAllGather, in, out, in.count,
                         mpiType(in.dtype), MPI_OP_NULL, ctx))
      Backend::allGather(in, out, ctx);
  }
  void reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) override {
    if (!persistent_.run(comm_, rank_, size_, PersistentCalls::Kind::kReduceScatter, in, out,
                         out.count, mpiType(out.dtype), mpiOp(out.dtype, op), ctx))
      Backend::reduceScatter(in, out, op, ctx);
  }

  void ibroadcast(const Buffer& buf, int root, Requests& r) override {
    const int n = checkedCount(buf.count, "count");
    checkMpi(MPI_Ibcast(buf.data, n, mpiType(buf.dtype), root, comm_, collective(r)), "MPI_Ibcast");
  }
  void ibarrier(Requests& r) override {
    checkMpi(MPI_Ibarrier(comm_, collective(r)), "MPI_Ibarrier");
  }

  void isend(const void* buf, size_t bytes, int peer, int tag, Requests& r) override {
    pieces(static_cast<const char*>(buf), bytes, [&](const char* p, int n) {
      checkMpi(
          MPI_Isend(p, n, MPI_BYTE, peer, tag, comm_, mine(r).add(MpiRequests::Kind::kSend, peer)),
          "MPI_Isend");
    });
  }
  void irecv(void* buf, size_t bytes, int peer, int tag, Requests& r) override {
    pieces(static_cast<char*>(buf), bytes, [&](char* p, int n) {
      checkMpi(
          MPI_Irecv(p, n, MPI_BYTE, peer, tag, comm_, mine(r).add(MpiRequests::Kind::kRecv, peer)),
          "MPI_Irecv");
    });
  }

  std::shared_ptr<void> allocate(size_t bytes) override { return allocateHost(bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) moveBytes(dst, src, bytes);
  }
  void scale(const Buffer& buf, double factor) override {
    scaleInPlace(buf.data, buf.count, buf.dtype, factor);
  }

  std::unique_ptr<Backend> split(int color, int key, OpContext& ctx) override;
  bool sharesMemory(OpContext& ctx) override;
  std::unique_ptr<SharedSegment> sharedSegment(size_t bytesPerRank, OpContext& ctx) override;

 private:
  static MpiRequests& mine(Requests& r) { return static_cast<MpiRequests&>(r); }
  static MPI_Request* collective(Requests& r) {
    return mine(r).add(MpiRequests::Kind::kCollective, -1);
  }
  // Posts a message of `bytes` as pieces of at most kMaxPiece bytes (MPI counts are int), at
  // least one even when empty.
  template <class Byte, class Post>
  static void pieces(Byte* p, size_t bytes, const Post& post) {
    do {
      const size_t piece = bytes < kMaxPiece ? bytes : kMaxPiece;
      post(p, static_cast<int>(piece));
      p += piece;
      bytes -= piece;
    } while (bytes > 0);
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 0;
  std::vector<int> worldRanks_;
  PersistentCalls persistent_;
};

std::unique_ptr<Backend> MpiBackend::split(int color, int key, OpContext& ctx) {
  enterBlockingCall(comm_, ctx);
  MPI_Comm c;
  checkMpi(MPI_Comm_split(comm_, color, key, &c), "MPI_Comm_split");
  int n = 0;
  MPI_Comm_size(c, &n);
  std::vector<int> wr(n);
  int myWorld = worldRanks_.at(rank_);
  auto out = std::make_unique<MpiBackend>(c, true, std::vector<int>(n, -1));
  MpiRequests r(&out->worldRanks_);
  checkMpi(MPI_Iallgather(&myWorld, 1, MPI_INT, wr.data(), 1, MPI_INT, c,
                          r.add(MpiRequests::Kind::kCollective, -1)),
           "MPI_Iallgather");
  r.wait(0, 1, ctx);
  out->worldRanks_ = wr;
  return out;
}

bool MpiBackend::sharesMemory(OpContext& ctx) {
  enterBlockingCall(comm_, ctx);
  MPI_Comm shared;
  checkMpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared),
           "MPI_Comm_split_type");
  int n = 0;
  MPI_Comm_size(shared, &n);
  MPI_Comm_free(&shared);
  // Every member must agree, or some would try a shared window and others not.
  int32_t mine = n == size_ ? 1 : 0, all = 0;
  allReduce(Buffer(&mine, 1, DataType::kInt32), Buffer(&all, 1, DataType::kInt32), ReduceOp::kMin,
            ctx);
  return all == 1;
}

std::unique_ptr<SharedSegment> MpiBackend::sharedSegment(size_t bytesPerRank, OpContext& ctx) {
  enterBlockingCall(comm_, ctx);
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  char* mine = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  const int rc =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytesPerRank), 1, info, comm_, &mine, &win);
  MPI_Info_free(&info);
  checkMpi(rc, "MPI_Win_allocate_shared");
  MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
  std::vector<char*> bases(size_);
  for (int j = 0; j < size_; ++j) {
    MPI_Aint size = 0;
    int disp = 0;
    void* p = nullptr;
    checkMpi(MPI_Win_shared_query(win, j, &size, &disp, &p), "MPI_Win_shared_query");
    bases[j] = static_cast<char*>(p);
  }
  checkMpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, win), "MPI_Win_lock_all");
  return std::make_unique<MpiSegment>(comm_, win, std::move(bases), bytesPerRank, rank_,
                                      ctx.timeoutSeconds);
}

}  // namespace

void enterBlockingCall(MPI_Comm comm, OpContext& ctx) {
  MPI_Request r = MPI_REQUEST_NULL;
  checkMpi(MPI_Ibarrier(comm, &r), "MPI_Ibarrier");
  waitMpi(&r, 1, ctx);
  OpContext commit = ctx;
  commit.interruptible = false;
  commit.deadline = std::max(ctx.deadline, deadlineAfter(Clock::now(), kCommitGraceSeconds));
  checkMpi(MPI_Ibarrier(comm, &r), "MPI_Ibarrier");
  waitMpi(&r, 1, commit);
}

void waitMpi(MPI_Request* reqs, int n, OpContext& ctx) {
  if (n == 0) return;
  Backoff backoff(ctx.spin);
  WaitWatch watch(ctx);
  while (true) {
    int done = 0;
    checkMpi(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    if (watch.expired()) {
      throw TimeoutError("fourd: " + ctx.describe() + " timed out after " +
                         std::to_string(ctx.elapsed()) + " s (timeout " +
                         std::to_string(ctx.timeoutSeconds) + " s): not every rank arrived");
    }
    backoff.pause();
  }
}

std::unique_ptr<Backend> makeMpiBackend(MPI_Comm comm, bool owned, std::vector<int> worldRanks) {
  return std::make_unique<MpiBackend>(comm, owned, std::move(worldRanks));
}

MPI_Comm mpiHandle(const Backend& b) noexcept {
  const auto* m = dynamic_cast<const MpiBackend*>(&b);
  return m ? m->handle() : MPI_COMM_NULL;
}

}  // namespace fourd::detail
