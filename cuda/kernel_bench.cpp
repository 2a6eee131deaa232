// fourd_kernel_bench: bandwidth of fourd's CUDA kernels next to the device's own copy.
//
// For each case it times `iters` back-to-back launches with CUDA events after `warmup` launches
// and reports the mean time per launch and the bytes moved per second, counting every byte read
// and written once (a reduction of n sources over B bytes moves (n + 1) * B; a copy 2 * B). The
// reference is cudaMemcpyAsync device-to-device over the same buffer size, measured the same way,
// so "vs copy" near 100 % means the kernel runs at the memory system's practical limit.
//
// Output: a human-readable table, then one line of JSON (the last line of stdout; also written
// to --json FILE when given).
//
// Usage: fourd_kernel_bench [--mib N (256)] [--iters N (20)] [--warmup N (3)] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fourd_cuda.hpp"

namespace {

using fourd::DataType;
using fourd::ReduceOp;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
  }
}

struct Options {
  size_t mib = 256;
  int iters = 20;
  int warmup = 3;
  std::string jsonPath;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--mib") {
      o.mib = std::stoul(next());
    } else if (a == "--iters") {
      o.iters = std::stoi(next());
    } else if (a == "--warmup") {
      o.warmup = std::stoi(next());
    } else if (a == "--json") {
      o.jsonPath = next();
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: fourd_kernel_bench [--mib N] [--iters N] [--warmup N] [--json FILE]\n");
      std::exit(0);
    } else {
      throw std::runtime_error("unknown argument " + a);
    }
  }
  if (o.mib == 0 || o.iters < 1 || o.warmup < 0) throw std::runtime_error("bad arguments");
  return o;
}

const char* orUnknown(const char* name) { return name != nullptr ? name : "?"; }

struct Row {
  std::string kind;   // "copy", "reduce", "permute"
  std::string name;   // what was run
  std::string dtype;  // "" for byte copies
  int nsrcs = 0;
  size_t bytes = 0;  // bytes per buffer
  size_t moved = 0;  // bytes read + written per launch
  double us = 0;
  double gbps = 0;
  double vsCopy = 0;  // gbps / copy gbps
};

template <typename F>
double timeUs(F&& launch, int warmup, int iters, cudaStream_t s) {
  for (int i = 0; i < warmup; ++i) launch();
  check(cudaStreamSynchronize(s), "warmup");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaEventRecord(a, s), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) launch();
  check(cudaEventRecord(b, s), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / iters;
}

std::string jsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

// The buffers, the stream and the rows of one run.
struct Bench {
  static constexpr int kMaxSrcs = 8;
  const Options& opt;
  size_t bytes;
  std::vector<void*> bufs;
  void* dst = nullptr;
  cudaStream_t s = nullptr;
  std::vector<Row> rows;
  double copyGbps = 0.0;

  explicit Bench(const Options& o) : opt(o), bytes(o.mib << 20), bufs(kMaxSrcs + 1, nullptr) {
    // One extra 16 bytes per buffer so the misaligned cases stay inside the allocation.
    for (auto& p : bufs) {
      check(cudaMalloc(&p, bytes + 16), "cudaMalloc (lower --mib?)");
      // Bytes 0x11: small finite values in every dtype (no NaN or Inf slow paths).
      check(cudaMemset(p, 0x11, bytes + 16), "cudaMemset");
    }
    // The memsets ran on the legacy default stream, which the non-blocking stream below does
    // not wait for: finish them before the first timed launch.
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    dst = bufs[kMaxSrcs];
  }
  ~Bench() {
    for (void* p : bufs) cudaFree(p);
    if (s) cudaStreamDestroy(s);
  }

  // Reference: the device's own device-to-device copy.
  void addCopy() {
    Row copy;
    copy.kind = "copy";
    copy.name = "cudaMemcpyAsync D2D";
    copy.bytes = bytes;
    copy.moved = 2 * bytes;
    copy.us = timeUs(
        [&] {
          check(cudaMemcpyAsync(dst, bufs[0], bytes, cudaMemcpyDeviceToDevice, s),
                "cudaMemcpyAsync");
        },
        opt.warmup, opt.iters, s);
    copy.gbps = copy.moved / copy.us / 1e3;
    copy.vsCopy = 1.0;
    copyGbps = copy.gbps;
    rows.push_back(copy);
  }

  void addReduce(const std::string& label, DataType t, ReduceOp op, int n, size_t nbytes,
                 size_t srcShift, size_t dstShift) {
    const size_t es = fourd::cuda::elementSize(t);
    const size_t count = nbytes / es;
    std::vector<const void*> srcs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      // srcShift applies to source 0 only: that breaks mutual alignment (scalar path).
      srcs[static_cast<size_t>(i)] =
          static_cast<const char*>(bufs[static_cast<size_t>(i)]) + (i == 0 ? srcShift : dstShift);
    }
    void* d = static_cast<char*>(dst) + dstShift;
    Row r;
    r.kind = "reduce";
    r.name = label.empty() ? orUnknown(fourd::detail::reduceOpName(op)) : label;
    r.dtype = orUnknown(fourd::detail::dataTypeName(t));
    r.nsrcs = n;
    r.bytes = count * es;
    r.moved = static_cast<size_t>(n + 1) * r.bytes;
    r.us = timeUs([&] { fourd::cuda::reduce(d, srcs.data(), n, count, t, op, s); }, opt.warmup,
                  opt.iters, s);
    r.gbps = r.moved / r.us / 1e3;
    r.vsCopy = r.gbps / copyGbps;
    rows.push_back(r);
  }

  void addReductions() {
    for (int i = 0; i < fourd::kNumDataTypes; ++i)
      addReduce("", static_cast<DataType>(i), ReduceOp::kSum, 2, bytes, 0, 0);
    for (ReduceOp op : {ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
      addReduce("", DataType::kFloat32, op, 2, bytes, 0, 0);
    }
    addReduce("", DataType::kBFloat16, ReduceOp::kAvg, 2, bytes, 0, 0);
    for (int n : {4, 8}) {
      addReduce("", DataType::kFloat32, ReduceOp::kSum, n, bytes, 0, 0);
      addReduce("", DataType::kBFloat16, ReduceOp::kSum, n, bytes, 0, 0);
    }
    addReduce("sum, all offset 4 B (peeled)", DataType::kFloat32, ReduceOp::kSum, 2, bytes - 16, 4,
              4);
    addReduce("sum, src0 offset 4 B (scalar)", DataType::kFloat32, ReduceOp::kSum, 2, bytes - 16, 4,
              0);
    addReduce("sum, src0 offset 2 B (scalar)", DataType::kBFloat16, ReduceOp::kSum, 2, bytes - 16,
              2, 0);
    // Small buffers: launch overhead and tail effects.
    for (size_t small : {size_t(64) << 10, size_t(1) << 20, size_t(16) << 20}) {
      if (small < bytes) addReduce("", DataType::kFloat32, ReduceOp::kSum, 2, small, 0, 0);
    }
  }

  // Block permutations (reverse order) over the whole buffer, kernel against cudaMemcpyAsync.
  void addPermute(size_t blockBytes, fourd::cuda::CopyMethod m, size_t total) {
    const int nblocks = static_cast<int>(total / blockBytes);
    if (nblocks < 1) return;
    std::vector<int> perm(static_cast<size_t>(nblocks));
    for (int i = 0; i < nblocks; ++i) perm[static_cast<size_t>(i)] = nblocks - 1 - i;
    Row r;
    r.kind = "permute";
    r.name = std::string(m == fourd::cuda::CopyMethod::kKernel ? "kernel" : "memcpy") +
             " blocks of " + std::to_string(blockBytes >> 10) + " KiB x " + std::to_string(nblocks);
    r.bytes = blockBytes * static_cast<size_t>(nblocks);
    r.moved = 2 * r.bytes;
    r.us = timeUs(
        [&] { fourd::cuda::permuteBlocks(dst, bufs[0], blockBytes, perm.data(), nblocks, s, m); },
        opt.warmup, opt.iters, s);
    r.gbps = r.moved / r.us / 1e3;
    r.vsCopy = r.gbps / copyGbps;
    rows.push_back(r);
  }

  void addPermutes() {
    const size_t kib = 1024;
    for (size_t bb : {4 * kib, 64 * kib, 256 * kib, 1024 * kib, 16384 * kib, 65536 * kib}) {
      // At most 1024 blocks: the group sizes the algorithms permute over.
      const size_t total = std::min(bytes, bb * 1024);
      addPermute(bb, fourd::cuda::CopyMethod::kKernel, total);
      addPermute(bb, fourd::cuda::CopyMethod::kMemcpy, total);
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
};

std::string rowsJson(const cudaDeviceProp& prop, int ver, int drv, const Options& opt, size_t bytes,
                     const std::vector<Row>& rows) {
  std::string json = "{\"bench\":\"fourd_kernel_bench\",\"device\":\"" + jsonEscape(prop.name) +
                     "\",\"sms\":" + std::to_string(prop.multiProcessorCount) +
                     ",\"cuda_runtime\":" + std::to_string(ver) +
                     ",\"cuda_driver\":" + std::to_string(drv) +
                     ",\"nccl\":" + std::to_string(fourd::cuda::ncclVersion()) +
                     ",\"buffer_bytes\":" + std::to_string(bytes) +
                     ",\"iters\":" + std::to_string(opt.iters) + ",\"rows\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    char num[256];
    std::snprintf(num, sizeof(num),
                  "\"nsrcs\":%d,\"bytes\":%zu,\"moved\":%zu,\"us\":%.3f,\"gbps\":%.2f,"
                  "\"vs_copy\":%.4f",
                  r.nsrcs, r.bytes, r.moved, r.us, r.gbps, r.vsCopy);
    json += std::string(i ? "," : "") + "{\"kind\":\"" + r.kind + "\",\"case\":\"" +
            jsonEscape(r.name) + "\",\"dtype\":\"" + r.dtype + "\"," + num + "}";
  }
  return json + "]}";
}

void report(const Bench& b, const cudaDeviceProp& prop) {
  int ver = 0;
  cudaRuntimeGetVersion(&ver);
  int drv = 0;
  cudaDriverGetVersion(&drv);
  const Options& opt = b.opt;
  std::printf(
      "fourd_kernel_bench: %s, %d SMs, runtime %d, driver %d, NCCL %d; buffers %zu MiB, "
      "%d iterations after %d warm-up\n",
      prop.name, prop.multiProcessorCount, ver, drv, fourd::cuda::ncclVersion(), opt.mib, opt.iters,
      opt.warmup);
  std::printf("bandwidth counts bytes read + written; 'vs copy' = against cudaMemcpyAsync D2D\n");
  std::printf("%-8s %-36s %-9s %5s %10s %10s %9s %8s\n", "kind", "case", "dtype", "nsrcs",
              "MiB/buf", "time us", "GB/s", "vs copy");
  for (const Row& r : b.rows) {
    std::printf("%-8s %-36s %-9s %5d %10.3f %10.1f %9.1f %7.1f%%\n", r.kind.c_str(), r.name.c_str(),
                r.dtype.empty() ? "-" : r.dtype.c_str(), r.nsrcs, r.bytes / 1048576.0, r.us, r.gbps,
                100.0 * r.vsCopy);
  }
  const std::string json = rowsJson(prop, ver, drv, opt, b.bytes, b.rows);
  std::printf("%s\n", json.c_str());
  if (!opt.jsonPath.empty()) {
    FILE* f = std::fopen(opt.jsonPath.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + opt.jsonPath);
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
}

int run(const Options& opt) {
  std::string why;
  if (fourd::cuda::deviceCount(&why) == 0) {
    std::fprintf(stderr, "fourd_kernel_bench: no CUDA device: %s\n", why.c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  Bench b(opt);
  b.addCopy();
  b.addReductions();
  b.addPermutes();
  report(b, prop);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fourd_kernel_bench: error: %s\n", e.what());
    return 1;
  }
}
