// Collectives on CUDA buffers (GPU builds; cuda/backends/device_path.cpp). The communicator
// routes every operation whose buffers live on a CUDA device here; CPU buffers never come
// this way.
//
// Which backend a group's CUDA buffers use is decided once per communicator, inside its first
// CUDA operation (so in issue order on every rank), from what every rank reports through one
// all-gather: FOURD_CUDA_BACKEND=mpi on any rank, or two ranks of the group on the same GPU
// (NCCL needs one GPU per rank) -> MPI (the library's own device path when every rank reports
// a CUDA-aware MPI, else host staging); otherwise NCCL. The device group is a Group of that
// backend with the host group's topology, so the same algorithms (flat, hierarchical) run on it.
//
// Stream semantics: the operation is ordered after the work already enqueued on the caller's
// stream (Buffer::stream), runs on the device group's own stream, and the caller's stream is
// made to wait on the operation's end event. The Work completes when the end event has
// completed: the waiting thread polls it, with the device backend's asynchronous errors, until
// then or until the deadline.
#pragma once

#include "internal/comm_state.hpp"
#include "internal/op_spec.hpp"

namespace fourd::detail {

/// The group that runs calls on `device` buffers: the host group for CPU buffers, the device
/// group once a CUDA operation has made it (the host group before: same topology).
const Group& groupFor(const CommState& s, DeviceType device) noexcept;

#ifdef FOURD_HAVE_CUDA
/// Runs `spec` (CUDA buffers) to completion or throws (InvalidArgument, BackendError,
/// TimeoutError, AbortedError), on the thread that runs the operation.
void runDeviceOp(CommState& s, const OpSpec& spec, OpContext& ctx);
#endif

}  // namespace fourd::detail
