#include "internal/comm_state.hpp"

#include <sys/mman.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "fourd/error.hpp"

namespace fourd::detail {

CommState::CommState(std::string n, AxisMask m, std::unique_ptr<MpiComm> comm, GroupTopology t,
                     std::shared_ptr<const MachineProfile>* p)
    : name(std::move(n)), mask(m), mpi(std::move(comm)), topo(std::move(t)), profile(p) {
  // FOURD_TUNE=0 turns tuning in use off (tuner.hpp); it must be the same on every rank.
  if (const char* v = std::getenv("FOURD_TUNE")) {
    std::string x(v);
    for (auto& ch : x) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (x == "0" || x == "off" || x == "false" || x == "no") tuner.setEnabled(false);
  }
}

CommState::~CommState() {
  // Per-algorithm state first: a shared-memory window is freed collectively over the intra
  // communicator's group, which must still exist then (members die in reverse order, and
  // intra_ is declared after cache).
  cache.clear();
}

void CommState::Aligned::operator()(void* p) const noexcept { std::free(p); }

void* CommState::scratch(int slot, size_t bytes) {
  if (bytes > scratchBytes_[slot]) {
    size_t cap = 64;
    while (cap < bytes) cap *= 2;
    // Large buffers: huge-page aligned and advised, and every page written now. Left to fault
    // in the first collectives that touch them (and to be collapsed into huge pages later by
    // the kernel), new scratch made ring and rhd read up to 1.6x slow for seconds after they
    // first ran at a larger size (16 MiB bfloat16 on 2 ranks, in the init calibration).
    constexpr size_t kHugePage = size_t(2) << 20;
    const size_t align = cap >= kHugePage ? kHugePage : 64;
    scratch_[slot].reset();  // the old buffer goes first: peak memory is the new one only
    scratchBytes_[slot] = 0;
    void* p = std::aligned_alloc(align, cap);
    if (!p) throw Error("fourd: out of memory allocating " + std::to_string(cap) + " scratch bytes");
#ifdef MADV_HUGEPAGE
    if (cap >= kHugePage) (void)madvise(p, cap, MADV_HUGEPAGE);  // advice: failure is harmless
#endif
    std::memset(p, 0, cap);
    scratch_[slot].reset(p);
    scratchBytes_[slot] = cap;
  }
  return scratch_[slot].get();
}

MpiComm& CommState::intra(OpContext& ctx) {
  if (!intra_) {
    const int me = rank();
    intra_.reset(mpi->split(topo.nodeIndex[me], me, ctx));
  }
  return *intra_;
}

MpiComm& CommState::rail(OpContext& ctx) {
  if (!rail_) {
    const int me = rank();
    rail_.reset(mpi->split(topo.localIndex[me], topo.nodeIndex[me], ctx));
  }
  return *rail_;
}

bool CommState::intraSharesMemory(OpContext& ctx) {
  if (sharesMemory_ < 0) {
    MpiComm& in = intra(ctx);
    MPI_Comm shared;
    checkMpi(MPI_Comm_split_type(in.handle(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared),
             "MPI_Comm_split_type");
    int n = 0;
    MPI_Comm_size(shared, &n);
    MPI_Comm_free(&shared);
    // Every member must agree, or some would try the shared window and others not.
    int mine = n == in.size() ? 1 : 0, all = 0;
    MPI_Request r;
    checkMpi(MPI_Iallreduce(&mine, &all, 1, MPI_INT, MPI_MIN, in.handle(), &r), "MPI_Iallreduce");
    in.wait(&r, 1, nullptr, ctx);
    sharesMemory_ = all;
  }
  return sharesMemory_ == 1;
}

void CommState::poison(const std::string& why) {
  std::lock_guard<std::mutex> lk(poisonMu);
  if (!poisoned.load()) {
    poisonReason = why;
    poisoned.store(true);
  }
}

}  // namespace fourd::detail
