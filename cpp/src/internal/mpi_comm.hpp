// The MPI backend: one flat group of ranks on one MPI communicator.
//
// Every operation is non-blocking underneath (MPI_I*) and completed by wait(), which polls with a
// deadline and an interrupt check, so no call into MPI can hang past its deadline. Point-to-point
// messages are sent as bytes and split into 1 GiB pieces, so counts are not limited by int.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "fourd/buffer.hpp"
#include "fourd/data_type.hpp"
#include "internal/op_context.hpp"

namespace fourd::detail {

/// Throws BackendError naming `what` and MPI's error string when rc != MPI_SUCCESS.
void checkMpi(int rc, const char* what);

/// MPI datatype of a fourd dtype (float16/bfloat16 travel as MPI_UINT16_T with fourd's ops).
MPI_Datatype mpiType(DataType t);
/// MPI operator for (dtype, op). Avg maps to sum (callers scale). 16-bit floats get fourd's own
/// commutative user-defined operators, accumulating in float32, so any MPI library works.
MPI_Op mpiOp(DataType t, ReduceOp op);

class MpiComm {
 public:
  /// Wraps `comm`; frees it in the destructor when `owned` (and MPI is still initialised).
  MpiComm(MPI_Comm comm, bool owned, std::vector<int> worldRanks);
  ~MpiComm();
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm handle() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// World rank of each rank of this communicator.
  const std::vector<int>& worldRanks() const noexcept { return worldRanks_; }

  /// Completes `n` requests or throws: TimeoutError at ctx.deadline (naming the peers whose
  /// requests never completed, where `peers` gives them: a rank of this communicator per
  /// request, or -1), AbortedError when interrupted.
  void wait(MPI_Request* reqs, int n, const int* peers, OpContext& ctx);

  // ---- point to point (bytes; ranks of this communicator) ----
  void sendRecv(const void* sendBuf, size_t sendBytes, int dst, void* recvBuf, size_t recvBytes,
                int src, OpContext& ctx);
  void send(const void* buf, size_t bytes, int dst, OpContext& ctx);
  void recv(void* buf, size_t bytes, int src, OpContext& ctx);
  /// Appends the requests of a non-blocking send / receive (split into 1 GiB pieces).
  void isend(const void* buf, size_t bytes, int dst, int tag, std::vector<MPI_Request>& reqs,
             std::vector<int>& peers);
  void irecv(void* buf, size_t bytes, int src, int tag, std::vector<MPI_Request>& reqs,
             std::vector<int>& peers);

  // ---- the MPI library's own collectives ("flat") ----
  /// in.data == out.data means in place. Avg is left as a sum (the caller scales).
  void allReduce(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx);
  void allGather(const Buffer& in, const Buffer& out, OpContext& ctx);
  void reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx);
  void broadcast(const Buffer& buf, int root, OpContext& ctx);
  void barrier(OpContext& ctx);
  /// Gathers `bytes` from every rank into out (size * bytes), in rank order.
  void allGatherBytes(const void* in, size_t bytes, void* out, OpContext& ctx);

  /// MPI_Comm_split after a barrier with a deadline (so a missing rank times out instead of
  /// hanging in the split). The result is owned.
  MpiComm* split(int color, int key, OpContext& ctx);

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 0;
  std::vector<int> worldRanks_;
};

}  // namespace fourd::detail
