// Batched copies for packing and unpacking blocks (the reorderings the hierarchical algorithms do
// between phases).
//
// The region table travels as a __grid_constant__ kernel parameter (up to kMaxRegionsPerLaunch
// regions, about 3 KiB, under the classic 4 KiB parameter limit): no device table to allocate,
// fill and free, and one launch replaces up to 128 cudaMemcpyAsync calls whose per-call overhead
// (a few microseconds each) dominates when blocks are small. blockIdx.y picks the region,
// blockIdx.x strides through it with the widest access both of its addresses allow.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "fourd_cuda.hpp"
#include "kernel_common.cuh"

namespace fourd::cuda {

namespace {

struct CopyParams {
  char* dst;
  const char* src;
  CopyRegion regions[kMaxRegionsPerLaunch];
};

constexpr int kCopyUnroll = 4;

template <typename W>
__device__ __forceinline__ void copyWords(char* d, const char* s, size_t bytes, size_t tid,
                                          size_t nthreads) {
  const size_t nw = bytes / sizeof(W);
  W* dw = reinterpret_cast<W*>(d);
  const W* sw = reinterpret_cast<const W*>(s);
  for (size_t base = tid; base < nw; base += nthreads * kCopyUnroll) {
    W v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const size_t i = base + u * nthreads;
      if (i < nw) v[u] = sw[i];
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const size_t i = base + u * nthreads;
      if (i < nw) dw[i] = v[u];
    }
  }
  for (size_t j = nw * sizeof(W) + tid; j < bytes; j += nthreads) d[j] = s[j];
}

__global__ void __launch_bounds__(detail::kThreads)
    copyRegionsKernel(const __grid_constant__ CopyParams p) {
  const CopyRegion& r = p.regions[blockIdx.y];
  char* d = p.dst + r.dstOffset;
  const char* s = p.src + r.srcOffset;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const uintptr_t a = reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s);
  if ((a & 15u) == 0) {
    copyWords<uint4>(d, s, r.bytes, tid, nthreads);
  } else if ((a & 7u) == 0) {
    copyWords<uint2>(d, s, r.bytes, tid, nthreads);
  } else if ((a & 3u) == 0) {
    copyWords<uint32_t>(d, s, r.bytes, tid, nthreads);
  } else {
    copyWords<unsigned char>(d, s, r.bytes, tid, nthreads);
  }
}

int copyBlocksPerSm() {
  static const int n = [] {
    int v = 0;
    detail::check(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, copyRegionsKernel, detail::kThreads, 0),
        "copyRegions (occupancy query)");
    return v;
  }();
  return n;
}

void launchCopyKernel(char* dst, const char* src, const CopyRegion* regions, int n,
                      cudaStream_t stream) {
  CopyParams p{};
  p.dst = dst;
  p.src = src;
  size_t maxBytes = 0;
  for (int i = 0; i < n; ++i) {
    p.regions[i] = regions[i];
    maxBytes = std::max(maxBytes, regions[i].bytes);
  }
  // x-blocks per region: enough for the largest region at 16 B x kCopyUnroll per thread, while
  // all regions together fill the device once (blocks of short regions finish early).
  const size_t perThread = 16 * kCopyUnroll;
  const size_t perBlock = perThread * detail::kThreads;
  const size_t wantX = (maxBytes + perBlock - 1) / perBlock;
  const size_t fill = static_cast<size_t>(detail::multiProcessorCount()) *
                      static_cast<size_t>(std::max(1, copyBlocksPerSm()));
  const size_t capX = std::max<size_t>(1, fill / static_cast<size_t>(n));
  const dim3 grid(static_cast<unsigned>(std::max<size_t>(1, std::min(wantX, capX))),
                  static_cast<unsigned>(n));
  copyRegionsKernel<<<grid, detail::kThreads, 0, stream>>>(p);
  detail::checkLaunch("copyRegions (kernel launch)");
}

bool rangesOverlap(uintptr_t a, size_t na, uintptr_t b, size_t nb) {
  return na > 0 && nb > 0 && a < b + nb && b < a + na;
}

// Throws when a destination range overlaps a source range. Cheap in the usual case (separate
// buffers: the two bounding spans are disjoint); otherwise sorts the source ranges once.
void checkNoOverlap(const char* dst, const char* src, const CopyRegion* regions, int n) {
  uintptr_t dLo = UINTPTR_MAX, dHi = 0, sLo = UINTPTR_MAX, sHi = 0;
  for (int i = 0; i < n; ++i) {
    if (regions[i].bytes == 0) continue;
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst) + regions[i].dstOffset;
    const uintptr_t s = reinterpret_cast<uintptr_t>(src) + regions[i].srcOffset;
    dLo = std::min(dLo, d);
    dHi = std::max(dHi, d + regions[i].bytes);
    sLo = std::min(sLo, s);
    sHi = std::max(sHi, s + regions[i].bytes);
  }
  if (dHi == 0 || !rangesOverlap(dLo, dHi - dLo, sLo, sHi - sLo)) return;
  std::vector<std::pair<uintptr_t, uintptr_t>> srcRanges;  // [begin, end), sorted by begin
  srcRanges.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (regions[i].bytes == 0) continue;
    const uintptr_t s = reinterpret_cast<uintptr_t>(src) + regions[i].srcOffset;
    srcRanges.emplace_back(s, s + regions[i].bytes);
  }
  std::sort(srcRanges.begin(), srcRanges.end());
  // Running maximum of the ends, so one binary search answers "does any range reach past x".
  std::vector<uintptr_t> maxEnd(srcRanges.size());
  uintptr_t m = 0;
  for (size_t i = 0; i < srcRanges.size(); ++i) maxEnd[i] = m = std::max(m, srcRanges[i].second);
  for (int i = 0; i < n; ++i) {
    if (regions[i].bytes == 0) continue;
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst) + regions[i].dstOffset;
    const uintptr_t dEnd = d + regions[i].bytes;
    // Source ranges beginning before dEnd; the overlap exists if one of them ends after d.
    const auto it =
        std::lower_bound(srcRanges.begin(), srcRanges.end(), std::make_pair(dEnd, uintptr_t(0)));
    const size_t k = static_cast<size_t>(it - srcRanges.begin());
    if (k > 0 && maxEnd[k - 1] > d) {
      throw InvalidArgument("regions: destination range of region " + std::to_string(i) +
                            " overlaps a source range; copies must be out of place");
    }
  }
}

}  // namespace

void copyRegions(void* dst, const void* src, const CopyRegion* regions, int n, void* stream,
                 CopyMethod method) {
  if (n < 0) throw InvalidArgument("n: expected a region count >= 0; found " + std::to_string(n));
  if (n == 0) return;
  if (regions == nullptr) throw InvalidArgument("regions: null array with n > 0");
  const int m = static_cast<int>(method);
  if (m < 0 || m > 2) {
    throw InvalidArgument("method: expected kAuto, kKernel or kMemcpy; found the value " +
                          std::to_string(m));
  }
  bool anyBytes = false;
  bool allLarge = true;
  for (int i = 0; i < n; ++i) {
    if (regions[i].bytes == 0) continue;
    anyBytes = true;
    allLarge = allLarge && regions[i].bytes >= kMemcpyRegionBytes;
  }
  if (!anyBytes) return;
  if (dst == nullptr || src == nullptr) {
    throw InvalidArgument(std::string(dst == nullptr ? "dst" : "src") +
                          ": null pointer with bytes to copy");
  }
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  checkNoOverlap(d, s, regions, n);
  cudaStream_t st = static_cast<cudaStream_t>(stream);

  if (method == CopyMethod::kMemcpy || (method == CopyMethod::kAuto && allLarge)) {
    for (int i = 0; i < n; ++i) {
      if (regions[i].bytes == 0) continue;
      detail::check(cudaMemcpyAsync(d + regions[i].dstOffset, s + regions[i].srcOffset,
                                    regions[i].bytes, cudaMemcpyDeviceToDevice, st),
                    "copyRegions (cudaMemcpyAsync)");
    }
    return;
  }
  // Kernel path: drop empty regions, then one launch per kMaxRegionsPerLaunch.
  std::vector<CopyRegion> live;
  live.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (regions[i].bytes > 0) live.push_back(regions[i]);
  }
  for (size_t first = 0; first < live.size(); first += kMaxRegionsPerLaunch) {
    const int count = static_cast<int>(std::min<size_t>(kMaxRegionsPerLaunch, live.size() - first));
    launchCopyKernel(d, s, live.data() + first, count, st);
  }
}

void permuteBlocks(void* dst, const void* src, size_t blockBytes, const int* perm, int nblocks,
                   void* stream, CopyMethod method) {
  if (nblocks < 0) {
    throw InvalidArgument("nblocks: expected a block count >= 0; found " + std::to_string(nblocks));
  }
  if (nblocks == 0 || blockBytes == 0) return;
  if (perm == nullptr) throw InvalidArgument("perm: null array with nblocks > 0");
  std::vector<CopyRegion> regions(static_cast<size_t>(nblocks));
  for (int i = 0; i < nblocks; ++i) {
    if (perm[i] < 0 || perm[i] >= nblocks) {
      throw InvalidArgument("perm[" + std::to_string(i) + "]: expected a block index in [0, " +
                            std::to_string(nblocks) + "); found " + std::to_string(perm[i]));
    }
    regions[static_cast<size_t>(i)] = CopyRegion{
        static_cast<size_t>(i) * blockBytes, static_cast<size_t>(perm[i]) * blockBytes, blockBytes};
  }
  copyRegions(dst, src, regions.data(), nblocks, stream, method);
}

}  // namespace fourd::cuda
