// A checkpoint read while it is still arriving (the target of `migrate --to ssh://`, a restore
// from s3://): the receiver records which bytes of each blob are in place, in any order, and
// a reader waits for the bytes of a chunk before it reads them. The manifest is in before any
// reader starts, so readers know every chunk; the bytes CRIU needs first (its small images)
// are fetched first, and the pages in the order it reads them.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpuckpt/error.h"
#include "image/manifest.h"

namespace gpuckpt::image {

struct BlobRange {
  std::size_t blob;
  std::uint64_t begin, end;
};

// Where the chunks of every file but CRIU's page data (pages-*.img) lie, in blob order: what a
// restore reads before the pages (inventory.img first, which the dump writes last), so it is
// fetched first and the restore can start while the pages still come.
inline std::vector<BlobRange> ranges_needed_first(const Manifest& m) {
  std::vector<BlobRange> out;
  for (const auto& e : m.entries) {
    if (e.path.rfind("pages-", 0) == 0) continue;
    for (const auto& c : e.chunks) out.push_back({c.blob, c.offset, c.offset + c.stored});
  }
  std::sort(out.begin(), out.end(), [](const BlobRange& a, const BlobRange& b) {
    return a.blob != b.blob ? a.blob < b.blob : a.begin < b.begin;
  });
  return out;
}

// Byte ranges [begin, end), merged where they touch.
class IntervalSet {
 public:
  void add(std::uint64_t begin, std::uint64_t end) {
    if (begin >= end) return;
    auto it = m_.upper_bound(begin);
    if (it != m_.begin() && std::prev(it)->second >= begin) {
      --it;
      begin = it->first;
    }
    while (it != m_.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = m_.erase(it);
    }
    m_.emplace(begin, end);
  }
  bool covers(std::uint64_t begin, std::uint64_t end) const {
    if (begin >= end) return true;
    auto it = m_.upper_bound(begin);
    return it != m_.begin() && std::prev(it)->second >= end;
  }
  bool overlaps(std::uint64_t begin, std::uint64_t end) const {
    if (begin >= end) return false;
    auto it = m_.lower_bound(end);  // the first interval starting at or past `end`
    return it != m_.begin() && std::prev(it)->second > begin;
  }
  // The first stretch of [begin, end) not covered, as [first, second); first == second: none.
  std::pair<std::uint64_t, std::uint64_t> first_gap(std::uint64_t begin, std::uint64_t end) const {
    auto it = m_.upper_bound(begin);
    if (it != m_.begin() && std::prev(it)->second > begin) begin = std::prev(it)->second;
    if (begin >= end) return {end, end};
    return {begin, it != m_.end() ? std::min(end, it->first) : end};
  }
  const std::map<std::uint64_t, std::uint64_t>& intervals() const { return m_; }

 private:
  std::map<std::uint64_t, std::uint64_t> m_;  // begin -> end
};

class BlobArrival {
 public:
  explicit BlobArrival(std::size_t blobs) : in_(blobs) {}

  // The receiver: bytes [begin, end) of `blob` are written.
  void add(std::size_t blob, std::uint64_t begin, std::uint64_t end) {
    {
      std::lock_guard lock(mu_);
      in_.at(blob).add(begin, end);
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
  // Whether bytes [begin, end) of `blob` are all there now (never waits).
  bool has(std::size_t blob, std::uint64_t begin, std::uint64_t end) const {
    std::lock_guard lock(mu_);
    return in_.at(blob).covers(begin, end);
  }
  // A reader: returns once bytes [begin, end) of `blob` are all there; Error(kIo) if they
  // never come.
  void wait(std::size_t blob, std::uint64_t begin, std::uint64_t end) const {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return in_.at(blob).covers(begin, end) || failed_; });
    if (!in_.at(blob).covers(begin, end)) throw Error(Errc::kIo, why_);
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<IntervalSet> in_;
  bool failed_ = false, done_ = false;
  std::string why_;
};

}  // namespace gpuckpt::image
