// Blocks and Schedule (schedule.hpp): the small engine the point-to-point algorithms are built on.
#include "algorithms/schedule.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>

#include <algorithm>
#include <sstream>

#include "fourd/error.hpp"

namespace fourd::detail {

// ---- Blocks ---------------------------------------------------------------------------------

Blocks Blocks::even(size_t total, int p) {
  Blocks b;
  b.off.resize(static_cast<size_t>(p) + 1);
  const size_t base = total / p, extra = total % p;
  b.off[0] = 0;
  for (int i = 0; i < p; ++i)
    b.off[i + 1] = b.off[i] + base + (static_cast<size_t>(i) < extra ? 1 : 0);
  return b;
}

Blocks Blocks::uniform(size_t each, int p) {
  Blocks b;
  b.off.resize(static_cast<size_t>(p) + 1);
  for (int i = 0; i <= p; ++i) b.off[i] = each * static_cast<size_t>(i);
  return b;
}

size_t Blocks::maxCount() const noexcept {
  size_t m = 0;
  for (int i = 0; i < size(); ++i) m = std::max(m, count(i));
  return m;
}

// ---- Schedule -------------------------------------------------------------------------------

Schedule::Schedule(Backend& backend, int tag)
    : backend_(&backend), tag_(tag), reqs_(backend.requests()) {
  // A small collective appends a handful of actions (an all_gather through shm: 6): one
  // allocation instead of a chain of reallocations that move every Action's std::functions.
  actions_.reserve(8);
}

Schedule::~Schedule() {
  // A schedule left unfinished by an exception: nothing it posted may write into its buffers
  // after the operation has failed (the caller's buffers may be reused or freed).
  if (!done()) abandon(1.0);
}

bool Schedule::abandon(double seconds) noexcept { return reqs_->abandon(seconds); }

Schedule::Handle Schedule::send(const void* buf, size_t bytes, int peer) {
  Msg m;
  m.sbuf = buf;
  m.bytes = bytes;
  m.peer = peer;
  return add(Kind::kSend, std::move(m));
}

namespace {
std::atomic<uint64_t> gMessageBytes{0};
}  // namespace

uint64_t messageBytesSent() noexcept { return gMessageBytes.load(std::memory_order_relaxed); }

Schedule::Handle Schedule::sendMessage(const void* msg, int peer) {
  Msg m;
  m.sbuf = msg;
  m.prefixed = true;
  m.peer = peer;
  return add(Kind::kSend, std::move(m));
}

Schedule::Handle Schedule::recv(void* buf, size_t bytes, int peer) {
  Msg m;
  m.rbuf = buf;
  m.bytes = bytes;
  m.peer = peer;
  return add(Kind::kRecv, std::move(m));
}

Schedule::Handle Schedule::collective(std::function<void(Requests&)> post) {
  Msg m;
  m.post = std::move(post);
  return add(Kind::kCollective, std::move(m));
}

Schedule::Handle Schedule::add(Kind kind, Msg m) {
  msgs_.push_back(std::move(m));
  Action a{kind};
  a.first = static_cast<Handle>(msgs_.size()) - 1;
  actions_.push_back(std::move(a));
  return static_cast<Handle>(msgs_.size()) - 1;
}

void Schedule::wait(Handle first, Handle last) {
  if (last <= first) return;
  Action a{Kind::kWait};
  a.first = first;
  a.last = last;
  actions_.push_back(std::move(a));
}

void Schedule::waitAll() { wait(0, handles()); }

void Schedule::compute(std::function<void()> fn) {
  Action a{Kind::kCompute};
  a.fn = std::move(fn);
  actions_.push_back(std::move(a));
}

void Schedule::waitUntil(std::function<bool()> ready, std::function<std::string()> laggards,
                         double spinMicros) {
  Action a{Kind::kUntil};
  a.ready = std::move(ready);
  a.laggards = std::move(laggards);
  a.spinMicros = spinMicros;
  actions_.push_back(std::move(a));
}

void Schedule::waitRange(const Action& a, size_t* begin, size_t* end) const {
  // Handles are posted in order, so the requests of [first, last) are contiguous.
  *begin = msgs_[a.first].reqBegin;
  *end = msgs_[a.last - 1].reqEnd;
}

bool Schedule::testCurrent() {
  const Action& a = actions_[next_];
  if (a.kind == Kind::kUntil) return a.ready();
  size_t b, e;
  waitRange(a, &b, &e);
  return b == e || reqs_->test(b, e);
}

bool Schedule::advance(OpContext& ctx) {
  while (next_ < actions_.size()) {
    Action& a = actions_[next_];
    switch (a.kind) {
      case Kind::kSend:
      case Kind::kRecv:
      case Kind::kCollective: {
        Msg& m = msgs_[a.first];
        m.reqBegin = reqs_->size();
        if (a.kind == Kind::kSend && m.prefixed) {
          uint64_t len;
          std::memcpy(&len, m.sbuf, sizeof(len));
          m.bytes = sizeof(len) + static_cast<size_t>(len);
          gMessageBytes.fetch_add(m.bytes, std::memory_order_relaxed);
        }
        if (a.kind == Kind::kSend)
          backend_->isend(m.sbuf, m.bytes, m.peer, tag_, *reqs_);
        else if (a.kind == Kind::kRecv)
          backend_->irecv(m.rbuf, m.bytes, m.peer, tag_, *reqs_);
        else
          m.post(*reqs_);
        m.reqEnd = reqs_->size();
        break;
      }
      case Kind::kWait:
      case Kind::kUntil:
        if (!testCurrent()) return false;
        break;
      case Kind::kCompute:
        a.fn();
        break;
    }
    ++next_;
  }
  return true;
}

void Schedule::run(OpContext& ctx) {
  while (next_ < actions_.size()) {
    if (advance(ctx)) return;
    const Action& a = actions_[next_];
    if (a.kind == Kind::kWait) {
      size_t b, e;
      waitRange(a, &b, &e);
      reqs_->wait(b, e, ctx);
    } else {
      detail::waitUntil(a.ready, a.laggards, ctx, a.spinMicros);
    }
    ++next_;
  }
}

void Schedule::timeout(OpContext& ctx) {
  std::ostringstream os;
  os << "fourd: " << ctx.describe() << " timed out after " << ctx.elapsed() << " s (timeout "
     << ctx.timeoutSeconds << " s)";
  if (next_ < actions_.size()) {
    const Action& a = actions_[next_];
    if (a.kind == Kind::kUntil) {
      os << " waiting for " << (a.laggards ? a.laggards() : std::string("a shared-memory flag"));
    } else if (a.kind == Kind::kWait) {
      size_t b, e;
      waitRange(a, &b, &e);
      const std::vector<int> missing = reqs_->pendingPeers(b, e);
      if (!missing.empty()) {
        os << "; peers that never arrived: world ranks [";
        for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
        os << "]";
      }
    }
  }
  throw TimeoutError(os.str());
}

void runConcurrently(const std::vector<Schedule*>& schedules, OpContext& ctx) {
  if (schedules.size() == 1) {
    schedules[0]->run(ctx);
    return;
  }
  Backoff backoff;
  WaitWatch watch(ctx);
  while (true) {
    bool allDone = true, progressed = false;
    for (Schedule* s : schedules) {
      if (s->done()) continue;
      const size_t before = s->next_;
      s->advance(ctx);
      progressed = progressed || s->next_ != before;
      allDone = allDone && s->done();
    }
    if (allDone) return;
    if (progressed) {
      backoff.restart();
      continue;
    }
    if (watch.expired()) {
      for (Schedule* s : schedules)
        if (!s->done()) s->timeout(ctx);
    }
    backoff.pause();
  }
}

void waitUntil(const std::function<bool()>& ready, const std::function<std::string()>& laggards,
               OpContext& ctx, double spinMicros) {
  if (ready()) return;
  if (spinMicros > 0) {
    // Peers on other cores usually arrive within microseconds: keep the core (a yield can
    // hand it to another process for a whole time slice).
    // One pause between looks: a pause takes 40-75 ns on this project's VMs, and with 32 of
    // them a flag set a moment after a look was seen up to 2.4 us late, as long as a whole
    // 1 KiB all_gather through MPI (2 ranks: shm's 1-4 KiB calls then took 1.5x flat's time).
    // The clock is read every 16 looks.
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double, std::micro>(spinMicros));
    for (unsigned looks = 1;; ++looks) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (ready()) return;
      if ((looks & 15u) == 0 && Clock::now() >= until) break;
    }
  }
  // Where ranks outnumber cores, the flag waits of shm spin for their communicator's learned
  // budget too, but only on up to twice as many ranks as cores (flagWaitsLearnSpin): 4 ranks on
  // 2 cores, yielding at once made shm lose the tuning's exploration to the algorithms whose
  // MPI waits spin (the 1-64 KiB sweep on x: shm run in 24-48 of 48 cells, against 38-48
  // spinning); 8 ranks on 2 cores, the 8-rank layer tests took 63-76 s spinning against 61-65
  // yielding at once (bench/README.md, "Polling").
  Backoff backoff(flagWaitsLearnSpin() ? ctx.spin : nullptr);
  WaitWatch watch(ctx);
  while (!ready()) {
    if (watch.expired()) {
      std::ostringstream os;
      os << "fourd: " << ctx.describe() << " timed out after " << ctx.elapsed() << " s (timeout "
         << ctx.timeoutSeconds << " s) waiting for "
         << (laggards ? laggards() : std::string("a shared-memory flag"));
      throw TimeoutError(os.str());
    }
    backoff.pause();
  }
}

int laneTag(const OpContext& ctx, int lane) {
  if (lane == 0) return ctx.tag;
  return static_cast<int>((static_cast<long>(ctx.tag) - 1 + 10007L * lane) % 30000) + 1;
}

}  // namespace fourd::detail
