// The direct MPI backend (device_backends.hpp): a CUDA-aware MPI library takes device pointers
// as they are. It reads and writes device memory outside any stream, so the device path waits
// for the caller's stream before the operation, and the local work here (copies, avg's
// scaling) completes before it returns. fourd's MPI operators for float16 / bfloat16 run on
// the host and cannot touch device memory: reduces() says so, and those calls are staged.
#include <utility>

#include "cuda_support.hpp"
#include "device_backends.hpp"

namespace fourd::detail {

namespace {

class DirectMpiBackend final : public Backend {
 public:
  DirectMpiBackend(std::unique_ptr<Backend> host, cudaStream_t stream)
      : host_(std::move(host)), stream_(stream) {}

  std::string kind() const override { return host_->kind() + " (CUDA-aware)"; }
  int rank() const noexcept override { return host_->rank(); }
  int size() const noexcept override { return host_->size(); }
  const std::vector<int>& worldRanks() const noexcept override { return host_->worldRanks(); }
  DeviceType device() const noexcept override { return DeviceType::kCuda; }
  size_t maxCount() const noexcept override { return host_->maxCount(); }
  bool reduces(DataType t, ReduceOp) const noexcept override {
    return t != DataType::kFloat16 && t != DataType::kBFloat16;
  }
  std::unique_ptr<Requests> requests() override { return host_->requests(); }

  void iallReduce(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) override {
    host_->iallReduce(in, out, op, r);
  }
  void iallGather(const Buffer& in, const Buffer& out, Requests& r) override {
    host_->iallGather(in, out, r);
  }
  void ireduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) override {
    host_->ireduceScatter(in, out, op, r);
  }
  void ibroadcast(const Buffer& buf, int root, Requests& r) override {
    host_->ibroadcast(buf, root, r);
  }
  void ibarrier(Requests& r) override { host_->ibarrier(r); }
  void isend(const void* buf, size_t bytes, int peer, int tag, Requests& r) override {
    host_->isend(buf, bytes, peer, tag, r);
  }
  void irecv(void* buf, size_t bytes, int peer, int tag, Requests& r) override {
    host_->irecv(buf, bytes, peer, tag, r);
  }

  std::shared_ptr<void> allocate(size_t bytes) override { return deviceAllocate(bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) {
      checkCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    }
  }
  void scale(const Buffer& buf, double factor) override {
    cuda::scale(buf.data, buf.data, buf.count, buf.dtype, factor, stream_);
    checkCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  std::unique_ptr<Backend> split(int color, int key, OpContext& ctx) override {
    return std::make_unique<DirectMpiBackend>(host_->split(color, key, ctx), stream_);
  }
  bool sharesMemory(OpContext&) override { return false; }
  std::unique_ptr<SharedSegment> sharedSegment(size_t, OpContext&) override { return nullptr; }

 private:
  std::unique_ptr<Backend> host_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<Backend> makeDirectMpiBackend(std::unique_ptr<Backend> host, cudaStream_t stream) {
  return std::make_unique<DirectMpiBackend>(std::move(host), stream);
}

}  // namespace fourd::detail
