// Private helpers shared by the point-to-point algorithms (ring, rhd, hierarchical, shm):
//
//   Blocks    - how a buffer is cut into one contiguous block per rank (uneven when the count is
//               not divisible).
//   Schedule  - a resumable list of actions over one Backend: post a send / receive or one of
//               the backend's own collectives, wait for what was posted, run a local step (a
//               reduction, a copy), wait for a condition (a shared-memory flag). Built first,
//               then run. A Schedule can run alone (blocking: every wait on requests is
//               Requests::wait with the op's deadline) or
//               several can be advanced together (runConcurrently), which is how the levels of
//               "hierarchical" overlap: the inter-node schedule of chunk i progresses while the
//               intra-node schedule of chunk i+1 runs. This is MPICH's "NBC schedule" idea in
//               its smallest form.
//
// Cross-rank invariant: every rank of a communicator builds the same sequence of messages for a
// given (collective, count, layout), so messages between two ranks with one tag match in the
// order they are posted (MPI's non-overtaking rule). Two schedules that run concurrently on the
// same communicator must use different tags.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "fourd/data_type.hpp"
#include "internal/backend.hpp"
#include "internal/op_context.hpp"

namespace fourd::detail {

/// A partition of `total` elements into p contiguous blocks; block i is [offset(i), offset(i+1)).
struct Blocks {
  std::vector<size_t> off;  // p + 1 offsets

  /// Even split: the first total % p blocks get one more element.
  static Blocks even(size_t total, int p);
  /// p blocks of `each` elements.
  static Blocks uniform(size_t each, int p);

  int size() const noexcept { return static_cast<int>(off.size()) - 1; }
  size_t offset(int i) const noexcept { return off[i]; }
  size_t count(int i) const noexcept { return off[i + 1] - off[i]; }
  /// Elements of blocks [first, last).
  size_t span(int first, int last) const noexcept { return off[last] - off[first]; }
  size_t total() const noexcept { return off.back(); }
  size_t maxCount() const noexcept;
};

class Schedule {
 public:
  using Handle = int;

  /// Messages go over `backend` with `tag`.
  Schedule(Backend& backend, int tag);
  ~Schedule();
  Schedule(const Schedule&) = delete;
  Schedule& operator=(const Schedule&) = delete;

  Backend& backend() const noexcept { return *backend_; }
  /// The backend's rank and size (the members of this schedule's messages).
  int rank() const noexcept { return backend_->rank(); }
  int size() const noexcept { return backend_->size(); }

  // ---- building ----
  /// Posts a non-blocking send / receive of `bytes` (0 is allowed) when reached.
  Handle send(const void* buf, size_t bytes, int peer);
  Handle recv(void* buf, size_t bytes, int peer);
  /// Posts a send of a length-prefixed message when reached: its first 8 bytes hold the
  /// payload's length L (a uint64 written by an earlier step), and 8 + L bytes are sent. The
  /// receiver posts recv() of the largest such message (MPI takes a shorter one) and reads
  /// the length from the same header (compressed messages, codec_ring.cpp).
  Handle sendMessage(const void* msg, int peer);
  /// Posts one of the backend's own non-blocking collectives when reached: `post` receives
  /// the schedule's request set (Backend::iallReduce and the like).
  Handle collective(std::function<void(Requests&)> post);
  /// Waits for the handles [first, last) (consecutive integers from 0).
  void wait(Handle first, Handle last);
  void wait(Handle h) { wait(h, h + 1); }
  /// Waits for everything posted so far.
  void waitAll();
  /// Runs a local step (a reduction or a copy) when reached.
  void compute(std::function<void()> fn);
  /// Waits until `ready()` returns true. `laggards()` names who is late, for a timeout message.
  /// `spinMicros`: poll without yielding the core for that long first (for short waits on peers
  /// that run on other cores; 0 when ranks may outnumber cores).
  void waitUntil(std::function<bool()> ready, std::function<std::string()> laggards,
                 double spinMicros = 0.0);
  /// Number of handles created so far.
  Handle handles() const noexcept { return static_cast<Handle>(msgs_.size()); }

  // ---- running ----
  /// Runs actions until one cannot proceed without blocking; true once every action has run.
  bool advance(OpContext& ctx);
  /// Runs to completion; waits on requests with Requests::wait (ctx's deadline).
  void run(OpContext& ctx);
  bool done() const noexcept { return next_ == actions_.size(); }
  /// Stops what is still pending after a failure (Requests::abandon).
  bool abandon(double seconds) noexcept;

 private:
  friend void runConcurrently(const std::vector<Schedule*>&, OpContext&);
  enum class Kind { kSend, kRecv, kCollective, kWait, kCompute, kUntil };
  struct Action {
    Kind kind;
    Handle first = 0, last = 0;  // kSend/kRecv/kCollective: the handle; kWait: the range
    std::function<void()> fn;
    std::function<bool()> ready;
    std::function<std::string()> laggards;
    double spinMicros = 0.0;
  };
  struct Msg {
    const void* sbuf = nullptr;
    void* rbuf = nullptr;
    size_t bytes = 0;
    int peer = -1;
    bool prefixed = false;                // sendMessage: bytes = 8 + the header's length
    std::function<void(Requests&)> post;  // kCollective
    size_t reqBegin = 0, reqEnd = 0;      // filled when posted
  };
  Handle add(Kind kind, Msg m);
  // Requests of the wait at actions_[next_] (a contiguous range).
  void waitRange(const Action& a, size_t* begin, size_t* end) const;
  bool testCurrent();
  // Throws TimeoutError naming whatever the current action waits for.
  [[noreturn]] void timeout(OpContext& ctx);

  Backend* backend_;
  int tag_;
  std::unique_ptr<Requests> reqs_;
  std::vector<Action> actions_;
  std::vector<Msg> msgs_;
  size_t next_ = 0;
};

/// Advances several schedules together until all are done (each may wait on the others through
/// waitUntil flags). Polls with a polite backoff; throws TimeoutError at ctx's deadline (naming
/// the peers that never arrived) and AbortedError on an interrupt.
void runConcurrently(const std::vector<Schedule*>& schedules, OpContext& ctx);

/// Polls until ready() or ctx's deadline: without yielding for the first `spinMicros`, then
/// politely (yielding the core). Used for shared-memory flags.
void waitUntil(const std::function<bool()>& ready, const std::function<std::string()>& laggards,
               OpContext& ctx, double spinMicros = 0.0);

/// Bytes this process has sent with Schedule::sendMessage (the compressed messages' wire
/// bytes, headers included), since it started: the benchmark's wire-byte count.
uint64_t messageBytesSent() noexcept;

/// A tag that differs from ctx.tag and from the other lanes of the same operation.
int laneTag(const OpContext& ctx, int lane);

}  // namespace fourd::detail
