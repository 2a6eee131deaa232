// The progress engine: one thread per communicator, created at the first asynchronous call.
// Blocking calls run inline on the caller's thread when the communicator is idle, so they cost
// what the algorithm costs and no thread hand-off.
#include <chrono>

#include "internal/comm_state.hpp"
#include "internal/op_context.hpp"

namespace fourd::detail {

namespace {
void runBody(const std::shared_ptr<Work>& w) {
  std::exception_ptr err;
  try {
    if (w->body) w->body();
  } catch (...) {
    err = std::current_exception();
  }
  w->markCompleted(err);
}
}  // namespace

// In a forked child the thread is the parent's: never join it; its object is leaked (a
// joinable std::thread may not be destroyed).
static void abandonThread(std::thread& t) {
  if (t.joinable()) new std::thread(std::move(t));
}

Executor::~Executor() {
  if (forkedChild()) {
    abandonThread(thread_);
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  const bool idle = queue_.empty() && !busy_;
  stop_ = true;
  cv_.notify_all();
  lk.unlock();
  if (thread_.joinable()) {
    if (idle)
      thread_.join();
    else
      thread_.detach();  // only reached when the owner chose to leak a stuck communicator
  }
}

void Executor::submit(const std::shared_ptr<Work>& w) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(w);
    if (!thread_.joinable()) {
      stop_ = false;
      thread_ = std::thread([this] { loop(); });
    }
  }
  cv_.notify_one();
}

bool Executor::runInlineIfIdle(const std::shared_ptr<Work>& w) {
  const auto body = [](void* p) {
    Work* x = static_cast<Work*>(p);
    if (x->body) x->body();
  };
  if (runNowIfIdle(*w, body, w.get())) return true;
  submit(w);  // busy (or busy again): the progress thread runs it in turn
  return false;
}

bool Executor::runNowIfIdle(Work& w, void (*fn)(void*), void* arg) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (busy_ || !queue_.empty()) return false;
    busy_ = true;
  }
  std::exception_ptr err;
  try {
    fn(arg);
  } catch (...) {
    err = std::current_exception();
  }
  w.markCompleted(err);
  {
    std::lock_guard<std::mutex> lk(mu_);
    busy_ = false;
  }
  cv_.notify_all();
  idleCv_.notify_all();
  return true;
}

void Executor::loop() {
  markBackgroundThread();  // its waits leave the cores to the computing caller (op_context.cpp)
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || (!queue_.empty() && !busy_); });
    if (queue_.empty() || busy_) {
      if (stop_) break;
      continue;
    }
    auto w = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    runBody(w);
    w.reset();
    lk.lock();
    busy_ = false;
    idleCv_.notify_all();
    cv_.notify_all();
  }
}

bool Executor::remove(const std::shared_ptr<Work>& w) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (*it == w) {
      queue_.erase(it);
      idleCv_.notify_all();
      return true;
    }
  }
  return false;
}

size_t Executor::inFlight() {
  std::lock_guard<std::mutex> lk(mu_);
  return queue_.size() + (busy_ ? 1 : 0);
}

bool Executor::drain(double timeoutSeconds) {
  if (forkedChild()) {
    abandonThread(thread_);
    return true;
  }
  std::unique_lock<std::mutex> lk(mu_);
  const bool idle = idleCv_.wait_until(lk, deadlineAfter(Clock::now(), timeoutSeconds),
                                       [&] { return queue_.empty() && !busy_; });
  if (!idle) return false;  // still running: the owner decides (Grid leaks the communicator)
  stop_ = true;
  cv_.notify_all();
  if (!thread_.joinable()) return true;
  lk.unlock();
  thread_.join();
  return true;
}

}  // namespace fourd::detail
