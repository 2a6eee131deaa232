// Host memory for fourd's own buffers (internal/host_memory.hpp).
#include "internal/host_memory.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "fourd/error.hpp"

namespace fourd::detail {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

// `cap` bytes of zeros, every page written now: from kHugePage, huge-page aligned and advised
// `huge` (for huge pages, else against them); below, 64-byte aligned. `what` names them in
// the error.
std::shared_ptr<void> zeroedHost(size_t cap, bool huge, const char* what) {
  const bool large = cap >= kHugePage;
  void* p = std::aligned_alloc(large ? kHugePage : 64, cap);
  if (!p) throw Error("fourd: out of memory allocating " + std::to_string(cap) + what);
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
  if (large) (void)madvise(p, cap, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);  // failure: harmless
#else
  (void)huge;
#endif
  std::memset(p, 0, cap);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace

std::shared_ptr<void> allocateHost(size_t bytes) {
  size_t cap = 64;
  while (cap < bytes) cap *= 2;
  // Large buffers: huge-page aligned and advised, and every page written now. Left to fault
  // in the first collectives that touch them (and to be collapsed into huge pages later by
  // the kernel), new scratch made ring and rhd read up to 1.6x slow for seconds after they
  // first ran at a larger size.
  return zeroedHost(cap, true, " scratch bytes");
}

bool onHugePages(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    // A mapping's first line: "start-end perms offset dev inode [path]", addresses in hex.
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find(':') > space) {
      if (inside) return false;  // the mapping's fields ended without either sign
      const uintptr_t lo = std::strtoull(line.c_str(), nullptr, 16);
      const uintptr_t hi = std::strtoull(line.c_str() + dash + 1, nullptr, 16);
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("AnonHugePages:", 0) == 0 && std::strtoull(line.c_str() + 14, nullptr, 10) > 0)
      return true;
    if (line.rfind("THPeligible:", 0) == 0) return std::strtol(line.c_str() + 12, nullptr, 10) == 1;
  }
  return false;
}

std::shared_ptr<void> allocateHostLike(size_t bytes, const void* like, size_t likeBytes) {
  if (bytes < kHugePage)
    return zeroedHost(std::max<size_t>(64, (bytes + 63) / 64 * 64), false, " bytes");
  const size_t cap = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  return zeroedHost(cap, onHugePages(static_cast<const char*>(like) + likeBytes / 2), " bytes");
}

}  // namespace fourd::detail
