#include "internal/comm_state.hpp"

namespace fourd::detail {

CommState::CommState(std::string n, AxisMask m, std::unique_ptr<Group> h)
    : name(std::move(n)), mask(m), host(std::move(h)), selector(*host) {}

CommState::~CommState() {
  // The device group first (its backends may wrap the host group's), then the host group.
  device.reset();
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
