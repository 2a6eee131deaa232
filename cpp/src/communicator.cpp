// Communicator: validation, sequence numbers, deadlines, debug fingerprints and poisoning
// around the algorithms; the selector (internal/selector.hpp) decides which algorithm runs.
// Every check that can fail on bad input runs before any communication, on the calling thread.
#include "fourd/communicator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "fourd/error.hpp"
#include "internal/comm_state.hpp"
#include "internal/device_path.hpp"
#include "internal/op_spec.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd {

using detail::CallShape;
using detail::Clock;
using detail::CommState;
using detail::OpContext;
using detail::OpSpec;

Communicator::Communicator(std::unique_ptr<CommState> state)
    : state_(std::move(state)),
      rank_(state_->rank()),
      size_(state_->size()),
      mask_(state_->mask),
      name_(state_->name),
      worldRanks_(state_->host->backend().worldRanks()),
      topology_(state_->host->topology()) {}
Communicator::~Communicator() = default;

int Communicator::rank() const noexcept { return rank_; }
int Communicator::size() const noexcept { return size_; }
AxisMask Communicator::mask() const noexcept { return mask_; }
const std::string& Communicator::name() const noexcept { return name_; }
const std::vector<int>& Communicator::worldRanks() const noexcept { return worldRanks_; }
const GroupTopology& Communicator::topology() const noexcept { return topology_; }
bool Communicator::poisoned() const noexcept { return !state_ || state_->poisoned.load(); }
void Communicator::abort(const std::string& why) {
  if (state_) state_->poison("aborted: " + why);
}
std::string Communicator::poisonReason() const {
  if (!state_) return "the grid was finalized";
  std::lock_guard<std::mutex> lk(state_->poisonMu);
  return state_->poisonReason;
}
detail::Group& Communicator::group() noexcept { return *live().host; }

CommState& Communicator::live() const {
  if (!state_) {
    throw AbortedError("fourd: axis '" + name_ +
                       "' belongs to a finalized grid; call fourd.init() again");
  }
  return *state_;
}

bool Communicator::drain(double timeoutSeconds) noexcept {
  try {
    return !state_ || state_->executor.drain(timeoutSeconds);
  } catch (...) {
    return false;
  }
}

void Communicator::close() noexcept { state_.reset(); }

void Communicator::setDefaultAlgorithm(Algorithm a) {
  if (a != Algorithm::kAuto && detail::algorithmImpl(a) == nullptr) {
    throw InvalidArgument(std::string("algorithm: '") + algorithmName(a) +
                          "' is not built into this version of fourd");
  }
  live().selector.setDefault(a);
}

Algorithm Communicator::defaultAlgorithm() const noexcept {
  return state_ ? state_->selector.defaultAlgorithm() : Algorithm::kAuto;
}

namespace {

// The largest element count of a call of `nbytes` (nccl-tests sizes: the all-reduce buffer,
// the gathered output of all-gather, the reduce-scatter input), as the communicator counts
// its calls (CallShape::count).
size_t countOf(size_t nbytes, DataType dtype) {
  return nbytes / std::max<size_t>(1, dataTypeSize(dtype));
}

}  // namespace

Algorithm Communicator::choose(Collective c, size_t nbytes, DataType dtype, bool inPlace,
                               DeviceType device) const {
  const CallShape call{c, nbytes, dtype, inPlace, device, countOf(nbytes, dtype)};
  const CommState& st = live();
  return st.selector.choose(call, detail::groupFor(st, device));
}

Communicator::Explanation Communicator::explain(Collective c, size_t nbytes, DataType dtype,
                                                bool inPlace, DeviceType device) const {
  const CallShape call{c, nbytes, dtype, inPlace, device, countOf(nbytes, dtype)};
  const CommState& st = live();
  const detail::Group& runsOn = detail::groupFor(st, device);
  auto e = st.selector.explain(call, runsOn);
  if (device != DeviceType::kCpu && &runsOn == st.host.get()) {
    // No CUDA operation has run yet: the device backend is not known; price as NCCL would run.
    for (auto& p : e.candidates) {
      if (p.supported && p.algorithm != Algorithm::kFlat &&
          p.algorithm != Algorithm::kHierarchical) {
        p.supported = false;
        p.reason = "runs on host memory only; CUDA buffers use the device backend";
      }
    }
  }
  return {std::move(e.candidates), e.choice, std::move(e.source)};
}

Communicator::CompressionChoice Communicator::compression(Collective c, size_t nbytes,
                                                          DataType dtype, DeviceType device,
                                                          const std::string& requested) const {
  const CallShape call{c, nbytes, dtype, false, device, countOf(nbytes, dtype)};
  const CommState& st = live();
  const auto choice = st.selector.codec(call, requested, *st.host);
  CompressionChoice out{choice.spec.none() ? "" : choice.spec.text(), choice.source, "",
                        choice.note};
  if (choice.spec.none()) return out;
  const bool multi = st.host->topology().numNodes > 1;
  const Algorithm a = st.selector.compressedAlgorithm(Algorithm::kAuto, *st.host);
  if (a == Algorithm::kHierarchical && multi)
    out.where = "the rail level of hierarchical (between nodes); the intra-node phases run raw";
  else
    out.where = "the whole group (compressed ring)";
  if (choice.spec.kind == detail::CodecKind::kAuto)
    out.where += "; auto decides at the first call of a size whether lossless pays";
  return out;
}

Communicator::Tuning Communicator::tuning(Collective c, size_t nbytes, DataType dtype,
                                          bool inPlace) const {
  Tuning out;
  const CommState& st = live();
  const auto& tuner = st.selector.tuner();
  if (c == Collective::kBroadcast || !tuner.tunes(nbytes, size())) {
    out.state = "off";
    return out;
  }
  const CallShape call{c, nbytes, dtype, inPlace};
  const auto r = tuner.report(call.key(), st.host->profile(), inPlace);
  out.state = r.state;
  out.candidates = r.candidates;
  out.seconds = r.seconds;
  out.settled = r.settled;
  out.agreed = r.inPlace != Algorithm::kAuto;
  out.inPlaceSettled = r.inPlace;
  out.exploreCalls = r.exploreCalls;
  out.recheckGap = r.recheckGap;
  out.period = r.period;
  out.saved = r.saved;
  return out;
}

std::vector<Communicator::TunedCall> Communicator::tunedCalls() const {
  const CommState& st = live();
  std::vector<TunedCall> out;
  for (const auto& c : st.selector.tuner().choices(st.host->profile())) {
    out.push_back({static_cast<Collective>(std::get<0>(c.key)), std::get<1>(c.key),
                   static_cast<DataType>(std::get<2>(c.key)), c.algorithm, c.provisional, c.calls,
                   c.cands, c.seconds, c.gap, c.inPlace});
  }
  return out;
}

int Communicator::seedTuning(const std::vector<TunedCall>& calls) {
  CommState& st = live();
  auto& tuner = st.selector.tuner();
  const auto profile = st.host->profile();
  int taken = 0;
  for (const auto& c : calls) {
    const CallShape call{c.collective, c.nbytes,         c.dtype,
                         false,        DeviceType::kCpu, countOf(c.nbytes, c.dtype)};
    if (c.collective == Collective::kBroadcast || !tuner.tunes(c.nbytes, size())) continue;
    // Only a choice this group would consider: the same profile and shape give the same
    // shortlist on every rank, so every rank takes the same seeds.
    const auto cands = st.selector.shortlist(call, profile);
    auto considered = [&](Algorithm a) {
      return std::find(cands.begin(), cands.end(), a) != cands.end();
    };
    if (!considered(c.algorithm)) continue;
    if (c.inPlace != Algorithm::kAuto && !considered(c.inPlace)) continue;
    if (!c.provisional) {
      tuner.seed(call.key(), profile, c.algorithm, c.inPlace);
      ++taken;
      continue;
    }
    // One figure per candidate, or two (out of place, in place) where both were timed.
    const bool figures =
        (c.seconds.size() == cands.size() || c.seconds.size() == 2 * cands.size()) &&
        std::all_of(c.seconds.begin(), c.seconds.end(),
                    [](double s) { return std::isfinite(s) && s > 0; });
    const bool switched =
        c.algorithm != cands[0] || (c.inPlace != Algorithm::kAuto && c.inPlace != cands[0]);
    if (c.candidates != cands || !switched || !figures || c.calls < 0 || c.recheckGap < 0) {
      continue;
    }
    tuner.seedProvisional(call.key(), profile, cands, c.algorithm, c.seconds, c.calls, c.recheckGap,
                          c.inPlace);
    ++taken;
  }
  return taken;
}

namespace {

bool overlaps(const Buffer& a, const Buffer& b) {
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a.bytes() && b.bytes() && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

void checkDevice(const Buffer& b, const char* arg) {
  if (b.device == DeviceType::kCpu) return;
#ifndef FOURD_HAVE_CUDA
  throw InvalidArgument(
      std::string(arg) +
      ": expected a CPU tensor (this build of fourd has no "
      "CUDA support; rebuild with FOURD_CUDA=ON), found a CUDA tensor on device " +
      std::to_string(b.deviceIndex));
#endif
}

void checkSameDtype(const Buffer& in, const Buffer& out) {
  checkDevice(in, "input");
  checkDevice(out, "output");
  if (in.dtype != out.dtype) {
    throw TypeMismatch("output: expected the input's dtype " + toString(in.dtype) + ", found " +
                       toString(out.dtype));
  }
  if (in.device != out.device) {
    throw InvalidArgument("output: expected a tensor on the input's device, found one on the " +
                          std::string(out.device == DeviceType::kCuda ? "GPU" : "CPU"));
  }
}

// A call that moves nothing (no elements, or a group of one): done on the spot, except in
// debug mode, where every call is compared across the group.
std::shared_ptr<Work> doneAtOnce(CommState& s, const char* what) {
  auto w = std::make_shared<Work>(std::string(what) + " (nothing to send)");
  s.nextSeq.fetch_add(1);
  w->markCompleted(nullptr);
  return w;
}

}  // namespace

// The algorithm of a call on host buffers (CUDA buffers are resolved when they run, on the
// group's device backend). `nbytes`: the nccl-tests size of the call.
static void resolve(CommState& s, OpSpec& spec, size_t nbytes, bool inPlace, size_t count) {
  spec.call = CallShape{spec.coll, nbytes,         spec.in.dtype,
                        inPlace,   spec.in.device, std::max(spec.in.count, spec.out.count)};
  if (spec.in.device != DeviceType::kCpu) {
    // An explicit codec on CUDA buffers is refused here, before any communication.
    if (!spec.opts.compression.empty()) s.selector.codec(spec.call, spec.opts.compression, *s.host);
    spec.algorithm = spec.coll == Collective::kBroadcast ? Algorithm::kFlat : spec.opts.algorithm;
    return;
  }
  spec.algorithm =
      count == 0 ? Algorithm::kFlat : s.selector.select(spec.call, spec.opts.algorithm, *s.host);
  if (!spec.opts.compression.empty() || !s.selector.policyCodec().none()) {
    spec.codec = s.selector.codec(spec.call, spec.opts.compression, *s.host).spec;
    if (count == 0) spec.codec = detail::CodecSpec{};
    // A codec named (not auto) fixes the algorithm: no tuning of compressed calls.
    if (!spec.codec.none() && spec.codec.kind != detail::CodecKind::kAuto)
      spec.algorithm = s.selector.compressedAlgorithm(spec.algorithm, *s.host);
  }
  if (spec.algorithm == Algorithm::kAuto) spec.profile = s.host->profile();
}

std::shared_ptr<Work> Communicator::allReduce(const Buffer& in, const Buffer& out, ReduceOp op,
                                              const CallOptions& opts) {
  checkSameDtype(in, out);
  checkOpSupported(op, in.dtype);
  if (in.count != out.count) {
    throw InvalidArgument("output: expected " + std::to_string(in.count) +
                          " elements (the input's count), found " + std::to_string(out.count));
  }
  if (in.data != out.data && overlaps(in, out)) {
    throw InvalidArgument(
        "output: overlaps the input of an out-of-place all_reduce; pass the "
        "same tensor for in place, or non-overlapping tensors");
  }
  OpSpec spec{Collective::kAllReduce, "all_reduce", in, out};
  spec.op = op;
  spec.hasOp = true;
  spec.opts = opts;
  resolve(live(), spec, in.bytes(), in.data == out.data, in.count);
  const bool cuda = in.device != DeviceType::kCpu;
  if (!cuda && (in.count == 0 || size() == 1)) {
    if (in.data != out.data && in.bytes()) std::memcpy(out.data, in.data, in.bytes());
    if (!live().debug) return doneAtOnce(live(), "all_reduce");
  }
  return detail::dispatch(live(), spec);
}

std::shared_ptr<Work> Communicator::allGather(const Buffer& in, const Buffer& out,
                                              const CallOptions& opts) {
  checkSameDtype(in, out);
  const size_t expect = in.count * static_cast<size_t>(size());
  if (out.count != expect) {
    throw InvalidArgument("output: expected " + std::to_string(expect) + " elements (group size " +
                          std::to_string(size()) + " x input count " + std::to_string(in.count) +
                          "), found " + std::to_string(out.count));
  }
  const Buffer myBlock = out.slice(in.count * rank(), in.count);
  if (in.data != myBlock.data && overlaps(in, out)) {
    throw InvalidArgument(
        "input: overlaps the output of an out-of-place all_gather (only the "
        "output block of this rank may be passed as input)");
  }
  OpSpec spec{Collective::kAllGather, "all_gather", in, out};
  spec.opts = opts;
  resolve(live(), spec, out.bytes(), in.data == myBlock.data, in.count);
  const bool cuda = in.device != DeviceType::kCpu;
  if (!cuda && (in.count == 0 || size() == 1) && !live().debug) {
    if (in.data != out.data && in.bytes()) detail::moveBytes(out.data, in.data, in.bytes());
    return doneAtOnce(live(), "all_gather");
  }
  return detail::dispatch(live(), spec);
}

std::shared_ptr<Work> Communicator::reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op,
                                                  const CallOptions& opts) {
  checkSameDtype(in, out);
  checkOpSupported(op, in.dtype);
  const size_t expect = out.count * static_cast<size_t>(size());
  if (in.count != expect) {
    throw InvalidArgument("input: expected " + std::to_string(expect) + " elements (group size " +
                          std::to_string(size()) + " x output count " + std::to_string(out.count) +
                          "), found " + std::to_string(in.count) +
                          (in.count % size() ? " (not divisible by the group size)" : ""));
  }
  // In place, as nccl-tests lays it out: the output is this rank's block of the input.
  const bool inPlace = out.count > 0 && out.data == in.slice(out.count * rank(), out.count).data;
  if (!inPlace && overlaps(in, out)) {
    throw InvalidArgument(
        "output: overlaps the input of reduce_scatter; pass separate tensors, "
        "or this rank's block of the input for in place");
  }
  OpSpec spec{Collective::kReduceScatter, "reduce_scatter", in, out};
  spec.inPlace = inPlace;
  spec.op = op;
  spec.hasOp = true;
  spec.opts = opts;
  resolve(live(), spec, in.bytes(), inPlace, out.count);
  const bool cuda = in.device != DeviceType::kCpu;
  if (!cuda && (out.count == 0 || size() == 1) && !live().debug) {
    if (out.bytes() && out.data != in.data) detail::moveBytes(out.data, in.data, out.bytes());
    return doneAtOnce(live(), "reduce_scatter");
  }
  return detail::dispatch(live(), spec);
}

std::shared_ptr<Work> Communicator::broadcast(const Buffer& buf, int root,
                                              const CallOptions& opts) {
  checkDevice(buf, "tensor");
  if (root < 0 || root >= size()) {
    throw InvalidArgument("src: expected a group rank 0 <= src < " + std::to_string(size()) +
                          " on axis '" + name() + "', found " + std::to_string(root));
  }
  OpSpec spec{Collective::kBroadcast, "broadcast", buf, buf};
  spec.root = root;
  spec.opts = opts;
  spec.algorithm = Algorithm::kFlat;
  spec.call =
      CallShape{Collective::kBroadcast, buf.bytes(), buf.dtype, true, buf.device, buf.count};
  return detail::dispatch(live(), spec);
}

std::shared_ptr<Work> Communicator::barrier(const CallOptions& opts) {
  OpSpec spec{Collective::kBroadcast, "barrier", Buffer(), Buffer()};
  spec.opts = opts;
  spec.isBarrier = true;
  spec.algorithm = Algorithm::kFlat;
  return detail::dispatch(live(), spec);
}

}  // namespace fourd
