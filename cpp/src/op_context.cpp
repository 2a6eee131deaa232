#include "internal/op_context.hpp"

#include <sched.h>
#include <time.h>

#include <atomic>
#include <sstream>

#include "fourd/error.hpp"

namespace fourd::detail {

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
  if ((++polls_ & 63u) != 0) return false;
  const auto now = Clock::now();
  if (now >= nextCheck_) {
    nextCheck_ = now + std::chrono::milliseconds(20);
    if (interruptRequested()) {
      throw AbortedError("fourd: " + ctx_.describe() + " was interrupted after " +
                         std::to_string(ctx_.elapsed()) + " s");
    }
  }
  return now >= ctx_.deadline;
}

void Backoff::pause() noexcept {
  // Spin first (lowest latency), then yield the core, and after a few thousand polls sleep in
  // short naps: with more ranks than cores a spinning waiter would steal the time its peers
  // need to make the progress it is waiting for.
  ++spins_;
  if (spins_ <= 64) return;
  if (spins_ <= 4096) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 50 * 1000};
  nanosleep(&ts, nullptr);
}

}  // namespace fourd::detail
