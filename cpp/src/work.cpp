#include "fourd/work.hpp"

#include <chrono>
#include <vector>

#include "internal/op_context.hpp"

namespace fourd {

bool Work::isCompleted() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

bool Work::wait(double timeoutSeconds) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeoutSeconds < 0) {
    cv_.wait(lk, [&] { return done_; });
  } else if (!cv_.wait_until(lk, detail::deadlineAfter(detail::Clock::now(), timeoutSeconds),
                             [&] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

void Work::cancel(const std::string& why) noexcept {
  if (cancelled_.exchange(true)) return;
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) return;
    hook = onCancel;
  }
  try {
    if (hook) hook(why);
  } catch (...) {
  }
}

namespace {
// The buffers of operations that failed: an MPI collective the library has started cannot be
// cancelled and may still write them when late peers arrive, so they are never released.
std::mutex gKeptMu;
std::vector<std::shared_ptr<void>>* gKept = new std::vector<std::shared_ptr<void>>();
}  // namespace

void Work::markCompleted(std::exception_ptr error) noexcept {
  std::shared_ptr<void> release;
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    error_ = error;
    body = nullptr;
    onCancel = nullptr;
    release.swap(keepAlive_);
  }
  if (error && release) {
    try {
      std::lock_guard<std::mutex> lk(gKeptMu);
      gKept->push_back(std::move(release));
    } catch (...) {
    }
  }
  cv_.notify_all();
  // `release` drops the kept-alive buffers here, after waiters were woken.
}

}  // namespace fourd
