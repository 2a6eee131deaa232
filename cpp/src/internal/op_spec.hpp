// One operation as the communicator issues it, and the engine that runs it
// (cpp/src/operation.cpp): the poison check, the deadline, the debug fingerprint, the chosen
// algorithm on the group of the buffers' device, tuning in use, poisoning on failure.
#pragma once

#include <memory>

#include "fourd/buffer.hpp"
#include "fourd/communicator.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/work.hpp"
#include "internal/codec.hpp"
#include "internal/selector.hpp"

namespace fourd::detail {

class CommState;

struct OpSpec {
  Collective coll;
  const char* opName;
  Buffer in, out;
  ReduceOp op = ReduceOp::kSum;
  bool hasOp = false;
  int root = -1;
  bool isBarrier = false;
  bool inPlace = false;  // reduce_scatter whose output is this rank's block of the input
  /// The selector's answer for host buffers (kAuto: tuned as the call runs); the caller's
  /// request for CUDA buffers (resolved on the device group when the call runs).
  Algorithm algorithm = Algorithm::kFlat;
  CallOptions opts;
  uint64_t seq = 0;
  CallShape call;
  /// algorithm == kAuto on host buffers: the profile current when the call was issued (the
  /// same call on every rank prices its tuning alike).
  std::shared_ptr<const MachineProfile> profile;
  /// The call's codec (internal/compression.hpp): none, a codec, or kAuto (resolved as the
  /// call runs).
  CodecSpec codec;
};

/// Gives `spec` its sequence number and runs it: inline when the communicator is idle and the
/// call blocks, else on the progress thread. Throws AbortedError on a poisoned communicator.
std::shared_ptr<Work> dispatch(CommState& s, OpSpec spec);

/// The data movement of one operation on `g` with the concrete algorithm `a` (after the debug
/// check): float32 widening, in-place reduce_scatter through scratch, avg's scaling.
void runAlgorithm(Group& g, const OpSpec& spec, Algorithm a, OpContext& ctx);

}  // namespace fourd::detail
