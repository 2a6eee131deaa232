// Group (internal/group.hpp): a group's backend, topology, levels, scratch and state.
#include "internal/group.hpp"

#include <utility>

#include "fourd/error.hpp"

namespace fourd::detail {

Group::Group(std::string name, std::unique_ptr<Backend> backend, GroupTopology topology,
             const std::shared_ptr<const MachineProfile>* profile)
    : name_(std::move(name)),
      backend_(std::move(backend)),
      topology_(std::move(topology)),
      profile_(profile) {}

Group::~Group() {
  // Per-algorithm state first: a shared-memory window is freed collectively over a level's
  // backend, which must still exist then.
  state_.clear();
  intra_.reset();
  rail_.reset();
}

GroupShape Group::shape() const noexcept {
  GroupShape g;
  g.size = topology_.size;
  g.nodes = topology_.numNodes;
  g.uniform = topology_.uniform;
  g.ranksPerNode = topology_.uniform ? topology_.k : 0;
  return g;
}

namespace {

// The topology of a level: `n` members, on one node (intra) or one per node (rail).
GroupTopology levelTopology(int n, bool oneNode) {
  GroupTopology t;
  t.size = n;
  t.numNodes = oneNode ? 1 : n;
  t.uniform = true;
  t.k = oneNode ? n : 1;
  t.nodeIndex.resize(n);
  t.localIndex.resize(n);
  for (int i = 0; i < n; ++i) {
    t.nodeIndex[i] = oneNode ? 0 : i;
    t.localIndex[i] = oneNode ? i : 0;
  }
  t.ranksPerNode.assign(t.numNodes, oneNode ? n : 1);
  return t;
}

}  // namespace

Group& Group::intra(OpContext& ctx) {
  if (!intra_) {
    const int me = rank();
    auto b = backend_->split(topology_.nodeIndex[me], me, ctx);
    const int n = b->size();
    intra_ = std::make_unique<Group>(name_ + " (intra-node level)", std::move(b),
                                     levelTopology(n, true), profile_);
  }
  return *intra_;
}

Group& Group::rail(OpContext& ctx) {
  if (!rail_) {
    const int me = rank();
    auto b = backend_->split(topology_.localIndex[me], topology_.nodeIndex[me], ctx);
    const int n = b->size();
    rail_ = std::make_unique<Group>(name_ + " (rail level)", std::move(b), levelTopology(n, false),
                                    profile_);
  }
  return *rail_;
}

void Group::abort() noexcept {
  if (intra_) intra_->abort();
  if (rail_) rail_->abort();
  backend_->abort();
}

void* Group::scratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= kSlots) throw Error("fourd: scratch slot out of range");
  if (bytes > scratchBytes_[slot] || !scratch_[slot]) {
    size_t cap = 64;
    while (cap < bytes) cap *= 2;
    scratch_[slot].reset();  // the old buffer goes first: peak memory is the new one only
    scratchBytes_[slot] = 0;
    scratch_[slot] = backend_->allocate(cap);
    scratchBytes_[slot] = cap;
  }
  return scratch_[slot].get();
}

}  // namespace fourd::detail
