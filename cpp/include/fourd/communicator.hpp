// A group of ranks along a grid axis (or a combination of axes), its topology levels, its
// progress thread and its defaults (timeout, debug checks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fourd/buffer.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/data_type.hpp"
#include "fourd/process_grid.hpp"
#include "fourd/topology.hpp"
#include "fourd/work.hpp"

namespace fourd {

namespace detail {
class CommState;
class Group;
}  // namespace detail

/// Per-call options.
struct CallOptions {
  Algorithm algorithm = Algorithm::kAuto;
  double timeoutSeconds = 0.0;  ///< <= 0: the communicator's default (FOURD_TIMEOUT_S, 300 s)
  bool async = false;           ///< true: return at once, the progress thread runs it
  bool accumulateFp32 = false;  ///< float16/bfloat16: keep partial sums in float32 across steps
  /// A codec for this call ("zfp:rate=8", "int8", "lossless", "none", ...; docs/compression.md);
  /// empty: the grid's policy decides.
  std::string compression;
};

/// A group of ranks. Collectives are collective: every member calls them in the same order.
/// Operations on one communicator complete in the order issued; different communicators run
/// concurrently. Buffers must stay valid until the returned Work completes (the Python layer
/// keeps them alive through Work::setKeepAlive).
class Communicator {
 public:
  explicit Communicator(std::unique_ptr<detail::CommState> state);
  ~Communicator();

  int rank() const noexcept;
  int size() const noexcept;
  AxisMask mask() const noexcept;
  const std::string& name() const noexcept;
  /// World rank of every group rank, in group-rank order.
  const std::vector<int>& worldRanks() const noexcept;
  const GroupTopology& topology() const noexcept;

  /// The codec a call would use (docs/compression.md): its canonical text ("" for none),
  /// where the choice came from ("argument", "policy", "FOURD_COMPRESSION"), where it applies,
  /// and why a policy codec does not apply to this call. `requested`: the call's argument.
  struct CompressionChoice {
    std::string codec, source, where, note;
  };
  CompressionChoice compression(Collective c, size_t nbytes, DataType dtype, DeviceType device,
                                const std::string& requested) const;

  /// In place when in.data == out.data. out.count == in.count.
  std::shared_ptr<Work> allReduce(const Buffer& in, const Buffer& out, ReduceOp op,
                                  const CallOptions& opts = {});
  /// out.count == size() * in.count; out = inputs concatenated in group-rank order.
  std::shared_ptr<Work> allGather(const Buffer& in, const Buffer& out,
                                  const CallOptions& opts = {});
  /// in.count == size() * out.count; block i of the reduced input ends on group rank i.
  std::shared_ptr<Work> reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op,
                                      const CallOptions& opts = {});
  /// `root` is a group rank.
  std::shared_ptr<Work> broadcast(const Buffer& buf, int root, const CallOptions& opts = {});
  std::shared_ptr<Work> barrier(const CallOptions& opts = {});

  /// The default of calls that ask for `auto` on this group (a plan's per-axis choice);
  /// kAuto: none. Must be set alike on every rank.
  void setDefaultAlgorithm(Algorithm a);
  Algorithm defaultAlgorithm() const noexcept;

  /// The algorithm a call with algorithm = auto runs (the default set above, FOURD_ALGORITHM,
  /// tuning in use, the cost model, the device: internal/selector.hpp). `device`: where the
  /// call's buffers live (CUDA buffers run on the group's device backend, which this rank
  /// knows once a CUDA operation has run; until then, NCCL's rule is assumed).
  Algorithm choose(Collective c, size_t nbytes, DataType dtype, bool inPlace = false,
                   DeviceType device = DeviceType::kCpu) const;
  /// Every candidate with its predicted time and whether it can run, the choice, and where
  /// the choice comes from ("argument" never: "plan", "FOURD_ALGORITHM", "tuning", "model",
  /// "device", "broadcast", "one rank").
  struct Explanation {
    std::vector<Prediction> candidates;
    Algorithm choice = Algorithm::kFlat;
    std::string source;
  };
  Explanation explain(Collective c, size_t nbytes, DataType dtype, bool inPlace = false,
                      DeviceType device = DeviceType::kCpu) const;

  /// What `auto`'s tuning in use knows of this call (docs/algorithms.md, "Tuning in use"):
  /// state "off" (FOURD_TUNE=0, a call of 0 bytes, a one-rank group or broadcast: the
  /// model alone decides), "" (no such call has run with the current profile), "single" (no
  /// rival on the shortlist: the model's choice runs), "exploring", "provisional" (the
  /// exploration chose another algorithm than the model: it runs until a second exploration
  /// confirms it), "rechecking" (that second exploration) or "settled"; the candidates tried,
  /// the model's choice first; from "provisional", the slowest rank's median time of each (the
  /// lower of two explorations once re-checked) and the algorithm the calls run.
  struct Tuning {
    std::string state;
    std::vector<Algorithm> candidates;
    std::vector<double> seconds;
    Algorithm settled = Algorithm::kAuto;
    int exploreCalls = 0;  ///< how many calls one exploration takes (0 when nothing to try)
    int recheckGap = 0;    ///< how many calls a switch runs before it is re-checked
    double period = 0.0;   ///< the call period (s) the decision measured (0: none yet)
    bool saved = false;    ///< the choice came from a saved decision (seedTuning)
    /// The calls agree on their placement first: `settled` runs where some rank calls out of
    /// place, `inPlaceSettled` where every rank calls in place (docs/algorithms.md,
    /// "Placement").
    bool agreed = false;
    Algorithm inPlaceSettled = Algorithm::kAuto;
  };
  Tuning tuning(Collective c, size_t nbytes, DataType dtype, bool inPlace = false) const;

  /// A choice of tuning in use: calls of `nbytes` (the nccl-tests size) and `dtype` run
  /// `algorithm`. A provisional one is a switch away from the model's choice that has not yet
  /// had its re-check: it carries the calls it has run since its exploration, the shortlist,
  /// the exploration's common figures, one per candidate (Tuning::seconds), and the calls it
  /// runs before its re-check (Tuning::recheckGap; 0 when seeding: the default gap).
  struct TunedCall {
    Collective collective = Collective::kAllReduce;
    size_t nbytes = 0;
    DataType dtype = DataType::kFloat32;
    Algorithm algorithm = Algorithm::kFlat;
    bool provisional = false;
    int calls = 0;
    std::vector<Algorithm> candidates;
    std::vector<double> seconds;
    int recheckGap = 0;
    /// A split key: the algorithm where every rank calls in place (kAuto: none; `algorithm`
    /// runs whatever the placements). Provisional ones then carry two figures per candidate,
    /// out of place then in place.
    Algorithm inPlace = Algorithm::kAuto;
  };
  /// The choices tuning in use has made under the current profile (final or provisional,
  /// explored here or seeded), to save for the next run of the same layout.
  std::vector<TunedCall> tunedCalls() const;
  /// Seeds saved choices under the current profile. A final one runs at once, where it is one
  /// of the call's candidates on this group; a provisional one runs at once and is re-checked
  /// when its calls reach the re-check gap, where its candidates are the call's shortlist on
  /// this group, it is not the model's choice, and its figures are positive, one per
  /// candidate. Others are left out. Every rank of the group must pass the same list
  /// (collective in effect, though it communicates nothing). Returns how many were taken.
  int seedTuning(const std::vector<TunedCall>& calls);

  bool poisoned() const noexcept;
  std::string poisonReason() const;
  /// Poisons the communicator on this rank (torch's ProcessGroup.abort): every later call
  /// raises AbortedError with `why`; an operation in flight runs on to its end or deadline.
  /// Local: the other ranks learn of it only when their calls time out.
  void abort(const std::string& why);

  /// Waits for every operation in flight (up to timeoutSeconds) and stops the progress thread.
  /// Returns false if some did not finish in time.
  bool drain(double timeoutSeconds) noexcept;

  /// Frees the group (after drain): every later call raises AbortedError ("finalized"); the
  /// rank, size and names above stay readable.
  void close() noexcept;
  bool closed() const noexcept { return !state_; }

  /// What the algorithms see of this group (host buffers): for native tests.
  detail::Group& group() noexcept;

 private:
  detail::CommState& live() const;  // the state, or AbortedError once closed

  std::unique_ptr<detail::CommState> state_;
  int rank_ = 0, size_ = 1;
  AxisMask mask_ = 0;
  std::string name_;
  std::vector<int> worldRanks_;
  GroupTopology topology_;
};

}  // namespace fourd
