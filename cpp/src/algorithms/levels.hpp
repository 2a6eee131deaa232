// Level collectives: ring, recursive halving/doubling, shared-memory and the backend's own
// ("flat") building blocks over one flat Backend, appended to a Schedule. "ring" and "rhd" run
// them on the whole group; "hierarchical" runs them on its intra-node and rail levels (Groups
// of their own) and overlaps the levels.
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
#include "internal/codec.hpp"
#include "internal/group.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

struct ShmWindow;

// ---- one rank (ring and rhd) ----
/// The reduce-scatter of a one-rank schedule: my block of `in` copied to `out` unless in place.
/// Returns false (and adds nothing) when the schedule's communicator has more ranks.
inline bool oneRankReduceScatter(Schedule& s, const char* in, char* out, const Blocks& blocks,
                                 size_t elemSize) {
  if (s.size() != 1) return false;
  const char* mine = in + blocks.offset(0) * elemSize;
  const size_t bytes = blocks.count(0) * elemSize;
  if (out != mine) s.compute([=] { moveBytes(out, mine, bytes); });
  return true;
}
/// The all-reduce of a one-rank schedule: `in` copied to `out` unless in place. Returns false
/// (and adds nothing) when the schedule's communicator has more ranks.
inline bool oneRankAllReduce(Schedule& s, const void* in, void* out, size_t bytes) {
  if (s.size() != 1) return false;
  if (in != out) s.compute([=] { std::memcpy(out, in, bytes); });
  return true;
}

/// My block of an all-gather in place in `buf`, and where it comes from: `mine` out of place
/// (not in `buf` yet), else its place in `buf`. ring and rhd send it from `source` and queue
/// `place` (the copy into `buf`, nothing in place) once their first messages are posted.
struct OwnBlock {
  OwnBlock(char* buf, const Blocks& blocks, int rank, size_t elemSize, const void* mine)
      : at(buf + blocks.offset(rank) * elemSize),
        mine(static_cast<const char*>(mine)),
        bytes(blocks.count(rank) * elemSize) {}
  const char* source() const noexcept { return mine ? mine : at; }
  void place(Schedule& s) const {
    if (mine) s.compute([to = at, from = mine, n = bytes] { copyCached(to, from, n); });
  }
  char* at;
  const char* mine;
  size_t bytes;
};

// ---- ring (ring.cpp) ----
/// Raw bytes of one message segment of a ring step (FOURD_RING_SEGMENT_BYTES, 1 MiB by
/// default): ring.cpp and codec_ring.cpp pipeline their steps in segments of this size.
size_t ringSegmentBytes();
/// Bytes of scratch for a ring reduce-scatter: three rotating receive buffers of the largest block.
size_t ringReduceScatterScratch(const Blocks& blocks, size_t elemSize);
void ringReduceScatter(Schedule& s, const void* in, void* out, const Blocks& blocks, DataType t,
                       ReduceOp op, void* scratch);
/// All-gather in place in `buf`. `mine`, where given, holds my own block, which is not in `buf`
/// yet (an out-of-place call): the block is sent from there and copied into `buf` once the
/// messages are posted. Sending the copy instead, the peer reads bytes this core has just
/// written; on this kind of VM that ran 4-5x slower in some launches (bench/README.md,
/// "Sending what was just copied"), as MPI's own out-of-place all_gather does.
void ringAllGather(Schedule& s, void* buf, const Blocks& blocks, DataType t,
                   const void* mine = nullptr);
size_t ringAllReduceScratch(size_t count, int p, size_t elemSize);
void ringAllReduce(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                   void* scratch);

// ---- recursive halving / doubling (rhd.cpp) ----
size_t rhdReduceScatterScratch(const Blocks& blocks, size_t elemSize);
void rhdReduceScatter(Schedule& s, const void* in, void* out, const Blocks& blocks, DataType t,
                      ReduceOp op, void* scratch);
/// As ringAllGather, `mine` included.
void rhdAllGather(Schedule& s, void* buf, const Blocks& blocks, DataType t,
                  const void* mine = nullptr);
size_t rhdAllReduceScratch(size_t count, int p, size_t elemSize);
/// Rabenseifner (halving + doubling) for large buffers, recursive doubling for small ones.
void rhdAllReduce(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                  void* scratch);

// ---- shared memory (shm.cpp) ----
/// Whether the members of `node` (a group on one node: an intra level) share memory; asked
/// once, collectively, and remembered in the group's state.
bool shmAvailable(Group& node, OpContext& ctx);
/// The shared-memory window of `node`, made (collectively, in issue order) on first use and
/// grown to hold `bytesPerRank` per buffer, up to a cap. Returns null when the members do not
/// share memory.
ShmWindow* shmWindow(Group& node, size_t bytesPerRank, OpContext& ctx);
void shmReduceScatter(Schedule& s, ShmWindow& w, const void* in, void* out, const Blocks& blocks,
                      DataType t, ReduceOp op);
/// all_gather into `buf`; my block comes from `mine` when given (an out-of-place call's input:
/// copied into my block of buf on the way), from my block of buf otherwise (in place).
void shmAllGather(Schedule& s, ShmWindow& w, void* buf, const Blocks& blocks, DataType t,
                  const void* mine = nullptr);
void shmAllReduce(Schedule& s, ShmWindow& w, const void* in, void* out, size_t count, DataType t,
                  ReduceOp op);
/// Marks the window busy while a schedule using it runs (a window left busy by an exception is
/// leaked at exit instead of freed collectively, which could hang).
void markShmRunning(ShmWindow* w, bool running);

// ---- compressed ring (codec_ring.cpp): a codec on every message of a ring ----
size_t codecRingAllGatherScratch(const Codec& c, const Blocks& blocks, size_t elemSize);
/// Every block is encoded once at its owner and forwarded unchanged; a lossy codec's owner
/// keeps the decoded values of its own block (every rank ends with the same buffer).
void codecRingAllGather(Schedule& s, const Codec& c, void* buf, const Blocks& blocks, DataType t,
                        void* scratch);
size_t codecRingReduceScatterScratch(const Codec& c, const Blocks& blocks, size_t elemSize);
void codecRingReduceScatter(Schedule& s, const Codec& c, const void* in, void* out,
                            const Blocks& blocks, DataType t, ReduceOp op, void* scratch);
size_t codecRingAllReduceScratch(const Codec& c, size_t count, int p, size_t elemSize);
void codecRingAllReduce(Schedule& s, const Codec& c, const void* in, void* out, size_t count,
                        DataType t, ReduceOp op, void* scratch);

// ---- the backend's own collectives (flat.cpp), for levels on any backend ----
/// Blocks of `blockCount` elements each (the backend's collectives take uniform blocks); out
/// may be exactly my block of in (in place, the layout NCCL takes) or disjoint from it.
void flatReduceScatter(Schedule& s, const void* in, void* out, size_t blockCount, DataType t,
                       ReduceOp op);
/// buf holds size() blocks of `blockCount`; mine is filled on entry, every block on exit.
void flatAllGather(Schedule& s, void* buf, size_t blockCount, DataType t);
/// in == out (in place) or disjoint.
void flatAllReduce(Schedule& s, const void* in, void* out, size_t count, DataType t, ReduceOp op);

/// Algorithms a level can run: fourd's own on host memory, the backend's own anywhere.
enum class LevelAlgo { kRing, kRhd, kShm, kFlat };
const char* levelAlgoName(LevelAlgo a);

/// Small-message threshold of rhdAllReduce (bytes): below it, recursive doubling.
size_t rhdDoublingThreshold();

}  // namespace fourd::detail
