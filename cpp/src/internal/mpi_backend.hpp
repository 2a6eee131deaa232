// The MPI backend (backend.hpp) over one MPI communicator, and the MPI helpers the grid needs.
//
// Every operation is non-blocking underneath (MPI_I*) and completed by MpiRequests::wait, which
// polls with the operation's deadline and an interrupt check, so no call into MPI can hang past
// its deadline. Point-to-point messages are sent as bytes and split into 1 GiB pieces, so their
// sizes are not limited by int; the library's collectives take at most 2^31-1 elements.
// float16 / bfloat16 reductions use fourd's own commutative MPI operators (accumulating in
// float32), so any MPI library works.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "fourd/buffer.hpp"
#include "fourd/data_type.hpp"
#include "internal/backend.hpp"

namespace fourd::detail {

/// Throws BackendError naming `what` and MPI's error string when rc != MPI_SUCCESS.
void checkMpi(int rc, const char* what);

/// The MPI backend of `comm` (freed with the backend when `owned` and MPI is still running).
/// `worldRanks[i]` is the world rank of rank i of `comm`. Host buffers; a CUDA-aware library's
/// device pointers are passed through by a wrapper in cuda/ (cuda_backends.hpp).
std::unique_ptr<Backend> makeMpiBackend(MPI_Comm comm, bool owned, std::vector<int> worldRanks);

/// Completes `n` raw MPI requests (of calls outside any backend, such as MPI_Comm_idup) within
/// ctx's deadline: TimeoutError at the deadline, AbortedError when interrupted.
void waitMpi(MPI_Request* reqs, int n, OpContext& ctx);

/// Call before a blocking MPI call over every member of `comm` that has no non-blocking form
/// (MPI_Comm_split, MPI_Comm_split_type, MPI_Win_allocate_shared, MPI_Comm_create_group): a
/// member that is missing, late past the deadline, or leaves early must make the others raise,
/// not block in MPI forever. Two barriers. The first is waited for with ctx (deadline, cancel,
/// Ctrl-C); a member that leaves during it never posts the second, so the others time out
/// there. A member that completed the first knows every member posted it and posts the second
/// at once, so the second is waited for uninterruptibly, with at least kCommitGraceSeconds.
void enterBlockingCall(MPI_Comm comm, OpContext& ctx);
constexpr double kCommitGraceSeconds = 3.0;

/// The MPI communicator under an MPI backend (nullptr for any other backend).
MPI_Comm mpiHandle(const Backend& b) noexcept;

}  // namespace fourd::detail
