#include "internal/op_context.hpp"

#include <sched.h>

#include <atomic>
#include <sstream>

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

void Backoff::pause() noexcept {
  if (++spins_ > 64) sched_yield();
}

}  // namespace fourd::detail
