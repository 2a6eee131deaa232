// auto's tuning in use (internal/tuner.hpp): the shortlist, the decision, and the schedule every
// rank steps through alike.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "fourd/cost_model.hpp"
#include "internal/tuner.hpp"

using namespace fourd;
using fourd::detail::Tuner;

namespace {

Prediction pred(Algorithm a, double s, bool ok = true) {
  Prediction p;
  p.algorithm = a;
  p.seconds = ok ? s : 1.0 / 0.0;
  p.supported = ok;
  return p;
}

const Tuner::Key kKey{0, size_t(1) << 20, 0};

}  // namespace

TEST(Tuner, ShortlistIsTheChoiceThenRivalsWithinTheWindowByPrediction) {
  const std::vector<Prediction> preds = {
      pred(Algorithm::kFlat, 4.1), pred(Algorithm::kRing, 3.9), pred(Algorithm::kRhd, 1.2),
      pred(Algorithm::kHierarchical, 1.0, false), pred(Algorithm::kShm, 1.0)};
  const auto s = Tuner::shortlist(preds, Algorithm::kShm, size_t(1) << 20);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], Algorithm::kShm);
  EXPECT_EQ(s[1], Algorithm::kRhd);   // 1.2x
  EXPECT_EQ(s[2], Algorithm::kRing);  // 3.9x; flat (4.1x) and unsupported hierarchical are out
}

TEST(Tuner, ShortlistKeepsAtMostFourAndIsAloneWithoutRivals) {
  const std::vector<Prediction> close = {
      pred(Algorithm::kFlat, 1.0), pred(Algorithm::kRing, 1.0), pred(Algorithm::kRhd, 1.0),
      pred(Algorithm::kHierarchical, 1.0), pred(Algorithm::kShm, 1.0)};
  const auto s = Tuner::shortlist(close, Algorithm::kRhd, size_t(1) << 20);
  ASSERT_EQ(static_cast<int>(s.size()), Tuner::kMaxCandidates);
  EXPECT_EQ(s[0], Algorithm::kRhd);
  EXPECT_EQ(s[1], Algorithm::kFlat);  // ties keep enum order: the same on every rank
  EXPECT_EQ(s[2], Algorithm::kRing);
  EXPECT_EQ(s[3], Algorithm::kHierarchical);  // shm, the fifth, is left out
  const std::vector<Prediction> far = {pred(Algorithm::kFlat, 1.0), pred(Algorithm::kRing, 4.1)};
  EXPECT_EQ(Tuner::shortlist(far, Algorithm::kFlat, size_t(1) << 20),
            std::vector<Algorithm>{Algorithm::kFlat});
  // Below 256 KiB every supported algorithm is tried, whatever the model predicts.
  const std::vector<Prediction> small = {pred(Algorithm::kFlat, 1.0), pred(Algorithm::kRing, 9.0),
                                         pred(Algorithm::kRhd, 4.5),
                                         pred(Algorithm::kHierarchical, 1.0, false)};
  EXPECT_EQ(Tuner::shortlist(small, Algorithm::kFlat, 4096),
            (std::vector<Algorithm>{Algorithm::kFlat, Algorithm::kRhd, Algorithm::kRing}));
  EXPECT_EQ(Tuner::shortlist(small, Algorithm::kFlat, size_t(256) << 10),
            std::vector<Algorithm>{Algorithm::kFlat});
}

TEST(Tuner, TimedCallsCarryTwelveMiBBetweenThreeAndTwelveCallsAndAreMoreForSmallCalls) {
  EXPECT_EQ(Tuner::timedCalls(1), Tuner::kSmallTimed);
  EXPECT_EQ(Tuner::timedCalls(4096), Tuner::kSmallTimed);
  EXPECT_EQ(Tuner::timedCalls((size_t(256) << 10) - 1), Tuner::kSmallTimed);
  EXPECT_EQ(Tuner::timedCalls(size_t(256) << 10), 12);
  EXPECT_EQ(Tuner::timedCalls(size_t(1) << 20), 12);
  EXPECT_EQ(Tuner::timedCalls((size_t(1) << 20) + 1), 12);
  EXPECT_EQ(Tuner::timedCalls(size_t(2) << 20), 6);
  EXPECT_EQ(Tuner::timedCalls(size_t(3) << 20), 4);
  EXPECT_EQ(Tuner::timedCalls(size_t(4) << 20), 3);
  EXPECT_EQ(Tuner::timedCalls(size_t(64) << 20), 3);
}

TEST(Tuner, EveryCallThatMovesDataIsTunedOnGroupsOfTwoOrMore) {
  Tuner t;
  EXPECT_TRUE(t.tunes(1, 2));
  EXPECT_TRUE(t.tunes(4096, 8));
  EXPECT_TRUE(t.tunes(size_t(1) << 30, 2));
  EXPECT_FALSE(t.tunes(0, 2));     // nothing to time
  EXPECT_FALSE(t.tunes(4096, 1));  // nothing to choose
  t.setEnabled(false);             // FOURD_TUNE=0
  EXPECT_FALSE(t.tunes(4096, 2));
}

TEST(Tuner, WarmCallsCarryNinetySixMiBFromFourMiBBetweenTwoAndSix) {
  EXPECT_EQ(Tuner::warmCalls(1), Tuner::kSmallWarm);  // below 256 KiB: more
  EXPECT_EQ(Tuner::warmCalls((size_t(256) << 10) - 1), Tuner::kSmallWarm);
  EXPECT_EQ(Tuner::warmCalls(size_t(256) << 10), 2);
  EXPECT_EQ(Tuner::warmCalls((size_t(4) << 20) - 1), 2);  // below 4 MiB: two
  EXPECT_EQ(Tuner::warmCalls(size_t(4) << 20), 6);
  EXPECT_EQ(Tuner::warmCalls(size_t(16) << 20), 6);
  EXPECT_EQ(Tuner::warmCalls(size_t(20) << 20), 5);
  EXPECT_EQ(Tuner::warmCalls(size_t(32) << 20), 3);
  EXPECT_EQ(Tuner::warmCalls(size_t(64) << 20), 2);
  EXPECT_EQ(Tuner::warmCalls(size_t(1) << 30), 2);
}

TEST(Tuner, LargeCallsWarmLongerBeforeTheBarrierAndTheTimedCalls) {
  Tuner t;
  auto prof = std::make_shared<const MachineProfile>();
  const Tuner::Key big{0, size_t(16) << 20, 0};
  auto make = [] { return std::vector<Algorithm>{Algorithm::kRing, Algorithm::kRhd}; };
  const int warm = Tuner::warmCalls(std::get<1>(big)), timed = Tuner::timedCalls(std::get<1>(big));
  ASSERT_EQ(warm, 6);
  ASSERT_EQ(timed, 3);
  for (int i = 0; i < warm + timed; ++i) {
    const auto step = t.next(big, prof, make);
    EXPECT_EQ(step.algorithm, Algorithm::kRing);
    EXPECT_EQ(step.timed, i >= warm) << i;
    EXPECT_EQ(step.barrier, i == warm) << i;
  }
  EXPECT_EQ(t.next(big, prof, make).algorithm, Algorithm::kRhd);
  EXPECT_EQ(t.report(big, prof).exploreCalls, 2 * 2 * (6 + 3));
}

TEST(Tuner, DecideLeavesTheModelsChoiceOnlyForAClearGain) {
  EXPECT_EQ(Tuner::decide({1.0, 0.97, 1.2}), 0u);  // 3% faster: noise, the model's stays
  EXPECT_EQ(Tuner::decide({1.0, 0.90, 0.94}), 1u);
  EXPECT_EQ(Tuner::decide({1.0, 0.94, 0.60}), 2u);
  EXPECT_EQ(Tuner::decide({0.5, 0.9}), 0u);
  EXPECT_EQ(Tuner::decide({}), 0u);
}

TEST(Tuner, ScheduleTriesEachCandidateInTwoPassesThenRunsTheFastest) {
  Tuner t;
  auto prof = std::make_shared<const MachineProfile>();
  const std::vector<Algorithm> cands = {Algorithm::kRing, Algorithm::kRhd, Algorithm::kShm};
  int made = 0;
  auto make = [&] {
    ++made;
    return cands;
  };
  const int timed = Tuner::timedCalls(std::get<1>(kKey));
  ASSERT_EQ(timed, 12);  // 1 MiB calls: 12 MiB of timed calls
  const int warm = Tuner::warmCalls(std::get<1>(kKey));
  ASSERT_EQ(warm, Tuner::kWarm);  // below 4 MiB: two
  const int per = warm + timed;
  ASSERT_EQ(Tuner::kPasses, 2);
  // Pass 1 times ring slow (a first call of the size); pass 2 in reverse order times it fast.
  const double pass1[] = {9.0, 1.0, 2.0}, pass2[] = {3.0, 1.5, 2.5};
  const int order[] = {0, 1, 2, 2, 1, 0};
  for (int b = 0; b < 6; ++b) {
    const int c = order[b];
    for (int i = 0; i < per; ++i) {
      EXPECT_EQ(t.report(kKey, prof).state, b == 0 && i == 0 ? "" : "exploring");
      const auto step = t.next(kKey, prof, make);
      EXPECT_EQ(step.algorithm, cands[c]) << "block " << b << " call " << i;
      EXPECT_EQ(step.candidate, c);
      EXPECT_EQ(step.timed, i >= warm);
      EXPECT_EQ(step.barrier, i == warm);
      EXPECT_EQ(step.last, b == 5 && i == per - 1);
      if (!step.timed) continue;
      const double base = b < 3 ? pass1[c] : pass2[c];
      const auto got = t.record(kKey, prof, step, base + 0.1 * (i - warm));
      if (!step.last) {
        EXPECT_TRUE(got.empty());
        continue;
      }
      // The last timed call hands back every timed call's time, candidate by candidate in
      // call order (the caller makes them the group's MAX, call by call) ...
      ASSERT_EQ(got.size(), 3u * Tuner::kPasses * timed);
      for (int k = 0; k < 3; ++k) {
        for (int j = 0; j < timed; ++j) {
          EXPECT_DOUBLE_EQ(got[(k * 2 + 0) * timed + j], pass1[k] + 0.1 * j);
          EXPECT_DOUBLE_EQ(got[(k * 2 + 1) * timed + j], pass2[k] + 0.1 * j);
        }
      }
      const auto fig = Tuner::figures(got, 3);
      ASSERT_EQ(fig.size(), 3u);     // ... whose figures are
      for (int k = 0; k < 3; ++k) {  // the better pass's median (the upper middle of 12)
        EXPECT_DOUBLE_EQ(fig[k], std::min(pass1[k], pass2[k]) + 0.1 * (timed / 2));
      }
      t.settleSamples(kKey, prof, got);
    }
  }
  EXPECT_EQ(made, 1);
  const auto r = t.report(kKey, prof);
  EXPECT_EQ(r.state, "provisional");      // rhd over ring, the model's choice: re-checked later
  EXPECT_EQ(r.settled, Algorithm::kRhd);  // 1.1 against ring's 3.1 and shm's 2.1
  EXPECT_EQ(r.candidates, cands);
  ASSERT_EQ(r.seconds.size(), 3u);
  for (int i = 0; i < 5; ++i) {
    const auto step = t.next(kKey, prof, make);
    EXPECT_EQ(step.algorithm, Algorithm::kRhd);
    EXPECT_FALSE(step.timed);
    EXPECT_FALSE(step.barrier);
  }
  // Another key is tuned on its own; a new profile starts every key again.
  const Tuner::Key other{0, size_t(1) << 22, 0};
  EXPECT_EQ(t.next(other, prof, make).algorithm, Algorithm::kRing);
  auto prof2 = std::make_shared<const MachineProfile>();
  EXPECT_EQ(t.report(kKey, prof2).state, "");
  EXPECT_EQ(t.next(kKey, prof2, make).algorithm, Algorithm::kRing);
  EXPECT_EQ(t.report(kKey, prof2).state, "exploring");
  EXPECT_EQ(t.report(kKey, prof).state, "");  // the old profile's entries are gone
}

TEST(Tuner, ASwitchRunsProvisionallyThenIsReCheckedOnTheLowerFigures) {
  Tuner t;
  auto prof = std::make_shared<const MachineProfile>();
  const Tuner::Key big{0, size_t(64) << 20, 0};  // 2 warm + 3 timed calls
  auto make = [] { return std::vector<Algorithm>{Algorithm::kFlat, Algorithm::kRing}; };
  // Runs one exploration of `tu`; the timed calls of candidate c take times[c]. Returns its
  // calls.
  auto explore = [&](Tuner& tu, const double* times) {
    int n = 0;
    for (;; ++n) {
      const auto step = tu.next(big, prof, make);
      if (step.candidate < 0) return n;  // not exploring
      if (!step.timed) continue;
      const auto got = tu.record(big, prof, step, times[step.candidate]);
      if (step.last) {
        tu.settleSamples(big, prof, got);
        return n + 1;
      }
    }
  };
  const int calls = 2 * 2 * (2 + 3);
  // First exploration: flat (the model's) read slow, as right after start-up: a switch.
  const double slowFlat[] = {2.4, 1.5};
  ASSERT_EQ(explore(t, slowFlat), calls);
  auto r = t.report(big, prof);
  EXPECT_EQ(r.state, "provisional");
  EXPECT_EQ(r.settled, Algorithm::kRing);
  EXPECT_EQ(r.recheckGap, Tuner::kRecheckGap * calls);
  for (int i = 0; i < r.recheckGap; ++i) {  // ring runs, untimed, until the re-check
    const auto step = t.next(big, prof, make);
    EXPECT_EQ(step.algorithm, Algorithm::kRing);
    EXPECT_FALSE(step.timed);
  }
  EXPECT_EQ(t.report(big, prof).state, "provisional");
  // The re-check: flat at its own speed now; each figure is the lower of the two.
  const double steady[] = {1.0, 1.6};
  EXPECT_EQ(t.next(big, prof, make).algorithm, Algorithm::kFlat);  // its first call
  EXPECT_EQ(t.report(big, prof).state, "rechecking");
  ASSERT_EQ(explore(t, steady), calls - 1);
  r = t.report(big, prof);
  EXPECT_EQ(r.state, "settled");
  EXPECT_EQ(r.settled, Algorithm::kFlat);
  EXPECT_EQ(r.seconds, (std::vector<double>{1.0, 1.5}));
  for (int i = 0; i < 3 * calls; ++i)
    EXPECT_EQ(t.next(big, prof, make).algorithm, Algorithm::kFlat);
  EXPECT_EQ(t.report(big, prof).state, "settled");
  // Keeping the model's choice is final at once.
  Tuner u;
  const double flatFast[] = {1.0, 1.2};
  ASSERT_EQ(explore(u, flatFast), calls);
  EXPECT_EQ(u.report(big, prof).state, "settled");
  EXPECT_EQ(u.report(big, prof).settled, Algorithm::kFlat);
}

TEST(Tuner, ReCheckGapIsTheExplorationsCallsOrFewerThatSpanTheReCheckTime) {
  const int calls = 20, most = Tuner::kRecheckGap * calls, least = Tuner::kPeriodCalls + 1;
  EXPECT_EQ(Tuner::recheckGap(calls, 0.0), most);    // period unknown
  EXPECT_EQ(Tuner::recheckGap(calls, 1e-4), most);   // fast calls: the count bounds it
  EXPECT_EQ(Tuner::recheckGap(calls, 0.5), 20);      // 10 s at 0.5 s a call
  EXPECT_EQ(Tuner::recheckGap(calls, 0.3), 34);      // rounded up
  EXPECT_EQ(Tuner::recheckGap(calls, 60.0), least);  // the calls that measured the period
  EXPECT_EQ(Tuner::recheckGap(calls, 1.0 / 0.0), most);
}

TEST(Tuner, ASwitchOfASlowlyCalledKeyIsReCheckedAfterTheReCheckTimeOfCalls) {
  Tuner t;
  t.setUpfront(true);
  auto prof = std::make_shared<const MachineProfile>();
  const Tuner::Key big{0, size_t(64) << 20, 0};  // 2 warm + 3 timed calls
  auto make = [] { return std::vector<Algorithm>{Algorithm::kFlat, Algorithm::kRing}; };
  const int most = Tuner::kRecheckGap * 2 * 2 * (2 + 3);
  // The program's first call, then its second: the exploration runs inside it (its further
  // runs are no arrivals) and switches to ring.
  EXPECT_LT(t.next(big, prof, make).candidate, 0);  // seen once
  for (auto step = t.next(big, prof, make); step.candidate >= 0;
       step = t.next(big, prof, make, false)) {
    if (!step.timed) continue;
    const auto got = t.record(big, prof, step, step.candidate == 0 ? 2.4 : 1.5);
    if (step.last) t.settleSamples(big, prof, got);
  }
  auto r = t.report(big, prof);
  ASSERT_EQ(r.state, "provisional");
  // Not agreed yet: the count bounds it (upfront, both placements: twice the inline count).
  EXPECT_EQ(r.recheckGap, 2 * most);
  EXPECT_EQ(r.period, 0.0);
  // The program's next calls come 20 ms apart: kPeriodCalls intervals, then the agreement.
  Tuner::Step step;
  for (int i = 0; i <= Tuner::kPeriodCalls; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    step = t.next(big, prof, make);
    EXPECT_EQ(step.algorithm, Algorithm::kRing);
    EXPECT_EQ(step.agree, i == Tuner::kPeriodCalls) << i;
  }
  EXPECT_GE(step.period, 0.02);
  EXPECT_LT(step.period, 5.0);
  // The group's common figure (the MAX): 2 s a call, so 5 calls span 10 s; 6 have run (the
  // deciding call and the 5 timed ones), so the next call re-checks.
  t.agreePeriod(big, prof, 2.0);
  r = t.report(big, prof);
  EXPECT_EQ(r.state, "provisional");
  EXPECT_EQ(r.period, 2.0);
  EXPECT_EQ(r.recheckGap, 5);
  EXPECT_EQ(r.seconds, (std::vector<double>{2.4, 1.5}));
  ASSERT_EQ(t.choices(prof).size(), 1u);
  EXPECT_EQ(t.choices(prof)[0].gap, 5);  // saved with the switch
  t.agreePeriod(big, prof, 0.001);       // agreed once: a second agreement changes nothing
  EXPECT_EQ(t.report(big, prof).recheckGap, 5);
  EXPECT_EQ(t.next(big, prof, make).candidate, 0);  // the re-check, all inside this call
  EXPECT_EQ(t.report(big, prof).state, "rechecking");
  // With 0.5 s a call: 20 calls before the re-check.
  Tuner u;
  u.seedProvisional(big, prof, make(), Algorithm::kRing, {2.4, 1.5}, 0);
  EXPECT_EQ(u.report(big, prof).recheckGap, most);
  for (int i = 0; i <= Tuner::kPeriodCalls; ++i) step = u.next(big, prof, make);
  ASSERT_TRUE(step.agree);
  u.agreePeriod(big, prof, 0.5);
  EXPECT_EQ(u.report(big, prof).recheckGap, 20);
  for (int i = Tuner::kPeriodCalls + 1; i < 20; ++i) {
    EXPECT_EQ(u.next(big, prof, make).algorithm, Algorithm::kRing);
  }
  EXPECT_EQ(u.next(big, prof, make).candidate, 0);
  // A seeded switch keeps the gap it was saved with, and agrees nothing.
  Tuner v;
  v.seedProvisional(big, prof, make(), Algorithm::kRing, {2.4, 1.5}, 2, 7);
  EXPECT_EQ(v.report(big, prof).recheckGap, 7);
  for (int i = 2; i < 7; ++i) {
    step = v.next(big, prof, make);
    EXPECT_EQ(step.algorithm, Algorithm::kRing);
    EXPECT_FALSE(step.agree);
  }
  EXPECT_EQ(v.next(big, prof, make).candidate, 0);
}

TEST(Tuner, ASingleCandidateRunsAtOnceUntimed) {
  Tuner t;
  auto prof = std::make_shared<const MachineProfile>();
  for (int i = 0; i < 3; ++i) {
    const auto step =
        t.next(kKey, prof, [] { return std::vector<Algorithm>{Algorithm::kHierarchical}; });
    EXPECT_EQ(step.algorithm, Algorithm::kHierarchical);
    EXPECT_FALSE(step.timed);
  }
  EXPECT_EQ(t.report(kKey, prof).state, "single");
}

TEST(Tuner, SettleIgnoresAStaleProfileOrAWrongCount) {
  Tuner t;
  auto prof = std::make_shared<const MachineProfile>();
  auto make = [] { return std::vector<Algorithm>{Algorithm::kRing, Algorithm::kRhd}; };
  t.next(kKey, prof, make);
  t.settle(kKey, prof, {1.0});  // one time for two candidates
  EXPECT_EQ(t.report(kKey, prof).state, "exploring");
  t.settle(kKey, std::make_shared<const MachineProfile>(), {2.0, 1.0});
  EXPECT_EQ(t.report(kKey, prof).state, "exploring");
  t.settle(kKey, prof, {2.0, 1.0});
  EXPECT_EQ(t.report(kKey, prof).settled, Algorithm::kRhd);
}

TEST(Tuner, DecisionsAreSavedAndASeedRunsAtOnceUnderItsProfileOnly) {
  Tuner t;
  auto prof = std::make_shared<const MachineProfile>();
  auto make = [] { return std::vector<Algorithm>{Algorithm::kRing, Algorithm::kRhd}; };
  const Tuner::Key other{1, 4096, 0};
  EXPECT_TRUE(t.choices(prof).empty());
  t.next(kKey, prof, make);
  EXPECT_TRUE(t.choices(prof).empty());  // exploring: nothing final
  t.settle(kKey, prof, {1.0, 1.2});      // the model's choice kept: final
  t.next(other, prof, [] { return std::vector<Algorithm>{Algorithm::kFlat}; });  // single
  auto saved = t.choices(prof);
  ASSERT_EQ(saved.size(), 1u);  // a single candidate is no decision: not saved
  EXPECT_EQ(saved[0].key, kKey);
  EXPECT_EQ(saved[0].algorithm, Algorithm::kRing);
  EXPECT_FALSE(saved[0].provisional);
  // A switch is saved as provisional, with its calls, shortlist and figures.
  Tuner u;
  u.next(kKey, prof, make);
  u.settle(kKey, prof, {2.0, 1.0});
  EXPECT_EQ(u.report(kKey, prof).state, "provisional");
  for (int i = 0; i < 7; ++i) u.next(kKey, prof, make);
  const auto p = u.choices(prof);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].provisional);
  EXPECT_EQ(p[0].algorithm, Algorithm::kRhd);
  EXPECT_EQ(p[0].calls, 7);
  EXPECT_EQ(p[0].cands, make());
  EXPECT_EQ(p[0].seconds, (std::vector<double>{2.0, 1.0}));
  // A seed: settled at once, untimed, reported as saved and saved again.
  Tuner s;
  s.seed(other, prof, Algorithm::kRhd);
  const auto r = s.report(other, prof);
  EXPECT_EQ(r.state, "settled");
  EXPECT_TRUE(r.saved);
  EXPECT_EQ(r.settled, Algorithm::kRhd);
  for (int i = 0; i < 3; ++i) {
    const auto step = s.next(other, prof, make);
    EXPECT_EQ(step.algorithm, Algorithm::kRhd);
    EXPECT_FALSE(step.timed);
    EXPECT_LT(step.candidate, 0);
  }
  ASSERT_EQ(s.choices(prof).size(), 1u);
  // Another profile prices the shortlist anew: the seed is gone.
  auto prof2 = std::make_shared<const MachineProfile>();
  EXPECT_TRUE(s.choices(prof2).empty());
  EXPECT_EQ(s.next(other, prof2, make).candidate, 0);
  EXPECT_EQ(s.report(other, prof2).state, "exploring");
}

TEST(Tuner, ASeededSwitchRunsAtOnceAndIsReCheckedWhenItsCallsOverTheRunsReachTheGap) {
  Tuner t;
  auto prof = std::make_shared<const MachineProfile>();
  const Tuner::Key big{0, size_t(64) << 20, 0};  // 2 warm + 3 timed calls
  auto make = [] { return std::vector<Algorithm>{Algorithm::kFlat, Algorithm::kRing}; };
  const int calls = 2 * 2 * (2 + 3), gap = Tuner::kRecheckGap * calls, before = gap - 5;
  // Saved after `before` calls of ring in an earlier run; flat read 2.4, ring 1.5 then.
  t.seedProvisional(big, prof, make(), Algorithm::kRing, {2.4, 1.5}, before);
  auto r = t.report(big, prof);
  EXPECT_EQ(r.state, "provisional");
  EXPECT_TRUE(r.saved);
  EXPECT_EQ(r.settled, Algorithm::kRing);
  EXPECT_EQ(r.candidates, make());
  for (int i = 0; i < 5; ++i) {  // the rest of the gap: ring, untimed
    const auto step = t.next(big, prof, make);
    EXPECT_EQ(step.algorithm, Algorithm::kRing);
    EXPECT_LT(step.candidate, 0);
  }
  ASSERT_EQ(t.choices(prof).size(), 1u);
  EXPECT_EQ(t.choices(prof)[0].calls, gap);
  // The re-check: flat's own speed now (1.0) beats the saved 2.4 and ring's better 1.5.
  auto step = t.next(big, prof, make);
  EXPECT_EQ(step.candidate, 0);
  r = t.report(big, prof);
  EXPECT_EQ(r.state, "rechecking");
  EXPECT_FALSE(r.saved);  // explored in this process from here on
  for (; step.candidate >= 0; step = t.next(big, prof, make)) {
    if (!step.timed) continue;
    const auto got = t.record(big, prof, step, step.candidate == 0 ? 1.0 : 1.6);
    if (step.last) t.settleSamples(big, prof, got);
  }
  r = t.report(big, prof);
  EXPECT_EQ(r.state, "settled");
  EXPECT_EQ(r.settled, Algorithm::kFlat);
  EXPECT_EQ(r.seconds, (std::vector<double>{1.0, 1.5}));  // the lower of the two per candidate
  const auto c = t.choices(prof);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].provisional);  // final now
  EXPECT_EQ(c[0].algorithm, Algorithm::kFlat);
}

TEST(Tuner, UpfrontTheFirstCallRunsTheModelsChoiceAndTheSecondStartsTheExploration) {
  Tuner t;
  t.setUpfront(true);
  auto prof = std::make_shared<const MachineProfile>();
  auto make = [] { return std::vector<Algorithm>{Algorithm::kRing, Algorithm::kRhd}; };
  const auto first = t.next(kKey, prof, make);
  EXPECT_EQ(first.algorithm, Algorithm::kRing);
  EXPECT_LT(first.candidate, 0);
  EXPECT_FALSE(first.timed);
  EXPECT_EQ(t.report(kKey, prof).state, "seen once");
  EXPECT_TRUE(t.choices(prof).empty());
  const auto second = t.next(kKey, prof, make);  // the exploration's first step
  EXPECT_EQ(second.candidate, 0);
  EXPECT_EQ(t.report(kKey, prof).state, "exploring");
  // The rest of the schedule is the inline one: a whole exploration in all.
  int steps = 1;
  for (auto s = second; s.candidate >= 0; s = t.next(kKey, prof, make)) {
    if (s.timed) {
      const auto got = t.record(kKey, prof, s, s.candidate == 0 ? 1.0 : 2.0);
      if (s.last) t.settleSamples(kKey, prof, got);
    }
    ++steps;
  }
  EXPECT_EQ(steps - 1, t.report(kKey, prof).exploreCalls);
  EXPECT_EQ(t.report(kKey, prof).state, "settled");
  EXPECT_EQ(t.report(kKey, prof).settled, Algorithm::kRing);
}

TEST(Tuner, UpfrontFromSmallBytesTheExplorationTimesEachCandidateOutOfPlaceThenInPlace) {
  Tuner t;
  t.setUpfront(true);
  auto prof = std::make_shared<const MachineProfile>();
  const std::vector<Algorithm> cands = {Algorithm::kRing, Algorithm::kRhd};
  auto make = [&] { return cands; };
  EXPECT_EQ(t.placements(Tuner::kSmallBytes), 2);
  EXPECT_EQ(t.placements(Tuner::kSmallBytes - 1), 1);  // small calls: the call's own
  t.next(kKey, prof, make);                            // seen once
  const int per = Tuner::warmCalls(std::get<1>(kKey)) + Tuner::timedCalls(std::get<1>(kKey));
  // Two passes over (ring out, ring in, rhd out, rhd in), the second in reverse order.
  const int order[] = {0, 1, 2, 3, 3, 2, 1, 0};
  int steps = 0;
  for (int b = 0; b < 8; ++b) {
    for (int i = 0; i < per; ++i, ++steps) {
      const auto s = t.next(kKey, prof, make, false);
      ASSERT_EQ(s.candidate, order[b]) << "block " << b << " call " << i;
      EXPECT_EQ(s.algorithm, cands[order[b] / 2]);
      EXPECT_TRUE(s.placements2);
      EXPECT_EQ(s.trialInPlace, order[b] % 2 == 1);
      if (!s.timed) continue;
      const auto got = t.record(kKey, prof, s, 1.0);
      if (s.last) {
        EXPECT_EQ(got.size(), 4u * Tuner::kPasses * Tuner::timedCalls(std::get<1>(kKey)));
        EXPECT_EQ(Tuner::figures(got, 4).size(), 4u);
      }
    }
  }
  EXPECT_EQ(steps, t.report(kKey, prof).exploreCalls);
  EXPECT_EQ(t.report(kKey, prof).placements, 2);
  // Inline, one placement: the call's own.
  Tuner inl;
  inl.next(kKey, prof, make);
  EXPECT_FALSE(inl.next(kKey, prof, make).placements2);
  EXPECT_EQ(inl.report(kKey, prof).placements, 1);
}

namespace {

// A tuner whose key kKey has explored ring (the model's choice) and rhd in both placements,
// settled on `figures` (ring out, ring in, rhd out, rhd in) with `placing`.
Tuner::Report settledOn(Tuner& t, const std::shared_ptr<const MachineProfile>& prof,
                        std::vector<double> figures, Tuner::Placing placing) {
  t.setUpfront(true);
  auto make = [] { return std::vector<Algorithm>{Algorithm::kRing, Algorithm::kRhd}; };
  t.next(kKey, prof, make);
  t.next(kKey, prof, make);  // exploring
  t.settle(kKey, prof, figures, placing);
  return t.report(kKey, prof);
}

}  // namespace

TEST(Tuner, AKeyIsSplitOnlyWhereTheOtherPlacementsWinnerGainsMoreThanItsAgreementsCost) {
  auto prof = std::make_shared<const MachineProfile>();
  // ring wins out of place, rhd in place by 1.0 s: agreements of 0.1 s cost less than a third.
  {
    Tuner t;
    const auto r = settledOn(t, prof, {1.0, 2.0, 2.0, 1.0}, {false, 0.1});
    EXPECT_EQ(r.settled, Algorithm::kRing);
    EXPECT_EQ(r.inPlace, Algorithm::kRhd);
    EXPECT_EQ(r.state, "provisional");  // in place it left the model's choice: re-checked
    EXPECT_EQ(r.seconds, (std::vector<double>{1.0, 2.0}));  // out of place
    EXPECT_EQ(t.report(kKey, prof, true).seconds, (std::vector<double>{2.0, 1.0}));
    auto make = [] { return std::vector<Algorithm>{}; };
    const auto s = t.next(kKey, prof, make);
    EXPECT_LT(s.candidate, 0);
    EXPECT_EQ(s.algorithm, Algorithm::kRing);
    EXPECT_EQ(s.inPlace, Algorithm::kRhd);  // agreed per call
    const auto c = t.choices(prof);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].inPlace, Algorithm::kRhd);
    EXPECT_EQ(c[0].seconds.size(), 4u);
  }
  // The same gain against agreements of 0.5 s (3 x 0.5 > 1.0): one algorithm, the winner of
  // the placement the group explored with.
  {
    Tuner t;
    const auto r = settledOn(t, prof, {1.0, 2.0, 2.0, 1.0}, {false, 0.5});
    EXPECT_EQ(r.settled, Algorithm::kRing);
    EXPECT_EQ(r.inPlace, Algorithm::kAuto);
    EXPECT_EQ(r.state, "settled");
  }
  {
    Tuner t;
    const auto r = settledOn(t, prof, {1.0, 2.0, 2.0, 1.0}, {true, 0.5});
    EXPECT_EQ(r.settled, Algorithm::kRhd);  // explored in place on every rank
    EXPECT_EQ(r.inPlace, Algorithm::kAuto);
    EXPECT_EQ(r.state, "provisional");
  }
  // The same winner in both placements, or an unknown agreement cost: never split.
  {
    Tuner t;
    const auto r = settledOn(t, prof, {1.0, 1.0, 2.0, 2.0}, {false, 0.0});
    EXPECT_EQ(r.settled, Algorithm::kRing);
    EXPECT_EQ(r.inPlace, Algorithm::kAuto);
  }
  {
    Tuner t;
    const auto r = settledOn(t, prof, {1.0, 2.0, 2.0, 1.0}, Tuner::Placing{});
    EXPECT_EQ(r.inPlace, Algorithm::kAuto);
  }
  // A wrong count of figures (one per candidate for a two-placement exploration) is ignored.
  {
    Tuner t;
    const auto r = settledOn(t, prof, {1.0, 2.0}, {false, 0.1});
    EXPECT_EQ(r.state, "exploring");
  }
}

TEST(Tuner, ASplitKeyIsSavedAndSeededWithItsInPlaceAlgorithm) {
  auto prof = std::make_shared<const MachineProfile>();
  auto make = [] { return std::vector<Algorithm>{Algorithm::kRing, Algorithm::kRhd}; };
  Tuner t;
  t.seed(kKey, prof, Algorithm::kFlat, Algorithm::kShm);
  auto s = t.next(kKey, prof, make);
  EXPECT_EQ(s.algorithm, Algorithm::kFlat);
  EXPECT_EQ(s.inPlace, Algorithm::kShm);
  EXPECT_EQ(t.choices(prof)[0].inPlace, Algorithm::kShm);
  t.seed(kKey, prof, Algorithm::kFlat, Algorithm::kFlat);  // the same: not split
  EXPECT_EQ(t.next(kKey, prof, make).inPlace, Algorithm::kAuto);
  // A provisional split with two figures per candidate keeps them per placement (upfront) ...
  t.setUpfront(true);
  t.seedProvisional(kKey, prof, {Algorithm::kRing, Algorithm::kRhd}, Algorithm::kRing,
                    {1.0, 2.0, 2.0, 1.0}, 3, 0, Algorithm::kRhd);
  const auto r = t.report(kKey, prof, true);
  EXPECT_EQ(r.state, "provisional");
  EXPECT_EQ(r.placements, 2);
  EXPECT_EQ(r.seconds, (std::vector<double>{2.0, 1.0}));
  s = t.next(kKey, prof, make);
  EXPECT_EQ(s.algorithm, Algorithm::kRing);
  EXPECT_EQ(s.inPlace, Algorithm::kRhd);
  // ... and inline, whose re-check times the call's own placement, the out-of-place ones.
  Tuner inl;
  inl.seedProvisional(kKey, prof, {Algorithm::kRing, Algorithm::kRhd}, Algorithm::kRing,
                      {1.0, 2.0, 2.0, 1.0}, 3, 0, Algorithm::kRhd);
  EXPECT_EQ(inl.report(kKey, prof).placements, 1);
  EXPECT_EQ(inl.report(kKey, prof).seconds, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(inl.next(kKey, prof, make).inPlace, Algorithm::kRhd);
}

TEST(Tuner, ASplitKeyStopsAgreeingOnceItsCallsKeepToOnePlacement) {
  auto prof = std::make_shared<const MachineProfile>();
  auto make = [] { return std::vector<Algorithm>{}; };
  // Placements that change within kAgreeCalls keep the split.
  Tuner t;
  t.seed(kKey, prof, Algorithm::kFlat, Algorithm::kShm);
  for (int i = 0; i < 3 * Tuner::kAgreeCalls; ++i) {
    ASSERT_EQ(t.next(kKey, prof, make).inPlace, Algorithm::kShm) << i;
    t.agreed(kKey, prof, (i / (Tuner::kAgreeCalls - 1)) % 2 == 0);
  }
  // kAgreeCalls in a row in place: the in-place winner from then on, without agreeing.
  for (int i = 0; i < Tuner::kAgreeCalls; ++i) {
    ASSERT_EQ(t.next(kKey, prof, make).inPlace, Algorithm::kShm) << i;
    t.agreed(kKey, prof, true);
  }
  auto s = t.next(kKey, prof, make);
  EXPECT_EQ(s.algorithm, Algorithm::kShm);
  EXPECT_EQ(s.inPlace, Algorithm::kAuto);
  EXPECT_EQ(t.report(kKey, prof).inPlace, Algorithm::kAuto);
  // Out of place (or mixed) every time: the out-of-place winner.
  Tuner u;
  u.seed(kKey, prof, Algorithm::kFlat, Algorithm::kShm);
  for (int i = 0; i < Tuner::kAgreeCalls; ++i) {
    u.next(kKey, prof, make);
    u.agreed(kKey, prof, false);
  }
  s = u.next(kKey, prof, make);
  EXPECT_EQ(s.algorithm, Algorithm::kFlat);
  EXPECT_EQ(s.inPlace, Algorithm::kAuto);
}
