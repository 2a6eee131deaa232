// Internal state of a Communicator, shared by the algorithms.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fourd/buffer.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/process_grid.hpp"
#include "fourd/topology.hpp"
#include "fourd/work.hpp"
#include "internal/mpi_comm.hpp"
#include "internal/op_context.hpp"
#include "internal/tuner.hpp"

namespace fourd::detail {

class CommState;

/// One algorithm: a row of function pointers (one file per algorithm in cpp/src/algorithms/).
/// allReduce: in.data == out.data means in place, else the two do not overlap.
/// allGather/reduceScatter: in and out do not overlap, except all_gather's in may be exactly its
/// own block of out. Counts are > 0 (the Communicator handles empty calls).
/// ReduceOp::kAvg arrives as a sum: the Communicator scales afterwards.
struct AlgorithmImpl {
  Algorithm id;
  const char* name;
  bool (*supports)(Collective c, CommState& s, std::string* reason);
  void (*allReduce)(CommState& s, const Buffer& in, const Buffer& out, ReduceOp op,
                    OpContext& ctx);
  void (*allGather)(CommState& s, const Buffer& in, const Buffer& out, OpContext& ctx);
  void (*reduceScatter)(CommState& s, const Buffer& in, const Buffer& out, ReduceOp op,
                        OpContext& ctx);
};

/// The implementation of `a` (never kAuto); nullptr when it is not built in.
const AlgorithmImpl* algorithmImpl(Algorithm a);

/// Runs Work bodies in issue order: inline on the caller when idle (blocking calls), otherwise
/// on a progress thread created at first need.
class Executor {
 public:
  ~Executor();
  /// Queues `w`; the progress thread runs it.
  void submit(const std::shared_ptr<Work>& w);
  /// Runs `w` now on this thread if nothing is queued or running, else queues it and waits.
  /// Returns false if it was queued (the caller then waits on the Work).
  bool runInlineIfIdle(const std::shared_ptr<Work>& w);
  /// Waits until idle (up to timeoutSeconds) and stops the thread. False on timeout.
  bool drain(double timeoutSeconds);
  size_t inFlight();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idleCv_;
  std::deque<std::shared_ptr<Work>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

class CommState {
 public:
  CommState(std::string name, AxisMask mask, std::unique_ptr<MpiComm> mpi, GroupTopology topo,
            std::shared_ptr<const MachineProfile>* profile);
  ~CommState();

  std::string name;
  AxisMask mask;
  std::unique_ptr<MpiComm> mpi;  ///< the whole group
  GroupTopology topo;
  const std::shared_ptr<const MachineProfile>* profile;  ///< owned by the Grid

  int rank() const noexcept { return mpi->rank(); }
  int size() const noexcept { return mpi->size(); }

  /// Topology levels, made on first use (inside an operation, so in issue order on every rank).
  /// intra: the members on my node (rank = my local index). rail: the members with my local
  /// index on every node (rank = my node index). Valid only when topo.uniform or as noted.
  MpiComm& intra(OpContext& ctx);
  MpiComm& rail(OpContext& ctx);
  /// Whether the intra level shares memory (MPI_COMM_TYPE_SHARED covers the whole level).
  bool intraSharesMemory(OpContext& ctx);

  /// Scratch memory reused across operations, grown on demand, 64-byte aligned. Slots 0-1: the
  /// algorithms; 2-3: float32 widening; 4: the result of an in-place reduce_scatter.
  void* scratch(int slot, size_t bytes);

  /// Per-algorithm state (for example shared-memory windows), keyed by name.
  std::map<std::string, std::shared_ptr<void>> cache;

  /// auto's choice for (collective, bytes, dtype, in place), remembered for the profile it was
  /// made with: the model and its corrections cost microseconds per call, a lookup does not.
  /// The stored profile pointer keeps that profile alive, so a new one never shares its
  /// address; a different profile empties the memo.
  struct ChoiceMemo {
    std::mutex mu;
    std::shared_ptr<const MachineProfile> profile;
    std::map<std::tuple<int, size_t, int, bool>, Algorithm> choices;
  } choiceMemo;

  /// auto's tuning in use (tuner.hpp): calls run in issue order, so every rank steps it alike.
  Tuner tuner;

  // Defaults and reliability.
  double defaultTimeout = 300.0;
  bool debug = false;
  bool abortOnTimeout = false;
  std::atomic<uint64_t> nextSeq{1};
  std::atomic<bool> poisoned{false};
  std::mutex poisonMu;
  std::string poisonReason;
  void poison(const std::string& why);

  Executor executor;

 private:
  std::unique_ptr<MpiComm> intra_, rail_;
  int sharesMemory_ = -1;
  struct Aligned {
    void operator()(void* p) const noexcept;
  };
  std::unique_ptr<void, Aligned> scratch_[5];
  size_t scratchBytes_[5] = {0, 0, 0, 0, 0};
};

}  // namespace fourd::detail
