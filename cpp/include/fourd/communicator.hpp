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
}

/// Per-call options.
struct CallOptions {
  Algorithm algorithm = Algorithm::kAuto;
  double timeoutSeconds = 0.0;   ///< <= 0: the communicator's default (FOURD_TIMEOUT_S, 300 s)
  bool async = false;            ///< true: return at once, the progress thread runs it
  bool accumulateFp32 = false;   ///< float16/bfloat16: keep partial sums in float32 across steps
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

  /// In place when in.data == out.data. out.count == in.count.
  std::shared_ptr<Work> allReduce(const Buffer& in, const Buffer& out, ReduceOp op,
                                  const CallOptions& opts = {});
  /// out.count == size() * in.count; out = inputs concatenated in group-rank order.
  std::shared_ptr<Work> allGather(const Buffer& in, const Buffer& out, const CallOptions& opts = {});
  /// in.count == size() * out.count; block i of the reduced input ends on group rank i.
  std::shared_ptr<Work> reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op,
                                      const CallOptions& opts = {});
  /// `root` is a group rank.
  std::shared_ptr<Work> broadcast(const Buffer& buf, int root, const CallOptions& opts = {});
  std::shared_ptr<Work> barrier(const CallOptions& opts = {});

  /// The algorithm `auto` picks for this call, and every candidate with its predicted time.
  Algorithm choose(Collective c, size_t nbytes, DataType dtype, bool inPlace = false) const;
  std::vector<Prediction> explain(Collective c, size_t nbytes, DataType dtype,
                                  bool inPlace = false) const;

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
  };
  Tuning tuning(Collective c, size_t nbytes, DataType dtype, bool inPlace = false) const;

  bool poisoned() const noexcept;
  std::string poisonReason() const;

  /// Waits for every operation in flight (up to timeoutSeconds) and stops the progress thread.
  /// Returns false if some did not finish in time.
  bool drain(double timeoutSeconds) noexcept;

  detail::CommState& state() noexcept { return *state_; }

 private:
  std::unique_ptr<detail::CommState> state_;
};

}  // namespace fourd
