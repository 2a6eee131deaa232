#include "internal/comm_state.hpp"

#include <sstream>

#include "fourd/error.hpp"

namespace fourd::detail {

CommState::CommState(std::string n, AxisMask m, std::unique_ptr<Group> h)
    : name(std::move(n)), mask(m), host(std::move(h)), selector(*host) {}

CommState::~CommState() {
  // The device group first (its backends may wrap the host group's), then the host group.
  device.reset();
}

void CommState::claimThread() {
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id current{};
  if (owner.compare_exchange_strong(current, me) || current == me) return;
  std::ostringstream os;
  os << "fourd: axis '" << name << "' is used from another thread (thread " << current
     << ", the thread of its first collective; this is thread " << me
     << "): every rank must issue the collectives of an axis in the same order, which two "
        "threads cannot keep. Issue them from that thread, or give each thread an axis of its "
        "own (different axes may run on different threads).";
  throw InvalidArgument(os.str());
}

void CommState::poison(const std::string& why) {
  std::lock_guard<std::mutex> lk(poisonMu);
  if (!poisoned.load()) {
    poisonReason = why;
    poisoned.store(true);
  }
}

#ifndef FOURD_HAVE_CUDA
void destroyDeviceState(DeviceState*) noexcept {}
#endif

}  // namespace fourd::detail
