// A non-owning view of a contiguous buffer: (address, element count, dtype, device).
#pragma once

#include <cstddef>

#include "fourd/data_type.hpp"

namespace fourd {

/// Where a buffer lives.
enum class DeviceType : int { kCpu = 0, kCuda = 1 };

/// A non-owning view. `count` is in elements, never bytes. The caller keeps the memory alive
/// for as long as any operation using the view is in flight.
struct Buffer {
  void* data = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  DeviceType device = DeviceType::kCpu;
  int deviceIndex = 0;
  /// CUDA buffers: the stream (a cudaStream_t; nullptr = the legacy default stream) whose
  /// enqueued work the operation is ordered after, and which is made to wait for its end.
  void* stream = nullptr;

  Buffer() = default;
  Buffer(void* d, size_t n, DataType t, DeviceType dev = DeviceType::kCpu, int idx = 0,
         void* st = nullptr)
      : data(d), count(n), dtype(t), device(dev), deviceIndex(idx), stream(st) {}

  /// Size in bytes.
  size_t bytes() const noexcept { return count * dataTypeSize(dtype); }

  /// A view of elements [offset, offset + n).
  Buffer slice(size_t offset, size_t n) const noexcept {
    return Buffer(static_cast<char*>(data) + offset * dataTypeSize(dtype), n, dtype, device,
                  deviceIndex, stream);
  }

  /// Typed address of element 0.
  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(data);
  }
};

}  // namespace fourd
