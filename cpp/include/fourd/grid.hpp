// The 4D grid over MPI: the rank arithmetic, the node topology, and one Communicator per axis
// and per combination of axes (15 of them, each made with one MPI_Comm_split).
#pragma once

#include <mpi.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fourd/communicator.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/process_grid.hpp"
#include "fourd/topology.hpp"

namespace fourd {

namespace detail {
class Backend;
class CommState;
}  // namespace detail

struct GridConfig {
  std::array<int, kNumAxes> sizes{1, 1, 1, 1};  ///< indexed by Axis
  std::string order = "x-y-z-data";             ///< innermost first
  int ranksPerNode = 0;           ///< > 0: virtual nodes of this many consecutive world ranks
  double timeoutSeconds = 300.0;  ///< default deadline of every wait
  bool debug = false;             ///< compare every collective's fingerprint across its group
  bool abortOnTimeout = false;    ///< MPI_Abort the job on a timeout
  /// The compression policy ("data=zfp:rate=8;x,y,z=lossless", a preset, or empty: none);
  /// FOURD_COMPRESSION replaces it when set (docs/compression.md).
  std::string compression;
};

class Grid {
 public:
  /// Collective over `parent`. Every rank must pass the same config: the ranks compare a
  /// fingerprint of it first and all raise MismatchError (or the invalid rank's
  /// InvalidArgument) otherwise, never hang. Requires MPI_THREAD_MULTIPLE.
  Grid(MPI_Comm parent, const GridConfig& config);
  ~Grid();
  Grid(const Grid&) = delete;
  Grid& operator=(const Grid&) = delete;

  const ProcessGrid& processGrid() const noexcept { return grid_; }
  const Topology& topology() const noexcept { return *topology_; }
  const GridConfig& config() const noexcept { return config_; }
  int worldRank() const noexcept { return worldRank_; }
  int worldSize() const noexcept { return grid_.worldSize(); }
  /// Host name of every world rank (MPI_Get_processor_name).
  const std::vector<std::string>& hostNames() const noexcept { return hosts_; }
  bool virtualTopology() const noexcept { return config_.ranksPerNode > 0; }
  /// How this rank's waits poll (FOURD_POLL; docs/errors.md): the world ranks that share its
  /// cores (those on the same kernel, at least its shared-memory domain), the cores they may
  /// run on together, and whether waits yield at once (more of those ranks than cores).
  struct CoreShare {
    int ranks = 1;
    long cores = 0;
    bool oversubscribed = false;
  };
  const CoreShare& coreShare() const noexcept { return coreShare_; }

  /// The communicator of my group along `mask` (1..15). Throws InvalidArgument for mask 0.
  Communicator& communicator(AxisMask mask);

  /// The communicator of an arbitrary group of world ranks, in the given order (group rank i
  /// is worldRanks[i]); this rank must be one of them. Collective over the listed ranks only,
  /// each passing the same list (compared first: a different list raises MismatchError there,
  /// a missing rank times out). A list that is exactly my group along an axis mask gives that
  /// axis's communicator; any other is made once (MPI_Comm_create_group), with its topology
  /// from the grid's, and cached. A cached group whose communicator was poisoned (a failed or
  /// timed-out operation) is made anew, so that a program can recover by asking again; the old
  /// one stays alive (it may still be referenced, and MPI may still touch its buffers). A grid
  /// axis's communicator is never made anew.
  Communicator& group(const std::vector<int>& worldRanks, double timeoutSeconds);

  /// The cost-model profile `auto` uses (identical on every rank).
  const MachineProfile& profile() const noexcept;
  /// Replaces the profile (must be called identically on every rank).
  void setProfile(const MachineProfile& p);

  /// Waits for operations in flight (deadline), stops progress threads, frees communicators.
  /// Returns false if some operation did not finish in time. Idempotent; never throws.
  bool finalize(double timeoutSeconds) noexcept;
  bool finalized() const noexcept { return finalized_; }

 private:
  static void checkMpiReady();
  void makeCommunicators();
  std::unique_ptr<detail::CommState> newState(const std::string& name, AxisMask mask,
                                              std::unique_ptr<detail::Backend> backend,
                                              const std::vector<int>& ranks) const;

  GridConfig config_;
  ProcessGrid grid_;
  std::unique_ptr<Topology> topology_;
  int worldRank_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL;  // our own duplicate of the parent
  std::vector<std::string> hosts_;
  CoreShare coreShare_;
  std::array<std::unique_ptr<Communicator>, 16> comms_;
  std::map<std::vector<int>, std::unique_ptr<Communicator>> groups_;
  std::map<std::vector<int>, AxisMask> axisGroups_;     ///< agreed lists that are an axis's ranks
  std::vector<std::unique_ptr<Communicator>> retired_;  ///< poisoned groups made anew
  std::shared_ptr<MachineProfile> profile_;
  // The slot every CommState reads the profile from (swapped by setProfile).
  std::unique_ptr<std::shared_ptr<const MachineProfile>> profileHolder_;
  bool finalized_ = false;
};

/// "fourd 0.1.0, MPI: <library version>, CUDA: yes/no".
std::string buildInfo();
std::string mpiLibraryVersion();
/// "MPICH" (and ABI-compatible derivatives), "Open MPI", or "" (unknown) from a library
/// version string.
std::string mpiFamily(const std::string& libraryVersion);
/// The family of the mpi.h fourd was compiled against ("" when unknown).
std::string mpiHeaderFamily();
/// "" when fourd's MPI calls reach a library of the family its mpi.h belongs to; otherwise the
/// error message (the grid constructor throws it as BackendError before any other MPI call).
std::string mpiAbiMismatch();

}  // namespace fourd
