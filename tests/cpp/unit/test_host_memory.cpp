// Host memory for scratch and for tuning's explorations (internal/host_memory.hpp): large
// buffers are paged like the memory they stand in for, because at 64 MiB every algorithm ran
// 1.6-2.2x slower on small pages than on huge ones.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "internal/host_memory.hpp"

namespace {

using fourd::detail::allocateHost;
using fourd::detail::allocateHostLike;
using fourd::detail::onHugePages;

constexpr size_t kMiB = size_t(1) << 20;

// The kernel's transparent huge page mode ("always", "madvise" or "never"; "" where unknown).
std::string thpMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  std::getline(f, text);
  const size_t open = text.find('['), close = text.find(']');
  if (open == std::string::npos || close == std::string::npos) return "";
  return text.substr(open + 1, close - open - 1);
}

// What onHugePages() must say of memory advised for huge pages under this kernel's mode.
bool advisedIsHuge() {
  const std::string mode = thpMode();
  return mode == "always" || mode == "madvise";
}

// An anonymous mapping advised against huge pages, every page written.
struct SmallPaged {
  explicit SmallPaged(size_t n) : bytes(n) {
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
    if (p) {
      (void)madvise(p, n, MADV_NOHUGEPAGE);
      std::memset(p, 1, n);
    }
  }
  ~SmallPaged() {
    if (p) munmap(p, bytes);
  }
  void* p = nullptr;
  size_t bytes;
};

const char* middle(const std::shared_ptr<void>& p, size_t n) {
  return static_cast<const char*>(p.get()) + n / 2;
}

bool allZero(const void* p, size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (c[i] != 0) return false;
  return true;
}

TEST(HostMemory, ScratchIsAdvisedForHugePages) {
  std::printf("transparent huge pages: %s\n", thpMode().c_str());
  const size_t n = 8 * kMiB;
  auto scratch = allocateHost(n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(scratch.get()) % (2 * kMiB), 0u);
  EXPECT_EQ(onHugePages(middle(scratch, n)), advisedIsHuge());
}

TEST(HostMemory, SmallPagesReadAsSmall) {
  SmallPaged small(8 * kMiB);
  ASSERT_NE(small.p, nullptr);
  EXPECT_FALSE(onHugePages(static_cast<char*>(small.p) + small.bytes / 2));
  int onStack = 0;
  EXPECT_FALSE(onHugePages(&onStack));
}

TEST(HostMemory, LargeBuffersArePagedLikeTheirModel) {
  const size_t n = 6 * kMiB + 100;  // not a multiple of the huge page
  SmallPaged small(8 * kMiB);
  ASSERT_NE(small.p, nullptr);
  auto huge = allocateHost(8 * kMiB);

  auto likeHuge = allocateHostLike(n, huge.get(), 8 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(likeHuge.get()) % (2 * kMiB), 0u);
  EXPECT_EQ(onHugePages(middle(likeHuge, n)), advisedIsHuge());
  EXPECT_TRUE(allZero(likeHuge.get(), n));

  auto likeSmall = allocateHostLike(n, small.p, small.bytes);
  EXPECT_FALSE(onHugePages(middle(likeSmall, n)));
  EXPECT_TRUE(allZero(likeSmall.get(), n));
}

TEST(HostMemory, SmallBuffersAreAlignedZeros) {
  for (size_t n : {size_t(1), size_t(63), size_t(4096), kMiB}) {
    auto p = allocateHostLike(n, nullptr, 0);
    ASSERT_NE(p.get(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u) << n;
    EXPECT_TRUE(allZero(p.get(), n)) << n;
  }
}

}  // namespace
