// Backoff (op_context.cpp): how a wait polls. A progress thread on more ranks than cores naps
// once its wait has lasted kBackgroundYield (each nap at least kBackgroundNapNs), and never
// before; a caller's thread, or a progress thread with a core per rank, does not nap that soon
// (they nap only after 65536 polls, which these tests stay below). SpinHint: the spin budget a
// communicator's waits learn on more ranks than cores, which shared-memory flag waits use only
// where flagWaitsLearnSpin says so.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "algorithms/schedule.hpp"
#include "internal/op_context.hpp"

namespace fd = fourd::detail;
using Clock = std::chrono::steady_clock;

namespace {

struct Oversubscribed {
  bool was = fd::oversubscribed();
  explicit Oversubscribed(bool on) { fd::setOversubscribed(on); }
  ~Oversubscribed() { fd::setOversubscribed(was); }  // and learning spins, as by default
};

// Pauses for `span` of wall time, at most `most` times; returns how many.
int pauseFor(fd::Backoff& b, Clock::duration span, int most = 1 << 30) {
  const auto t0 = Clock::now();
  int n = 0;
  while (Clock::now() - t0 < span && n < most) {
    b.pause();
    ++n;
  }
  return n;
}

}  // namespace

TEST(Backoff, AProgressThreadOnMoreRanksThanCoresNapsOnceItsWaitOutlastsTheYieldTime) {
  Oversubscribed over(true);
  unsigned napsEarly = 1, napsLater = 0, napsTimed = 0;
  double timed = 0;
  std::thread t([&] {
    fd::markBackgroundThread();
    EXPECT_TRUE(fd::backgroundThread());
    fd::Backoff b;
    pauseFor(b, fd::Backoff::kBackgroundYield / 2);
    napsEarly = b.naps();  // inside the yield time: none
    pauseFor(b, fd::Backoff::kBackgroundYield);
    napsLater = b.naps();
    const auto t0 = Clock::now();
    for (int i = 0; i < 20; ++i) b.pause();
    timed = std::chrono::duration<double>(Clock::now() - t0).count();
    napsTimed = b.naps() - napsLater;
  });
  t.join();
  EXPECT_EQ(napsEarly, 0u);
  EXPECT_GT(napsLater, 0u);
  EXPECT_EQ(napsTimed, 20u);
  EXPECT_GE(timed, 20 * fd::Backoff::kBackgroundNapNs * 1e-9);
  fd::Backoff fresh;  // a new wait yields again first (this thread is not a progress thread,
  fresh.pause();      // and a new Backoff starts from its first poll)
  EXPECT_EQ(fresh.naps(), 0u);
}

TEST(Backoff, TheCallersThreadDoesNotNapThatSoon) {
  Oversubscribed over(true);
  EXPECT_FALSE(fd::backgroundThread());
  fd::Backoff b;
  // Fewer polls than the 65536 after which any wait naps.
  pauseFor(b, fd::Backoff::kBackgroundYield * 2, 60000);
  EXPECT_EQ(b.naps(), 0u);
}

TEST(Backoff, AProgressThreadWithACorePerRankDoesNotNapThatSoon) {
  Oversubscribed over(false);
  unsigned naps = 1;
  std::thread t([&] {
    fd::markBackgroundThread();
    fd::Backoff b;
    pauseFor(b, fd::Backoff::kBackgroundYield * 2, 60000);
    naps = b.naps();
  });
  t.join();
  EXPECT_EQ(naps, 0u);
}

// SpinHint: how long a communicator's waits spin before yielding on more ranks than cores.
TEST(SpinHint, AWaitThatEndsWhileSpinningDoublesTheBudgetUpToItsMost) {
  fd::SpinHint h;
  unsigned b = h.budget();
  EXPECT_EQ(b, fd::SpinHint::kProbe);
  h.record(b, b);  // ended on its last spinning poll
  EXPECT_EQ(h.budget(), 2 * fd::SpinHint::kProbe);
  for (int i = 0; i < 20; ++i) h.record(h.budget(), 1);
  EXPECT_EQ(h.budget(), fd::SpinHint::kMax);
}

TEST(SpinHint, AWaitThatHadToYieldQuartersItAndAtZeroEveryFewWaitsProbe) {
  fd::SpinHint h;
  for (int i = 0; i < 20; ++i) h.record(h.budget(), 1);
  h.record(fd::SpinHint::kMax, fd::SpinHint::kMax + 1);
  EXPECT_EQ(h.budget(), fd::SpinHint::kMax / 4);
  while (h.budget() > 0) h.record(h.budget(), h.budget() + 1);
  int probes = 0;
  for (unsigned i = 0; i < 4 * fd::SpinHint::kProbeEvery; ++i) {
    const unsigned b = h.budget();
    EXPECT_TRUE(b == 0 || b == fd::SpinHint::kProbe) << b;
    probes += b > 0;
    h.record(b, 1000);  // the probe had to yield as well: the budget stays 0
  }
  EXPECT_EQ(probes, 4);
  h.record(0, 1);  // a wait that never spun teaches nothing
  EXPECT_EQ(h.budget(), 0u);
}

TEST(SpinHint, ABackoffOnMoreRanksThanCoresRecordsItsWaitInTheHint) {
  Oversubscribed over(true);
  fd::SpinHint h;
  {
    fd::Backoff b(&h);
    for (int i = 0; i < 3; ++i) b.pause();  // within the budget of kProbe polls
  }
  EXPECT_EQ(h.budget(), 2 * fd::SpinHint::kProbe);
  {
    fd::Backoff b(&h);
    for (unsigned i = 0; i <= 2 * fd::SpinHint::kProbe; ++i) b.pause();  // one past it
  }
  EXPECT_EQ(h.budget(), 0u);  // a quarter of 2 kProbe is under kProbe
  {
    fd::Backoff b(&h);  // found its peers there: no pause, nothing learned
  }
  EXPECT_EQ(h.budget(), 0u);  // a quarter of 2 kProbe is under kProbe
}

TEST(SpinHint, IsNotConsultedWithACorePerRankNorWithFourdPollYieldNorOnAProgressThread) {
  fd::SpinHint h;
  {
    Oversubscribed over(false);
    fd::Backoff b(&h);
    for (int i = 0; i < 1000; ++i) b.pause();
  }
  EXPECT_EQ(h.budget(), fd::SpinHint::kProbe);
  {
    Oversubscribed over(true);
    fd::setOversubscribed(true, /*learnSpin=*/false);  // FOURD_POLL=yield
    fd::Backoff b(&h);
    for (int i = 0; i < 1000; ++i) b.pause();
  }
  EXPECT_EQ(h.budget(), fd::SpinHint::kProbe);
  Oversubscribed over(true);
  std::thread t([&] {
    fd::markBackgroundThread();
    fd::Backoff b(&h);
    for (int i = 0; i < 1000; ++i) b.pause();
  });
  t.join();
  EXPECT_EQ(h.budget(), fd::SpinHint::kProbe);
}

TEST(SpinHint, FlagWaitsUseItOnlyWhereFlagWaitsLearnSpinSaysSo) {
  Oversubscribed over(true);
  fd::OpContext ctx;
  ctx.start = Clock::now();
  ctx.deadline = ctx.start + std::chrono::seconds(60);
  const bool was = fd::flagWaitsLearnSpin();
  for (const bool learn : {false, true}) {
    fd::setFlagWaitsLearnSpin(learn);
    fd::SpinHint h;
    ctx.spin = &h;
    int looks = 0;  // ready at the fourth look: three pauses, within the budget of kProbe polls
    fd::waitUntil([&] { return ++looks >= 4; }, nullptr, ctx, /*spinMicros=*/0.0);
    EXPECT_EQ(looks, 4);
    EXPECT_EQ(h.budget(), learn ? 2 * fd::SpinHint::kProbe : fd::SpinHint::kProbe) << learn;
  }
  fd::setFlagWaitsLearnSpin(was);
}
