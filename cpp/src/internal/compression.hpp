// Which codec a call uses, and where (docs/compression.md).
//
// Precedence, first that applies:
//   1. the call's `compression=` argument (any group, any size: asked for, always used);
//   2. the grid's policy: FOURD_COMPRESSION when set, else fourd.init(compression=...), as
//      text "axes=codec;axes=codec" (axes a comma list of x, y, z, data; a bare codec applies
//      to every axis; presets "mzhybrid" and "zhybrid"). An entry applies to a group when every
//      axis of the group is listed; the first that applies wins. A policy compresses only
//      groups that span nodes (a slow link), on float data the codec takes, on host memory;
//   3. none.
// "auto" resolves as the call runs: the lossless codec where the cost model, with the ratio and
// codec speed measured on the call's data (agreed over the group), predicts a win, else none.
//
// Where it applies: "hierarchical" compresses its rail level (the links between nodes) and
// leaves the intra-node phases raw; any other algorithm, or a group "hierarchical" cannot run
// on, runs the compressed ring over the whole group (codec_ring.cpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fourd/buffer.hpp"
#include "fourd/cost_model.hpp"
#include "internal/codec.hpp"

namespace fourd::detail {

struct CompressionPolicy {
  /// (axes, codec) in the order given; axes empty: every axis.
  std::vector<std::pair<std::vector<std::string>, CodecSpec>> entries;
  bool empty() const noexcept { return entries.empty(); }
  /// Canonical text ("data=zfp:rate=8;x,y,z=lossless:lz4"): what ranks compare at init.
  std::string text() const;
};

/// Parses a policy (above). Throws InvalidArgument naming `argName` for an unknown axis, a
/// malformed entry or a bad codec.
CompressionPolicy parsePolicy(const std::string& text, const char* argName = "compression");

/// The codec the policy names for a group of these axes ("z+data" -> {"z", "data"}; "world"
/// -> every axis); none when no entry applies.
CodecSpec policyCodec(const CompressionPolicy& policy, const std::string& groupName);

/// The grid's policy text: FOURD_COMPRESSION when set and not empty, else `configured`.
std::string effectivePolicyText(const std::string& configured);

/// A call's codec, where it came from ("argument", "policy", "FOURD_COMPRESSION", "" for
/// none) and, when a policy codec does not apply to this call, why.
struct CodecChoice {
  CodecSpec spec;
  std::string source;
  std::string note;
};

class Group;
struct OpContext;

/// The error bound of a compressed ring (codec_ring.cpp) of `chain` + 1 ranks whose inputs are
/// at most `absmax` in magnitude: the reduce_scatter's chain of partial sums, and with
/// `gatherAfter` the all_gather of the sums (all_reduce). 0 for a lossless codec. Over
/// "hierarchical", chain is nodes - 1 and absmax the intra-node sum's bound (k * absmax).
double composedBound(const Codec& c, int chain, double absmax, bool gatherAfter);

/// Decides an "auto" codec for one call of `coll` on `g` (the host group) whose input is
/// `in` (`nbytes`: the nccl-tests size): samples the input with the lossless codec (ratio,
/// encode and decode speed), agrees on the worst of each over the group (one small all-reduce,
/// so every rank decides alike), and returns the lossless codec when the link time it saves
/// exceeds its own time by a margin, else none. `rail`: the call runs "hierarchical" across
/// nodes (the codec's level is the rail).
CodecSpec decideAutoCodec(Group& g, Collective coll, const Buffer& in, size_t nbytes, bool rail,
                          OpContext& ctx);

}  // namespace fourd::detail
