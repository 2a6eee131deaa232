// The host-staging backend (device_backends.hpp): CUDA buffers through pinned host memory onto
// any host backend.
//
// Every operation is a staged step: copy its input to a pinned buffer (device -> host, on the
// backend's stream), post the host backend's operation on the pinned buffers when that copy
// has completed, and when the host operation has completed copy its output back (host ->
// device, on the stream). The steps advance inside Requests::test and ::wait, so nothing
// blocks outside the operation's deadline. An all_reduce is cut into chunks of kChunkBytes:
// the copy of chunk i+1 to the host overlaps the host all_reduce of chunk i, and the copy back
// of chunk i overlaps the next. Steps post their host operations in the order they were
// posted here, so the host backend's collectives are posted in the same order on every rank.
#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda_support.hpp"
#include "device_backends.hpp"

namespace fourd::detail {

namespace {

constexpr size_t kChunkBytes = size_t(4) << 20;

// Pinned buffers reused across operations (cudaMallocHost costs milliseconds).
class PinnedPool {
 public:
  std::shared_ptr<char> get(size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.lower_bound(bytes);
    std::shared_ptr<void> raw;
    size_t cap = bytes;
    if (it != free_.end()) {
      cap = it->first;
      raw = std::move(it->second);
      free_.erase(it);
    } else {
      raw = pinnedAllocate(bytes);
    }
    auto self = state_;
    return std::shared_ptr<char>(static_cast<char*>(raw.get()), [self, raw, cap](char*) mutable {
      std::lock_guard<std::mutex> lk(self->mu);
      self->back.emplace_back(cap, std::move(raw));
    });
  }
  // Buffers given back since the last call return to the free list.
  void reclaim() {
    std::lock_guard<std::mutex> lk0(mu_);
    std::lock_guard<std::mutex> lk(state_->mu);
    for (auto& b : state_->back) free_.emplace(b.first, std::move(b.second));
    state_->back.clear();
  }

 private:
  struct Returned {
    std::mutex mu;
    std::vector<std::pair<size_t, std::shared_ptr<void>>> back;
  };
  std::mutex mu_;
  std::multimap<size_t, std::shared_ptr<void>> free_;
  std::shared_ptr<Returned> state_ = std::make_shared<Returned>();
};

// One staged step.
struct Step {
  enum Stage { kToHost, kReady, kRunning, kToDevice, kDone };
  Stage stage = kToHost;
  std::unique_ptr<Event> ev;                // end of the copy in flight
  std::function<void(Requests&)> post;      // the host operation on the pinned buffers
  std::function<void()> back;               // enqueues the copies back (may be empty)
  std::vector<std::shared_ptr<char>> keep;  // the pinned buffers
  size_t begin = 0, end = 0;                // its requests in the host set
};

class StagingRequests final : public Requests {
 public:
  StagingRequests(Backend& host, cudaStream_t stream) : host_(host.requests()), stream_(stream) {}

  size_t size() const noexcept override { return steps_.size(); }
  Step& add() {
    steps_.emplace_back();
    return steps_.back();
  }
  cudaStream_t stream() const noexcept { return stream_; }

  bool test(size_t begin, size_t end) override {
    advance();
    for (size_t i = begin; i < end; ++i)
      if (steps_[i].stage != Step::kDone) return false;
    return true;
  }

  void wait(size_t begin, size_t end, OpContext& ctx) override {
    Backoff backoff;
    WaitWatch watch(ctx);
    while (!test(begin, end)) {
      if (watch.expired()) {
        std::vector<int> peers = pendingPeers(begin, end);
        std::string who;
        for (size_t i = 0; i < peers.size(); ++i) who += (i ? ", " : "") + std::to_string(peers[i]);
        throw TimeoutError(
            "fourd: " + ctx.describe() + " timed out after " + std::to_string(ctx.elapsed()) +
            " s (timeout " + std::to_string(ctx.timeoutSeconds) + " s) in a host-staged step" +
            (who.empty() ? "" : "; peers that never arrived: world ranks [" + who + "]"));
      }
      backoff.pause();
    }
  }

  std::vector<int> pendingPeers(size_t begin, size_t end) override {
    std::vector<int> out;
    for (size_t i = begin; i < end; ++i) {
      if (steps_[i].stage != Step::kRunning) continue;
      for (int p : host_->pendingPeers(steps_[i].begin, steps_[i].end))
        if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
    return out;
  }

  bool abandon(double seconds) noexcept override { return host_->abandon(seconds); }

 private:
  static bool eventDone(const Step& s) {
    const cudaError_t rc = cudaEventQuery(s.ev->e);
    if (rc == cudaErrorNotReady) return false;
    checkCuda(rc, "cudaEventQuery (staging copy)");
    return true;
  }

  // Moves every step as far as it can go; host operations are posted in step order.
  void advance() {
    bool mayPost = true;
    for (Step& s : steps_) {
      if (s.stage == Step::kToHost && eventDone(s)) s.stage = Step::kReady;
      if (s.stage == Step::kReady && mayPost) {
        s.begin = host_->size();
        s.post(*host_);
        s.end = host_->size();
        s.stage = Step::kRunning;
      }
      mayPost = mayPost && s.stage != Step::kToHost && s.stage != Step::kReady;
      if (s.stage == Step::kRunning && host_->test(s.begin, s.end)) {
        if (s.back) {
          s.back();
          if (!s.ev) s.ev = std::make_unique<Event>();
          checkCuda(cudaEventRecord(s.ev->e, stream_), "cudaEventRecord");
          s.stage = Step::kToDevice;
        } else {
          s.stage = Step::kDone;
        }
      }
      if (s.stage == Step::kToDevice && eventDone(s)) {
        s.stage = Step::kDone;
        s.keep.clear();
      }
    }
  }

  std::unique_ptr<Requests> host_;
  cudaStream_t stream_;
  std::deque<Step> steps_;  // a deque: references stay valid as steps are added
};

class StagingBackend final : public Backend {
 public:
  StagingBackend(std::unique_ptr<Backend> host, cudaStream_t stream)
      : host_(std::move(host)), stream_(stream) {}

  std::string kind() const override { return "staged(" + host_->kind() + ")"; }
  int rank() const noexcept override { return host_->rank(); }
  int size() const noexcept override { return host_->size(); }
  const std::vector<int>& worldRanks() const noexcept override { return host_->worldRanks(); }
  DeviceType device() const noexcept override { return DeviceType::kCuda; }
  size_t maxCount() const noexcept override { return host_->maxCount(); }
  bool reduces(DataType t, ReduceOp op) const noexcept override { return host_->reduces(t, op); }
  std::unique_ptr<Requests> requests() override {
    pool_.reclaim();
    return std::make_unique<StagingRequests>(*host_, stream_);
  }

  void iallReduce(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) override {
    const size_t es = dataTypeSize(in.dtype);
    const size_t per = std::max<size_t>(1, kChunkBytes / es);
    for (size_t off = 0; off < in.count || off == 0; off += per) {
      const size_t n = std::min(per, in.count - off);
      const Buffer din = in.slice(off, n), dout = out.slice(off, n);
      Step& s = stage(r, {din}, n * es);
      const Buffer h(s.keep[0].get(), n, in.dtype);
      Backend* host = host_.get();
      s.post = [host, h, op](Requests& hr) { host->iallReduce(h, h, op, hr); };
      s.back = backTo(dout, h.data);
      if (in.count == 0) break;
    }
  }
  void iallGather(const Buffer& in, const Buffer& out, Requests& r) override {
    Step& s = stage(r, {in}, out.bytes());
    char* hout = s.keep[0].get();
    const Buffer hin(hout + in.bytes() * rank(), in.count, in.dtype);  // in place, my block
    const Buffer hall(hout, out.count, out.dtype);
    Backend* host = host_.get();
    s.post = [host, hin, hall](Requests& hr) { host->iallGather(hin, hall, hr); };
    s.back = backTo(out, hout);
  }
  void ireduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, Requests& r) override {
    Step& s = stage(r, {in}, in.bytes());
    s.keep.push_back(pool_.get(out.bytes()));
    const Buffer hin(s.keep[0].get(), in.count, in.dtype);
    const Buffer hout(s.keep[1].get(), out.count, out.dtype);
    Backend* host = host_.get();
    s.post = [host, hin, hout, op](Requests& hr) { host->ireduceScatter(hin, hout, op, hr); };
    s.back = backTo(out, hout.data);
  }
  void ibroadcast(const Buffer& buf, int root, Requests& r) override {
    Step& s = stage(r, {buf}, buf.bytes());
    const Buffer h(s.keep[0].get(), buf.count, buf.dtype);
    Backend* host = host_.get();
    s.post = [host, h, root](Requests& hr) { host->ibroadcast(h, root, hr); };
    s.back = backTo(buf, h.data);
  }
  void ibarrier(Requests& r) override {
    Step& s = stage(r, {}, 0);
    Backend* host = host_.get();
    s.post = [host](Requests& hr) { host->ibarrier(hr); };
  }
  void isend(const void* buf, size_t bytes, int peer, int tag, Requests& r) override {
    Step& s = stage(r, {Buffer(const_cast<void*>(buf), bytes, DataType::kUInt8)}, bytes);
    const char* h = s.keep[0].get();
    Backend* host = host_.get();
    s.post = [host, h, bytes, peer, tag](Requests& hr) { host->isend(h, bytes, peer, tag, hr); };
  }
  void irecv(void* buf, size_t bytes, int peer, int tag, Requests& r) override {
    Step& s = stage(r, {}, bytes);
    char* h = s.keep[0].get();
    Backend* host = host_.get();
    s.post = [host, h, bytes, peer, tag](Requests& hr) { host->irecv(h, bytes, peer, tag, hr); };
    s.back = backTo(Buffer(buf, bytes, DataType::kUInt8), h);
  }

  std::shared_ptr<void> allocate(size_t bytes) override { return deviceAllocate(bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) {
      checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                "cudaMemcpyAsync");
    }
  }
  void scale(const Buffer& buf, double factor) override {
    cuda::scale(buf.data, buf.data, buf.count, buf.dtype, factor, stream_);
  }
  std::unique_ptr<Backend> split(int color, int key, OpContext& ctx) override {
    return std::make_unique<StagingBackend>(host_->split(color, key, ctx), stream_);
  }
  bool sharesMemory(OpContext&) override { return false; }
  std::unique_ptr<SharedSegment> sharedSegment(size_t, OpContext&) override { return nullptr; }

 private:
  // A new step whose pinned buffer 0 holds `hostBytes` and receives the device `inputs` (one
  // after the other), copied on the stream; the step may post once that copy has completed.
  Step& stage(Requests& r, std::initializer_list<Buffer> inputs, size_t hostBytes) {
    Step& s = static_cast<StagingRequests&>(r).add();
    s.keep.push_back(pool_.get(hostBytes));
    size_t off = 0;
    for (const Buffer& b : inputs) {
      if (b.bytes()) {
        checkCuda(cudaMemcpyAsync(s.keep[0].get() + off, b.data, b.bytes(), cudaMemcpyDeviceToHost,
                                  stream_),
                  "cudaMemcpyAsync (to the host)");
      }
      off += b.bytes();
    }
    s.ev = std::make_unique<Event>();
    checkCuda(cudaEventRecord(s.ev->e, stream_), "cudaEventRecord");
    return s;
  }
  // Enqueues the copy of the host result back into `dst` (device memory).
  std::function<void()> backTo(const Buffer& dst, const void* host) {
    cudaStream_t st = stream_;
    return [dst, host, st] {
      if (dst.bytes()) {
        checkCuda(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, st),
                  "cudaMemcpyAsync (to the device)");
      }
    };
  }

  std::unique_ptr<Backend> host_;
  cudaStream_t stream_;
  PinnedPool pool_;
};

}  // namespace

std::unique_ptr<Backend> makeStagingBackend(std::unique_ptr<Backend> host, cudaStream_t stream) {
  return std::make_unique<StagingBackend>(std::move(host), stream);
}

}  // namespace fourd::detail
