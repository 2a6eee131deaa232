// Selector (internal/selector.hpp): the one place that chooses an algorithm.
#include "internal/selector.hpp"

#include <cmath>
#include <cstdlib>

#include "fourd/error.hpp"

namespace fourd::detail {

namespace {

// The model's candidates for a call, priced alike on every rank: the geometric mean of the
// in-place and the out-of-place predictions (placement is the one rank-local property of a
// call, and a rank that chose from its own could pick another algorithm than its peers).
std::vector<Prediction> placementFree(const CallShape& call, const GroupShape& shape,
                                      const MachineProfile& profile) {
  auto out = candidates(call.collective, call.nbytes, call.dtype, shape, profile, false);
  const auto in = candidates(call.collective, call.nbytes, call.dtype, shape, profile, true);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].supported = out[i].supported && in[i].supported;
    if (!out[i].supported) continue;
    out[i].seconds = std::sqrt(out[i].seconds * in[i].seconds);
    out[i].correction = std::sqrt(out[i].correction * in[i].correction);
  }
  return out;
}

// The supported candidate with the smallest price (ties: the lower enum value), flat excluded
// when `noFlat`; flat when none is supported.
Algorithm cheapest(const std::vector<Prediction>& preds, bool noFlat) {
  Algorithm best = Algorithm::kFlat;
  double bestT = HUGE_VAL;
  for (const auto& p : preds) {
    if (!p.supported || algorithmImpl(p.algorithm) == nullptr) continue;
    if (noFlat && p.algorithm == Algorithm::kFlat) continue;
    if (p.seconds < bestT) {
      best = p.algorithm;
      bestT = p.seconds;
    }
  }
  return best;
}

}  // namespace

Selector::Selector(const Group& group) : group_(group) {
  // FOURD_TUNE=0 turns tuning in use off, FOURD_TUNE=inline explores on the calls themselves
  // (tuner.hpp); it must be the same on every rank (the grid's agreement check compares it).
  tuner_.setUpfront(true);
  if (const char* v = std::getenv("FOURD_TUNE")) {
    std::string x(v);
    for (auto& ch : x) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (x == "0" || x == "off" || x == "false" || x == "no") tuner_.setEnabled(false);
    if (x == "inline") tuner_.setUpfront(false);
  }
  if (const char* env = std::getenv("FOURD_ALGORITHM"); env && *env)
    env_ = parseAlgorithm(env, "FOURD_ALGORITHM");
}

void Selector::setDefault(Algorithm a) noexcept {
  std::lock_guard<std::mutex> lock(memoMu_);
  default_ = a;
}

Algorithm Selector::defaultAlgorithm() const noexcept {
  std::lock_guard<std::mutex> lock(memoMu_);
  return default_;
}

bool Selector::flatTooLarge(const CallShape& call, const Group& runsOn, std::string* why) const {
  const size_t limit = runsOn.backend().maxCount();
  if (call.count <= limit) return false;
  if (why) {
    *why = "the " + runsOn.backend().kind() + " library's collectives take at most " +
           std::to_string(limit) + " elements per call; this call passes " +
           std::to_string(call.count);
  }
  return true;
}

void Selector::checkRuns(const CallShape& call, Algorithm a, const Group& runsOn) const {
  const auto* impl = algorithmImpl(a);
  if (impl == nullptr) {
    throw InvalidArgument(std::string("algorithm: '") + algorithmName(a) +
                          "' is not built into this version of fourd");
  }
  std::string why;
  const bool ok = impl->supports(call.collective, runsOn, &why) &&
                  !(a == Algorithm::kFlat && flatTooLarge(call, runsOn, &why));
  if (!ok) {
    throw InvalidArgument(std::string("algorithm: '") + algorithmName(a) + "' cannot run " +
                          collectiveName(call.collective) + " on axis '" + group_.name() + "' (" +
                          runsOn.topology().describe() + "): " + why);
  }
}

Algorithm Selector::modelChoice(const CallShape& call, const Group& runsOn) const {
  const std::shared_ptr<const MachineProfile> profile = group_.profile();
  const Tuner::Key key = call.key();
  {
    std::lock_guard<std::mutex> lock(memoMu_);
    if (memoProfile_ != profile) {
      memo_.clear();
      memoProfile_ = profile;
    }
    const auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
  }
  const Algorithm a =
      cheapest(placementFree(call, group_.shape(), *profile), flatTooLarge(call, runsOn, nullptr));
  std::lock_guard<std::mutex> lock(memoMu_);
  if (memoProfile_ == profile) {
    if (memo_.size() >= 4096) memo_.clear();  // bounded: sizes vary per call
    memo_.emplace(key, a);
  }
  return a;
}

Algorithm Selector::deviceChoice(const CallShape& call, const Group& runsOn) const {
  const auto* h = algorithmImpl(Algorithm::kHierarchical);
  return h && h->supports(call.collective, runsOn, nullptr) ? Algorithm::kHierarchical
                                                            : Algorithm::kFlat;
}

Algorithm Selector::select(const CallShape& call, Algorithm requested, const Group& runsOn) const {
  if (call.collective == Collective::kBroadcast) return Algorithm::kFlat;
  if (requested == Algorithm::kAuto) requested = defaultAlgorithm();
  const bool host = call.device == DeviceType::kCpu;
  if (requested == Algorithm::kAuto && host) requested = envAlgorithm();
  if (requested == Algorithm::kAuto) {
    if (!host) return runsOn.size() == 1 ? Algorithm::kFlat : deviceChoice(call, runsOn);
    if (tuner_.tunes(call.nbytes, runsOn.size())) return Algorithm::kAuto;
    return tunedOrModel(call, runsOn);
  }
  if (runsOn.size() == 1) return Algorithm::kFlat;
  checkRuns(call, requested, runsOn);
  return requested;
}

Algorithm Selector::tunedOrModel(const CallShape& call, const Group& runsOn) const {
  if (call.device != DeviceType::kCpu) return deviceChoice(call, runsOn);
  if (tuner_.tunes(call.nbytes, runsOn.size())) {
    // Tuned in use: what the calls chose runs from then on (provisionally or for good; kAuto
    // while they explore, and then the model's choice is reported). An in-place call of a split
    // key (tuner.hpp, "Placement") reports its in-place algorithm, which runs where every rank
    // calls in place.
    const auto t = tuner_.report(call.key(), group_.profile());
    if (t.settled != Algorithm::kAuto) {
      return call.inPlace && t.inPlace != Algorithm::kAuto ? t.inPlace : t.settled;
    }
  }
  return modelChoice(call, runsOn);
}

Algorithm Selector::choose(const CallShape& call, const Group& runsOn, std::string* source) const {
  auto from = [&](const char* s) {
    if (source) *source = s;
  };
  if (call.collective == Collective::kBroadcast) {
    from("broadcast");
    return Algorithm::kFlat;
  }
  if (runsOn.size() == 1) {
    from("one rank");
    return Algorithm::kFlat;
  }
  if (const Algorithm plan = defaultAlgorithm(); plan != Algorithm::kAuto) {
    from("plan");
    return plan;
  }
  if (call.device == DeviceType::kCpu) {
    if (const Algorithm env = envAlgorithm(); env != Algorithm::kAuto) {
      from("FOURD_ALGORITHM");
      return env;
    }
  }
  const Algorithm a = tunedOrModel(call, runsOn);
  if (source) {
    const bool tuned = call.device == DeviceType::kCpu &&
                       tuner_.tunes(call.nbytes, runsOn.size()) &&
                       tuner_.report(call.key(), group_.profile()).settled != Algorithm::kAuto;
    *source = call.device != DeviceType::kCpu ? "device" : tuned ? "tuning" : "model";
  }
  return a;
}

Explanation Selector::explain(const CallShape& call, const Group& runsOn) const {
  Explanation e;
  e.candidates = placementFree(call, group_.shape(), *group_.profile());
  for (auto& p : e.candidates) {
    const auto* impl = algorithmImpl(p.algorithm);
    // `supported` says whether a request by name runs; the reason also says when auto leaves
    // a runnable algorithm out.
    if (!p.supported) {
      if (p.algorithm != Algorithm::kHierarchical || runsOn.topology().numNodes != 1) continue;
      p.supported = true;
      p.reason =
          "the group is on one node: not a candidate of auto; asked for by name, it runs its "
          "intra-node level alone";
    }
    if (call.collective == Collective::kBroadcast && p.algorithm != Algorithm::kFlat) {
      p.supported = false;
      p.reason = "broadcast always runs the backend's own (flat)";
    } else if (impl == nullptr) {
      p.supported = false;
      p.reason = "not built into this version of fourd";
    } else if (!impl->supports(call.collective, runsOn, &p.reason)) {
      p.supported = false;
    } else if (p.algorithm == Algorithm::kFlat && flatTooLarge(call, runsOn, &p.reason)) {
      p.supported = false;
    }
  }
  e.choice = choose(call, runsOn, &e.source);
  return e;
}

std::vector<Algorithm> Selector::shortlist(
    const CallShape& call, const std::shared_ptr<const MachineProfile>& profile) const {
  auto preds = placementFree(call, group_.shape(), *profile);
  const bool noFlat = flatTooLarge(call, group_, nullptr);
  for (auto& p : preds) {
    p.supported =
        p.supported && algorithmImpl(p.algorithm) && !(noFlat && p.algorithm == Algorithm::kFlat);
  }
  return Tuner::shortlist(preds, cheapest(preds, noFlat), call.nbytes);
}

// ---- compression ----

void Selector::setPolicyCodec(const CodecSpec& codec, const std::string& source) {
  policy_ = codec;
  policySource_ = source;
}

namespace {

// Why a policy codec does not apply to this call ("" when it does).
std::string policyMiss(const CodecSpec& c, const CallShape& call, const Group& g) {
  if (call.device != DeviceType::kCpu) return "compression runs on host buffers only";
  if (call.collective == Collective::kBroadcast) return "broadcast is not compressed";
  if (g.size() < 2 || call.nbytes == 0) return "nothing crosses a link";
  if (g.topology().numNodes < 2)
    return "the group is on one node: a policy compresses only links between nodes";
  try {
    checkCodecDtype(c, call.dtype);
  } catch (const InvalidArgument& e) {
    return std::string("not for this dtype: ") + e.what();
  }
  return "";
}

}  // namespace

CodecChoice Selector::codec(const CallShape& call, const std::string& requested,
                            const Group& runsOn) const {
  CodecChoice out;
  if (!requested.empty()) {
    out.spec = parseCodec(requested, "compression");
    out.source = "argument";
    if (out.spec.none()) return out;
    if (call.device != DeviceType::kCpu) {
      throw InvalidArgument(
          "compression: codecs run on host buffers in this version of fourd; found a CUDA "
          "tensor (pass compression=None, or a CPU tensor)");
    }
    if (call.collective == Collective::kBroadcast)
      throw InvalidArgument("compression: broadcast takes no codec");
    if (out.spec.kind != CodecKind::kAuto) checkCodecDtype(out.spec, call.dtype);
    if (out.spec.kind == CodecKind::kAuto && call.dtype != DataType::kFloat32 &&
        call.dtype != DataType::kFloat64 && call.dtype != DataType::kBFloat16 &&
        call.dtype != DataType::kFloat16) {
      out.spec = CodecSpec{};
      out.note = "auto compresses floating-point data only";
    }
    return out;
  }
  if (policy_.none()) return out;
  out.note = policyMiss(policy_, call, runsOn);
  if (out.note.empty()) {
    out.spec = policy_;
    out.source = policySource_;
  }
  return out;
}

Algorithm Selector::compressedAlgorithm(Algorithm chosen, const Group& g) const {
  const bool spans = g.topology().numNodes > 1;
  if (chosen == Algorithm::kAuto || chosen == Algorithm::kHierarchical) {
    std::string why;
    if (spans && shapeSupports(Collective::kAllReduce, Algorithm::kHierarchical, g, &why))
      return Algorithm::kHierarchical;
    return chosen == Algorithm::kAuto ? Algorithm::kRing : chosen;
  }
  return chosen;
}

bool Selector::autoCodec(const Tuner::Key& key, CodecSpec* out) {
  // Re-decided every kAutoRecheck calls: the data (and its ratio) change as training goes.
  constexpr int kAutoRecheck = 64;
  std::lock_guard<std::mutex> lk(autoMu_);
  auto it = autoCodecs_.find(key);
  if (it == autoCodecs_.end() || ++it->second.calls > kAutoRecheck) return false;
  *out = it->second.codec;
  return true;
}

void Selector::rememberAutoCodec(const Tuner::Key& key, const CodecSpec& codec) {
  std::lock_guard<std::mutex> lk(autoMu_);
  autoCodecs_[key] = AutoCodec{codec, 1};
}

}  // namespace fourd::detail
