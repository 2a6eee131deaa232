#include "internal/op_context.hpp"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <sstream>

#include "fourd/error.hpp"

namespace fourd::detail {

Clock::time_point deadlineAfter(Clock::time_point start, double seconds) noexcept {
  // Compare in seconds before converting: duration_cast of 1e10 s to nanoseconds overflows.
  const double room = std::chrono::duration<double>(Clock::time_point::max() - start).count() * 0.5;
  if (!(seconds < room)) return Clock::time_point::max();
  if (!(seconds > 0)) return start;
  return start +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

namespace {
std::atomic<Clock::rep> gTeardown{Clock::time_point::max().time_since_epoch().count()};
std::atomic<bool> gForked{false};
// Registered once, when this library is loaded (before any thread of fourd exists).
const bool gAtFork = [] {
  pthread_atfork(nullptr, nullptr, [] { gForked.store(true); });
  return true;
}();
}  // namespace

void setTeardownDeadline(Clock::time_point t) noexcept {
  gTeardown.store(t.time_since_epoch().count());
}

Clock::time_point teardownDeadline() noexcept {
  return Clock::time_point(Clock::duration(gTeardown.load()));
}

bool forkedChild() noexcept { return gForked.load(); }

std::string OpContext::describe() const {
  std::ostringstream os;
  os << op << " on axis '" << axis << "' (group of world ranks [";
  if (groupWorldRanks) {
    const auto& r = *groupWorldRanks;
    const size_t shown = r.size() <= 16 ? r.size() : 16;
    for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << r[i];
    if (shown < r.size()) os << ", ... (" << r.size() << " ranks)";
  }
  os << "], seq " << seq;
  if (!algorithm.empty()) os << ", algorithm " << algorithm;
  os << ")";
  return os.str();
}

double OpContext::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

namespace {
std::atomic<InterruptCheck> gInterrupt{nullptr};
}

void setInterruptCheck(InterruptCheck fn) noexcept { gInterrupt.store(fn); }

bool interruptRequested() noexcept {
  InterruptCheck fn = gInterrupt.load();
  return fn != nullptr && fn();
}

WaitWatch::WaitWatch(const OpContext& ctx)
    : ctx_(ctx), nextCheck_(Clock::now() + std::chrono::milliseconds(20)) {}

bool WaitWatch::expired() {
  if (ctx_.interruptible && ctx_.cancelled != nullptr &&
      ctx_.cancelled->load(std::memory_order_relaxed)) {
    throw AbortedError("fourd: " + ctx_.describe() + " was cancelled after " +
                       std::to_string(ctx_.elapsed()) + " s");
  }
  if ((++polls_ & 63u) != 0) return false;
  const auto now = Clock::now();
  if (now >= nextCheck_) {
    nextCheck_ = now + std::chrono::milliseconds(20);
    if (ctx_.interruptible && interruptRequested()) {
      throw AbortedError("fourd: " + ctx_.describe() + " was interrupted after " +
                         std::to_string(ctx_.elapsed()) + " s");
    }
  }
  return now >= ctx_.deadline;
}

namespace {
std::atomic<bool> gOversubscribed{false};
std::atomic<bool> gLearnSpin{true};
std::atomic<bool> gFlagWaitsLearn{false};
thread_local bool tBackground = false;
}  // namespace

void setOversubscribed(bool yes, bool learnSpin) noexcept {
  gOversubscribed.store(yes, std::memory_order_relaxed);
  gLearnSpin.store(learnSpin, std::memory_order_relaxed);
}

bool oversubscribed() noexcept { return gOversubscribed.load(std::memory_order_relaxed); }

void setFlagWaitsLearnSpin(bool yes) noexcept {
  gFlagWaitsLearn.store(yes, std::memory_order_relaxed);
}

bool flagWaitsLearnSpin() noexcept { return gFlagWaitsLearn.load(std::memory_order_relaxed); }

void markBackgroundThread() noexcept { tBackground = true; }

bool backgroundThread() noexcept { return tBackground; }

unsigned SpinHint::budget() noexcept {
  const unsigned b = budget_.load(std::memory_order_relaxed);
  if (b > 0) return b;
  const unsigned n = idle_.load(std::memory_order_relaxed) + 1;
  idle_.store(n, std::memory_order_relaxed);
  return n % kProbeEvery == 0 ? kProbe : 0;
}

void SpinHint::record(unsigned spin, unsigned polls) noexcept {
  if (spin == 0) return;  // it never spun: nothing learned
  const unsigned next =
      polls <= spin ? std::min(kMax, spin * 2) : (spin / 4 < kProbe ? 0 : spin / 4);
  budget_.store(next, std::memory_order_relaxed);
}

Backoff::Backoff(SpinHint* hint) noexcept : hint_(hint) {
  if (hint_ != nullptr && !tBackground && gOversubscribed.load(std::memory_order_relaxed) &&
      gLearnSpin.load(std::memory_order_relaxed)) {
    spin_ = hint_->budget();
  } else {
    hint_ = nullptr;
  }
}

Backoff::~Backoff() { finish(); }

void Backoff::finish() noexcept {
  // A wait that never paused found its peers there already: it says nothing about spinning.
  if (hint_ != nullptr && polls_ > 0) hint_->record(spin_, polls_);
}

void Backoff::restart() noexcept {
  finish();
  polls_ = 0;
  naps_ = 0;
  since_ = {};
  if (hint_ != nullptr) spin_ = hint_->budget();
}

void Backoff::pause() noexcept {
  // With a core per rank: spin a little first (lowest latency), then yield. With more ranks
  // than cores: spin only for the budget the communicator's SpinHint learned, then yield. A
  // waiter that spins while its peer shares its core steals the time slice the peer needs to
  // make the progress it waits for; one whose peer runs on another core returns at once
  // instead of handing its core to another rank for a slice (4 ranks on 2 cores, flat and
  // ring at 1-4 KiB: 0.74-0.88x MPI's blocking collective yielding at once, 0.97-1.16x with
  // the hint; bench/README.md, "Polling"). MPI's non-blocking collectives only progress inside
  // our MPI_Test calls, so the waiter must keep polling rather than sleep.
  // Only a wait that has lasted some 65k polls (tens of milliseconds: a peer that computes, or
  // is late) naps, so that it leaves the core to the computing ranks.
  //
  // A progress thread (markBackgroundThread) on more ranks than cores naps much sooner: after
  // kBackgroundYield of yielding. Its caller usually computes meanwhile (DDP's backward, an
  // overlapped layer), and so do its peers, so every core it takes by yielding is taken from
  // that compute; a yielding thread is rescheduled at once whenever it is the least-run one,
  // which a thread that mostly yields always is. Measured on a DDP step, 4 ranks on 2 cores
  // (bench/README.md, ddp_np4 and ddp_np4_forced_*): yielding only, some steps took 0.9-4.9 s
  // whatever the algorithm, MPI's own included; with these naps the slowest of 50 took 0.9 s.
  // Not sooner: a wait past kBackgroundYield ends up to a nap late, and the 8-rank suite of
  // overlapped layers (many short background operations) took 72 s instead of 44 with 1 ms,
  // 47 s with 5 ms. Napping only while this process computes does not do: the core a waiting
  // progress thread takes is mostly another rank's.
  ++polls_;
  const bool over = gOversubscribed.load(std::memory_order_relaxed);
  if (over ? polls_ <= spin_ : polls_ <= 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    return;
  }
  bool nap = polls_ > 65536;
  long napNs = 20 * 1000;
  if (over && tBackground) {
    const auto now = Clock::now();
    if (polls_ == 1) since_ = now;
    nap = now - since_ >= kBackgroundYield;
    napNs = kBackgroundNapNs;
  }
  if (!nap) {
    sched_yield();
    return;
  }
  ++naps_;
  struct timespec ts = {0, napNs};
  nanosleep(&ts, nullptr);
}

}  // namespace fourd::detail
