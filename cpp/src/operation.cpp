// The engine of one operation (internal/op_spec.hpp): what runs between dispatch and the
// algorithm, on the thread that runs it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include <mpi.h>

#include "algorithms/levels.hpp"
#include "fourd/error.hpp"
#include "internal/comm_state.hpp"
#include "internal/compression.hpp"
#include "internal/device_path.hpp"
#include "internal/host_memory.hpp"
#include "internal/op_spec.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

namespace {

// What every rank of a group compares in debug mode.
struct Fingerprint {
  char op[24];
  char codec[32];
  uint32_t mask;
  int32_t dtype;
  int32_t redop;
  int32_t root;
  int32_t algorithm;
  int32_t pad;
  uint64_t count;
  uint64_t seq;
};

std::string fingerprintText(const Fingerprint& f, const std::string& axis) {
  std::ostringstream os;
  os << "(" << f.op << ", axis " << axis << ", count " << f.count << ", dtype "
     << toString(static_cast<DataType>(f.dtype));
  if (f.redop >= 0) os << ", op " << toString(static_cast<ReduceOp>(f.redop));
  if (f.root >= 0) os << ", src " << f.root;
  os << ", algorithm " << algorithmName(static_cast<Algorithm>(f.algorithm));
  if (f.codec[0]) os << ", compression " << f.codec;
  os << ", seq " << f.seq << ")";
  return os.str();
}

Fingerprint fingerprintOf(const CommState& s, const OpSpec& spec) {
  Fingerprint f{};
  std::snprintf(f.op, sizeof(f.op), "%s", spec.opName);
  if (!spec.codec.none()) std::snprintf(f.codec, sizeof(f.codec), "%s", spec.codec.text().c_str());
  f.mask = s.mask;
  f.dtype =
      static_cast<int32_t>(spec.coll == Collective::kBroadcast ? spec.out.dtype : spec.in.dtype);
  f.redop = spec.hasOp ? static_cast<int32_t>(spec.op) : -1;
  f.root = spec.root;
  // What the caller asked for: the choice itself may differ between ranks only through a bug,
  // and the message names what the user wrote.
  f.algorithm = static_cast<int32_t>(spec.opts.algorithm);
  f.count = spec.in.count;
  f.seq = spec.seq;
  return f;
}

// FOURD_DEBUG: every rank compares what it called with the others; MismatchError on every
// rank, listing which ranks called what.
void debugCheck(CommState& s, const OpSpec& spec, OpContext& ctx) {
  const Fingerprint mine = fingerprintOf(s, spec);
  std::vector<Fingerprint> all(s.size());
  s.host->backend().allGatherBytes(&mine, sizeof(mine), all.data(), ctx);
  bool same = true;
  for (const auto& f : all) same = same && std::memcmp(&f, &all[0], sizeof(f)) == 0;
  if (same) return;
  const auto& world = s.host->backend().worldRanks();
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
        os << (first ? "" : ", ") << world[j];
        first = false;
      }
    }
    os << "] called " << fingerprintText(all[i], s.name);
  }
  os << "\n  this rank (world rank " << world[s.rank()] << ") called "
     << fingerprintText(mine, s.name);
  throw MismatchError(os.str());
}

// float16 / bfloat16 with accumulate_fp32 (host memory): partial sums stay float32 across
// every step of the algorithm; rounded once at the end.
// The codec of `spec` for elements of `t`, made once per process and kept (codecs hold no
// per-call state).
const Codec& cachedCodec(const CodecSpec& spec, DataType t) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, std::unique_ptr<Codec>> codecs;
  std::lock_guard<std::mutex> lk(mu);
  auto& c = codecs[{spec.text(), static_cast<int>(t)}];
  if (!c) c = makeCodec(spec, t);
  return *c;
}

// A compressed call on the whole group: the compressed ring (codec_ring.cpp).
void runWholeGroupCompressed(Group& g, Collective coll, const Codec& c, const Buffer& in,
                             const Buffer& out, ReduceOp op, OpContext& ctx) {
  const size_t es = dataTypeSize(in.dtype);
  Schedule s(g.backend(), ctx.tag);
  if (coll == Collective::kAllReduce) {
    void* scratch = g.scratch(0, codecRingAllReduceScratch(c, in.count, g.size(), es));
    codecRingAllReduce(s, c, in.data, out.data, in.count, in.dtype, op, scratch);
  } else if (coll == Collective::kAllGather) {
    const Buffer mine = out.slice(in.count * g.rank(), in.count);
    if (mine.data != in.data) std::memcpy(mine.data, in.data, in.bytes());
    const Blocks B = Blocks::uniform(in.count, g.size());
    codecRingAllGather(s, c, out.data, B, in.dtype,
                       g.scratch(0, codecRingAllGatherScratch(c, B, es)));
  } else {
    const Blocks B = Blocks::uniform(out.count, g.size());
    void* scratch = g.scratch(0, codecRingReduceScatterScratch(c, B, es));
    codecRingReduceScatter(s, c, in.data, out.data, B, in.dtype, op, scratch);
  }
  s.run(ctx);
}

// One collective with algorithm `a` on `g`, compressed when `codec` names a codec:
// "hierarchical" on a group spanning nodes compresses its rail level, anything else runs the
// compressed ring on the whole group (internal/compression.hpp).
void runImpl(Group& g, Collective coll, Algorithm a, const Buffer& in, const Buffer& out,
             ReduceOp op, const CodecSpec& codec, OpContext& ctx) {
  const auto* impl = algorithmImpl(a);
  if (!codec.none()) {
    const Codec& c = cachedCodec(codec, in.dtype);
    if (a != Algorithm::kHierarchical || g.topology().numNodes < 2)
      return runWholeGroupCompressed(g, coll, c, in, out, op, ctx);
    ctx.codec = &c;
  }
  struct Reset {
    OpContext& ctx;
    ~Reset() { ctx.codec = nullptr; }
  } reset{ctx};
  switch (coll) {
    case Collective::kAllReduce:
      impl->allReduce(g, in, out, op, ctx);
      break;
    case Collective::kAllGather:
      impl->allGather(g, in, out, ctx);
      break;
    case Collective::kReduceScatter:
      impl->reduceScatter(g, in, out, op, ctx);
      break;
    default:
      break;
  }
}

void runWidened(Group& g, const OpSpec& spec, Algorithm a, OpContext& ctx) {
  const Buffer& in = spec.in;
  const Buffer& out = spec.out;
  float* wi = static_cast<float*>(g.scratch(2, in.count * sizeof(float)));
  float* wo = static_cast<float*>(g.scratch(3, out.count * sizeof(float)));
  toFloat32(wi, in.data, in.count, in.dtype);
  Buffer win(wi, in.count, DataType::kFloat32);
  Buffer wout(in.data == out.data && spec.coll == Collective::kAllReduce ? wi : wo, out.count,
              DataType::kFloat32);
  runImpl(g, spec.coll, a, win, wout, spec.op, spec.codec, ctx);
  if (spec.op == ReduceOp::kAvg) scaleInPlace(wout.data, wout.count, wout.dtype, 1.0 / g.size());
  fromFloat32(out.data, static_cast<float*>(wout.data), out.count, out.dtype);
}

}  // namespace

void runAlgorithm(Group& g, const OpSpec& spec, Algorithm a, OpContext& ctx) {
  if (spec.coll == Collective::kBroadcast) {
    if (spec.out.count) g.backend().broadcast(spec.out, spec.root, ctx);
    return;
  }
  const bool half = spec.in.dtype == DataType::kFloat16 || spec.in.dtype == DataType::kBFloat16;
  if (spec.opts.accumulateFp32 && spec.hasOp && half && g.backend().hostMemory()) {
    return runWidened(g, spec, a, ctx);
  }
  // An in-place reduce_scatter whose algorithm cannot take its own block of the input as the
  // output (a codec's ring never does) reduces into scratch, then the block is copied over this
  // rank's part of the input (no longer read then).
  const bool viaScratch =
      spec.inPlace && !(spec.codec.none() && algorithmImpl(a)->reduceScatterInPlace);
  intoOrThroughScratch(g, spec.out, viaScratch, [&](const Buffer& out) {
    runImpl(g, spec.coll, a, spec.in, out, spec.op, spec.codec, ctx);
    if (spec.hasOp && spec.op == ReduceOp::kAvg) g.backend().scale(out, 1.0 / g.size());
  });
}

namespace {

// The group's MAX of each rank's figures: how tuning's measurements become the same on every
// member (called at the same call of a key on every rank).
std::vector<double> groupMax(Backend& b, std::vector<double> mine, OpContext& ctx) {
  std::vector<double> common(mine.size());
  b.allReduce(Buffer(mine.data(), mine.size(), DataType::kFloat64),
              Buffer(common.data(), common.size(), DataType::kFloat64), ReduceOp::kMax, ctx);
  return common;
}

// Whether every rank of the group calls in place: one MAX all-reduce of a word (a split key's
// agreement before each call, tuner.hpp), the same call on every rank.
bool allInPlace(Backend& b, bool mine, OpContext& ctx) {
  return groupMax(b, {mine ? 0.0 : 1.0}, ctx)[0] == 0.0;
}

// What a two-placement exploration makes common besides its times, appended to them before
// their MAX all-reduce: what one placement agreement costs on this group (the median of
// kAgreeRuns, timed as calls would pay them) and whether this rank's call is out of place.
void appendPlacing(Backend& b, std::vector<double>& mine, bool callInPlace, OpContext& ctx) {
  std::vector<double> t(Tuner::kAgreeRuns);
  for (double& x : t) {
    const auto t0 = Clock::now();
    allInPlace(b, callInPlace, ctx);
    x = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  mine.push_back(t[t.size() / 2]);
  mine.push_back(callInPlace ? 0.0 : 1.0);
}

// One call's part in its key's tuning (tuner.hpp): `spec` run with the step's algorithm; the
// time of a timed call goes back to the tuning, and after the last timed call of the key every
// timed call's time becomes its slowest rank's (one MAX all-reduce on this group, at the same
// call on every rank), from which the tuning takes each candidate's figure (a two-placement
// exploration's with appendPlacing's; `callInPlace`: the placement of the call that explores).
void runStep(CommState& s, const OpSpec& spec, const Tuner::Step& step, OpContext& ctx,
             bool callInPlace) {
  Tuner& tuner = s.selector.tuner();
  ctx.algorithm = algorithmName(step.algorithm);
  Backend& b = s.host->backend();
  // A candidate's timed calls start from a barrier (the first calls of a size only): else a
  // rank's time holds its wait for the others, whatever the algorithm.
  if (step.barrier) b.barrier(ctx);
  const auto t0 = Clock::now();
  runAlgorithm(*s.host, spec, step.algorithm, ctx);
  if (!step.timed) return;
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const Tuner::Key key = spec.call.key();
  std::vector<double> mine = tuner.record(key, spec.profile, step, dt);
  if (mine.empty()) return;
  if (!step.placements2) {
    tuner.settleSamples(key, spec.profile, groupMax(b, std::move(mine), ctx));
    return;
  }
  appendPlacing(b, mine, callInPlace, ctx);
  std::vector<double> common = groupMax(b, std::move(mine), ctx);
  Tuner::Placing placing;
  placing.allInPlace = common.back() == 0.0;
  placing.agreeSeconds = common[common.size() - 2];
  common.resize(common.size() - 2);
  tuner.settleSamples(key, spec.profile, common, placing);
}

using TrialStorage = std::shared_ptr<void>;

// The buffers an upfront exploration runs on: the call's own where running it again and again
// leaves its result as one run would (an out-of-place call rewrites its output from an input
// it only reads; an in-place all_gather rewrites every block with the same data), else zeros
// of the same size and layout held by `hold` (an in-place all_reduce or reduce_scatter would
// reduce its own result again; zeros stay zeros under every op and never turn denormal).
OpSpec trialSpec(const OpSpec& spec, TrialStorage& hold) {
  OpSpec t = spec;
  const bool inPlace =
      spec.coll == Collective::kAllReduce ? spec.in.data == spec.out.data : spec.inPlace;
  if (spec.coll == Collective::kAllGather || !inPlace) return t;
  const size_t bytes = spec.in.bytes();  // in place: the input holds the output
  hold = allocateHostLike(bytes, spec.in.data, bytes);
  char* base = static_cast<char*>(hold.get());
  t.in.data = base;
  t.out.data =
      base + (static_cast<const char*>(spec.out.data) - static_cast<const char*>(spec.in.data));
  return t;
}

// The buffers a two-placement exploration runs the other placement than the call's on: zeros
// of the call's sizes held by `hold`, laid out in place (nccl-tests' layout: this rank's block
// of the all_gather output or of the reduce_scatter input) or out of place.
OpSpec otherPlacementSpec(const OpSpec& spec, int rank, TrialStorage& hold) {
  OpSpec t = spec;
  const bool in = !spec.call.inPlace;  // the placement to run
  const size_t inBytes = spec.in.bytes(), outBytes = spec.out.bytes();
  auto round = [](size_t b) { return (b + 63) / 64 * 64; };
  const size_t total = in ? std::max(inBytes, outBytes) : round(inBytes) + round(outBytes);
  hold = allocateHostLike(total, spec.out.data, outBytes);
  char* base = static_cast<char*>(hold.get());
  t.call.inPlace = in;
  t.inPlace = in && spec.coll == Collective::kReduceScatter;
  if (!in) {
    t.in.data = base;
    t.out.data = base + round(inBytes);
    return t;
  }
  switch (spec.coll) {
    case Collective::kAllGather:  // the input is this rank's block of the output
      t.out.data = base;
      t.in.data = base + static_cast<size_t>(rank) * inBytes;
      break;
    case Collective::kReduceScatter:  // the output is this rank's block of the input
      t.in.data = base;
      t.out.data = base + static_cast<size_t>(rank) * outBytes;
      break;
    default:
      t.in.data = t.out.data = base;
      break;
  }
  return t;
}

// An `auto` call on host buffers: its tuning (tuner.hpp) picks the algorithm. Upfront (the
// default), a key's exploration runs whole inside its second call, on trialSpec's buffers,
// before the call's own work runs with the choice; inline, one step per call.
void runTuned(CommState& s, const OpSpec& spec, OpContext& ctx) {
  Tuner& tuner = s.selector.tuner();
  const Tuner::Key key = spec.call.key();
  auto shortlist = [&] { return s.selector.shortlist(spec.call, spec.profile); };
  Tuner::Step step = tuner.next(key, spec.profile, shortlist);
  if (step.candidate >= 0 && tuner.upfront()) {
    TrialStorage hold, holdOther;
    const OpSpec trial = trialSpec(spec, hold);
    // A two-placement exploration runs the call's placement on `trial`, the other on `other`.
    const OpSpec other =
        step.placements2 ? otherPlacementSpec(spec, s.host->backend().rank(), holdOther) : trial;
    // Bounded (twice the longest exploration, kPasses x kMaxCandidates x (kSmallWarm +
    // kSmallTimed) calls), so that a profile replaced meanwhile cannot restart it forever.
    const int most =
        2 * Tuner::kPasses * Tuner::kMaxCandidates * (Tuner::kSmallWarm + Tuner::kSmallTimed);
    for (int i = 0; step.candidate >= 0 && i < most; ++i) {
      const bool same = !step.placements2 || step.trialInPlace == spec.call.inPlace;
      runStep(s, same ? trial : other, step, ctx, spec.call.inPlace);
      step = tuner.next(key, spec.profile, shortlist, false);
    }
  }
  // A split key: the group agrees on the placement first (every rank in place: the in-place
  // winner; else the out-of-place one).
  if (step.candidate < 0 && step.inPlace != Algorithm::kAuto) {
    const bool all = allInPlace(s.host->backend(), spec.call.inPlace, ctx);
    if (all) step.algorithm = step.inPlace;
    tuner.agreed(key, spec.profile, all);
  }
  runStep(s, spec, step, ctx, spec.call.inPlace);
  if (step.agree) {  // a switch's call period, made common (the same call on every rank)
    tuner.agreePeriod(key, spec.profile, groupMax(s.host->backend(), {step.period}, ctx)[0]);
  }
}

[[noreturn]] void abortJob(const std::string& msg) {
  std::fprintf(stderr, "%s\nfourd: FOURD_ABORT_ON_TIMEOUT is set: aborting the job.\n",
               msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

[[noreturn]] void refusePoisoned(CommState& s, const char* opName) {
  std::lock_guard<std::mutex> lk(s.poisonMu);
  throw AbortedError(
      "fourd: " + std::string(opName) + " on axis '" + s.name +
      "' refused: the communicator is poisoned by an earlier failure: " + s.poisonReason);
}

OpContext contextOf(CommState& s, const OpSpec& spec, const std::atomic<bool>* cancelled) {
  OpContext ctx;
  ctx.op = spec.opName;
  ctx.axis = s.name;
  ctx.algorithm = algorithmName(spec.algorithm);
  ctx.seq = spec.seq;
  ctx.groupWorldRanks = &s.host->backend().worldRanks();
  ctx.timeoutSeconds = spec.opts.timeoutSeconds > 0 ? spec.opts.timeoutSeconds : s.defaultTimeout;
  ctx.start = Clock::now();
  ctx.deadline = deadlineAfter(ctx.start, ctx.timeoutSeconds);
  ctx.tag = static_cast<int>(spec.seq % 30000) + 1;
  ctx.cancelled = cancelled;
  ctx.spin = &s.spin;
  return ctx;
}

void runBody(CommState& s, const OpSpec& spec, OpContext& ctx);

// A call whose codec is "auto": decided at its first call of a size (and again every few
// dozen calls), the same on every rank (compression/auto_codec.cpp), then run as a named codec
// or uncompressed.
void runAutoCodec(CommState& s, const OpSpec& spec, OpContext& ctx) {
  OpSpec call = spec;
  const Tuner::Key key = spec.call.key();
  if (!s.selector.autoCodec(key, &call.codec)) {
    const Algorithm a = s.selector.compressedAlgorithm(spec.algorithm, *s.host);
    const bool rail = a == Algorithm::kHierarchical && s.host->topology().numNodes > 1;
    call.codec = decideAutoCodec(*s.host, spec.coll, spec.in, spec.call.nbytes, rail, ctx);
    s.selector.rememberAutoCodec(key, call.codec);
  }
  if (!call.codec.none()) call.algorithm = s.selector.compressedAlgorithm(spec.algorithm, *s.host);
  runBody(s, call, ctx);
}

void runBody(CommState& s, const OpSpec& spec, OpContext& ctx) {
  if (s.debug) debugCheck(s, spec, ctx);
  if (spec.isBarrier) {
    s.host->backend().barrier(ctx);
    return;
  }
#ifdef FOURD_HAVE_CUDA
  if (spec.in.device == DeviceType::kCuda || spec.out.device == DeviceType::kCuda) {
    return runDeviceOp(s, spec, ctx);
  }
#endif
  if (spec.codec.kind == CodecKind::kAuto) return runAutoCodec(s, spec, ctx);
  if (spec.algorithm == Algorithm::kAuto)
    runTuned(s, spec, ctx);
  else
    runAlgorithm(*s.host, spec, spec.algorithm, ctx);
}

void runOp(CommState& s, const OpSpec& spec, const std::atomic<bool>* cancelled) {
  if (s.poisoned.load()) refusePoisoned(s, spec.opName);
  OpContext ctx = contextOf(s, spec, cancelled);
  // Built only on failure: a small call's whole budget is a few microseconds.
  auto what = [&] { return std::string("seq ") + std::to_string(spec.seq) + " (" + spec.opName; };
  try {
    runBody(s, spec, ctx);
  } catch (const TimeoutError& e) {
    s.poison(what() + ") timed out: " + e.what());
    if (s.abortOnTimeout) abortJob(e.what());
    throw;
  } catch (const AbortedError& e) {
    s.poison(what() + ") was interrupted: " + e.what());
    throw;
  } catch (const BackendError& e) {
    s.poison(what() + ") failed in the backend: " + e.what());
    throw;
  }
}

}  // namespace

namespace {

// Waits without rethrowing the operation's error (the caller looks at it afterwards).
bool waitQuietly(Work& w, double seconds) {
  try {
    return w.wait(seconds);
  } catch (...) {
    return true;
  }
}

// What Work::cancel does on this communicator: this rank leaves the group's sequence of
// collectives (poisoned), and an operation that has not started never will.
void onCancel(CommState& s, const std::weak_ptr<Work>& weak, uint64_t seq, const char* op,
              const std::string& why) {
  s.poison("seq " + std::to_string(seq) + " (" + op + ") was cancelled: " + why);
  auto w = weak.lock();
  if (w && s.executor.remove(w)) {
    w->markCompleted(std::make_exception_ptr(
        AbortedError("fourd: " + w->description() + " was cancelled before it started: " + why)));
  }
}

}  // namespace

std::shared_ptr<Work> dispatch(CommState& s, OpSpec spec) {
  if (s.poisoned.load()) refusePoisoned(s, spec.opName);
  s.claimThread();
  spec.seq = s.nextSeq.fetch_add(1);
  std::string description;
  description.reserve(48 + s.name.size());
  description.append(spec.opName).append(" on axis '").append(s.name).append("' seq ");
  description.append(std::to_string(spec.seq));
  auto w = std::make_shared<Work>(std::move(description));
  CommState* sp = &s;
  const std::atomic<bool>* flag = w->cancelFlag();
  if (!spec.opts.async) {
    // Idle: run it here and now, the common blocking call. Nobody else holds `w` until this
    // returns, so it needs no cancel hook (its waits still poll `flag`).
    struct Call {
      CommState* s;
      const OpSpec* spec;
      const std::atomic<bool>* flag;
    } call{sp, &spec, flag};
    const auto run = [](void* p) {
      const Call* c = static_cast<const Call*>(p);
      runOp(*c->s, *c->spec, c->flag);
    };
    if (s.executor.runNowIfIdle(*w, run, &call)) {
      if (auto e = w->error()) std::rethrow_exception(e);
      return w;
    }
  }
  w->body = [sp, spec, flag] { runOp(*sp, spec, flag); };
  std::weak_ptr<Work> weak = w;
  w->onCancel = [sp, weak, seq = spec.seq, op = spec.opName](const std::string& why) {
    onCancel(*sp, weak, seq, op, why);
  };
  if (spec.opts.async) {
    s.executor.submit(w);
    return w;
  }
  if (!s.executor.runInlineIfIdle(w)) {
    // Queued behind asynchronous work on this communicator: wait in short slices so an
    // interrupt (Ctrl-C) is seen within ~20 ms. Interrupted, the call is cancelled and this
    // waits until it is gone (removed from the queue, or stopped at its next poll), so that
    // it never writes the caller's buffers after the caller has been told it failed.
    while (!waitQuietly(*w, 0.02)) {
      if (interruptRequested()) {
        w->cancel("interrupted (Ctrl-C) while queued behind asynchronous work");
        while (!waitQuietly(*w, 0.02)) {
        }
        throw AbortedError("fourd: interrupted while waiting for " + w->description());
      }
    }
  }
  if (auto e = w->error()) std::rethrow_exception(e);
  return w;
}

#ifndef FOURD_HAVE_CUDA
const Group& groupFor(const CommState& s, DeviceType) noexcept { return *s.host; }
#endif

}  // namespace fourd::detail
