// What the device backends share: CUDA and NCCL error checks, events, a current-device guard,
// device and pinned memory, and a deadline-aware wait for an event.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "fourd/data_type.hpp"
#include "fourd/error.hpp"
#include "fourd_cuda.hpp"
#include "internal/op_context.hpp"

namespace fourd::detail {

inline void checkCuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw cuda::CudaError(std::string("fourd: ") + what + " failed: " + cudaGetErrorName(rc) +
                              ": " + cudaGetErrorString(rc),
                          static_cast<int>(rc));
  }
}

[[noreturn]] inline void throwNccl(ncclResult_t rc, const char* what, ncclComm_t comm) {
  std::string msg = std::string("fourd: ") + what + " failed: " + ncclGetErrorString(rc);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) msg += std::string(" (") + last + ")";
  }
  throw cuda::CudaError(msg, static_cast<int>(rc));
}

/// Restores the calling thread's current device (device work may run inline on the caller).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    checkCuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) checkCuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { checkCuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() {
    if (e) (void)cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

/// `bytes` of device memory (cudaMalloc), freed with the pointer.
inline std::shared_ptr<void> deviceAllocate(size_t bytes) {
  void* p = nullptr;
  checkCuda(cudaMalloc(&p, bytes < 256 ? 256 : bytes), "cudaMalloc (scratch)");
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFree(q); });
}

/// `bytes` of pinned host memory (cudaMallocHost), freed with the pointer.
inline std::shared_ptr<void> pinnedAllocate(size_t bytes) {
  void* p = nullptr;
  checkCuda(cudaMallocHost(&p, bytes < 256 ? 256 : bytes), "cudaMallocHost (staging buffer)");
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFreeHost(q); });
}

/// Waits for `ev` with ctx's deadline and interrupt check. `check` is called on every poll
/// (the NCCL backends raise their asynchronous errors there); `onExpiry` runs before the
/// TimeoutError is thrown (the NCCL backends abort their communicators).
inline void waitEvent(cudaEvent_t ev, const char* what, OpContext& ctx,
                      const std::function<void()>& check = nullptr,
                      const std::function<void()>& onExpiry = nullptr) {
  Backoff backoff;
  WaitWatch watch(ctx);
  for (;;) {
    const cudaError_t rc = cudaEventQuery(ev);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) checkCuda(rc, what);
    if (check) check();
    bool expired = false;
    try {
      expired = watch.expired();
    } catch (...) {  // interrupted
      if (onExpiry) onExpiry();
      throw;
    }
    if (expired) {
      if (onExpiry) onExpiry();
      throw TimeoutError("fourd: " + ctx.describe() + " timed out after " +
                         std::to_string(ctx.elapsed()) + " s waiting for " + what + " on the GPU");
    }
    backoff.pause();
  }
}

}  // namespace fourd::detail
