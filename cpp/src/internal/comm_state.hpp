// The private state of a Communicator: its group, the selector, the executor that runs its
// operations in issue order, and what keeps it reliable (sequence numbers, deadlines, the
// poison flag). Only the communicator's own sources include this header; algorithms see the
// Group (internal/group.hpp) and nothing else.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "fourd/process_grid.hpp"
#include "fourd/work.hpp"
#include "internal/group.hpp"
#include "internal/selector.hpp"

namespace fourd::detail {

/// Runs Work bodies in issue order: inline on the caller when idle (blocking calls), otherwise
/// on a progress thread created at first need.
class Executor {
 public:
  ~Executor();
  /// Queues `w`; the progress thread runs it.
  void submit(const std::shared_ptr<Work>& w);
  /// Runs `w` now on this thread if nothing is queued or running, else queues it.
  /// Returns false if it was queued (the caller then waits on the Work).
  bool runInlineIfIdle(const std::shared_ptr<Work>& w);
  /// A blocking call's fast path: runs `fn(arg)` as `w`'s body on this thread and completes `w`
  /// if nothing is queued or running, and returns true; else returns false and leaves `w` alone
  /// (the caller then gives it a body and queues it). No std::function, no copy of the call.
  bool runNowIfIdle(Work& w, void (*fn)(void*), void* arg);
  /// Removes `w` from the queue if it has not started. True when it was removed.
  bool remove(const std::shared_ptr<Work>& w);
  /// Waits until idle (up to timeoutSeconds) and stops the thread. False on timeout.
  bool drain(double timeoutSeconds);
  size_t inFlight();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idleCv_;
  std::deque<std::shared_ptr<Work>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

/// The group of a communicator's CUDA buffers and how its operations are ordered with the
/// caller's streams (cuda/backends/device_path.cpp; GPU builds only).
struct DeviceState;
void destroyDeviceState(DeviceState* d) noexcept;

class CommState {
 public:
  CommState(std::string name, AxisMask mask, std::unique_ptr<Group> host);
  ~CommState();

  std::string name;
  AxisMask mask;
  /// The group of host buffers (the MPI backend).
  std::unique_ptr<Group> host;
  Selector selector;
  /// Made at the first operation on CUDA buffers (in issue order on every rank).
  std::unique_ptr<DeviceState, void (*)(DeviceState*)> device{nullptr, destroyDeviceState};

  int rank() const noexcept { return host->rank(); }
  int size() const noexcept { return host->size(); }

  /// Binds the communicator to the thread of its first collective; throws InvalidArgument on
  /// a call from any other thread (two threads would issue the axis's collectives in a
  /// different order on each rank, and their results would cross).
  void claimThread();

  // Defaults and reliability.
  double defaultTimeout = 300.0;
  bool debug = false;
  bool abortOnTimeout = false;
  std::atomic<uint64_t> nextSeq{1};
  std::atomic<bool> poisoned{false};
  std::atomic<std::thread::id> owner{};
  std::mutex poisonMu;
  std::string poisonReason;
  void poison(const std::string& why);
  /// Whether this group's waits spin before yielding, on more ranks than cores (op_context.hpp).
  SpinHint spin;

  Executor executor;  // last: its thread stops before the rest goes
};

}  // namespace fourd::detail
