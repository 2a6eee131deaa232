// The device path (internal/device_path.hpp): which backend a communicator's CUDA buffers use,
// and how an operation on them is ordered with the caller's stream.
#include "internal/device_path.hpp"

#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "device_backends.hpp"
#include "fourd/error.hpp"

namespace fourd::detail {

struct DeviceState {
  int device = -1;
  std::string why;         // why this backend, for messages
  bool hostWaits = false;  // the backend reads device memory outside the stream
  cudaStream_t stream = nullptr;
  std::unique_ptr<Group> group;   // NCCL, direct MPI or staged
  std::unique_ptr<Group> staged;  // with direct MPI: what that library cannot reduce on GPUs

  ~DeviceState() {
    // Every operation has completed (its Work waited for its end event): the backends only
    // free their resources (ncclCommAbort never waits for peers that may be gone).
    staged.reset();
    group.reset();
    if (stream) (void)cudaStreamDestroy(stream);
  }
};

void destroyDeviceState(DeviceState* d) noexcept { delete d; }

const Group& groupFor(const CommState& s, DeviceType device) noexcept {
  return device == DeviceType::kCpu || !s.device ? *s.host : *s.device->group;
}

namespace {

std::string envLower(const char* name) {
  const char* v = std::getenv(name);
  std::string s = v ? v : "";
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool localCudaAwareMpi() {
  const std::string env = envLower("FOURD_CUDA_AWARE_MPI");
  if (env == "0" || env == "false" || env == "no") return false;
  if (env == "1" || env == "true" || env == "yes") return true;
#if defined(MPIX_GPU_SUPPORT_CUDA) || (defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

struct Report {
  unsigned char uuid[16];
  int32_t wantMpi;
  int32_t cudaAware;
};

// What every rank of the group reports, gathered once (collective, in issue order).
std::vector<Report> gatherReports(CommState& s, int device, const std::string& want,
                                  OpContext& ctx) {
  Report mine{};
  cudaDeviceProp prop{};
  checkCuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::memcpy(mine.uuid, &prop.uuid, sizeof(mine.uuid));
  mine.wantMpi = want == "mpi";
  mine.cudaAware = localCudaAwareMpi();
  std::vector<Report> all(s.size());
  s.host->backend().allGatherBytes(&mine, sizeof(mine), all.data(), ctx);
  return all;
}

std::unique_ptr<Group> deviceGroup(CommState& s, std::unique_ptr<Backend> b) {
  return std::make_unique<Group>(s.name, std::move(b), s.host->topology(), s.host->profileSlot());
}

void decide(CommState& s, DeviceState& d, OpContext& ctx) {
  const std::string want = envLower("FOURD_CUDA_BACKEND");
  if (!want.empty() && want != "auto" && want != "nccl" && want != "mpi") {
    throw InvalidArgument("FOURD_CUDA_BACKEND: expected auto, nccl or mpi, found '" + want + "'");
  }
  const auto all = gatherReports(s, d.device, want, ctx);
  bool anyMpi = false, allAware = true, shared = false;
  for (size_t i = 0; i < all.size(); ++i) {
    anyMpi = anyMpi || all[i].wantMpi;
    allAware = allAware && all[i].cudaAware;
    for (size_t j = 0; j < i; ++j)
      shared = shared || std::memcmp(all[i].uuid, all[j].uuid, sizeof(all[i].uuid)) == 0;
  }
  if (want == "nccl" && shared) {
    throw InvalidArgument(
        "FOURD_CUDA_BACKEND=nccl: NCCL needs one GPU per rank, but ranks of "
        "axis '" +
        s.name + "' share a GPU");
  }
  checkCuda(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags");
  // Each device backend talks through its own copy of the group's MPI communicator.
  auto host = [&] { return s.host->backend().split(0, s.rank(), ctx); };
  if (!anyMpi && !shared) {
    d.why = "one GPU per rank";
    d.group = deviceGroup(s, makeNcclBackend(host(), d.stream, d.device, ctx));
    return;
  }
  d.why = anyMpi ? "FOURD_CUDA_BACKEND=mpi" : "several ranks of the group share one GPU";
  d.staged = deviceGroup(s, makeStagingBackend(host(), d.stream));
  if (allAware) {
    d.hostWaits = true;
    d.group = deviceGroup(s, makeDirectMpiBackend(host(), d.stream));
  } else {
    d.group = std::move(d.staged);
  }
}

DeviceState& stateFor(CommState& s, int device, OpContext& ctx) {
  if (!s.device) {
    std::unique_ptr<DeviceState, void (*)(DeviceState*)> d(new DeviceState, destroyDeviceState);
    d->device = device;
    decide(s, *d, ctx);
    s.device = std::move(d);
  }
  if (device != s.device->device) {
    throw InvalidArgument("tensor: axis '" + s.name + "' runs its CUDA collectives on cuda:" +
                          std::to_string(s.device->device) +
                          " (its first CUDA call), found a "
                          "tensor on cuda:" +
                          std::to_string(device));
  }
  return *s.device;
}

// The group of this call: the direct backend cannot reduce 16-bit floats on the device, nor
// keep float32 partial sums (accumulate_fp32): those calls are staged.
Group& groupOf(DeviceState& d, const OpSpec& spec) {
  if (!d.staged || !d.hostWaits) return *d.group;
  const bool reduces = !spec.hasOp || (d.group->backend().reduces(spec.in.dtype, spec.op) &&
                                       !spec.opts.accumulateFp32);
  return reduces ? *d.group : *d.staged;
}

void abortAll(DeviceState& d) noexcept {
  if (d.group) d.group->abort();
  if (d.staged) d.staged->abort();
}

}  // namespace

void runDeviceOp(CommState& s, const OpSpec& spec, OpContext& ctx) {
  const Buffer& any = spec.in.device == DeviceType::kCuda ? spec.in : spec.out;
  if (spec.in.device != spec.out.device ||
      (spec.in.count && spec.out.count && spec.in.deviceIndex != spec.out.deviceIndex)) {
    throw InvalidArgument("output: expected a tensor on the input's device (cuda:" +
                          std::to_string(spec.in.deviceIndex) + "), found another device");
  }
  DeviceGuard guard(any.deviceIndex);
  DeviceState& d = stateFor(s, any.deviceIndex, ctx);
  cudaStream_t caller = static_cast<cudaStream_t>(any.stream);
  {  // ordered after the caller's stream
    Event start;
    checkCuda(cudaEventRecord(start.e, caller), "cudaEventRecord (caller's stream)");
    checkCuda(cudaStreamWaitEvent(d.stream, start.e, 0), "cudaStreamWaitEvent");
    if (d.hostWaits) waitEvent(start.e, "the caller's stream", ctx);
  }
  // Nothing to move (the same on every rank): only the stream ordering below.
  const bool empty = (spec.coll == Collective::kAllGather ? spec.in.count : spec.out.count) == 0;
  if (!empty) {
    Group& g = groupOf(d, spec);
    const Algorithm a = s.selector.select(spec.call, spec.algorithm, g);
    ctx.algorithm = std::string(algorithmName(a)) + " (" + g.backend().kind() + ")";
    runAlgorithm(g, spec, a, ctx);
  }
  Event end;
  checkCuda(cudaEventRecord(end.e, d.stream), "cudaEventRecord (end of operation)");
  // Later work on the caller's stream sees the result even before the host learns of it.
  checkCuda(cudaStreamWaitEvent(caller, end.e, 0), "cudaStreamWaitEvent (caller's stream)");
  waitEvent(end.e, ctx.op.c_str(), ctx, nullptr, [&d] { abortAll(d); });
}

}  // namespace fourd::detail
