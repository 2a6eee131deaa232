// The backends of CUDA buffers (internal/backend.hpp), made by the device path
// (device_path.cpp) when a group runs its first CUDA operation. Each takes the group's own
// host backend (an MPI backend of the same members: the rendezvous, the splits, the ranks)
// and the stream the group's device work runs on.
//
//   NCCL       nccl_backend.cpp         one GPU per rank; NCCL's collectives and send/recv.
//   staged     staging_backend.cpp      any host backend: every buffer goes through pinned
//                                       host memory (device -> host, the host backend's
//                                       operation, host -> device), pipelined in chunks.
//   direct     direct_mpi_backend.cpp   a CUDA-aware MPI library: device pointers go to MPI
//                                       as they are (no 16-bit reductions: fourd's MPI
//                                       operators for them run on the host).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "internal/backend.hpp"

namespace fourd::detail {

std::unique_ptr<Backend> makeNcclBackend(std::unique_ptr<Backend> host, cudaStream_t stream,
                                         int device, OpContext& ctx);
std::unique_ptr<Backend> makeStagingBackend(std::unique_ptr<Backend> host, cudaStream_t stream);
std::unique_ptr<Backend> makeDirectMpiBackend(std::unique_ptr<Backend> host, cudaStream_t stream);

}  // namespace fourd::detail
