// Collectives on CUDA buffers (GPU builds only): the NCCL backend and the MPI backend with CUDA
// buffers (CUDA-aware MPI, or staging through pinned host memory). Communicator::runOp routes
// every operation whose buffers live on a CUDA device here; CPU buffers never come this way.
//
// Which backend a group uses is decided once per communicator, inside its first CUDA operation
// (so in issue order on every rank), from what every rank reports through one allGatherBytes:
//   - FOURD_CUDA_BACKEND=mpi on any rank, or two ranks of the group on the same GPU (same
//     device UUID; NCCL needs one GPU per rank) -> MPI;
//   - otherwise NCCL.
// With MPI, device pointers go to the MPI library only when every rank reports CUDA-aware MPI
// (MPIX_Query_cuda_support where the header declares it, else FOURD_CUDA_AWARE_MPI=1) and the
// call needs no host-side reduction; everything else is staged through pinned host buffers and
// runs fourd's CPU algorithms.
//
// Stream semantics: the operation is ordered after the work already enqueued on the caller's
// stream (captured on the calling thread, see setCallerStream), runs on the communicator's own
// non-blocking stream, and the caller's stream is made to wait on the operation's end event.
// The Work completes when the end event has completed: the waiting thread (the caller for
// blocking calls, the progress thread for async_op=True) polls cudaEventQuery and
// ncclCommGetAsyncError until then or until the deadline; on expiry the NCCL communicators
// are aborted (ncclCommAbort) and fourd::TimeoutError is thrown (runOp then poisons).
#pragma once

#ifdef FOURD_HAVE_CUDA

#include <functional>

#include "fourd/buffer.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/data_type.hpp"
#include "internal/op_context.hpp"

namespace fourd::detail {

class CommState;

/// The stream (a cudaStream_t as void*; nullptr = legacy default stream) that the next CUDA
/// collective issued from this thread orders itself after. takeCallerStream() returns it and
/// resets it to nullptr, so a stale value never leaks into a later call. Thread-local.
void setCallerStream(void* stream) noexcept;
void* takeCallerStream() noexcept;

/// One collective on CUDA buffers, as runOp sees it after validation.
struct CudaOp {
  Collective coll = Collective::kAllReduce;
  const char* opName = "";
  Buffer in, out;
  ReduceOp op = ReduceOp::kSum;
  bool hasOp = false;
  int root = -1;             ///< broadcast only
  bool inPlace = false;      ///< reduce_scatter whose output is this rank's block of the input
  Algorithm requested = Algorithm::kAuto;  ///< as the caller asked (kAuto allowed)
  bool accumulateFp32 = false;
  void* stream = nullptr;    ///< the caller's stream
};

/// Runs fourd's CPU path on host buffers (same collective, op, root; in and out do not
/// overlap), synchronously, resolving `requested` (kAuto allowed) as for CPU buffers.
using HostRunner =
    std::function<void(const Buffer& in, const Buffer& out, Algorithm requested)>;

/// Runs `op` to completion or throws (InvalidArgument, fourd::cuda::CudaError, TimeoutError,
/// AbortedError). Called on the thread that runs the operation (caller or progress thread);
/// the calling thread's current CUDA device is restored before returning.
void runCudaOp(CommState& s, const CudaOp& op, OpContext& ctx, const HostRunner& runOnHost);

}  // namespace fourd::detail

#endif  // FOURD_HAVE_CUDA
