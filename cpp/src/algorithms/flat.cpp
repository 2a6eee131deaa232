// "flat": the MPI library's own collective on the whole group (the baseline and the oracle).
//
// Phases, bytes and cost are the library's (MPICH picks recursive doubling, Rabenseifner or a
// ring by size); fourd only adds a deadline-aware wait around MPI_Iallreduce,
// MPI_Iallgather and MPI_Ireduce_scatter_block. Cost model: min(ring, rhd) scaled by the
// profile's flatEfficiency (cost_model.cpp).
#include "internal/comm_state.hpp"

namespace fourd::detail {

namespace {

bool supports(Collective, CommState&, std::string*) { return true; }

void allReduce(CommState& s, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  s.mpi->allReduce(in, out, op, ctx);
}

void allGather(CommState& s, const Buffer& in, const Buffer& out, OpContext& ctx) {
  s.mpi->allGather(in, out, ctx);
}

void reduceScatter(CommState& s, const Buffer& in, const Buffer& out, ReduceOp op,
                   OpContext& ctx) {
  s.mpi->reduceScatter(in, out, op, ctx);
}

}  // namespace

extern const AlgorithmImpl kFlatAlgorithm = {Algorithm::kFlat, "flat", supports, allReduce,
                                             allGather, reduceScatter};

}  // namespace fourd::detail
