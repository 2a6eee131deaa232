// The one place that decides which algorithm a call runs, for the call and for explain().
//
// Every input to the choice is here, in this order of precedence:
//   1. the call's explicit `algorithm=` (anything but auto);
//   2. the group's default, set from a plan (fourd.init(plan=...), Grid.set_axis_algorithm);
//   3. FOURD_ALGORITHM (host buffers only: it names fourd's CPU algorithms);
//   4. tuning in use (tuner.hpp; host buffers, groups of 2+ ranks, calls that move data): once
//      the calls of a size have chosen, provisionally or for good, that algorithm; while they
//      explore, the choice is made as each call runs (select() returns kAuto);
//   5. the cost model with the group's measured profile (cost_model.hpp), memoised per call
//      shape and profile, each candidate priced by the geometric mean of its in-place and
//      out-of-place predictions (placement may differ between ranks, the choice may not);
// and the device: on GPU buffers only the algorithms the group's device backend can run are
// candidates (flat and hierarchical), and auto takes hierarchical where the group's shape
// supports it, else flat. Broadcast always runs the backend's own (flat); so does a one-rank
// group.
//
// Every rank makes the same choice for the same call: every input is the same on every rank
// (arguments, plan, environment, the profile the grid broadcast, the tuning's common times).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "fourd/buffer.hpp"
#include "fourd/cost_model.hpp"
#include "internal/compression.hpp"
#include "internal/group.hpp"
#include "internal/tuner.hpp"

namespace fourd::detail {

/// One call as the choice sees it (nccl-tests sizes: nbytes is the all-reduce buffer, the
/// gathered all-gather output, the reduce-scatter input).
struct CallShape {
  Collective collective = Collective::kAllReduce;
  size_t nbytes = 0;
  DataType dtype = DataType::kFloat32;
  bool inPlace = false;
  DeviceType device = DeviceType::kCpu;
  /// The largest element count the call passes to the backend's own collective (flat).
  size_t count = 0;

  /// The tuning's key. Placement is left out: it is the one property of a call that may
  /// differ between the ranks of a group, and every rank must choose alike.
  Tuner::Key key() const { return {static_cast<int>(collective), nbytes, static_cast<int>(dtype)}; }
};

/// What explain() reports: every candidate, the choice, and where the choice came from.
struct Explanation {
  std::vector<Prediction> candidates;
  Algorithm choice = Algorithm::kFlat;
  /// "argument", "plan" (the group's default), "FOURD_ALGORITHM", "tuning", "model",
  /// "device" (the GPU rule), "broadcast", "one rank".
  std::string source;
};

class Selector {
 public:
  /// `group`: the host group (its shape and profile price the model).
  explicit Selector(const Group& group);

  /// The group's default for calls that ask for auto (kAuto: none).
  void setDefault(Algorithm a) noexcept;
  Algorithm defaultAlgorithm() const noexcept;

  /// The algorithm a call runs, checked against `runsOn` (the group that will run it: the host
  /// group, or the device group for GPU buffers): throws InvalidArgument when an explicit
  /// choice cannot run there, naming why. kAuto: tuning decides as the call runs.
  Algorithm select(const CallShape& call, Algorithm requested, const Group& runsOn) const;
  /// The algorithm a call that asks for auto runs (never kAuto: while tuning explores, the
  /// model's choice); `source`, when given, says which input decided (Explanation::source).
  Algorithm choose(const CallShape& call, const Group& runsOn, std::string* source = nullptr) const;
  /// The candidates (predicted times, corrections, support on `runsOn`), choice and source.
  Explanation explain(const CallShape& call, const Group& runsOn) const;

  // ---- compression (internal/compression.hpp) ----
  /// The codec the grid's policy names for this group; `source` "policy" or
  /// "FOURD_COMPRESSION".
  void setPolicyCodec(const CodecSpec& codec, const std::string& source);
  const CodecSpec& policyCodec() const noexcept { return policy_; }
  /// A call's codec: `requested` is its compression= argument ("" when not given). An explicit
  /// codec that cannot run on the call (its dtype, GPU buffers) throws InvalidArgument; a
  /// policy codec that does not apply gives none, with the reason in `note`.
  CodecChoice codec(const CallShape& call, const std::string& requested, const Group& runsOn) const;
  /// The algorithm of a compressed call whose uncompressed choice is `chosen`: hierarchical
  /// (compressing its rail level) where `chosen` is auto or hierarchical and the group spans
  /// nodes it can run on; otherwise `chosen` itself, which then runs the compressed ring on
  /// the whole group (kAuto becomes ring).
  Algorithm compressedAlgorithm(Algorithm chosen, const Group& g) const;
  /// The remembered outcome of an "auto" codec for a call (true when known and still fresh;
  /// each lookup counts as one call).
  bool autoCodec(const Tuner::Key& key, CodecSpec* out);
  void rememberAutoCodec(const Tuner::Key& key, const CodecSpec& codec);

  /// Tuning in use (host buffers).
  Tuner& tuner() noexcept { return tuner_; }
  const Tuner& tuner() const noexcept { return tuner_; }
  /// The shortlist the tuning explores for a call: the model's choice first (tuner.hpp).
  std::vector<Algorithm> shortlist(const CallShape& call,
                                   const std::shared_ptr<const MachineProfile>& profile) const;

 private:
  Algorithm modelChoice(const CallShape& call, const Group& runsOn) const;
  /// Whether the call passes more elements than the backend's own collectives take.
  bool flatTooLarge(const CallShape& call, const Group& runsOn, std::string* why) const;
  Algorithm tunedOrModel(const CallShape& call, const Group& runsOn) const;
  Algorithm deviceChoice(const CallShape& call, const Group& runsOn) const;
  /// FOURD_ALGORITHM as the group was made (validated by the grid at init; read once, not per
  /// call: getenv scans the whole environment).
  Algorithm envAlgorithm() const noexcept { return env_; }
  void checkRuns(const CallShape& call, Algorithm a, const Group& runsOn) const;

  const Group& group_;
  Algorithm default_ = Algorithm::kAuto;
  Algorithm env_ = Algorithm::kAuto;
  CodecSpec policy_;
  std::string policySource_;
  struct AutoCodec {
    CodecSpec codec;
    int calls = 0;
  };
  std::mutex autoMu_;
  std::map<Tuner::Key, AutoCodec> autoCodecs_;
  Tuner tuner_;
  // The model's choice per call shape, for the profile it was made with: the model and its
  // corrections cost microseconds per call, a lookup does not. The stored profile keeps that
  // profile alive, so a new one never shares its address; a different profile empties it.
  mutable std::mutex memoMu_;
  mutable std::shared_ptr<const MachineProfile> memoProfile_;
  mutable std::map<Tuner::Key, Algorithm> memo_;
};

}  // namespace fourd::detail
