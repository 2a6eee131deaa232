// A handle on one collective operation, blocking or asynchronous.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace fourd {

/// Returned by every collective. An asynchronous operation runs on its communicator's progress
/// thread and progresses whether or not anyone waits. Thread-safe.
class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  /// True once the operation finished (successfully or with an error). Never blocks.
  bool isCompleted() const;

  /// Waits up to `timeoutSeconds` (< 0: until done). Returns true when the operation completed;
  /// rethrows its error (TimeoutError, AbortedError, ...). Returns false if still running.
  bool wait(double timeoutSeconds = -1.0);

  /// The operation's error, if it failed (nullptr otherwise or while running).
  std::exception_ptr error() const;

  const std::string& description() const noexcept { return description_; }

  /// Objects (for example Python buffers) kept alive until the operation completes.
  void setKeepAlive(std::shared_ptr<void> keepAlive) { keepAlive_ = std::move(keepAlive); }

  /// Stops the operation (Ctrl-C in a wait, or a caller that gives up): if it is still queued
  /// it never starts and completes with AbortedError; if it runs, its next poll throws
  /// AbortedError naming `why`. Either way this rank leaves the group's sequence of
  /// collectives, so the communicator is poisoned. Returns at once; wait() then returns soon.
  void cancel(const std::string& why) noexcept;
  bool cancelRequested() const noexcept { return cancelled_.load(std::memory_order_relaxed); }

  // ---- used by the engine ----
  void markCompleted(std::exception_ptr error) noexcept;
  std::function<void()> body;
  /// Called once by cancel() (the engine removes a queued operation and poisons).
  std::function<void(const std::string&)> onCancel;
  /// What every wait of the running operation polls.
  const std::atomic<bool>* cancelFlag() const noexcept { return &cancelled_; }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string description_;
  std::shared_ptr<void> keepAlive_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace fourd
