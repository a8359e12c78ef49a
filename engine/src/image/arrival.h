// A checkpoint read while it is still arriving (the target of `migrate --to ssh://`): the
// receiver advances how many bytes of each blob are in place, and a reader waits for the
// bytes of a chunk before it reads them. The manifest arrives first, so readers know every
// chunk from the start.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "gpuckpt/error.h"

namespace gpuckpt::image {

class BlobArrival {
 public:
  explicit BlobArrival(std::size_t blobs) : arrived_(blobs, 0) {}

  // The receiver: bytes [0, end) of `blob` are written.
  void advance(std::size_t blob, std::uint64_t end) {
    {
      std::lock_guard lock(mu_);
      arrived_.at(blob) = end;
    }
    cv_.notify_all();
  }
  // The receiver: nothing more will arrive; waiters for missing bytes fail with `why`.
  void fail(std::string why) {
    {
      std::lock_guard lock(mu_);
      failed_ = true;
      why_ = std::move(why);
    }
    cv_.notify_all();
  }

  // The receiver: everything has arrived.
  void finish() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }
  // A reader that needs the whole checkpoint at once: returns once all of it is there.
  void wait_complete() const {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_ || failed_; });
    if (!done_) throw Error(Errc::kIo, why_);
  }

  // A reader: returns once bytes [0, end) of `blob` are there; Error(kIo) if they never come.
  void wait(std::size_t blob, std::uint64_t end) const {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return arrived_.at(blob) >= end || failed_; });
    if (arrived_.at(blob) < end) throw Error(Errc::kIo, why_);
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<std::uint64_t> arrived_;
  bool failed_ = false, done_ = false;
  std::string why_;
};

}  // namespace gpuckpt::image
