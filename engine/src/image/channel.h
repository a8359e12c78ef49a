// A multi-producer multi-consumer queue of small values between pipeline threads. Bounded by
// construction: only slot indices travel through it, and there is a fixed number of slots.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "image/event_fd.h"

namespace gpuckpt::image {

template <class T>
class Channel {
 public:
  // `notify` (optional) is signalled on every push and on close, for consumers that wait on
  // an EventFd instead of blocking in pop().
  explicit Channel(EventFd* notify = nullptr) : notify_(notify) {}

  void push(T v) {
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      q_.push_back(std::move(v));
    }
    cv_.notify_one();
    if (notify_) notify_->notify();
  }
  // Blocks until a value is available; nullopt once closed and drained (or cancelled).
  std::optional<T> pop() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !q_.empty() || closed_; });
    return take_locked();
  }
  std::optional<T> try_pop() {
    std::lock_guard lock(mu_);
    return take_locked();
  }
  std::size_t size() {
    std::lock_guard lock(mu_);
    return q_.size();
  }
  // No more values will be pushed; consumers drain what is queued, then see nullopt.
  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
    if (notify_) notify_->notify();
  }
  // Drops queued values and closes: used when the pipeline fails.
  void cancel() {
    {
      std::lock_guard lock(mu_);
      q_.clear();
      closed_ = true;
    }
    cv_.notify_all();
    if (notify_) notify_->notify();
  }

 private:
  std::optional<T> take_locked() {
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> q_;
  bool closed_ = false;
  EventFd* notify_;
};

}  // namespace gpuckpt::image
