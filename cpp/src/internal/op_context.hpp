// What every wait inside an operation needs: the deadline, and the words for its error message.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fourd::detail {

class Codec;

using Clock = std::chrono::steady_clock;

/// `start` + `seconds`, saturating: an infinite or huge timeout gives a deadline that never
/// passes (instead of overflowing the clock's integer representation).
Clock::time_point deadlineAfter(Clock::time_point start, double seconds) noexcept;

/// A deadline for the collective frees of teardown (shared-memory windows): set by
/// Grid::finalize to its own deadline, so that no free waits past what finalize was given.
void setTeardownDeadline(Clock::time_point t) noexcept;
Clock::time_point teardownDeadline() noexcept;

/// True in the child of a fork() made after fourd started (pthread_atfork): the parent's
/// threads and MPI state are not the child's, so teardown touches neither.
bool forkedChild() noexcept;

class SpinHint;

/// One operation in flight. Built by Communicator when the operation starts running.
struct OpContext {
  std::string op;         ///< "all_reduce", "all_gather", ...
  std::string axis;       ///< "x", "z+data", "world"
  std::string algorithm;  ///< "flat", "ring", ...
  uint64_t seq = 0;       ///< per-communicator sequence number (1, 2, ...)
  const std::vector<int>* groupWorldRanks = nullptr;  ///< world rank of each group rank
  Clock::time_point start;
  Clock::time_point deadline;
  double timeoutSeconds = 300.0;
  int tag = 0;  ///< MPI tag for this operation's point-to-point messages
  /// Set by Work::cancel: every wait of the operation stops at its next poll (AbortedError).
  const std::atomic<bool>* cancelled = nullptr;
  /// False for the waits a member may not leave early (the commit step before a blocking MPI
  /// call, mpi_backend.hpp): neither cancel nor Ctrl-C stops them, only the deadline.
  bool interruptible = true;
  /// The codec of a compressed call (internal/codec.hpp): "hierarchical" applies it on its
  /// rail level; null when the call is not compressed.
  const Codec* codec = nullptr;
  /// The communicator's record of whether spinning pays on more ranks than cores (SpinHint);
  /// null: the waits yield at once there.
  SpinHint* spin = nullptr;

  /// "all_reduce on axis 'x' (group of world ranks [0, 1], seq 5, algorithm ring)".
  std::string describe() const;
  double elapsed() const;
};

/// Called about every 20 ms from every wait loop on the thread that waits. Returns true when
/// the wait must stop (Ctrl-C). The Python binding installs one that checks for signals on the
/// main thread; the default never interrupts.
using InterruptCheck = bool (*)();
void setInterruptCheck(InterruptCheck fn) noexcept;
bool interruptRequested() noexcept;

/// The periodic checks of a polling wait: every 64 polls it looks at the clock; every 20 ms it
/// runs the interrupt check (throwing AbortedError naming the operation) and it reports when the
/// operation's deadline has passed (the caller throws TimeoutError with what it waits for).
class WaitWatch {
 public:
  explicit WaitWatch(const OpContext& ctx);
  /// Call once per poll. True once the deadline has passed.
  bool expired();

 private:
  const OpContext& ctx_;
  unsigned polls_ = 0;
  Clock::time_point nextCheck_;
};

/// Whether this machine runs more ranks than it has cores for them (set when a grid is built,
/// from the ranks sharing the node and the CPUs this process may run on; FOURD_POLL overrides).
/// `learnSpin`: whether the waits there spin for their communicator's SpinHint budget before
/// yielding (FOURD_POLL=yield: no, they yield at once).
void setOversubscribed(bool yes, bool learnSpin = true) noexcept;
bool oversubscribed() noexcept;

/// Whether shared-memory flag waits (shm's barriers) also spin for their communicator's
/// SpinHint budget where ranks outnumber cores; else they yield at once there. Set with the
/// polling mode: only where the machine's ranks are at most twice its cores (grid.cpp).
void setFlagWaitsLearnSpin(bool yes) noexcept;
bool flagWaitsLearnSpin() noexcept;

/// Marks the calling thread as a progress thread (executor.cpp: it runs operations in the
/// background while their caller computes); its waits nap sooner on more ranks than cores.
void markBackgroundThread() noexcept;
bool backgroundThread() noexcept;

/// What one communicator's waits learned about spinning while ranks outnumber cores. A peer
/// on another core arrives within microseconds, and a waiter that keeps its core returns at
/// once; a peer on the waiter's own core cannot run until the waiter yields, so there spinning
/// only delays it. Which of the two holds is the scheduler's choice for each launch and pair,
/// so the waits measure it: a wait that ended within its spin budget doubles the budget (up to
/// kMax polls), one that had to yield quarters it (to 0 under kProbe), and at 0 every
/// kProbeEvery-th wait spins kProbe polls to find out whether that has changed. Calls of one
/// communicator come from one thread, so relaxed atomics suffice.
class SpinHint {
 public:
  static constexpr unsigned kMax = 128;
  static constexpr unsigned kProbe = 16;
  static constexpr unsigned kProbeEvery = 64;
  /// The spin budget (polls) for the next wait.
  unsigned budget() noexcept;
  /// A wait with spin budget `spin` ended after `polls` pauses.
  void record(unsigned spin, unsigned polls) noexcept;

 private:
  std::atomic<unsigned> budget_{kProbe};
  std::atomic<unsigned> idle_{0};
};

/// A polite poll: spins for a few polls when every rank has a core; with more ranks than cores
/// it spins for the budget of the communicator's SpinHint (where the wait has one) and then
/// yields the core; naps only after a long wait (on a progress thread with more ranks than
/// cores: after kBackgroundYield). See op_context.cpp.
class Backoff {
 public:
  static constexpr std::chrono::microseconds kBackgroundYield{5000};
  static constexpr long kBackgroundNapNs = 50 * 1000;
  Backoff() = default;
  explicit Backoff(SpinHint* hint) noexcept;
  ~Backoff();
  Backoff(const Backoff&) = delete;
  Backoff& operator=(const Backoff&) = delete;
  /// Starts a new wait: what the one so far taught is recorded, and the count starts over.
  void restart() noexcept;
  void pause() noexcept;
  /// How many of the pauses so far napped.
  unsigned naps() const noexcept { return naps_; }

 private:
  unsigned polls_ = 0;
  unsigned naps_ = 0;
  Clock::time_point since_{};
  SpinHint* hint_ = nullptr;
  unsigned spin_ = 0;      ///< polls to spin before yielding, with more ranks than cores
  void finish() noexcept;  ///< records the wait so far in the hint
};

}  // namespace fourd::detail
