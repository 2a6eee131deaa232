// Level collectives: ring, recursive halving/doubling and shared-memory building blocks over one
// flat MpiComm, appended to a Schedule. "ring" and "rhd" run them on the whole group;
// "hierarchical" runs them on its intra-node and rail communicators and overlaps the levels.
//
// Conventions (elements, not bytes, unless named *Bytes):
//   - `blocks` partitions the buffer over the ranks of the schedule's communicator; block r
//     belongs to rank r. Blocks may be uneven and may be empty.
//   - reduce-scatter: `in` holds the whole buffer (read only); `out` receives my reduced block.
//     out may be exactly in + offset(me) (in place), otherwise it does not overlap `in`.
//   - all-gather: `buf` holds the whole buffer; my block is filled on entry, every block on exit.
//   - all-reduce: in/out whole buffers, in == out (in place) or disjoint.
//   - `scratch` is caller-owned, at least the matching *ScratchBytes(), and untouched by anyone
//     else until the schedule has run.
// Every rank builds the same message sequence (schedule.hpp), so any count, including blocks of
// 0 elements, is safe.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "algorithms/schedule.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/data_type.hpp"

namespace fourd::detail {

class CommState;
struct ShmWindow;

// ---- one rank (ring and rhd) ----
/// The reduce-scatter of a one-rank schedule: my block of `in` copied to `out` unless in place.
/// Returns false (and adds nothing) when the schedule's communicator has more ranks.
inline bool oneRankReduceScatter(Schedule& s, const char* in, char* out, const Blocks& blocks,
                                 size_t elemSize) {
  if (s.comm().size() != 1) return false;
  const char* mine = in + blocks.offset(0) * elemSize;
  const size_t bytes = blocks.count(0) * elemSize;
  if (out != mine) s.compute([=] { std::memmove(out, mine, bytes); });
  return true;
}
/// The all-reduce of a one-rank schedule: `in` copied to `out` unless in place. Returns false
/// (and adds nothing) when the schedule's communicator has more ranks.
inline bool oneRankAllReduce(Schedule& s, const void* in, void* out, size_t bytes) {
  if (s.comm().size() != 1) return false;
  if (in != out) s.compute([=] { std::memcpy(out, in, bytes); });
  return true;
}

// ---- ring (ring.cpp) ----
/// Bytes of scratch for a ring reduce-scatter: three rotating receive buffers of the largest block.
size_t ringReduceScatterScratch(const Blocks& blocks, size_t elemSize);
void ringReduceScatter(Schedule& s, const void* in, void* out, const Blocks& blocks, DataType t,
                       ReduceOp op, void* scratch);
void ringAllGather(Schedule& s, void* buf, const Blocks& blocks, DataType t);
size_t ringAllReduceScratch(size_t count, int p, size_t elemSize);
void ringAllReduce(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                   void* scratch);

// ---- recursive halving / doubling (rhd.cpp) ----
size_t rhdReduceScatterScratch(const Blocks& blocks, size_t elemSize);
void rhdReduceScatter(Schedule& s, const void* in, void* out, const Blocks& blocks, DataType t,
                      ReduceOp op, void* scratch);
void rhdAllGather(Schedule& s, void* buf, const Blocks& blocks, DataType t);
size_t rhdAllReduceScratch(size_t count, int p, size_t elemSize);
/// Rabenseifner (halving + doubling) for large buffers, recursive doubling for small ones.
void rhdAllReduce(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                  void* scratch);

// ---- shared memory (shm.cpp) ----
/// The shared-memory window of `s`'s intra-node communicator, made (collectively, in issue
/// order) on first use and grown to hold `bytesPerRank` per buffer, up to a cap. Returns null
/// when the intra-node ranks do not share memory.
ShmWindow* shmWindow(CommState& s, size_t bytesPerRank, OpContext& ctx);
void shmReduceScatter(Schedule& s, ShmWindow& w, const void* in, void* out, const Blocks& blocks,
                      DataType t, ReduceOp op);
void shmAllGather(Schedule& s, ShmWindow& w, void* buf, const Blocks& blocks, DataType t);
void shmAllReduce(Schedule& s, ShmWindow& w, const void* in, void* out, size_t count, DataType t,
                  ReduceOp op);
/// Marks the window busy while a schedule using it runs (a window left busy by an exception is
/// leaked at exit instead of freed collectively, which could hang).
void markShmRunning(ShmWindow* w, bool running);

/// Algorithms a level can run.
enum class LevelAlgo { kRing, kRhd, kShm };
const char* levelAlgoName(LevelAlgo a);

/// The cost model's verdict (fourd::isSupported) on this group's shape, so that an explicit
/// request fails with the same reason explain() shows (registry.cpp).
bool shapeSupports(Collective c, Algorithm a, const CommState& s, std::string* reason);

/// Small-message threshold of rhdAllReduce (bytes): below it, recursive doubling.
size_t rhdDoublingThreshold();

}  // namespace fourd::detail
