// The NCCL backend (device_backends.hpp): CUDA buffers, one GPU per rank.
//
// Every communicator is created non-blocking (ncclConfig_t::blocking = 0): creation, splits
// and calls may return ncclInProgress, and NcclRequests completes them by polling
// ncclCommGetAsyncError against the operation's deadline. A request completes when its call
// is enqueued on the backend's stream: NCCL orders the calls of one stream, so the device path
// waits for the stream once, at the end of the operation. The levels split from a backend
// share its stream, so their calls are ordered too.
//
// NCCL has no barrier: ibarrier all-reduces one int. Point-to-point calls are grouped
// (ncclGroupStart at the first send or receive, ncclGroupEnd when the requests are next
// tested), so that two ranks that send to each other before receiving do not deadlock.
// Avg arrives as a sum, like on every backend (the communicator scales).
#include <cstring>
#include <utility>
#include <vector>

#include "cuda_support.hpp"
#include "device_backends.hpp"

namespace fourd::detail {

namespace {

ncclDataType_t ncclType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUInt8:
      return ncclUint8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
  }
  throw InvalidArgument("dtype: unknown fourd dtype code " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  throw InvalidArgument("op: unknown fourd op code " + std::to_string(static_cast<int>(op)));
}

ncclConfig_t nonBlockingConfig() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

// Polls `comm` until its last call is no longer in progress, or the deadline passes (then
// aborts it and throws TimeoutError).
void settle(ncclComm_t comm, const char* what, OpContext& ctx) {
  Backoff backoff;
  WaitWatch watch(ctx);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) throwNccl(rc, "ncclCommGetAsyncError", comm);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) throwNccl(state, what, comm);
    bool expired = false;
    try {
      expired = watch.expired();
    } catch (...) {
      (void)ncclCommAbort(comm);
      throw;
    }
    if (expired) {
      (void)ncclCommAbort(comm);
      throw TimeoutError("fourd: " + ctx.describe() + " timed out after " +
                         std::to_string(ctx.elapsed()) + " s in " + what +
                         " (NCCL communicator aborted)");
    }
    backoff.pause();
  }
}

class NcclBackend;

class NcclRequests final : public Requests {
 public:
  explicit NcclRequests(NcclBackend* b) : b_(b) {}
  size_t size() const noexcept override { return names_.size(); }
  void add(const char* what) { names_.push_back(what); }
  bool test(size_t begin, size_t end) override;
  void wait(size_t begin, size_t end, OpContext& ctx) override;
  std::vector<int> pendingPeers(size_t, size_t) override { return {}; }
  bool abandon(double) noexcept override { return true; }  // enqueued work is the stream's

 private:
  NcclBackend* b_;
  std::vector<const char*> names_;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(std::unique_ptr<Backend> host, ncclComm_t comm, cudaStream_t stream, int device)
      : host_(std::move(host)), comm_(comm), stream_(stream), device_(device) {
    one_ = deviceAllocate(sizeof(int32_t));
  }
  ~NcclBackend() override { abort(); }

  ncclComm_t comm() const noexcept { return comm_; }
  std::string kind() const override { return "nccl"; }
  int rank() const noexcept override { return host_->rank(); }
  int size() const noexcept override { return host_->size(); }
  const std::vector<int>& worldRanks() const noexcept override { return host_->worldRanks(); }
  DeviceType device() const noexcept override { return DeviceType::kCuda; }
  std::unique_ptr<Requests> requests() override { return std::make_unique<NcclRequests>(this); }

  void iallReduce(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) override {
    call(ncclAllReduce(in.data, out.data, out.count, ncclType(out.dtype), ncclOp(op), comm_,
                       stream_),
         "ncclAllReduce", r);
  }
  void iallGather(const Buffer& in, const Buffer& out, Requests& r) override {
    call(ncclAllGather(in.data, out.data, in.count, ncclType(in.dtype), comm_, stream_),
         "ncclAllGather", r);
  }
  void ireduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) override {
    call(ncclReduceScatter(in.data, out.data, out.count, ncclType(out.dtype), ncclOp(op), comm_,
                           stream_),
         "ncclReduceScatter", r);
  }
  void ibroadcast(const Buffer& buf, int root, Requests& r) override {
    call(ncclBroadcast(buf.data, buf.data, buf.count, ncclType(buf.dtype), root, comm_, stream_),
         "ncclBroadcast", r);
  }
  void ibarrier(Requests& r) override {
    call(ncclAllReduce(one_.get(), one_.get(), 1, ncclInt32, ncclSum, comm_, stream_),
         "ncclAllReduce (barrier)", r);
  }
  void isend(const void* buf, size_t bytes, int peer, int, Requests& r) override {
    openGroup();
    call(ncclSend(buf, bytes, ncclUint8, peer, comm_, stream_), "ncclSend", r);
  }
  void irecv(void* buf, size_t bytes, int peer, int, Requests& r) override {
    openGroup();
    call(ncclRecv(buf, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv", r);
  }

  std::shared_ptr<void> allocate(size_t bytes) override { return deviceAllocate(bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) {
      checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                "cudaMemcpyAsync");
    }
  }
  void scale(const Buffer& buf, double factor) override {
    cuda::scale(buf.data, buf.data, buf.count, buf.dtype, factor, stream_);
  }

  std::unique_ptr<Backend> split(int color, int key, OpContext& ctx) override {
    closeGroup();
    auto host = host_->split(color, key, ctx);
    ncclConfig_t cfg = nonBlockingConfig();
    ncclComm_t sub = nullptr;
    const ncclResult_t rc = ncclCommSplit(comm_, color, key, &sub, &cfg);
    if (rc != ncclSuccess && rc != ncclInProgress) throwNccl(rc, "ncclCommSplit", comm_);
    settle(comm_, "ncclCommSplit", ctx);
    if (sub) settle(sub, "ncclCommSplit", ctx);
    return std::make_unique<NcclBackend>(std::move(host), sub, stream_, device_);
  }
  bool sharesMemory(OpContext&) override { return false; }
  std::unique_ptr<SharedSegment> sharedSegment(size_t, OpContext&) override { return nullptr; }

  void abort() noexcept override {
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Ends the open point-to-point group (NcclRequests::test calls it).
  void closeGroup() {
    if (!groupOpen_) return;
    groupOpen_ = false;
    const ncclResult_t rc = ncclGroupEnd();
    if (rc != ncclSuccess && rc != ncclInProgress) throwNccl(rc, "ncclGroupEnd", comm_);
  }
  // ncclSuccess once nothing is in progress; throws on an asynchronous error.
  bool settled(const char* what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) throwNccl(rc, "ncclCommGetAsyncError", comm_);
    if (state != ncclSuccess && state != ncclInProgress) throwNccl(state, what, comm_);
    return state == ncclSuccess;
  }

 private:
  void openGroup() {
    if (groupOpen_) return;
    const ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) throwNccl(rc, "ncclGroupStart", comm_);
    groupOpen_ = true;
  }
  void call(ncclResult_t rc, const char* what, Requests& r) {
    if (rc != ncclSuccess && rc != ncclInProgress) throwNccl(rc, what, comm_);
    static_cast<NcclRequests&>(r).add(what);
  }

  std::unique_ptr<Backend> host_;  // the same members over MPI: rendezvous, splits, ranks
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  std::shared_ptr<void> one_;  // the barrier's int
  bool groupOpen_ = false;
};

bool NcclRequests::test(size_t begin, size_t end) {
  if (begin == end) return true;
  b_->closeGroup();
  return b_->settled(names_[end - 1]);
}

void NcclRequests::wait(size_t begin, size_t end, OpContext& ctx) {
  if (begin == end) return;
  b_->closeGroup();
  settle(b_->comm(), names_[end - 1], ctx);
}

}  // namespace

std::unique_ptr<Backend> makeNcclBackend(std::unique_ptr<Backend> host, cudaStream_t stream,
                                         int device, OpContext& ctx) {
  ncclUniqueId id{};
  if (host->rank() == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) throwNccl(rc, "ncclGetUniqueId", nullptr);
  }
  host->broadcast(Buffer(&id, sizeof(id), DataType::kUInt8), 0, ctx);
  ncclConfig_t cfg = nonBlockingConfig();
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, host->size(), id, host->rank(), &cfg);
  if (rc != ncclSuccess && rc != ncclInProgress) throwNccl(rc, "ncclCommInitRankConfig", comm);
  settle(comm, "ncclCommInitRankConfig", ctx);
  return std::make_unique<NcclBackend>(std::move(host), comm, stream, device);
}

}  // namespace fourd::detail
