// What an algorithm sees of its communicator: a narrow view, never the communicator's state.
//
//   Group          one group of ranks: its backend (internal/backend.hpp), its two-level
//                  topology, its levels (themselves Groups), scratch memory, the machine
//                  profile it is priced with, and per-algorithm state kept across operations.
//   AlgorithmImpl  one algorithm: a row of function pointers over a Group (one file per
//                  algorithm in this folder; registry.cpp holds the table).
//
// Levels. intra(ctx) is the members on my node (its rank is my local index on the node);
// rail(ctx) is the members with my local index on every node (its rank is my node index), so
// the k rails of a node run at once and every NIC carries traffic. Both are split from the
// group's backend inside the first operation that needs them (so in issue order on every
// rank), and are valid when the topology is uniform (rail) or always (intra).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "fourd/buffer.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/topology.hpp"
#include "internal/backend.hpp"
#include "internal/op_context.hpp"

namespace fourd::detail {

class Group {
 public:
  /// `profile` is the slot the grid swaps profiles into; it outlives the group.
  Group(std::string name, std::unique_ptr<Backend> backend, GroupTopology topology,
        const std::shared_ptr<const MachineProfile>* profile);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const noexcept { return name_; }
  Backend& backend() noexcept { return *backend_; }
  const Backend& backend() const noexcept { return *backend_; }
  const GroupTopology& topology() const noexcept { return topology_; }
  int rank() const noexcept { return backend_->rank(); }
  int size() const noexcept { return backend_->size(); }
  /// The group's shape as the cost model takes it.
  GroupShape shape() const noexcept;
  /// The profile current now (a snapshot: a later setProfile does not change it).
  std::shared_ptr<const MachineProfile> profile() const { return *profile_; }
  /// The slot the grid swaps profiles into (for groups made over the same members).
  const std::shared_ptr<const MachineProfile>* profileSlot() const noexcept { return profile_; }

  /// The levels (see above), made on first use.
  Group& intra(OpContext& ctx);
  Group& rail(OpContext& ctx);
  /// Aborts the backend and those of the levels made so far (Backend::abort).
  void abort() noexcept;

  /// Scratch memory of the backend's kind, reused across operations and grown on demand,
  /// 64-byte aligned (huge-page aligned when large). Slots 0-1: the algorithms; 2-3: float32
  /// widening; 4: the result of an in-place reduce_scatter.
  void* scratch(int slot, size_t bytes);

  /// Per-algorithm state kept across operations (a shared-memory window), keyed by name.
  /// Destroyed before the levels and the backend.
  std::map<std::string, std::shared_ptr<void>>& state() noexcept { return state_; }
  const std::map<std::string, std::shared_ptr<void>>& state() const noexcept { return state_; }

 private:
  std::string name_;
  std::unique_ptr<Backend> backend_;
  GroupTopology topology_;
  const std::shared_ptr<const MachineProfile>* profile_;
  std::unique_ptr<Group> intra_, rail_;
  static constexpr int kSlots = 5;
  std::shared_ptr<void> scratch_[kSlots];
  size_t scratchBytes_[kSlots] = {0, 0, 0, 0, 0};
  std::map<std::string, std::shared_ptr<void>> state_;  // last: destroyed first
};

/// One algorithm. allReduce: in.data == out.data means in place, else the two do not overlap.
/// allGather / reduceScatter: in and out do not overlap, except all_gather's in may be exactly
/// its own block of out. Counts are > 0 (the communicator handles empty calls). ReduceOp::kAvg
/// arrives as a sum: the communicator scales afterwards.
struct AlgorithmImpl {
  Algorithm id;
  const char* name;
  /// Whether it can run `c` on this group (its shape and its backend); `reason` says why not.
  bool (*supports)(Collective c, const Group& g, std::string* reason);
  void (*allReduce)(Group& g, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx);
  void (*allGather)(Group& g, const Buffer& in, const Buffer& out, OpContext& ctx);
  void (*reduceScatter)(Group& g, const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx);
  /// Whether reduceScatter accepts an output that is this rank's own block of its input (an
  /// in-place call): true where the block is read only by the rank's own reduction into it,
  /// before or as it is written. Otherwise the call reduces into scratch and copies the result.
  bool reduceScatterInPlace = false;
};

/// Runs `run(o)` with o = out, or, when `viaScratch`, with o in scratch slot 4 (out's size),
/// copied over `out` after: how an in-place reduce_scatter reaches an algorithm that cannot take
/// its output inside its input (AlgorithmImpl::reduceScatterInPlace).
template <class Run>
void intoOrThroughScratch(Group& g, const Buffer& out, bool viaScratch, Run&& run) {
  if (!viaScratch) return run(out);
  Buffer tmp = out;
  tmp.data = g.scratch(4, out.bytes());
  run(static_cast<const Buffer&>(tmp));
  g.backend().copy(out.data, tmp.data, out.bytes());
}

/// The implementation of `a` (never kAuto); nullptr when it is not built in.
const AlgorithmImpl* algorithmImpl(Algorithm a);

/// The cost model's verdict (fourd::isSupported) on this group's shape, so that an explicit
/// request fails with the same reason explain() shows.
bool shapeSupports(Collective c, Algorithm a, const Group& g, std::string* reason);

}  // namespace fourd::detail
