// The backend interface: one flat group of ranks and what a transport can do on it.
//
// Every algorithm (cpp/src/algorithms/) reaches the network only through this interface, so an
// algorithm runs on any backend that offers what it needs, and a wrapper (host staging of CUDA
// buffers, later a codec) slots in as a backend of its own:
//
//   MpiBackend      backends/mpi_backend.cpp   host buffers (device buffers too when the MPI
//                                              library is CUDA-aware)
//   NcclBackend     cuda/nccl_backend.cpp      CUDA buffers, one GPU per rank
//   StagingBackend  cuda/staging_backend.cpp   CUDA buffers through pinned host memory onto
//                                              any host backend
//
// Operations are non-blocking: each posts its requests into a Requests set made by the same
// backend, and the caller completes them with Requests::wait (which honours the operation's
// deadline and the interrupt check) or polls Requests::test. The blocking helpers
// (allReduce(..., ctx), ...) post and wait. Non-blocking collectives of one backend must be
// posted in the same order on every member (MPI's rule); point-to-point messages between two
// members with one tag match in posting order. Counts are elements of the buffer's dtype;
// point-to-point sizes are bytes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "fourd/buffer.hpp"
#include "fourd/data_type.hpp"
#include "internal/op_context.hpp"

namespace fourd::detail {

/// The requests of the operations posted on one backend, in posting order. Indices of a
/// request never change, so a caller remembers ranges [begin, end) of what it posted.
class Requests {
 public:
  virtual ~Requests() = default;
  /// Requests posted so far.
  virtual size_t size() const noexcept = 0;
  /// Whether every request in [begin, end) has completed. Never blocks.
  virtual bool test(size_t begin, size_t end) = 0;
  /// Completes [begin, end), or throws TimeoutError at ctx.deadline (naming the peers still
  /// missing) or AbortedError when interrupted.
  virtual void wait(size_t begin, size_t end, OpContext& ctx) = 0;
  /// World ranks of the peers of the requests in [begin, end) not completed yet (collectives
  /// have no single peer and are not listed).
  virtual std::vector<int> pendingPeers(size_t begin, size_t end) = 0;
  /// Stops every request still pending so that none writes into its buffer afterwards:
  /// receives are cancelled, sends and collectives are given up to `seconds` to finish.
  /// Returns false when some could not be stopped (their buffers must then stay allocated).
  virtual bool abandon(double seconds) noexcept = 0;

  void waitAll(OpContext& ctx) { wait(0, size(), ctx); }
};

/// Memory shared by the members of a backend whose ranks share a node: each member's segment
/// of bytesPerRank() bytes, mapped into every member's address space.
class SharedSegment {
 public:
  virtual ~SharedSegment() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual size_t bytesPerRank() const noexcept = 0;
  /// Member j's segment, as mapped in this process.
  virtual char* base(int j) const noexcept = 0;
  /// Makes this process's stores visible to the others and theirs to it (a memory barrier of
  /// the segment, MPI_Win_sync).
  virtual void sync() noexcept = 0;
  /// Frees the segment collectively when `clean` (every member is between operations), within
  /// a deadline; otherwise, or when a member does not arrive, leaks it rather than hang.
  virtual void release(bool clean) noexcept = 0;
};

/// One flat group of ranks on one transport.
class Backend {
 public:
  virtual ~Backend() = default;

  /// "mpi", "nccl", "staged(mpi)": for messages and explain.
  virtual std::string kind() const = 0;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// World rank of each member, in rank order.
  virtual const std::vector<int>& worldRanks() const noexcept = 0;
  /// Where the buffers it takes live.
  virtual DeviceType device() const noexcept = 0;
  /// Whether its point-to-point messages and host reductions can carry fourd's own
  /// point-to-point algorithms (ring, rhd): host memory only.
  virtual bool hostMemory() const noexcept { return device() == DeviceType::kCpu; }

  /// A new, empty set of requests for this backend.
  virtual std::unique_ptr<Requests> requests() = 0;

  // ---- non-blocking collectives (the transport's own algorithm: "flat") ----
  /// in.data == out.data: in place. Avg arrives as a sum (the caller scales).
  virtual void iallReduce(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) = 0;
  /// out.count == size() * in.count; in may be exactly my block of out (in place).
  virtual void iallGather(const Buffer& in, const Buffer& out, Requests& r) = 0;
  /// in.count == size() * out.count; out does not overlap in.
  virtual void ireduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) = 0;
  virtual void ibroadcast(const Buffer& buf, int root, Requests& r) = 0;
  virtual void ibarrier(Requests& r) = 0;
  /// The most elements one of its collectives takes (MPI: 2^31-1, an int).
  virtual size_t maxCount() const noexcept { return static_cast<size_t>(-1); }
  /// Whether iallReduce / ireduceScatter can reduce this dtype with this op on this backend.
  virtual bool reduces(DataType, ReduceOp) const noexcept { return true; }

  // ---- non-blocking point to point (bytes) ----
  virtual void isend(const void* buf, size_t bytes, int peer, int tag, Requests& r) = 0;
  virtual void irecv(void* buf, size_t bytes, int peer, int tag, Requests& r) = 0;

  // ---- memory and local work ordered with this backend's operations ----
  /// `bytes` of this backend's memory kind (host: 64-byte aligned, huge-page aligned and
  /// advised when large, every page written; device: cudaMalloc), freed with the pointer.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
  /// dst = src, `bytes` of this backend's memory (host memcpy, or a device copy on the
  /// backend's stream).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  /// buf *= factor (avg's division), ordered after the operations posted so far.
  virtual void scale(const Buffer& buf, double factor) = 0;

  // ---- structure ----
  /// Collective over the members: those with the same color form a backend, ranked by key.
  /// Completes within ctx's deadline (a missing member times out instead of hanging).
  virtual std::unique_ptr<Backend> split(int color, int key, OpContext& ctx) = 0;
  /// Whether every member shares memory with every other (one node). Collective; the answer is
  /// the same on every member.
  virtual bool sharesMemory(OpContext& ctx) = 0;
  /// A shared segment of `bytesPerRank` per member (collective), or nullptr when the members do
  /// not share memory or the backend has none.
  virtual std::unique_ptr<SharedSegment> sharedSegment(size_t bytesPerRank, OpContext& ctx) = 0;

  /// Stops the transport's work in flight for good after a timeout (NCCL: ncclCommAbort), so
  /// that no kernel is left waiting for a peer that is gone. The backend is unusable after.
  virtual void abort() noexcept {}

  // ---- blocking forms: post, then wait with ctx's deadline ----
  // (virtual: the MPI backend runs small ones through persistent requests, mpi_backend.cpp)
  virtual void allReduce(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx);
  virtual void allGather(const Buffer& in, const Buffer& out, OpContext& ctx);
  virtual void reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx);
  void broadcast(const Buffer& buf, int root, OpContext& ctx);
  void barrier(OpContext& ctx);
  /// Gathers `bytes` from every member into out (size() * bytes), in rank order.
  void allGatherBytes(const void* in, size_t bytes, void* out, OpContext& ctx);
};

}  // namespace fourd::detail
