// The entry points of an algorithm that runs one family of level collectives (levels.hpp) on the
// whole group as a single Schedule: "ring" and "rhd" differ only in the level functions they
// name, so they share these adapters.
//
//   all_reduce      scratch from slot 0 (the family's allReduceScratch), one schedule, run.
//   all_gather      my input copied into its block of the output (unless it is already there),
//                   then the family's all-gather in place over uniform blocks.
//   reduce_scatter  uniform blocks of the output's count, scratch from slot 0, one schedule.
#pragma once

#include <cstring>
#include <string>

#include "algorithms/levels.hpp"
#include "internal/comm_state.hpp"

namespace fourd::detail {

/// One family of level collectives (ring.cpp, rhd.cpp), as levels.hpp declares them.
struct LevelCollectives {
  size_t (*allReduceScratch)(size_t count, int p, size_t elemSize);
  void (*allReduce)(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                    void* scratch);
  void (*allGather)(Schedule& s, void* buf, const Blocks& blocks, DataType t);
  size_t (*reduceScatterScratch)(const Blocks& blocks, size_t elemSize);
  void (*reduceScatter)(Schedule& s, const void* in, void* out, const Blocks& blocks, DataType t,
                        ReduceOp op, void* scratch);
};

/// AlgorithmImpl functions that run L on the whole group (any size: supports() is always true).
template <const LevelCollectives& L>
struct WholeGroup {
  static bool supports(Collective, CommState&, std::string*) { return true; }

  static void allReduce(CommState& st, const Buffer& in, const Buffer& out, ReduceOp op,
                        OpContext& ctx) {
    void* scratch =
        st.scratch(0, L.allReduceScratch(in.count, st.size(), dataTypeSize(in.dtype)));
    Schedule s(*st.mpi, ctx.tag);
    L.allReduce(s, in.data, out.data, in.count, in.dtype, op, scratch);
    s.run(ctx);
  }

  static void allGather(CommState& st, const Buffer& in, const Buffer& out, OpContext& ctx) {
    const Buffer mine = out.slice(in.count * st.rank(), in.count);
    if (mine.data != in.data) std::memcpy(mine.data, in.data, in.bytes());
    Schedule s(*st.mpi, ctx.tag);
    L.allGather(s, out.data, Blocks::uniform(in.count, st.size()), in.dtype);
    s.run(ctx);
  }

  static void reduceScatter(CommState& st, const Buffer& in, const Buffer& out, ReduceOp op,
                            OpContext& ctx) {
    const Blocks B = Blocks::uniform(out.count, st.size());
    void* scratch = st.scratch(0, L.reduceScatterScratch(B, dataTypeSize(in.dtype)));
    Schedule s(*st.mpi, ctx.tag);
    L.reduceScatter(s, in.data, out.data, B, in.dtype, op, scratch);
    s.run(ctx);
  }
};

/// The AlgorithmImpl row of an algorithm that runs L on the whole group.
template <const LevelCollectives& L>
constexpr AlgorithmImpl wholeGroupAlgorithm(Algorithm id, const char* name) {
  return {id, name, WholeGroup<L>::supports, WholeGroup<L>::allReduce, WholeGroup<L>::allGather,
          WholeGroup<L>::reduceScatter};
}

}  // namespace fourd::detail
