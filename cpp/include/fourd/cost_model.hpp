// The alpha-beta-gamma cost model of every collective and algorithm, in one place.
//
// `auto` selection (Communicator) and the planner (python -m fourd.plan) both call predict().
// Sizes follow nccl-tests: `nbytes` is the full all-reduce buffer, the gathered all-gather output,
// the reduce-scatter input, the broadcast buffer.
#pragma once

#include <cstddef>
#include <string>
#include <variant>
#include <vector>

#include "fourd/data_type.hpp"

namespace fourd {

enum class Collective : int { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2, kBroadcast = 3 };
inline constexpr int kNumCollectives = 4;

/// Algorithms selectable with `algorithm=`. Numeric values cross the Python binding.
enum class Algorithm : int {
  kAuto = 0,
  kFlat = 1,          ///< the MPI (or NCCL) library's own collective
  kRing = 2,          ///< bandwidth-optimal ring over point-to-point
  kRhd = 3,           ///< recursive halving / doubling (log depth)
  kHierarchical = 4,  ///< intra-node level + rail-aligned inter-node level
  kShm = 5,           ///< MPI-3 shared-memory windows inside a node
};
inline constexpr int kNumAlgorithms = 6;

const char* collectiveName(Collective c);
Collective parseCollective(const std::string& s, const char* argName = "collective");
const char* algorithmName(Algorithm a);
Algorithm parseAlgorithm(const std::string& s, const char* argName = "algorithm");

/// A measured correction of the model (fourd.profile.measure writes them): for one collective and
/// algorithm on groups of `groupSize` ranks over `nodes` nodes, 16-bit floats or not, in place
/// or not, the measured time at `nbytes` over the model's prediction. The model's structure
/// (how time grows with the message, the group, the topology) stays; these points pin it to
/// what the algorithms really do on the machine where they were measured (tuning tables, as
/// MPI libraries keep).
struct Correction {
  Collective collective = Collective::kAllReduce;
  Algorithm algorithm = Algorithm::kFlat;
  int groupSize = 2;
  int nodes = 1;
  bool half16 = false;   ///< float16 / bfloat16 (their own reduction kernels)
  bool inPlace = false;  ///< the output is the input buffer
  double nbytes = 0.0;   ///< message size measured (nccl-tests convention), > 0
  double factor = 1.0;   ///< measured / predicted, > 0
};

/// Costs of one machine. Seconds and bytes per second (1e9 = 1 GB/s).
struct MachineProfile {
  std::string name = "default";
  int ranksPerNode = 1;         ///< GPUs (or MPI ranks) per node
  double intraAlpha = 1e-6;     ///< latency of one intra-node message, s
  double intraBw = 10e9;        ///< per-rank intra-node bandwidth, B/s
  double interAlpha = 5e-6;     ///< latency of one inter-node message, s
  double nicBw = 12.5e9;        ///< bandwidth of one NIC, B/s
  int nicsPerNode = 1;          ///< NICs per node; node injection Be = nicBw * nicsPerNode
  double reduceBw = 5e9;        ///< bytes of input reduced per second by one rank (1/gamma)
  double memcpyBw = 10e9;       ///< local copy bandwidth per rank, B/s
  double flatEfficiency = 1.0;  ///< the MPI library's own collective relative to the ring model
  /// flatEfficiency for float16 / bfloat16 reductions, which the library runs with a
  /// user-defined operator (no MPI datatype for them): its own algorithm choice and fused
  /// reduction do not apply, so its efficiency is measured apart; 0 means flatEfficiency.
  double flatEfficiency16 = 0.0;
  double computeFlops = 1e12;  ///< dense matmul throughput per rank (planner only)
  double memoryBytes = 80e9;   ///< memory per rank (planner only)
  /// Direct rank-to-rank links inside a node, no switch (Perlmutter's 4 A100s): each rank's
  /// intraBw is split evenly over its R-1 peers, so a group of k of the R ranks of a node gets
  /// intraBw * (k-1)/(R-1). False for a switched node (NVSwitch, or a CPU's memory).
  bool intraMesh = false;
  /// Chunks the hierarchical levels are pipelined over (1: the levels run one after another).
  int hierarchicalChunks = 1;
  /// Copy bandwidth into and out of a node's MPI shared-memory window, B/s; 0 means memcpyBw
  /// (host buffers). For device buffers the window is in host memory: the host-device link.
  double shmBw = 0.0;
  /// Bytes of float16 / bfloat16 input reduced per second by one rank with the pairwise kernel
  /// of ring, rhd and hierarchical (widen, add, round), with the data in the cache; streaming
  /// data add the float32 kernel's memory stall (cost_model.cpp, assumption 7). 0 means
  /// reduceBw / 2, the float32 element rate.
  double reduceBw16 = 0.0;
  /// The same for shm's k-input kernel (all k inputs widened and summed in float32, rounded
  /// once), which runs at its own rate; 0 means reduceBw16.
  double shmReduceBw16 = 0.0;
  /// The cache tier of a CPU node. intraBw, shmBw, memcpyBw and reduceBw are the figures of
  /// data streaming from memory (large messages). When the working sets of the node's ranks
  /// (every rank's input plus output bytes, all R ranks at once) fit in cacheBytes, those
  /// transfers run cacheBwGain times faster; a working set W > cacheBytes keeps the fraction
  /// cacheBytes / W resident. 0 (the default, and right for GPU nodes whose intra-node links
  /// are not memory copies) disables the tier. Network (NIC) terms never use it.
  double cacheBytes = 0.0;   ///< last-level cache shared by the ranks of one node, bytes
  double cacheBwGain = 1.0;  ///< cache-resident bandwidth / streaming bandwidth, >= 1
  /// Measured corrections (see Correction). A prediction is multiplied by the factor of the
  /// points that match its collective, algorithm, group size, nodes, dtype class and
  /// placement, interpolated linearly in log(size) between the measured sizes, held below the
  /// smallest and faded back to 1 over the two octaves above the largest; 1 where no point
  /// matches. Empty by default.
  std::vector<Correction> corrections;

  double nodeInjectionBw() const noexcept { return nicBw * nicsPerNode; }
};

/// One field of MachineProfile: its snake_case name (the name in profile files and in Python),
/// the member it stands for, and what it means. profileFields() lists every field once, in
/// declaration order; the Python binding and profile files are made from that list.
struct ProfileField {
  using Member =
      std::variant<std::string MachineProfile::*, int MachineProfile::*, double MachineProfile::*,
                   bool MachineProfile::*, std::vector<Correction> MachineProfile::*>;
  const char* name;
  Member member;
  const char* doc;
};
const std::vector<ProfileField>& profileFields();

/// Throws InvalidArgument naming the first field of `profile` out of its range (negative or
/// NaN figures, zero chunks, a correction that names no algorithm, ...).
void checkProfile(const MachineProfile& profile);

/// Time multiplier (in (0, 1]) of the memory-bound terms when the ranks of one node together
/// touch `nodeWorkingSetBytes`: 1 - f (1 - 1/cacheBwGain) with f = min(1, cacheBytes / W) the
/// resident fraction. 1 when the profile has no cache tier. Throws InvalidArgument on a bad
/// profile (the checks of predict()).
double memoryTimeScale(const MachineProfile& profile, double nodeWorkingSetBytes);

/// How a group is placed: `size` ranks on `nodes` nodes, `ranksPerNode` each when uniform.
struct GroupShape {
  int size = 1;
  int nodes = 1;
  int ranksPerNode = 1;  ///< k; meaningful when uniform
  bool uniform = true;
};

/// One candidate of a selection.
struct Prediction {
  Algorithm algorithm = Algorithm::kFlat;
  double seconds = 0.0;     ///< the model's time times `correction`
  double correction = 1.0;  ///< the measured correction applied (1: none matched)
  bool supported = true;
  std::string reason;  ///< why unsupported, or a short note on the phases
};

/// Whether `algorithm` can run `collective` on a group of this shape; `reason` says why not.
bool isSupported(Collective collective, Algorithm algorithm, const GroupShape& shape,
                 std::string* reason = nullptr);

/// Predicted time in seconds. Returns +infinity when unsupported.
double predict(Collective collective, Algorithm algorithm, size_t nbytes, DataType dtype,
               const GroupShape& shape, const MachineProfile& profile, bool inPlace = false);

/// Every concrete algorithm (not kAuto) with its prediction, in enum order.
std::vector<Prediction> candidates(Collective collective, size_t nbytes, DataType dtype,
                                   const GroupShape& shape, const MachineProfile& profile,
                                   bool inPlace = false);

/// The supported algorithm with the smallest prediction (ties: the lower enum value).
Algorithm choose(Collective collective, size_t nbytes, DataType dtype, const GroupShape& shape,
                 const MachineProfile& profile, bool inPlace = false);

/// The correction factor of `profile` for one call (1 when no point matches).
double correctionFactor(const MachineProfile& profile, Collective collective, Algorithm algorithm,
                        const GroupShape& shape, DataType dtype, bool inPlace, size_t nbytes);

}  // namespace fourd
