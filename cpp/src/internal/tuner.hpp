#pragma once
// Tuning in use: `auto` checks the cost model's choice against its close rivals on the calls
// themselves (docs/algorithms.md, "Tuning in use").
//
// The model's parameters come from a calibration of a few seconds on a busy machine; two
// calibrations in a row differ by a median 1.2x and up to 1.5x per point, so where two
// algorithms are predicted within that spread of each other the model picks between them by
// chance (on the emulated 2 x 3 cluster, 1 MiB all_reduce: predicted ring 5.4 ms, hierarchical
// 5.9 ms; ran 5.4-5.9 ms and 3.7-4.0 ms). Training issues the same collectives at the same
// sizes every step, so the calls can settle it: for each (collective, bytes, dtype, placement)
// the first calls run the shortlist (the model's choice and the algorithms predicted within
// kWindow of it, every supported one below kSmallBytes, kMaxCandidates at most) in two
// passes, the second in reverse order. In each pass a candidate gets untimed calls, then a
// barrier, then timed calls back to back:
// - untimed calls: kWarm, and from kWarmFrom as many as carry kWarmBytes (up to kMaxWarm):
//   after another algorithm, ring and rhd took 5-7 calls of 16 MiB to reach their steady
//   time (2 ranks of the VM: the first 1.25-1.65x, the third 1.15x), shm one; with two, the
//   timed calls read rhd 1.17-1.45x its steady time at 16 MiB in a recorded run, and `auto`
//   ran ring at 1.16x rhd's;
// - back to back, as the benchmark and training run them: a barrier before every timed call
//   timed rhd 1.3x faster than it ran in a row of calls;
// - as many as carry kTimedBytes (kTimed to kMaxTimed): the medians of 3 calls of 1 MiB on 4
//   ranks ranked shm, ring and rhd, within 10% of each other, the other way round from the
//   benchmark;
// - two passes, a candidate's figure being the better of its passes' medians: the first calls
//   of a size, and the first after another algorithm, ran up to 1.7x slow (4 ranks of the
//   2-core VM: rhd, first in a single pass, read 3.7 ms at 4 MiB bfloat16 and lost to ring at
//   2.5 ms; it then ran 2.2 ms against ring's 2.5).
// Tuning covers every size: below 256 KiB the model alone ran flat at 1.4x rhd's time (2 ranks,
// 4 KiB all_reduce) and ring at 1.8-1.9x flat's and rhd's (4 ranks, 1-4 KiB out of place),
// measured in 11 rounds. There calls take a few microseconds (2 ranks) to tens (4 ranks on
// 2 cores), and a short window times the scheduler more than the algorithm: with 2 untimed and
// 32 timed calls, 4 ranks timed rhd at 43 us against ring's 25 (1 KiB), then ran them at 16 and
// 29 us. So below kSmallBytes a candidate gets kSmallWarm untimed and kSmallTimed timed calls,
// and the shortlist holds every supported algorithm (the model's latency terms are the least
// sure: at 1 KiB on 2 ranks it priced rhd over 2x flat, which rhd beat by 1.1x).
// With a core per rank that settled small calls well (2 ranks: the choice within 10% of the
// fastest in 30 of 30 cells); with 4 ranks on 2 cores it stays a coin toss (bench/README.md).
// The shortlist is wide: kWindow is the calibration's own pruning threshold (what calibration
// stops timing as out of the race, tuning does not try either), and kMaxCandidates lets every
// algorithm of a one-node group in (flat, ring, rhd, shm). At 1.5x and three, a recorded 4-rank
// 4 MiB in-place all_reduce left shm out (a calibration priced it just over 1.5x flat's time)
// and ran ring, at 1.12x shm's time.
// After the last call, one all-reduce (MAX) of every candidate's figure over the group, and
// from then on every call runs the fastest (the model's choice unless another was faster by
// more than 1 - kSwitch).
// A switch away from the model's choice is confirmed: the new choice runs provisionally for
// kRecheckGap times the exploration's calls, then the shortlist is explored again, and each
// candidate's figure is the lower of its two (a passing slowdown only adds time, so the lower
// is the nearer to the candidate's own speed). On the emulated 2 x 2 cluster, the first row
// of a run explored flat at 2.4x its steady time (1 MiB in place, right after start-up) and
// `auto` switched to ring, which ran 1.5x hierarchical's time for the rest of the run.
//
// Every rank must make the same choice for the same call, so nothing here depends on a rank's
// own clock except the times that the all-reduce makes common: the schedule depends only on
// how many calls of a key this communicator has run (in issue order on every rank), and the
// profile that prices the shortlist is the one current when the call was issued.

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "fourd/cost_model.hpp"

namespace fourd::detail {

class Tuner {
 public:
  static constexpr int kWarm = 2;             ///< untimed calls of a candidate in each pass, at least
  static constexpr int kMaxWarm = 6;          ///< ... and at most
  static constexpr size_t kWarmBytes = size_t(96) << 20;  ///< what they carry from kWarmFrom
  static constexpr size_t kWarmFrom = size_t(4) << 20;    ///< below: kWarm
  static constexpr int kTimed = 3;            ///< then timed calls (their median counts), at least
  static constexpr int kMaxTimed = 12;        ///< ... and at most
  static constexpr size_t kTimedBytes = size_t(12) << 20;  ///< what the timed calls carry
  static constexpr int kPasses = 2;           ///< the second in reverse order
  static constexpr int kMaxCandidates = 4;    ///< the model's choice and up to 3 rivals
  static constexpr double kWindow = 2.0;      ///< rivals: predicted within this of the choice
  static constexpr double kSwitch = 0.95;     ///< leave the model's choice only below this
  static constexpr size_t kSmallBytes = 256 << 10;  ///< below: latency-bound calls ...
  static constexpr int kSmallWarm = 16;       ///< ... get this many untimed calls,
  static constexpr int kSmallTimed = 64;      ///< ... this many timed ones, and every
                                              ///< supported algorithm on the shortlist
  static constexpr int kRecheckGap = 4;       ///< a switch runs this many explorations' calls,
                                              ///< then the shortlist is explored again

  using Key = std::tuple<int, size_t, int, bool>;  ///< collective, bytes, dtype, in place

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

  /// One call's part in the tuning of its key.
  struct Step {
    Algorithm algorithm = Algorithm::kFlat;
    bool timed = false;  ///< pass the call's time to record()
    bool barrier = false;  ///< the first timed call of a candidate: start from a barrier
    bool last = false;     ///< the last timed call of the exploration
    int candidate = -1;
  };

  /// Whether tuning is on (FOURD_TUNE unset or on).
  bool enabled() const noexcept { return enabled_; }
  /// Whether a call of `nbytes` on a group of `groupSize` is tuned: tuning on, a call that
  /// moves data, more than one rank (broadcast never is: it always runs the library's own).
  bool tunes(size_t nbytes, int groupSize) const noexcept {
    return enabled_ && nbytes > 0 && groupSize > 1;
  }
  void setEnabled(bool on) noexcept { enabled_ = on; }

  /// The algorithm for the next call of `key` priced by `profile`. `candidates` computes the
  /// shortlist the first time the key is seen with this profile.
  template <class F>
  Step next(const Key& key, const std::shared_ptr<const MachineProfile>& profile, F&& candidates) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entryLocked(key, profile);
    if (e.cands.empty()) e.cands = candidates();
    return stepLocked(e);
  }
  /// Records a timed call's seconds. Returns every candidate's local figure (the better of its
  /// passes' medians) when this call was the key's last timed one (the caller makes them
  /// common, then calls settle()).
  std::vector<double> record(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
                             const Step& step, double seconds);
  /// Fixes the key's algorithm from the group's common times (one per candidate).
  void settle(const Key& key, const std::shared_ptr<const MachineProfile>& profile,
              const std::vector<double>& seconds);

  /// What is known of `key`: "exploring", "provisional" (a switch, running until the second
  /// exploration), "rechecking" (that exploration) or "settled" (with the shortlist and, from
  /// "provisional", the common times), "single" (no rival on the shortlist: the model's choice
  /// runs), or nothing yet (`state` empty: no call of it has run with the current profile).
  struct Report {
    std::string state;
    std::vector<Algorithm> candidates;
    std::vector<double> seconds;
    Algorithm settled = Algorithm::kAuto;
    int exploreCalls = 0;  ///< how many calls one exploration takes in all
    int recheckGap = 0;    ///< calls a switch runs before the second exploration
  };
  Report report(const Key& key, const std::shared_ptr<const MachineProfile>& profile) const;

 private:
  struct Entry {
    std::vector<Algorithm> cands;
    std::vector<std::vector<double>> samples;
    int calls = 0;
    int timed = kTimed;  ///< timedCalls() of the key's size
    int warm = kWarm;    ///< warmCalls() of the key's size
    int round = 0;       ///< 0: the first exploration, 1: the re-check of a switch
    bool provisional = false;  ///< settled is a switch not yet re-checked
    int sinceSettle = 0;       ///< calls run provisionally
    Algorithm settled = Algorithm::kAuto;
    std::vector<double> seconds;
  };
  Entry& entryLocked(const Key& key, const std::shared_ptr<const MachineProfile>& profile);
  Step stepLocked(Entry& e);

  mutable std::mutex mu_;
  bool enabled_ = true;
  std::shared_ptr<const MachineProfile> profile_;  ///< the profile the entries were made with
  std::map<Key, Entry> entries_;
};

}  // namespace fourd::detail
