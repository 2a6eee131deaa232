#pragma once
// Tuning in use: `auto` checks the cost model's choice against its close rivals on the calls
// themselves and keeps the fastest. docs/algorithms.md, "Tuning in use", holds the measurements
// behind each constant below.
//
// Why: the model's figures come from a calibration of a few seconds on a shared machine, whose
// points spread by up to 1.5x from one calibration to the next, so where two algorithms are
// predicted within that spread the model picks between them by chance. Training issues the same
// collectives at the same sizes every step, so the calls themselves can settle it.
//
// How, for each key (collective, bytes, dtype, placement):
// - Shortlist: the model's choice, then the algorithms predicted within kWindow of it (twice
//   the calibration's pruning threshold: two calibrations of one layout, 4 ranks on virtual
//   nodes, priced rhd's 256 KiB all_gather at 50 and 200 us, and hierarchical's at 79 and 66,
//   where both ran as in the first), fastest first, kMaxCandidates at most (every algorithm of
//   a one-node group). Below kSmallBytes, every supported algorithm: the model's latency terms
//   are its least sure.
// - Exploration: kPasses passes over the shortlist, the second in reverse order, so that the
//   slow first calls of a new size do not all fall on one candidate. In each pass a candidate
//   runs untimed calls to reach its steady speed (kWarm; from kWarmFrom, where ring and rhd need
//   several calls after another algorithm, as many as carry kWarmBytes, at most kMaxWarm), then
//   a barrier, then timed calls back to back, as training runs them (kTimed to kMaxTimed, as
//   many as carry kTimedBytes). Below kSmallBytes, kSmallWarm and kSmallTimed: a short window
//   there times the scheduler more than the algorithm.
// - Decision: one all-reduce (MAX) of every timed call's time over the group, so that each
//   timed call counts at its slowest rank's time, as a benchmark's per-iteration time and a
//   training step's wait do; a candidate's figure is the better of its passes' medians of
//   those. A rank's own median reads a point-to-point algorithm fast where ranks run
//   decoupled (a rank whose peer's messages have arrived returns at once while the peer waits):
//   4 ranks of the VM, 4 KiB all_gather on 2-rank groups, each rank's median read rhd 6.6 us and
//   flat 9.4, the mean of each call's slowest rank 12.2 and 10.7. From then on every call runs the
//   fastest, the model's choice unless another is faster by more than 1 - kSwitch (a near tie
//   is the machine's noise).
// - Re-check: a switch away from the model's choice runs provisionally, then the shortlist is
//   explored again and each candidate's figure becomes the lower of its two (a passing
//   slowdown only adds time); that decision is final. The switch runs kRecheckGap times the
//   exploration's calls, or fewer where the key's calls come slowly: as many as span
//   kRecheckAfter seconds at the key's call period, at least kPeriodCalls + 1. The period is
//   the time between the program's calls of the key while the switch runs, measured over its
//   calls after the deciding one (kPeriodCalls intervals) and made common by one MAX
//   all-reduce at the call that ends them (Step::agree; at the same call on every rank). A
//   training loop that calls a size once per step would otherwise run hundreds of steps
//   before the re-check; a second opinion kRecheckAfter seconds later is what the re-check is
//   for, and it costs one exploration either way.
// - Upfront (the default; FOURD_TUNE=inline explores on the calls themselves instead): the
//   first call of a key runs the model's choice; the whole exploration runs inside its second
//   call, before that call's own work, on buffers that give its result unchanged
//   (operation.cpp, runTuned), so a training loop runs the settled choice from its second
//   step, and a size called once never pays for an exploration. The second call pays the
//   exploration's runs at once (bounded by kWarmBytes and kTimedBytes per candidate and pass).
// - Placement (upfront, from kSmallBytes): the exploration runs each candidate both out of place
//   and in place, on buffers of its own where the call's do not serve (operation.cpp), so a
//   figure per candidate and placement. Every rank must choose alike, and a call's placement is
//   its own (ranks may differ within one operation), so the choice cannot follow it unasked. One
//   algorithm serves every call: the winner of the placement the group explored with (all in
//   place, else out of place; made common with the figures). Where the other placement's winner
//   differs and runs faster there by more than kAgreeGain times what the group's placement
//   agreement costs (one MAX all-reduce of a word, timed kAgreeRuns times in the exploration)
//   and by more than 1 - kSwitch, the key is split: every call first agrees on the placement,
//   and runs the in-place winner where every rank calls in place, the out-of-place one
//   otherwise (4 ranks of the VM, 16 MiB all_gather on 2-rank groups: shm 3.0 ms out of place
//   against MPI's 4.9, 2.1 in place against MPI's 1.6, where flat ran 1.6). A program that
//   calls the key one way only stops agreeing once kAgreeCalls calls in a row found the same
//   placement (the same count on every rank: the agreements are common), and runs that
//   placement's winner from then on. Below kSmallBytes, or inline, one placement: the call's
//   own.
// - Saved: a decision can be seeded (from the machine profile's tuning file,
//   python/fourd/profile/tuning.py), so that the next run of the same layout starts settled: a
//   final one with seed(); a provisional switch with seedProvisional(), which keeps its count
//   of calls and its figures, so that its re-check still comes once it has run the gap, over
//   as many runs as that takes.
//
// Every rank must make the same choice for the same call, so nothing here depends on a rank's
// own clock except the times that the all-reduce makes common: the schedule depends only on
// how many calls of a key this communicator has run (in issue order on every rank), and the
// profile that prices the shortlist is the one current when the call was issued.

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fourd/cost_model.hpp"

namespace fourd::detail {

/// What a two-placement exploration also makes common (Tuner::settle): whether every rank
/// explored in place (its calls' placement) and what one placement agreement costs (seconds;
/// infinite: unknown, never split).
struct TuningPlacing {
  bool allInPlace = false;
  double agreeSeconds = 1.0 / 0.0;
};

class Tuner {
 public:
  static constexpr int kWarm = 2;     ///< untimed calls of a candidate in each pass, at least
  static constexpr int kMaxWarm = 6;  ///< ... and at most
  static constexpr size_t kWarmBytes = size_t(96) << 20;  ///< what they carry from kWarmFrom
  static constexpr size_t kWarmFrom = size_t(4) << 20;    ///< below: kWarm
  static constexpr int kTimed = 3;      ///< then timed calls (their median counts), at least
  static constexpr int kMaxTimed = 12;  ///< ... and at most
  static constexpr size_t kTimedBytes = size_t(12) << 20;  ///< what the timed calls carry
  static constexpr int kPasses = 2;                        ///< the second in reverse order
  static constexpr int kMaxCandidates = 4;          ///< the model's choice and up to 3 rivals
  static constexpr double kWindow = 4.0;            ///< rivals: predicted within this of the choice
  static constexpr double kSwitch = 0.95;           ///< leave the model's choice only below this
  static constexpr size_t kSmallBytes = 256 << 10;  ///< below: latency-bound calls ...
  static constexpr int kSmallWarm = 16;             ///< ... get this many untimed calls,
  static constexpr int kSmallTimed = 64;            ///< ... this many timed ones, and every
                                                    ///< supported algorithm on the shortlist
  static constexpr int kRecheckGap = 4;          ///< a switch runs this many explorations' calls,
                                                 ///< then the shortlist is explored again ...
  static constexpr double kRecheckAfter = 10.0;  ///< ... or fewer, that span this many seconds
                                                 ///< at the key's call period,
  static constexpr int kPeriodCalls = 4;     ///< measured over this many intervals between calls
  static constexpr int kAgreeRuns = 9;       ///< timed placement agreements (their median counts)
  static constexpr double kAgreeGain = 3.0;  ///< split only for a gain of this many agreements
  static constexpr int kAgreeCalls = 256;    ///< a split key stops agreeing after this many calls
                                             ///< in a row found the same placement

  using Key = std::tuple<int, size_t, int>;  ///< collective, bytes, dtype (not placement)

  /// The algorithms to try for calls of `nbytes`, the model's choice first, then its rivals by
  /// predicted time (within kWindow of it; below kSmallBytes, every supported one).
  static std::vector<Algorithm> shortlist(const std::vector<Prediction>& preds, Algorithm model,
                                          size_t nbytes);
  /// Timed calls per candidate and pass for calls of `nbytes` (the same on every rank).
  static int timedCalls(size_t nbytes);
  /// Untimed calls before them (the same on every rank).
  static int warmCalls(size_t nbytes);
  /// Index of the candidate to keep, given every candidate's time (index 0: the model's).
  static size_t decide(const std::vector<double>& seconds);
  /// How many placements an exploration of `nbytes` times per candidate: 2 (out of place, then
  /// in place) upfront from kSmallBytes, else 1 (the call's own).
  int placements(size_t nbytes) const noexcept { return upfront_ && nbytes >= kSmallBytes ? 2 : 1; }

  /// One call's part in the tuning of its key.
  struct Step {
    Algorithm algorithm = Algorithm::kFlat;
    bool timed = false;    ///< pass the call's time to record()
    bool barrier = false;  ///< the first timed call of a candidate: start from a barrier
    bool last = false;     ///< the last timed call of the exploration
    int candidate = -1;
    bool agree = false;   ///< after the call: MAX-all-reduce `period` over the group, then
                          ///< agreePeriod() (the same call on every rank)
    double period = 0.0;  ///< this rank's call period of a switch, seconds
    /// An exploring step of a two-placement exploration: runs in place (else out of place),
    /// whatever the call's own placement.
    bool trialInPlace = false;
    bool placements2 = false;  ///< the exploration times both placements
    /// A split key (a settled step): the algorithm where every rank calls in place, agreed
    /// before the call (kAuto: not split, `algorithm` runs whatever the placements).
    Algorithm inPlace = Algorithm::kAuto;
  };

  /// Whether tuning is on (FOURD_TUNE unset or on).
  bool enabled() const noexcept { return enabled_; }
  /// Whether a call of `nbytes` on a group of `groupSize` is tuned: tuning on, a call that
  /// moves data, more than one rank (broadcast never is: it always runs the library's own).
  bool tunes(size_t nbytes, int groupSize) const noexcept {
    return enabled_ && nbytes > 0 && groupSize > 1;
  }
  void setEnabled(bool on) noexcept { enabled_ = on; }
  /// Whether an exploration runs all at once in the second call of its key (else one step per
  /// call, FOURD_TUNE=inline).
  bool upfront() const noexcept { return upfront_; }
  void setUpfront(bool on) noexcept { upfront_ = on; }

  /// Makes `algorithm` the final choice of `key` under `profile`, as if explored (a decision
  /// saved by an earlier run). Replaces what the key held.
  /// `inPlace`: a split key's algorithm for calls in place on every rank (kAuto: not split).
  void seed(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
            Algorithm algorithm, Algorithm inPlace = Algorithm::kAuto);
  /// Makes `algorithm` a provisional switch of `key` under `profile` (one saved by an earlier
  /// run): it runs at once, and its re-check comes when its calls reach `gap` (the saved
  /// run's re-check gap; 0: not agreed yet, this run measures it), counting the `calls` it ran
  /// before; `cands` is the shortlist and `seconds` the first exploration's common figures,
  /// one per candidate, or two (out of place, in place) where it timed both placements (the
  /// re-check, which explores as placements() says, takes each figure's lower of the two where
  /// the layouts match); `inPlace` as seed()'s. Replaces what the key held.
  void seedProvisional(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                       std::vector<Algorithm> cands, Algorithm algorithm,
                       std::vector<double> seconds, int calls, int gap = 0,
                       Algorithm inPlace = Algorithm::kAuto);

  /// A choice to save: final (settled after an exploration, re-checked where it switched, or
  /// seeded), or a provisional switch with what its re-check needs.
  struct Choice {
    Key key;
    Algorithm algorithm = Algorithm::kFlat;
    bool provisional = false;
    int calls = 0;                 ///< provisional: calls it has run since its exploration
    std::vector<double> seconds;   ///< provisional: the exploration's figures, per candidate
    std::vector<Algorithm> cands;  ///< provisional: the shortlist they belong to
    int gap = 0;                   ///< provisional: the calls it runs before its re-check
                                   ///< (0: not agreed yet)
    Algorithm inPlace = Algorithm::kAuto;  ///< a split key's in-place algorithm (Step::inPlace)
  };
  /// The keys under `profile` whose tuning has decided (final or provisional).
  std::vector<Choice> choices(const std::shared_ptr<const MachineProfile>& profile) const;

  /// The algorithm for the next call of `key` priced by `profile`. `candidates` computes the
  /// shortlist the first time the key is seen with this profile. `arrival`: a call the program
  /// made (false for the further runs of an upfront exploration inside one call); a switch
  /// times its arrivals for its call period.
  template <class F>
  Step next(const Key& key, const std::shared_ptr<const MachineProfile>& profile, F&& candidates,
            bool arrival = true) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entryLocked(key, profile);
    if (e.cands.empty()) e.cands = candidates();
    Step s = stepLocked(e);
    if (arrival) arriveLocked(e, s);
    return s;
  }
  /// Records a timed call's seconds. Returns every timed call's seconds of the exploration
  /// (candidate by candidate, in call order: the same layout on every rank) when this call was
  /// the key's last timed one; the caller makes them common (MAX over the group, call by call),
  /// then calls settleSamples().
  std::vector<double> record(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                             const Step& step, double seconds);
  using Placing = TuningPlacing;
  /// Each candidate's figure from record()'s layout of `m` candidates: the better of its
  /// passes' medians.
  static std::vector<double> figures(const std::vector<double>& samples, size_t m);
  /// settle() on the figures of the group's common samples.
  void settleSamples(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                     const std::vector<double>& samples, const Placing& placing = Placing{});
  /// Fixes the key's algorithm from the group's common times (one per candidate; for a
  /// two-placement exploration two, out of place then in place).
  void settle(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
              const std::vector<double>& seconds, const Placing& placing = Placing{});
  /// After a split key's placement agreement (Step::inPlace): `allInPlace`, what the group
  /// agreed. kAgreeCalls in a row that found the same placement end the split.
  void agreed(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
              bool allInPlace);
  /// Fixes a switch's call period and re-check gap from the group's common (MAX) period, after
  /// the call whose Step::agree was set.
  void agreePeriod(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                   double period);
  /// The calls a switch runs before its re-check: kRecheckGap x `exploreCalls`, or as many as
  /// span kRecheckAfter at `period` seconds per call where those are fewer (at least
  /// kPeriodCalls + 1, the calls that measured the period).
  static int recheckGap(int exploreCalls, double period);

  /// What is known of `key`: "seen once" (upfront: the first call ran the model's choice, the
  /// next one explores), "exploring", "provisional" (a switch, running until the second
  /// exploration), "rechecking" (that exploration) or "settled" (with the shortlist and, from
  /// "provisional", the common times), "single" (no rival on the shortlist: the model's choice
  /// runs), or nothing yet (`state` empty: no call of it has run with the current profile).
  struct Report {
    std::string state;
    std::vector<Algorithm> candidates;
    std::vector<double> seconds;
    Algorithm settled = Algorithm::kAuto;
    int exploreCalls = 0;  ///< how many calls one exploration takes in all
    int recheckGap = 0;    ///< calls a switch runs before the second exploration (decided
                           ///< with the switch; before it, kRecheckGap explorations' calls)
    double period = 0.0;   ///< a switch's common call period, seconds (0: not agreed yet)
    bool saved = false;    ///< seeded from a saved decision, not explored in this process
    int placements = 1;    ///< placements an exploration times per candidate (2: both)
    /// A split key: the algorithm of calls in place on every rank, agreed per call (kAuto:
    /// `settled` runs whatever the placements).
    Algorithm inPlace = Algorithm::kAuto;
  };
  /// `seconds`: one figure per candidate, of the placement `inPlace` names where the
  /// exploration timed both.
  Report report(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                bool inPlace = false) const;

 private:
  struct Entry {
    std::vector<Algorithm> cands;
    std::vector<std::vector<double>> samples;
    int calls = 0;
    int timed = kTimed;        ///< timedCalls() of the key's size
    int warm = kWarm;          ///< warmCalls() of the key's size
    int round = 0;             ///< 0: the first exploration, 1: the re-check of a switch
    bool provisional = false;  ///< settled is a switch not yet re-checked
    int sinceSettle = 0;       ///< calls run provisionally
    int gap = 0;               ///< calls to run provisionally before the re-check (0: not
                               ///< agreed yet; kRecheckGap explorations' calls bound it)
    double period = 0.0;       ///< the switch's common call period (0: not agreed yet)
    int arrivals = 0;          ///< the switch's calls timed for the period so far
    std::chrono::steady_clock::time_point firstArrival;
    Algorithm settled = Algorithm::kAuto;
    std::vector<double> seconds;
    bool saved = false;  ///< seeded (seed())
    bool seen = false;   ///< upfront: the first call ran (the model's choice)
    int placements = 1;  ///< placements(): 2, each candidate is timed out of place and in place
    Algorithm inPlace = Algorithm::kAuto;  ///< split: the algorithm where all are in place
    bool lastAllInPlace = false;           ///< split: what the last agreement found
    int sameInARow = 0;                    ///< split: agreements in a row that found it
  };
  Entry& entryLocked(const Key& key, const std::shared_ptr<const MachineProfile>& profile);
  Step stepLocked(Entry& e);
  void arriveLocked(Entry& e, Step& s);
  int exploreCallsLocked(const Entry& e) const;

  mutable std::mutex mu_;
  bool enabled_ = true;
  bool upfront_ = false;  ///< the selector's default is on (FOURD_TUNE unset)
  std::shared_ptr<const MachineProfile> profile_;  ///< the profile the entries were made with
  std::map<Key, Entry> entries_;
};

}  // namespace fourd::detail
