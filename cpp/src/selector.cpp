// Selector (internal/selector.hpp): the one place that chooses an algorithm.
#include "internal/selector.hpp"

#include <cstdlib>

#include "fourd/error.hpp"

namespace fourd::detail {

Selector::Selector(const Group& group) : group_(group) {
  // FOURD_TUNE=0 turns tuning in use off (tuner.hpp); it must be the same on every rank.
  if (const char* v = std::getenv("FOURD_TUNE")) {
    std::string x(v);
    for (auto& ch : x) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (x == "0" || x == "off" || x == "false" || x == "no") tuner_.setEnabled(false);
  }
}

void Selector::setDefault(Algorithm a) noexcept {
  std::lock_guard<std::mutex> lock(memoMu_);
  default_ = a;
}

Algorithm Selector::defaultAlgorithm() const noexcept {
  std::lock_guard<std::mutex> lock(memoMu_);
  return default_;
}

Algorithm Selector::envAlgorithm() {
  const char* env = std::getenv("FOURD_ALGORITHM");
  return env && *env ? parseAlgorithm(env, "FOURD_ALGORITHM") : Algorithm::kAuto;
}

void Selector::checkRuns(const CallShape& call, Algorithm a, const Group& runsOn) const {
  const auto* impl = algorithmImpl(a);
  if (impl == nullptr) {
    throw InvalidArgument(std::string("algorithm: '") + algorithmName(a) +
                          "' is not built into this version of fourd");
  }
  std::string why;
  if (!impl->supports(call.collective, runsOn, &why)) {
    throw InvalidArgument(std::string("algorithm: '") + algorithmName(a) + "' cannot run " +
                          collectiveName(call.collective) + " on axis '" + group_.name() + "' (" +
                          runsOn.topology().describe() + "): " + why);
  }
}

Algorithm Selector::modelChoice(const CallShape& call) const {
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
  Algorithm a = fourd::choose(call.collective, call.nbytes, call.dtype, group_.shape(), *profile,
                              call.inPlace);
  if (algorithmImpl(a) == nullptr) a = Algorithm::kFlat;  // only built-in algorithms run
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
    // while they explore, and then the model's choice is reported).
    const auto t = tuner_.report(call.key(), group_.profile());
    if (t.settled != Algorithm::kAuto) return t.settled;
  }
  return modelChoice(call);
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
  e.candidates = candidates(call.collective, call.nbytes, call.dtype, group_.shape(),
                            *group_.profile(), call.inPlace);
  for (auto& p : e.candidates) {
    const auto* impl = algorithmImpl(p.algorithm);
    if (!p.supported) continue;
    if (call.collective == Collective::kBroadcast && p.algorithm != Algorithm::kFlat) {
      p.supported = false;
      p.reason = "broadcast always runs the backend's own (flat)";
    } else if (impl == nullptr) {
      p.supported = false;
      p.reason = "not built into this version of fourd";
    } else if (!impl->supports(call.collective, runsOn, &p.reason)) {
      p.supported = false;
    }
  }
  e.choice = choose(call, runsOn, &e.source);
  return e;
}

std::vector<Algorithm> Selector::shortlist(
    const CallShape& call, const std::shared_ptr<const MachineProfile>& profile) const {
  const GroupShape shape = group_.shape();
  auto preds = candidates(call.collective, call.nbytes, call.dtype, shape, *profile, call.inPlace);
  for (auto& p : preds) p.supported = p.supported && algorithmImpl(p.algorithm);
  Algorithm model =
      fourd::choose(call.collective, call.nbytes, call.dtype, shape, *profile, call.inPlace);
  if (algorithmImpl(model) == nullptr) model = Algorithm::kFlat;
  return Tuner::shortlist(preds, model, call.nbytes);
}

}  // namespace fourd::detail
