// "flat": the backend's own collective on the whole group (the MPI library's, or NCCL's): the
// baseline and the oracle.
//
// Phases, bytes and cost are the library's (MPICH picks recursive doubling, Rabenseifner or a
// ring by size; NCCL rings and trees); fourd adds a deadline-aware wait around the
// non-blocking call. Cost model: min(ring, rhd) scaled by the profile's flatEfficiency
// (cost_model.cpp). The level functions below post the same calls into a Schedule, so that
// "hierarchical" can run its levels on any backend.
#include "algorithms/levels.hpp"

namespace fourd::detail {

void flatReduceScatter(Schedule& s, const void* in, void* out, size_t blockCount, DataType t,
                       ReduceOp op) {
  Backend* b = &s.backend();
  const Buffer bin(const_cast<void*>(in), blockCount * static_cast<size_t>(s.size()), t);
  const Buffer bout(out, blockCount, t);
  const auto h = s.collective([=](Requests& r) { b->ireduceScatter(bin, bout, op, r); });
  s.wait(h);
}

void flatAllGather(Schedule& s, void* buf, size_t blockCount, DataType t) {
  Backend* b = &s.backend();
  const Buffer whole(buf, blockCount * static_cast<size_t>(s.size()), t);
  const Buffer mine = whole.slice(blockCount * static_cast<size_t>(s.rank()), blockCount);
  const auto h = s.collective([=](Requests& r) { b->iallGather(mine, whole, r); });
  s.wait(h);
}

void flatAllReduce(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op) {
  Backend* b = &s.backend();
  const Buffer bin(const_cast<void*>(in), count, t), bout(out, count, t);
  const auto h = s.collective([=](Requests& r) { b->iallReduce(bin, bout, op, r); });
  s.wait(h);
}

namespace {

bool supports(Collective, const Group&, std::string*) { return true; }

void allReduce(Group& g, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  g.backend().allReduce(in, out, op, ctx);
}

void allGather(Group& g, const Buffer& in, const Buffer& out, OpContext& ctx) {
  g.backend().allGather(in, out, ctx);
}

void reduceScatter(Group& g, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  g.backend().reduceScatter(in, out, op, ctx);
}

}  // namespace

extern const AlgorithmImpl kFlatAlgorithm = {Algorithm::kFlat, "flat",    supports,
                                             allReduce,        allGather, reduceScatter};

}  // namespace fourd::detail
