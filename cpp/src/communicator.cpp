// Communicator: validation, algorithm choice, sequence numbers, deadlines, debug fingerprints and
// poisoning around the algorithms. Every check that can fail on bad input runs before any
// communication, on the calling thread.
#include "fourd/communicator.hpp"

#include <cstdio>
#include <cstring>
#include <sstream>

#include "fourd/error.hpp"
#include "internal/comm_state.hpp"
#include "internal/cuda_path.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd {

using detail::Clock;
using detail::CommState;
using detail::OpContext;
using detail::Tuner;

Communicator::Communicator(std::unique_ptr<CommState> state) : state_(std::move(state)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const noexcept { return state_->rank(); }
int Communicator::size() const noexcept { return state_->size(); }
AxisMask Communicator::mask() const noexcept { return state_->mask; }
const std::string& Communicator::name() const noexcept { return state_->name; }
const std::vector<int>& Communicator::worldRanks() const noexcept {
  return state_->mpi->worldRanks();
}
const GroupTopology& Communicator::topology() const noexcept { return state_->topo; }
bool Communicator::poisoned() const noexcept { return state_->poisoned.load(); }
std::string Communicator::poisonReason() const {
  std::lock_guard<std::mutex> lk(state_->poisonMu);
  return state_->poisonReason;
}

bool Communicator::drain(double timeoutSeconds) noexcept {
  try {
    return state_->executor.drain(timeoutSeconds);
  } catch (...) {
    return false;
  }
}

namespace {

GroupShape shapeOf(const GroupTopology& t) {
  GroupShape g;
  g.size = t.size;
  g.nodes = t.numNodes;
  g.uniform = t.uniform;
  g.ranksPerNode = t.uniform ? t.k : 0;
  return g;
}

// What every rank of a group compares in debug mode.
struct Fingerprint {
  char op[24];
  uint32_t mask;
  int32_t dtype;
  int32_t redop;
  int32_t root;
  int32_t algorithm;
  int32_t pad;
  uint64_t count;
  uint64_t seq;
};

std::string fingerprintText(const Fingerprint& f) {
  std::ostringstream os;
  os << "(" << f.op << ", axis " << maskName(f.mask) << ", count " << f.count << ", dtype "
     << toString(static_cast<DataType>(f.dtype));
  if (f.redop >= 0) os << ", op " << toString(static_cast<ReduceOp>(f.redop));
  if (f.root >= 0) os << ", src " << f.root;
  os << ", algorithm " << algorithmName(static_cast<Algorithm>(f.algorithm)) << ", seq " << f.seq
     << ")";
  return os.str();
}

bool overlaps(const Buffer& a, const Buffer& b) {
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a.bytes() && b.bytes() && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

}  // namespace

Algorithm Communicator::choose(Collective c, size_t nbytes, DataType dtype, bool inPlace) const {
  // Broadcast always runs the library's own; a one-rank group has nothing to choose.
  if (size() == 1 || c == Collective::kBroadcast) return Algorithm::kFlat;
  auto& memo = state_->choiceMemo;
  const auto key = std::make_tuple(static_cast<int>(c), nbytes, static_cast<int>(dtype), inPlace);
  std::shared_ptr<const MachineProfile> profile = *state_->profile;
  if (state_->tuner.tunes(nbytes, size())) {
    // Tuned in use (tuner.hpp): what the calls chose runs from then on (provisionally or
    // for good; kAuto while they explore).
    const auto t = state_->tuner.report(key, profile);
    if (t.settled != Algorithm::kAuto) return t.settled;
  }
  {
    std::lock_guard<std::mutex> lock(memo.mu);
    if (memo.profile != profile) {
      memo.choices.clear();
      memo.profile = profile;
    }
    const auto it = memo.choices.find(key);
    if (it != memo.choices.end()) return it->second;
  }
  Algorithm a = fourd::choose(c, nbytes, dtype, shapeOf(state_->topo), *profile, inPlace);
  // Only built-in algorithms can be chosen.
  if (detail::algorithmImpl(a) == nullptr) a = Algorithm::kFlat;
  std::lock_guard<std::mutex> lock(memo.mu);
  if (memo.profile == profile) {
    if (memo.choices.size() >= 4096) memo.choices.clear();  // bounded: sizes vary per call
    memo.choices.emplace(key, a);
  }
  return a;
}

std::vector<Prediction> Communicator::explain(Collective c, size_t nbytes, DataType dtype,
                                              bool inPlace) const {
  auto preds = candidates(c, nbytes, dtype, shapeOf(state_->topo), **state_->profile, inPlace);
  for (auto& p : preds) {
    if (c == Collective::kBroadcast && p.algorithm != Algorithm::kFlat && p.supported) {
      p.supported = false;
      p.reason = "broadcast always runs the MPI library's own (flat)";
    }
    if (p.supported && detail::algorithmImpl(p.algorithm) == nullptr) {
      p.supported = false;
      p.reason = "not built into this version of fourd";
    }
  }
  return preds;
}

Communicator::Tuning Communicator::tuning(Collective c, size_t nbytes, DataType dtype,
                                          bool inPlace) const {
  Tuning out;
  if (c == Collective::kBroadcast || !state_->tuner.tunes(nbytes, size())) {
    out.state = "off";
    return out;
  }
  const auto r = state_->tuner.report(
      std::make_tuple(static_cast<int>(c), nbytes, static_cast<int>(dtype), inPlace),
      *state_->profile);
  out.state = r.state;
  out.candidates = r.candidates;
  out.seconds = r.seconds;
  out.settled = r.settled;
  out.exploreCalls = r.exploreCalls;
  out.recheckGap = r.recheckGap;
  return out;
}

namespace {

// Resolves `requested` to a concrete algorithm that can run, or throws. kAuto only where the
// call's tuning decides when it runs (runTuned).
Algorithm resolveAlgorithm(Communicator& comm, Collective c, size_t nbytes, DataType dtype,
                           Algorithm requested, bool inPlace) {
  if (c == Collective::kBroadcast) return Algorithm::kFlat;
  if (requested == Algorithm::kAuto) {
    if (const char* env = std::getenv("FOURD_ALGORITHM")) {
      if (*env) requested = parseAlgorithm(env, "FOURD_ALGORITHM");
    }
  }
  if (requested == Algorithm::kAuto) {
    if (comm.state().tuner.tunes(nbytes, comm.size())) return Algorithm::kAuto;
    return comm.choose(c, nbytes, dtype, inPlace);
  }
  if (comm.size() == 1) return Algorithm::kFlat;
  const auto* impl = detail::algorithmImpl(requested);
  if (impl == nullptr) {
    throw InvalidArgument(std::string("algorithm: '") + algorithmName(requested) +
                          "' is not built into this version of fourd");
  }
  std::string why;
  if (!impl->supports(c, comm.state(), &why)) {
    throw InvalidArgument(std::string("algorithm: '") + algorithmName(requested) +
                          "' cannot run " + collectiveName(c) + " on axis '" + comm.name() +
                          "' (" + comm.topology().describe() + "): " + why);
  }
  return requested;
}

[[noreturn]] void abortJob(const std::string& msg) {
  std::fprintf(stderr, "%s\nfourd: FOURD_ABORT_ON_TIMEOUT is set: aborting the job.\n", msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

struct OpSpec {
  Collective coll;
  const char* opName;
  Buffer in, out;
  ReduceOp op = ReduceOp::kSum;
  bool hasOp = false;
  int root = -1;
  bool isBarrier = false;
  bool inPlace = false;  // reduce_scatter whose output is this rank's block of the input
  Algorithm algorithm = Algorithm::kFlat;
  CallOptions opts;
  uint64_t seq = 0;
  void* stream = nullptr;  // CUDA buffers: the caller's stream (see internal/cuda_path.hpp)
  // algorithm == kAuto on host buffers: tuned when it runs (runTuned), keyed by these, priced
  // by the profile current when the call was issued (the same call on every rank).
  size_t tuneBytes = 0;
  bool tuneInPlace = false;
  std::shared_ptr<const MachineProfile> profile;
};

// Fills in what runTuned needs when `auto` is left to the call's tuning.
void markTuned(Communicator& comm, OpSpec& spec, size_t nbytes, bool inPlace) {
  if (spec.algorithm != Algorithm::kAuto) return;
  spec.tuneBytes = nbytes;
  spec.tuneInPlace = inPlace;
  spec.profile = *comm.state().profile;
}

#ifdef FOURD_HAVE_CUDA
bool onCuda(const Buffer& in, const Buffer& out) {
  return in.device == DeviceType::kCuda || out.device == DeviceType::kCuda;
}
#endif

// The data movement of one operation on host buffers (everything after the debug check).
void runHostBody(CommState& s, const OpSpec& spec, OpContext& ctx) {
  if (spec.coll == Collective::kBroadcast) {
    if (spec.out.count) s.mpi->broadcast(spec.out, spec.root, ctx);
    return;
  }
  const auto* impl = detail::algorithmImpl(spec.algorithm);
  Buffer in = spec.in, out = spec.out;
  if (spec.inPlace) {
    // Algorithms take non-overlapping buffers: reduce into scratch, then copy the block over
    // this rank's part of the input (which the algorithm no longer reads).
    out.data = s.scratch(4, out.bytes());
  }
  const bool widen = spec.opts.accumulateFp32 && spec.hasOp &&
                     (in.dtype == DataType::kFloat16 || in.dtype == DataType::kBFloat16);
  if (widen) {
    // Keep partial sums in float32 across every step; round once at the end.
    float* wi = static_cast<float*>(s.scratch(2, in.count * sizeof(float)));
    float* wo = static_cast<float*>(s.scratch(3, out.count * sizeof(float)));
    detail::toFloat32(wi, in.data, in.count, in.dtype);
    Buffer win(wi, in.count, DataType::kFloat32);
    Buffer wout(in.data == out.data && spec.coll == Collective::kAllReduce ? wi : wo, out.count,
                DataType::kFloat32);
    if (spec.coll == Collective::kAllReduce) impl->allReduce(s, win, wout, spec.op, ctx);
    else impl->reduceScatter(s, win, wout, spec.op, ctx);
    if (spec.op == ReduceOp::kAvg) detail::scaleInPlace(wout.data, wout.count, wout.dtype, 1.0 / s.size());
    detail::fromFloat32(spec.out.data, static_cast<float*>(wout.data), out.count, out.dtype);
    return;
  }
  switch (spec.coll) {
    case Collective::kAllReduce: impl->allReduce(s, in, out, spec.op, ctx); break;
    case Collective::kAllGather: impl->allGather(s, in, out, ctx); break;
    case Collective::kReduceScatter: impl->reduceScatter(s, in, out, spec.op, ctx); break;
    default: break;
  }
  if (spec.hasOp && spec.op == ReduceOp::kAvg)
    detail::scaleInPlace(out.data, out.count, out.dtype, 1.0 / s.size());
  if (spec.inPlace) std::memcpy(spec.out.data, out.data, out.bytes());
}

#ifdef FOURD_HAVE_CUDA
// resolveAlgorithm for a CommState (the staged CUDA path picks per host call; kAuto allowed).
Algorithm resolveOnState(CommState& s, Collective c, size_t nbytes, DataType dtype,
                         Algorithm requested) {
  if (c == Collective::kBroadcast || s.size() == 1) return Algorithm::kFlat;
  if (requested == Algorithm::kAuto) {
    Algorithm a = fourd::choose(c, nbytes, dtype, shapeOf(s.topo), **s.profile);
    return detail::algorithmImpl(a) == nullptr ? Algorithm::kFlat : a;
  }
  const auto* impl = detail::algorithmImpl(requested);
  std::string why;
  if (impl == nullptr) why = "not built into this version of fourd";
  else if (!impl->supports(c, s, &why)) impl = nullptr;
  if (impl == nullptr) {
    throw InvalidArgument(std::string("algorithm: '") + algorithmName(requested) +
                          "' cannot run " + collectiveName(c) + " on axis '" + s.name + "' (" +
                          s.topo.describe() + "): " + why);
  }
  return requested;
}
#endif

// An `auto` call on host buffers: its tuning (tuner.hpp) picks the algorithm; the time of a
// timed call goes back to it, and after the last timed call of its key every rank's medians
// are made common (one MAX all-reduce on this group, at the same call on every rank).
void runTuned(CommState& s, const OpSpec& spec, OpContext& ctx) {
  const Tuner::Key key{static_cast<int>(spec.coll), spec.tuneBytes,
                       static_cast<int>(spec.in.dtype), spec.tuneInPlace};
  const auto step = s.tuner.next(key, spec.profile, [&] {
    const GroupShape shape = shapeOf(s.topo);
    auto preds = candidates(spec.coll, spec.tuneBytes, spec.in.dtype, shape, *spec.profile,
                            spec.tuneInPlace);
    for (auto& p : preds) p.supported = p.supported && detail::algorithmImpl(p.algorithm);
    Algorithm model = fourd::choose(spec.coll, spec.tuneBytes, spec.in.dtype, shape,
                                    *spec.profile, spec.tuneInPlace);
    if (detail::algorithmImpl(model) == nullptr) model = Algorithm::kFlat;
    return Tuner::shortlist(preds, model, spec.tuneBytes);
  });
  OpSpec run = spec;
  run.algorithm = step.algorithm;
  ctx.algorithm = algorithmName(step.algorithm);
  // A candidate's timed calls start from a barrier (the first calls of a size only): else a
  // rank's time holds its wait for the others, whatever the algorithm.
  if (step.barrier) s.mpi->barrier(ctx);
  const auto t0 = Clock::now();
  runHostBody(s, run, ctx);
  if (!step.timed) return;
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> mine = s.tuner.record(key, spec.profile, step, dt);
  if (mine.empty()) return;
  std::vector<double> common(mine.size());
  s.mpi->allReduce(Buffer(mine.data(), mine.size(), DataType::kFloat64),
                   Buffer(common.data(), common.size(), DataType::kFloat64), ReduceOp::kMax, ctx);
  s.tuner.settle(key, spec.profile, common);
}

void runOp(CommState& s, const OpSpec& spec) {
  if (s.poisoned.load()) {
    std::lock_guard<std::mutex> lk(s.poisonMu);
    throw AbortedError("fourd: " + std::string(spec.opName) + " on axis '" + s.name +
                       "' refused: the communicator is poisoned by an earlier failure: " +
                       s.poisonReason);
  }
  OpContext ctx;
  ctx.op = spec.opName;
  ctx.axis = s.name;
  ctx.algorithm = algorithmName(spec.algorithm);
  ctx.seq = spec.seq;
  ctx.groupWorldRanks = &s.mpi->worldRanks();
  ctx.timeoutSeconds = spec.opts.timeoutSeconds > 0 ? spec.opts.timeoutSeconds : s.defaultTimeout;
  ctx.start = Clock::now();
  ctx.deadline = ctx.start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(ctx.timeoutSeconds));
  ctx.tag = static_cast<int>(spec.seq % 30000) + 1;
  try {
    if (s.debug) {
      Fingerprint mine{};
      std::snprintf(mine.op, sizeof(mine.op), "%s", spec.opName);
      mine.mask = s.mask;
      mine.dtype = static_cast<int32_t>(spec.coll == Collective::kBroadcast ? spec.out.dtype
                                                                            : spec.in.dtype);
      mine.redop = spec.hasOp ? static_cast<int32_t>(spec.op) : -1;
      mine.root = spec.root;
      mine.algorithm = static_cast<int32_t>(spec.algorithm);
      mine.count = spec.in.count;
      mine.seq = spec.seq;
      std::vector<Fingerprint> all(s.size());
      s.mpi->allGatherBytes(&mine, sizeof(mine), all.data(), ctx);
      bool same = true;
      for (const auto& f : all) same = same && std::memcmp(&f, &all[0], sizeof(f)) == 0;
      if (!same) {
        std::ostringstream os;
        os << "fourd: ranks of axis '" << s.name << "' called different collectives (FOURD_DEBUG):";
        std::vector<bool> done(all.size(), false);
        for (size_t i = 0; i < all.size(); ++i) {
          if (done[i]) continue;
          os << "\n  world ranks [";
          bool first = true;
          for (size_t j = i; j < all.size(); ++j) {
            if (!done[j] && std::memcmp(&all[j], &all[i], sizeof(Fingerprint)) == 0) {
              done[j] = true;
              os << (first ? "" : ", ") << s.mpi->worldRanks()[j];
              first = false;
            }
          }
          os << "] called " << fingerprintText(all[i]);
        }
        os << "\n  this rank (world rank " << s.mpi->worldRanks()[s.rank()] << ") called "
           << fingerprintText(mine);
        throw MismatchError(os.str());
      }
    }
    if (spec.isBarrier) {
      s.mpi->barrier(ctx);
      return;
    }
#ifdef FOURD_HAVE_CUDA
    if (onCuda(spec.in, spec.out)) {
      detail::CudaOp op;
      op.coll = spec.coll;
      op.opName = spec.opName;
      op.in = spec.in;
      op.out = spec.out;
      op.op = spec.op;
      op.hasOp = spec.hasOp;
      op.root = spec.root;
      op.inPlace = spec.inPlace;
      op.requested = spec.algorithm;
      op.accumulateFp32 = spec.opts.accumulateFp32;
      op.stream = spec.stream;
      detail::runCudaOp(s, op, ctx, [&](const Buffer& hin, const Buffer& hout, Algorithm req) {
        OpSpec h = spec;
        h.in = hin;
        h.out = hout;
        h.inPlace = false;
        h.algorithm = resolveOnState(s, spec.coll, hin.bytes() > hout.bytes() ? hin.bytes()
                                                                               : hout.bytes(),
                                     hin.dtype, req);
        runHostBody(s, h, ctx);
      });
      return;
    }
#endif
    if (spec.algorithm == Algorithm::kAuto) runTuned(s, spec, ctx);
    else runHostBody(s, spec, ctx);
  } catch (const TimeoutError& e) {
    s.poison(std::string("seq ") + std::to_string(spec.seq) + " (" + spec.opName +
             ") timed out: " + e.what());
    if (s.abortOnTimeout) abortJob(e.what());
    throw;
  } catch (const AbortedError& e) {
    s.poison(std::string("seq ") + std::to_string(spec.seq) + " (" + spec.opName +
             ") was interrupted: " + e.what());
    throw;
  } catch (const BackendError& e) {
    s.poison(std::string("seq ") + std::to_string(spec.seq) + " (" + spec.opName +
             ") failed in the backend: " + e.what());
    throw;
  }
}

std::shared_ptr<Work> dispatch(CommState& s, OpSpec spec) {
  if (s.poisoned.load()) {
    std::lock_guard<std::mutex> lk(s.poisonMu);
    throw AbortedError("fourd: " + std::string(spec.opName) + " on axis '" + s.name +
                       "' refused: the communicator is poisoned by an earlier failure: " +
                       s.poisonReason);
  }
  spec.seq = s.nextSeq.fetch_add(1);
  auto w = std::make_shared<Work>(std::string(spec.opName) + " on axis '" + s.name + "' seq " +
                                  std::to_string(spec.seq));
  CommState* sp = &s;
  w->body = [sp, spec] { runOp(*sp, spec); };
  if (spec.opts.async) {
    s.executor.submit(w);
    return w;
  }
  if (!s.executor.runInlineIfIdle(w)) {
    // Queued behind asynchronous work on this communicator: wait in short slices so an
    // interrupt (Ctrl-C) is seen within ~20 ms.
    while (!w->wait(0.02)) {
      if (detail::interruptRequested()) {
        throw AbortedError("fourd: interrupted while waiting for " + w->description());
      }
    }
  }
  if (auto e = w->error()) std::rethrow_exception(e);
  return w;
}

void checkDevice(const Buffer& b, const char* arg) {
  if (b.device == DeviceType::kCpu) return;
#ifndef FOURD_HAVE_CUDA
  throw InvalidArgument(std::string(arg) + ": expected a CPU tensor (this build of fourd has no "
                        "CUDA support; rebuild with FOURD_CUDA=ON), found a CUDA tensor on device " +
                        std::to_string(b.deviceIndex));
#endif
}

// CUDA buffers: capture the caller's stream on the calling thread; the algorithm is resolved
// once the group's GPU backend is known (runCudaOp). False for CPU buffers (nothing changes).
bool prepareCuda(OpSpec& spec, const CallOptions& opts) {
#ifdef FOURD_HAVE_CUDA
  if (!onCuda(spec.in, spec.out)) return false;
  if (spec.in.device != spec.out.device) {
    throw InvalidArgument("output: expected a tensor on the input's device, found one on the " +
                          std::string(spec.out.device == DeviceType::kCuda ? "GPU" : "CPU"));
  }
  spec.algorithm = spec.coll == Collective::kBroadcast ? Algorithm::kFlat : opts.algorithm;
  spec.stream = detail::takeCallerStream();
  return true;
#else
  (void)spec;
  (void)opts;
  return false;
#endif
}

void checkSameDtype(const Buffer& in, const Buffer& out) {
  checkDevice(in, "input");
  checkDevice(out, "output");
  if (in.dtype != out.dtype) {
    throw TypeMismatch("output: expected the input's dtype " + toString(in.dtype) + ", found " +
                       toString(out.dtype));
  }
}

}  // namespace

std::shared_ptr<Work> Communicator::allReduce(const Buffer& in, const Buffer& out, ReduceOp op,
                                              const CallOptions& opts) {
  checkSameDtype(in, out);
  checkOpSupported(op, in.dtype);
  if (in.count != out.count) {
    throw InvalidArgument("output: expected " + std::to_string(in.count) +
                          " elements (the input's count), found " + std::to_string(out.count));
  }
  if (in.data != out.data && overlaps(in, out)) {
    throw InvalidArgument("output: overlaps the input of an out-of-place all_reduce; pass the "
                          "same tensor for in place, or non-overlapping tensors");
  }
  OpSpec spec{Collective::kAllReduce, "all_reduce", in, out};
  spec.op = op;
  spec.hasOp = true;
  spec.opts = opts;
  const bool cuda = prepareCuda(spec, opts);
  if (!cuda) {
    spec.algorithm = in.count == 0 ? Algorithm::kFlat
                                   : resolveAlgorithm(*this, Collective::kAllReduce, in.bytes(),
                                                      in.dtype, opts.algorithm,
                                                      in.data == out.data);
    markTuned(*this, spec, in.bytes(), in.data == out.data);
  }
  if (!cuda && (in.count == 0 || size() == 1)) {
    if (in.data != out.data && in.bytes()) std::memcpy(out.data, in.data, in.bytes());
    if (!state_->debug) {
      auto w = std::make_shared<Work>("all_reduce (nothing to send)");
      state_->nextSeq.fetch_add(1);
      w->markCompleted(nullptr);
      return w;
    }
  }
  return dispatch(*state_, spec);
}

std::shared_ptr<Work> Communicator::allGather(const Buffer& in, const Buffer& out,
                                              const CallOptions& opts) {
  checkSameDtype(in, out);
  const size_t expect = in.count * static_cast<size_t>(size());
  if (out.count != expect) {
    throw InvalidArgument("output: expected " + std::to_string(expect) + " elements (group size " +
                          std::to_string(size()) + " x input count " + std::to_string(in.count) +
                          "), found " + std::to_string(out.count));
  }
  const Buffer myBlock = out.slice(in.count * rank(), in.count);
  if (in.data != myBlock.data && overlaps(in, out)) {
    throw InvalidArgument("input: overlaps the output of an out-of-place all_gather (only the "
                          "output block of this rank may be passed as input)");
  }
  OpSpec spec{Collective::kAllGather, "all_gather", in, out};
  spec.opts = opts;
  const bool cuda = prepareCuda(spec, opts);
  if (!cuda) {
    spec.algorithm = in.count == 0 ? Algorithm::kFlat
                                   : resolveAlgorithm(*this, Collective::kAllGather, out.bytes(),
                                                      in.dtype, opts.algorithm,
                                                      in.data == myBlock.data);
    markTuned(*this, spec, out.bytes(), in.data == myBlock.data);
  }
  if (!cuda && (in.count == 0 || size() == 1) && !state_->debug) {
    if (in.data != out.data && in.bytes()) std::memmove(out.data, in.data, in.bytes());
    auto w = std::make_shared<Work>("all_gather (nothing to send)");
    state_->nextSeq.fetch_add(1);
    w->markCompleted(nullptr);
    return w;
  }
  return dispatch(*state_, spec);
}

std::shared_ptr<Work> Communicator::reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op,
                                                  const CallOptions& opts) {
  checkSameDtype(in, out);
  checkOpSupported(op, in.dtype);
  const size_t expect = out.count * static_cast<size_t>(size());
  if (in.count != expect) {
    throw InvalidArgument("input: expected " + std::to_string(expect) + " elements (group size " +
                          std::to_string(size()) + " x output count " +
                          std::to_string(out.count) + "), found " + std::to_string(in.count) +
                          (in.count % size() ? " (not divisible by the group size)" : ""));
  }
  // In place, as nccl-tests lays it out: the output is this rank's block of the input.
  const bool inPlace = out.count > 0 && out.data == in.slice(out.count * rank(), out.count).data;
  if (!inPlace && overlaps(in, out)) {
    throw InvalidArgument("output: overlaps the input of reduce_scatter; pass separate tensors, "
                          "or this rank's block of the input for in place");
  }
  OpSpec spec{Collective::kReduceScatter, "reduce_scatter", in, out};
  spec.inPlace = inPlace;
  spec.op = op;
  spec.hasOp = true;
  spec.opts = opts;
  const bool cuda = prepareCuda(spec, opts);
  if (!cuda) {
    spec.algorithm = out.count == 0 ? Algorithm::kFlat
                                    : resolveAlgorithm(*this, Collective::kReduceScatter, in.bytes(),
                                                       in.dtype, opts.algorithm, inPlace);
    markTuned(*this, spec, in.bytes(), inPlace);
  }
  if (!cuda && (out.count == 0 || size() == 1) && !state_->debug) {
    if (out.bytes() && out.data != in.data) std::memmove(out.data, in.data, out.bytes());
    auto w = std::make_shared<Work>("reduce_scatter (nothing to send)");
    state_->nextSeq.fetch_add(1);
    w->markCompleted(nullptr);
    return w;
  }
  return dispatch(*state_, spec);
}

std::shared_ptr<Work> Communicator::broadcast(const Buffer& buf, int root, const CallOptions& opts) {
  checkDevice(buf, "tensor");
  if (root < 0 || root >= size()) {
    throw InvalidArgument("src: expected a group rank 0 <= src < " + std::to_string(size()) +
                          " on axis '" + name() + "', found " + std::to_string(root));
  }
  OpSpec spec{Collective::kBroadcast, "broadcast", buf, buf};
  spec.root = root;
  spec.opts = opts;
  spec.algorithm = Algorithm::kFlat;
  prepareCuda(spec, opts);
  return dispatch(*state_, spec);
}

std::shared_ptr<Work> Communicator::barrier(const CallOptions& opts) {
  OpSpec spec{Collective::kBroadcast, "barrier", Buffer(), Buffer()};
  spec.opts = opts;
  spec.isBarrier = true;
  spec.algorithm = Algorithm::kFlat;
  return dispatch(*state_, spec);
}

}  // namespace fourd
