// The entry points of an algorithm that runs one family of level collectives (levels.hpp) on the
// whole group as a single Schedule: "ring" and "rhd" differ only in the level functions they
// name, so they share these adapters.
//
//   all_reduce      scratch from slot 0 (the family's allReduceScratch), one schedule, run.
//   all_gather      the family's all-gather in place over uniform blocks; out of place, my
//                   block is sent from the input and copied into the output meanwhile.
//   reduce_scatter  uniform blocks of the output's count, scratch from slot 0, one schedule.
//                   Both families read my own block of the input only in the reduction that
//                   writes my output (the same call all_reduce makes in place), so an in-place
//                   call passes its output, my block of the input, straight through.
#pragma once

#include <cstring>
#include <string>

#include "algorithms/levels.hpp"
#include "internal/group.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

/// One family of level collectives (ring.cpp, rhd.cpp), as levels.hpp declares them.
struct LevelCollectives {
  size_t (*allReduceScratch)(size_t count, int p, size_t elemSize);
  void (*allReduce)(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                    void* scratch);
  void (*allGather)(Schedule& s, void* buf, const Blocks& blocks, DataType t, const void* mine);
  size_t (*reduceScatterScratch)(const Blocks& blocks, size_t elemSize);
  void (*reduceScatter)(Schedule& s, const void* in, void* out, const Blocks& blocks, DataType t,
                        ReduceOp op, void* scratch);
};

/// Whether a group's backend can carry fourd's point-to-point algorithms (host memory: their
/// reductions and copies run on the CPU).
inline bool onHostMemory(const Group& g, std::string* reason) {
  if (g.backend().hostMemory()) return true;
  if (reason) {
    *reason =
        "fourd's point-to-point algorithms run on host memory; this group's buffers are "
        "on the GPU (backend " +
        g.backend().kind() + ": flat or hierarchical)";
  }
  return false;
}

/// AlgorithmImpl functions that run L on the whole group (any size, host memory).
template <const LevelCollectives& L>
struct WholeGroup {
  static bool supports(Collective, const Group& g, std::string* reason) {
    return onHostMemory(g, reason);
  }

  static void allReduce(Group& g, const Buffer& in, const Buffer& out, ReduceOp op,
                        OpContext& ctx) {
    void* scratch = g.scratch(0, L.allReduceScratch(in.count, g.size(), dataTypeSize(in.dtype)));
    Schedule s(g.backend(), ctx.tag);
    L.allReduce(s, in.data, out.data, in.count, in.dtype, op, scratch);
    s.run(ctx);
  }

  static void allGather(Group& g, const Buffer& in, const Buffer& out, OpContext& ctx) {
    const Buffer own = out.slice(in.count * g.rank(), in.count);
    Schedule s(g.backend(), ctx.tag);
    L.allGather(s, out.data, Blocks::uniform(in.count, g.size()), in.dtype,
                own.data != in.data ? in.data : nullptr);
    s.run(ctx);
  }

  static void reduceScatter(Group& g, const Buffer& in, const Buffer& out, ReduceOp op,
                            OpContext& ctx) {
    const Blocks B = Blocks::uniform(out.count, g.size());
    void* scratch = g.scratch(0, L.reduceScatterScratch(B, dataTypeSize(in.dtype)));
    Schedule s(g.backend(), ctx.tag);
    L.reduceScatter(s, in.data, out.data, B, in.dtype, op, scratch);
    s.run(ctx);
  }
};

/// The AlgorithmImpl row of an algorithm that runs L on the whole group.
template <const LevelCollectives& L>
constexpr AlgorithmImpl wholeGroupAlgorithm(Algorithm id, const char* name) {
  return {id,
          name,
          WholeGroup<L>::supports,
          WholeGroup<L>::allReduce,
          WholeGroup<L>::allGather,
          WholeGroup<L>::reduceScatter,
          /*reduceScatterInPlace=*/true};
}

}  // namespace fourd::detail
