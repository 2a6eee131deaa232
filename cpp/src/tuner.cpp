#include "internal/tuner.hpp"

#include <algorithm>
#include <cmath>

namespace fourd::detail {

std::vector<Algorithm> Tuner::shortlist(const std::vector<Prediction>& preds, Algorithm model,
                                        size_t nbytes) {
  const bool everyone = nbytes < kSmallBytes;
  double base = 0.0;
  for (const auto& p : preds) {
    if (p.algorithm == model && p.supported) base = p.seconds;
  }
  std::vector<const Prediction*> rivals;
  for (const auto& p : preds) {
    if (p.algorithm == model || !p.supported || !(p.seconds > 0) || !(base > 0)) continue;
    if (everyone || p.seconds <= kWindow * base) rivals.push_back(&p);
  }
  // Stable: equal predictions keep enum order, the same on every rank.
  std::stable_sort(rivals.begin(), rivals.end(), [](const Prediction* a, const Prediction* b) {
    return a->seconds < b->seconds;
  });
  std::vector<Algorithm> out{model};
  for (const auto* p : rivals) {
    if (static_cast<int>(out.size()) >= kMaxCandidates) break;
    out.push_back(p->algorithm);
  }
  return out;
}

int Tuner::timedCalls(size_t nbytes) {
  if (nbytes < kSmallBytes) return kSmallTimed;
  const size_t n = (kTimedBytes + nbytes - 1) / nbytes;
  return static_cast<int>(std::min<size_t>(kMaxTimed, std::max<size_t>(kTimed, n)));
}

int Tuner::warmCalls(size_t nbytes) {
  if (nbytes < kSmallBytes) return kSmallWarm;
  if (nbytes < kWarmFrom) return kWarm;
  const size_t n = (kWarmBytes + nbytes - 1) / nbytes;
  return static_cast<int>(std::min<size_t>(kMaxWarm, std::max<size_t>(kWarm, n)));
}

int Tuner::recheckGap(int exploreCalls, double period) {
  const int most = kRecheckGap * exploreCalls;
  if (!(period > 0) || !std::isfinite(period)) return most;
  const double n = std::ceil(kRecheckAfter / period);
  return n < most ? std::max(kPeriodCalls + 1, static_cast<int>(n)) : most;
}

int Tuner::exploreCallsLocked(const Entry& e) const {
  const int m = static_cast<int>(e.cands.size());
  return m <= 1 ? 0 : kPasses * m * e.placements * (e.warm + e.timed);
}

void Tuner::arriveLocked(Entry& e, Step& s) {
  // A switch whose gap is not agreed yet times the program's calls of it (after the deciding
  // call, which an upfront exploration lengthens): kPeriodCalls intervals, then the agreement.
  if (!e.provisional || e.gap > 0 || e.settled == Algorithm::kAuto) return;
  const auto now = std::chrono::steady_clock::now();
  if (e.arrivals == 0) e.firstArrival = now;
  if (++e.arrivals == kPeriodCalls + 1) {
    s.agree = true;
    s.period = std::chrono::duration<double>(now - e.firstArrival).count() / kPeriodCalls;
  }
}

void Tuner::agreePeriod(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                        double period) {
  std::lock_guard<std::mutex> lock(mu_);
  if (profile_ != profile) return;
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.provisional || it->second.gap > 0) return;
  Entry& e = it->second;
  e.period = period;
  e.gap = recheckGap(exploreCallsLocked(e), period);
}

void Tuner::agreed(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                   bool allInPlace) {
  std::lock_guard<std::mutex> lock(mu_);
  if (profile_ != profile) return;
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.inPlace == Algorithm::kAuto) return;
  Entry& e = it->second;
  if (e.sameInARow > 0 && allInPlace != e.lastAllInPlace) e.sameInARow = 0;
  e.lastAllInPlace = allInPlace;
  if (++e.sameInARow < kAgreeCalls) return;
  // The program calls it one way: that placement's winner, without agreeing.
  if (allInPlace) e.settled = e.inPlace;
  e.inPlace = Algorithm::kAuto;
  e.sameInARow = 0;
}

size_t Tuner::decide(const std::vector<double>& seconds) {
  if (seconds.empty()) return 0;
  size_t best = 0;
  for (size_t i = 1; i < seconds.size(); ++i) {
    if (seconds[i] < seconds[best]) best = i;
  }
  // The model's choice stays unless beaten clearly: a near tie is the noise of a busy machine.
  return best != 0 && seconds[best] < kSwitch * seconds[0] ? best : 0;
}

Tuner::Entry& Tuner::entryLocked(const Key& key,
                                 const std::shared_ptr<const MachineProfile>& profile) {
  if (profile_ != profile) {  // a new profile prices the shortlists anew
    entries_.clear();
    profile_ = profile;
  }
  if (entries_.size() >= 4096 && entries_.find(key) == entries_.end()) {
    entries_.clear();  // bounded: sizes may vary per call (the same count on every rank)
  }
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    it = entries_.emplace(key, Entry{}).first;
    it->second.timed = timedCalls(std::get<1>(key));
    it->second.warm = warmCalls(std::get<1>(key));
    it->second.placements = placements(std::get<1>(key));
  }
  return it->second;
}

Tuner::Step Tuner::stepLocked(Entry& e) {
  Step s;
  const int nc = static_cast<int>(e.cands.size());
  const int np = nc > 1 ? e.placements : 1;
  const int m = nc * np;  // what is timed: each candidate in each placement
  const int per = e.warm + e.timed;
  const int total = kPasses * m * per;
  if (e.provisional && e.sinceSettle >= (e.gap > 0 ? e.gap : kRecheckGap * total)) {
    // The re-check of a switch: the shortlist explored again, from its first call (and here:
    // a switch seeded from a saved run is no longer the saved decision).
    e.provisional = false;
    e.saved = false;
    e.settled = Algorithm::kAuto;
    e.round = 1;
    e.calls = 0;
    e.samples.clear();
  }
  if (e.settled != Algorithm::kAuto) {
    if (e.provisional) ++e.sinceSettle;
    s.algorithm = e.settled;
    s.inPlace = e.inPlace;
    return s;
  }
  if (nc <= 1) {  // nothing to compare
    e.settled = e.cands.empty() ? Algorithm::kFlat : e.cands[0];
    s.algorithm = e.settled;
    return s;
  }
  if (upfront_ && e.round == 0 && !e.seen) {  // a size called once never explores
    e.seen = true;
    s.algorithm = e.cands[0];
    return s;
  }
  if (e.samples.empty()) e.samples.assign(m, {});
  const int i = e.calls < total ? e.calls : total - 1;
  ++e.calls;
  const int pass = i / (m * per);
  const int block = (i % (m * per)) / per;
  const int pos = i % per;
  s.candidate = pass % 2 == 0 ? block : m - 1 - block;
  s.algorithm = e.cands[s.candidate / np];
  s.placements2 = np == 2;
  s.trialInPlace = np == 2 && s.candidate % 2 == 1;
  s.timed = pos >= e.warm;
  s.barrier = pos == e.warm;
  s.last = i == total - 1;
  return s;
}

std::vector<double> Tuner::record(const Key& key,
                                  const std::shared_ptr<const MachineProfile>& profile,
                                  const Step& step, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (profile_ != profile || step.candidate < 0) return {};
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.settled != Algorithm::kAuto) return {};
  Entry& e = it->second;
  e.samples[step.candidate].push_back(seconds);
  if (!step.last) return {};
  std::vector<double> all;
  for (const auto& v : e.samples) all.insert(all.end(), v.begin(), v.end());
  return all;
}

std::vector<double> Tuner::figures(const std::vector<double>& samples, size_t m) {
  const size_t per = m ? samples.size() / m : 0;  // kPasses x the timed calls of a pass
  const size_t k = per / kPasses;
  std::vector<double> best(m, 0.0);
  if (k == 0) return best;
  for (size_t c = 0; c < m; ++c) {
    for (size_t p = 0; p + k <= per; p += k) {  // one median per pass
      std::vector<double> w(samples.begin() + c * per + p, samples.begin() + c * per + p + k);
      std::nth_element(w.begin(), w.begin() + k / 2, w.end());
      best[c] = p == 0 ? w[k / 2] : std::min(best[c], w[k / 2]);
    }
  }
  return best;
}

void Tuner::settleSamples(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                          const std::vector<double>& samples, const Placing& placing) {
  size_t m = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    m = it->second.cands.size() * static_cast<size_t>(it->second.placements);
  }
  if (m == 0 || samples.size() % m != 0) return;
  settle(key, profile, figures(samples, m), placing);
}

void Tuner::settle(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                   const std::vector<double>& seconds, const Placing& placing) {
  std::lock_guard<std::mutex> lock(mu_);
  if (profile_ != profile) return;
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  const size_t np = static_cast<size_t>(e.placements);
  if (seconds.size() != e.cands.size() * np) return;
  if (e.settled != Algorithm::kAuto) return;  // already settled (a repeated call)
  std::vector<double> figures = seconds;
  if (e.round == 1 && e.seconds.size() == figures.size()) {
    // The re-check: each figure's lower of the two explorations.
    for (size_t i = 0; i < figures.size(); ++i) figures[i] = std::min(figures[i], e.seconds[i]);
  }
  size_t pick = 0;
  e.inPlace = Algorithm::kAuto;
  if (np == 1) {
    pick = decide(figures);
  } else {
    std::vector<double> out, in;
    for (size_t i = 0; i < figures.size(); i += 2) {
      out.push_back(figures[i]);
      in.push_back(figures[i + 1]);
    }
    const size_t wOut = decide(out), wIn = decide(in);
    // One algorithm for every call: the winner of the placement the group explored with. Split
    // where the other placement's winner gains more there than kAgreeGain agreements cost.
    const bool allIn = placing.allInPlace;
    pick = allIn ? wIn : wOut;
    const size_t other = allIn ? wOut : wIn;
    const std::vector<double>& there = allIn ? out : in;
    const double gain = there[pick] - there[other];
    if (other != pick && std::isfinite(placing.agreeSeconds) &&
        gain > kAgreeGain * placing.agreeSeconds && gain > (1.0 - kSwitch) * there[pick]) {
      pick = wOut;
      e.inPlace = e.cands[wIn];
    }
  }
  e.sameInARow = 0;
  e.seconds = figures;
  e.settled = e.cands[pick];
  // A switch away from the model's choice, in either placement, is re-checked.
  e.provisional =
      e.round == 0 && (pick != 0 || (e.inPlace != Algorithm::kAuto && e.inPlace != e.cands[0]));
  e.sinceSettle = 0;
  if (e.round == 0) {  // a switch agrees its period from here; a re-check keeps the figures
    e.gap = 0;
    e.period = 0.0;
    e.arrivals = 0;
  }
  e.samples.clear();
}

void Tuner::seed(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                 Algorithm algorithm, Algorithm inPlace) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entryLocked(key, profile);
  e = Entry{};
  e.cands = {algorithm};
  e.settled = algorithm;
  e.inPlace = inPlace == algorithm ? Algorithm::kAuto : inPlace;
  e.saved = true;
}

void Tuner::seedProvisional(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                            std::vector<Algorithm> cands, Algorithm algorithm,
                            std::vector<double> seconds, int calls, int gap, Algorithm inPlace) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entryLocked(key, profile);
  const int timed = e.timed, warm = e.warm;
  e = Entry{};
  e.timed = timed;
  e.warm = warm;
  // The re-check explores as this run does (placements()); figures of the other layout are
  // kept where they fit (an out-of-place half of two-placement figures) and else dropped (the
  // re-check then decides on its own figures).
  e.placements = placements(std::get<1>(key));
  if (e.placements == 1 && seconds.size() == 2 * cands.size()) {
    std::vector<double> out;
    for (size_t i = 0; i < seconds.size(); i += 2) out.push_back(seconds[i]);
    seconds = std::move(out);
  } else if (seconds.size() != cands.size() * static_cast<size_t>(e.placements)) {
    seconds.clear();
  }
  e.inPlace = inPlace == algorithm ? Algorithm::kAuto : inPlace;
  e.cands = std::move(cands);
  e.settled = algorithm;
  e.provisional = true;
  e.sinceSettle = calls;
  e.gap = std::max(0, gap);
  e.seconds = std::move(seconds);
  e.saved = true;
}

std::vector<Tuner::Choice> Tuner::choices(
    const std::shared_ptr<const MachineProfile>& profile) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Choice> out;
  if (profile_ != profile) return out;
  for (const auto& [key, e] : entries_) {
    if (e.settled == Algorithm::kAuto) continue;  // exploring, or not yet
    if (e.provisional) {
      out.push_back({key, e.settled, true, e.sinceSettle, e.seconds, e.cands, e.gap, e.inPlace});
    } else if (e.cands.size() > 1 || e.saved) {  // a single candidate is no decision
      out.push_back({key, e.settled, false, 0, {}, {}, 0, e.inPlace});
    }
  }
  return out;
}

Tuner::Report Tuner::report(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                            bool inPlace) const {
  std::lock_guard<std::mutex> lock(mu_);
  Report r;
  if (profile_ != profile) return r;
  auto it = entries_.find(key);
  if (it == entries_.end()) return r;
  const Entry& e = it->second;
  r.candidates = e.cands;
  r.placements = e.placements;
  r.inPlace = e.inPlace;
  if (e.placements == 2 && e.seconds.size() == 2 * e.cands.size()) {
    for (size_t i = inPlace ? 1 : 0; i < e.seconds.size(); i += 2)
      r.seconds.push_back(e.seconds[i]);
  } else {
    r.seconds = e.seconds;
  }
  r.settled = e.settled;
  r.exploreCalls = exploreCallsLocked(e);
  r.recheckGap = e.gap > 0 ? e.gap : kRecheckGap * r.exploreCalls;
  r.period = e.period;
  r.saved = e.saved;
  if (e.saved && !e.provisional) {
    r.state = "settled";
  } else if (e.cands.size() <= 1) {
    r.state = "single";
  } else if (e.settled == Algorithm::kAuto) {
    r.state = e.round != 0 ? "rechecking" : upfront_ && e.calls == 0 ? "seen once" : "exploring";
  } else {
    r.state = e.provisional ? "provisional" : "settled";
  }
  return r;
}

}  // namespace fourd::detail
