#include "remote/remote_checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/process.h"
#include "gpuckpt/support.h"
#include "image/manifest.h"
#include "image/transfer_common.h"
#include "process/proc_info.h"
#include "util/fault.h"
#include "util/unique_fd.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;
using gpuckpt::image::kManifestName;
using gpuckpt::image::kSealName;

namespace gpuckpt::remote {

namespace {

// Where writers claim a prefix (Upload::claim_prefix): no checkpoint file is named so.
constexpr const char* kClaimDir = ".gpuckpt-writers/";

std::string random_hex() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(rng()));
  return s;
}

constexpr std::uint64_t kMinPart = 5ull << 20;  // S3's minimum for every part but the last
constexpr unsigned kMaxParts = 10000;

unsigned resolve_connections(unsigned requested) {
  if (requested) return requested;
  if (const char* v = std::getenv("GPUCKPT_S3_CONNECTIONS")) {
    const long n = std::atol(v);
    if (n >= 1 && n <= 256) return static_cast<unsigned>(n);
  }
  return 8;
}

// Runs fn(0..n-1) on up to `threads` threads; the first error stops the others from taking
// more work and is rethrown here.
void parallel_for(std::size_t n, unsigned threads, const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex mu;
  auto loop = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= n || failed.load()) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
        failed = true;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned k = static_cast<unsigned>(std::min<std::size_t>(threads, n));
  for (unsigned t = 1; t < k; ++t) pool.emplace_back(loop);
  loop();
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

// Reports progress at most every 200 ms, from any thread.
class Meter {
 public:
  Meter(const ProgressFn& fn, std::string phase, std::uint64_t total)
      : fn_(fn), phase_(std::move(phase)), total_(total) {}
  void add(std::uint64_t n) {
    const std::uint64_t done = done_.fetch_add(n) + n;
    if (!fn_) return;
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    fn_({phase_, done, total_, std::chrono::duration<double>(now - start_).count()});
  }

 private:
  const ProgressFn& fn_;
  std::string phase_;
  std::uint64_t total_;
  std::atomic<std::uint64_t> done_{0};
  std::mutex mu_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The blob names of the checkpoint at `url`, if it has a readable manifest (for cleaning up
// after a replacement); empty otherwise.
std::set<std::string> remote_blob_names(const S3Client& s3, const S3Url& url) {
  std::set<std::string> names;
  try {
    const std::string text = s3.get(url.bucket, url.key(kManifestName), image::kMaxManifestBytes);
    for (const auto& b : image::parse_manifest(text, url.str()).blobs) names.insert(b.name);
  } catch (const Error&) {  // no manifest, or an unreadable one: nothing known to clean up
  }
  return names;
}

UniqueFd create_private(const fs::path& p) {
  UniqueFd fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw_errno(Errc::kIo, "create ", p);
  return fd;
}

}  // namespace

void check_remote_output(const S3Client& s3, const S3Url& url, bool replace) {
  bool missing = false;
  try {
    missing = !s3.bucket_exists(url.bucket);
  } catch (const Error&) {
    // Not a 404: credentials limited to a prefix (HeadBucket needs s3:ListBucket), another
    // region. The requests on the checkpoint's own keys below, and the upload, say what is wrong.
  }
  if (missing)
    throw Error(Errc::kInvalidInput, url.str() + ": the bucket " + url.bucket +
                                         " does not exist (create it first; nothing was frozen)");
  if (!replace && s3.head(url.bucket, url.key(kManifestName)))
    throw Error(Errc::kExists,
                url.str() + " already holds a checkpoint (use --force to replace it)");
}

TransferStats upload_checkpoint(const S3Client& s3, const fs::path& local, const S3Url& url,
                                bool replace, const TransferOptions& o) {
  Upload u(s3, url, replace, o);
  return u.finish(local);
}

Upload::Upload(const S3Client& s3, const S3Url& url, bool replace, const TransferOptions& o)
    : s3_(s3), url_(url), o_(o), part_(std::max(o.part_bytes, kMinPart)) {
  claim_prefix();
  try {
    check_remote_output(s3, url, replace);
  } catch (...) {
    release_claim();
    throw;
  }
  replace_ = replace;
  st_.connections = resolve_connections(o.connections);
  for (unsigned i = 0; i < st_.connections; ++i) threads_.emplace_back([this] { work(); });
}

namespace {

// Who a claim names: this gpuckpt, by what tells it from any other process anywhere (a pid is
// unique only within its host's boot and pid namespace, and until it is reused).
nlohmann::json claimant(const std::string& nonce) {
  const pid_t self = ::getpid();
  return {{"host", host_name()},
          {"boot_id", boot_id()},
          {"pidns", process::pid_namespace_inode(0).value_or(0)},
          {"pid", self},
          {"start", process::start_ticks(self).value_or(0)},
          {"nonce", nonce},
          {"started", image::utc_now_iso8601()}};
}

// A claim that a gpuckpt of this host, boot and pid namespace left when it was killed: its pid
// is gone, or is another process now.
bool left_by_the_dead(const nlohmann::json& c) {
  if (!c.is_object()) return false;
  const pid_t pid = c.value("pid", 0);
  const std::uint64_t ns = c.value("pidns", std::uint64_t{0});
  const std::uint64_t start = c.value("start", std::uint64_t{0});
  if (pid <= 0 || ns == 0 || start == 0 || c.value("host", "") != host_name() ||
      c.value("boot_id", "") != boot_id() || ns != process::pid_namespace_inode(0).value_or(0))
    return false;
  // Unreadable is not gone (hidepid=, another user's gpuckpt): gone only if the kernel says so.
  if (const auto now = process::start_ticks(pid)) return *now != start;
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

std::string holder(const nlohmann::json& c) {
  if (!c.is_object()) return "another writer";
  return "gpuckpt pid " + std::to_string(c.value("pid", 0)) + " on " +
         c.value("host", std::string("?")) + ", since " + c.value("started", std::string("?"));
}

}  // namespace

// The claim is two objects under PREFIX/.gpuckpt-writers/: one named by this writer's nonce,
// after which a listing must show no other writer's (stores that ignore conditional writes),
// and `lock`, written only where absent (what guards the prefix for credentials that may not
// list it). Shared with the interrupt hook, which removes it before gpuckpt dies of a signal.
class PrefixClaim {
 public:
  PrefixClaim(const S3Client& s3, S3Url url) : s3_(s3), url_(std::move(url)) {}
  void take();
  void release() noexcept;

 private:
  std::string dir() const { return url_.key(kClaimDir); }
  [[noreturn]] void held_by(const nlohmann::json& them, const std::string& key);
  bool take_lock(const std::string& mine);
  void hold(const std::string& key);
  S3Client s3_;
  S3Url url_;
  std::mutex mu_;
  std::vector<std::string> keys_;  // what is ours in the store, while held
  std::string mine_;               // what this claim wrote (set before any key is held)
  bool released_ = false;          // by the interrupt hook, maybe while take() runs
};

// `key` was written as ours: held from now, or removed at once if the claim was released
// meanwhile (an interrupt, whose gpuckpt is about to die).
void PrefixClaim::hold(const std::string& key) {
  {
    std::lock_guard lk(mu_);
    if (!released_) {
      keys_.push_back(key);
      return;
    }
  }
  s3_.remove(url_.bucket, key);
  throw Error(Errc::kProcess, "the claim on " + url_.str() + " was released: gpuckpt stops");
}

void PrefixClaim::held_by(const nlohmann::json& them, const std::string& key) {
  throw Error(Errc::kExists, url_.str() + " is being written by " + holder(them) +
                                 ": two checkpoints cannot share one prefix, so nothing was "
                                 "frozen. If no gpuckpt writes there any more, remove s3://" +
                                 url_.bucket + "/" + key);
}

void PrefixClaim::take() {
  const std::string nonce = random_hex();
  mine_ = claimant(nonce).dump();
  const std::string& mine = mine_;
  const std::string own_key = dir() + nonce;
  try {
    s3_.put(url_.bucket, own_key, mine);
  } catch (const Error& e) {
    if (e.code() == Errc::kInvalidInput && !s3_.bucket_exists(url_.bucket))
      throw Error(Errc::kInvalidInput, url_.str() + ": the bucket " + url_.bucket +
                                           " does not exist (create it first; nothing was frozen)");
    throw;
  }
  hold(own_key);
  try {
    std::vector<std::string> keys;
    try {
      keys = s3_.list(url_.bucket, dir());
    } catch (const Error& e) {
      if (e.code() != Errc::kInvalidInput) throw;
      spdlog::warn(
          "cannot list {} to see whether another gpuckpt writes there ({}): the prefix is "
          "guarded by {}lock alone, which holds only where the store honours If-None-Match",
          url_.str(), e.what(), kClaimDir);
    }
    for (const auto& other : keys) {
      if (other == own_key) continue;
      nlohmann::json them;
      try {
        them = nlohmann::json::parse(s3_.get(url_.bucket, other, 64 << 10));
      } catch (const std::exception&) {
        // Gone since the listing (its writer finished), or not ours to read: counted as held.
        if (!s3_.head(url_.bucket, other)) continue;
      }
      if (!left_by_the_dead(them)) held_by(them, other);
      spdlog::warn(
          "removing s3://{}/{}, a claim left by gpuckpt pid {} of this host, which is gone",
          url_.bucket, other, them.value("pid", 0));
      s3_.remove(url_.bucket, other);
    }
    if (!take_lock(mine)) {
      // A dead writer's lock, removed: once more, and a writer that took it meanwhile wins.
      if (!take_lock(mine))
        throw Error(Errc::kExists, url_.str() +
                                       " was claimed by another writer meanwhile; nothing "
                                       "was frozen");
    }
  } catch (...) {
    release();
    throw;
  }
}

// True once `lock` is ours; false after removing a dead writer's; Error(kExists) if held.
bool PrefixClaim::take_lock(const std::string& mine) {
  const std::string key = dir() + "lock";
  if (s3_.put_if_absent(url_.bucket, key, mine)) {
    hold(key);
    // A store that ignores the condition: the lock read back must be ours.
    const std::string now = s3_.get(url_.bucket, key, 64 << 10);
    if (now == mine) return true;
    {
      std::lock_guard lk(mu_);
      // Another writer's now: not ours to remove.
      if (!keys_.empty() && keys_.back() == key) keys_.pop_back();
    }
    held_by(nlohmann::json::parse(now, nullptr, false), key);
  }
  const auto read = [&]() -> std::optional<std::string> {
    try {
      return s3_.get(url_.bucket, key, 64 << 10);
    } catch (const Error&) {
      if (!s3_.head(url_.bucket, key)) return std::nullopt;  // released since: try again
      throw;
    }
  };
  const auto theirs = read();
  if (!theirs) return false;
  const nlohmann::json them = nlohmann::json::parse(*theirs, nullptr, false);
  if (!left_by_the_dead(them)) held_by(them, key);
  // Read again just before the removal: another writer that took the dead one's lock meanwhile
  // keeps it (S3 has no delete-if-unchanged that every store honours; the window left is the
  // two requests' time).
  if (read() != theirs) return false;
  spdlog::warn("removing s3://{}/{}, a claim left by gpuckpt pid {} of this host, which is gone",
               url_.bucket, key, them.value("pid", 0));
  s3_.remove(url_.bucket, key);
  return false;
}

void PrefixClaim::release() noexcept {
  std::vector<std::string> keys;
  {
    std::lock_guard lk(mu_);
    keys.swap(keys_);
    released_ = true;
  }
  for (const auto& key : keys) {
    try {
      // A store that ignored the lock's condition may hold another writer's there now.
      if (key == dir() + "lock" && s3_.get(url_.bucket, key, 64 << 10) != mine_) continue;
      s3_.remove(url_.bucket, key);
    } catch (const std::exception& e) {
      spdlog::warn("could not remove this upload's claim s3://{}/{}: {}", url_.bucket, key,
                   e.what());
    }
  }
}

void Upload::claim_prefix() {
  claim_ = std::make_shared<PrefixClaim>(s3_, url_);
  // gpuckpt dies of an interrupt without unwinding: its claim must not outlive it there. Set
  // before the first object is written.
  on_interrupt_ = std::make_unique<OnInterrupt>([claim = claim_] {
    claim->release();
    return std::string();
  });
  claim_->take();
}

void Upload::release_claim() noexcept {
  on_interrupt_.reset();
  if (claim_) claim_->release();
}

Upload::~Upload() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  for (std::size_t i = 0; i < blobs_.size(); ++i)
    if (!blobs_[i].upload_id.empty() && !blobs_[i].completed)
      s3_.abort_multipart(url_.bucket, url_.key(blobs_[i].name), blobs_[i].upload_id);
  release_claim();
}

void Upload::check() const {
  if (error_) throw Error(Errc::kIo, "the upload to " + url_.str() + " failed: " + why_);
}

void Upload::blob_created(std::uint32_t blob, const fs::path& path) {
  std::lock_guard lock(mu_);
  check();
  blobs_.created(blob, path);
}

void Upload::blob_written(std::uint32_t blob, std::uint64_t end) {
  {
    std::lock_guard lock(mu_);
    check();
    blobs_.written(blob, end);
    queue_parts(blob, false);
  }
  cv_.notify_all();
}

// Under mu_: a task for every whole part written and not yet queued; with `last`, the rest too
// (the blob is complete). A blob that never fills a part goes up in one PUT.
void Upload::queue_parts(std::size_t i, bool last) {
  Blob& b = blobs_[i];
  if (last && b.queued == 0 && b.written <= part_) {
    tasks_.push_back({i, 0, 0, b.written});
    b.queued = b.written;
    return;
  }
  while (b.written - b.queued >= part_ || (last && b.queued < b.written)) {
    const std::uint64_t len = std::min(part_, b.written - b.queued);
    const auto n = static_cast<unsigned>(b.queued / part_) + 1;
    if (n > kMaxParts)
      throw Error(Errc::kUsage, b.name + " needs more than " + std::to_string(kMaxParts) +
                                    " parts: use larger parts");
    tasks_.push_back({i, n, b.queued, len});
    b.queued += len;
  }
}

void Upload::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || error_ || !tasks_.empty(); });
    if (stop_ || error_) return;
    const Task t = tasks_.front();
    tasks_.pop_front();
    ++busy_;
    if (first_ == std::chrono::steady_clock::time_point{})
      first_ = std::chrono::steady_clock::now();
    Blob& b = blobs_[t.blob];
    try {
      const std::string key = url_.key(b.name);
      if (t.part == 0) {
        lock.unlock();
        s3_.put_from_fd(url_.bucket, key, b.fd.get(), 0, t.len);
        lock.lock();
      } else {
        // The first part to go creates the upload; the others wait for its id.
        if (b.upload_id.empty() && !b.creating) {
          b.creating = true;
          lock.unlock();
          std::string id = s3_.create_multipart(url_.bucket, key);
          lock.lock();
          b.upload_id = std::move(id);
          ++st_.requests;
          cv_.notify_all();
        }
        cv_.wait(lock, [&] { return !b.upload_id.empty() || error_ || stop_; });
        if (error_ || stop_) {
          --busy_;
          return;
        }
        const std::string id = b.upload_id;
        lock.unlock();
        std::string etag =
            s3_.upload_part(url_.bucket, key, id, t.part, b.fd.get(), t.offset, t.len);
        lock.lock();
        if (b.etags.size() < t.part) b.etags.resize(t.part);
        b.etags[t.part - 1] = std::move(etag);
      }
      ++st_.requests;
      st_.bytes += t.len;
      if (uploaded_) uploaded_(t.len);
    } catch (const std::exception& e) {
      if (!lock.owns_lock()) lock.lock();
      if (!error_) {
        error_ = std::current_exception();
        why_ = e.what();
      }
    }
    --busy_;
    cv_.notify_all();
  }
}

TransferStats Upload::finish(const fs::path& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  const image::Manifest m = image::load_manifest(dir);
  const std::string seal = read_file(dir / kSealName);
  const std::string manifest = read_file(dir / kManifestName);
  std::vector<std::size_t> single;  // blobs that go up in one PUT, which replaces at once
  {
    std::unique_lock lock(mu_);
    check();
    blobs_.published(dir, m);
    for (std::size_t i = 0; i < m.blobs.size(); ++i) {
      if (blobs_[i].queued == 0 && blobs_[i].written <= part_)
        single.push_back(i);
      else
        queue_parts(i, true);
    }
    // Progress from here on: during the dump, the dump's own is shown.
    std::uint64_t total = seal.size() + manifest.size();
    for (const auto& b : m.blobs) total += b.size;
    auto meter = std::make_shared<Meter>(o_.progress, "upload", total);
    meter->add(st_.bytes);
    uploaded_ = [meter](std::uint64_t n) { meter->add(n); };
    cv_.notify_all();
    cv_.wait(lock, [&] { return error_ || (tasks_.empty() && busy_ == 0); });
    check();
  }
  if (replace_) {
    // Every part is up, and invisible until its upload completes: the old checkpoint is whole
    // until now, even if this upload failed on the way. From here until the new manifest is in
    // place the prefix holds no checkpoint at all, rather than an old manifest over new blobs.
    old_blobs_ = remote_blob_names(s3_, url_);
    s3_.remove(url_.bucket, url_.key(kManifestName));
    std::lock_guard lock(mu_);
    ++st_.requests;
  }
  {
    std::unique_lock lock(mu_);
    for (const std::size_t i : single) queue_parts(i, true);
    cv_.notify_all();
    cv_.wait(lock, [&] { return error_ || (tasks_.empty() && busy_ == 0); });
  }
  try {
    check();
    std::vector<std::size_t> multipart;
    for (std::size_t i = 0; i < blobs_.size(); ++i)
      if (!blobs_[i].upload_id.empty()) multipart.push_back(i);
    parallel_for(multipart.size(), st_.connections, [&](std::size_t k) {
      Blob& b = blobs_[multipart[k]];
      s3_.complete_multipart(url_.bucket, url_.key(b.name), b.upload_id, b.etags);
      b.completed = true;
    });
    st_.requests += multipart.size();
    s3_.put(url_.bucket, url_.key(kSealName), seal);
  } catch (...) {
    rethrow_with_context("upload to " + url_.str() + " failed: ",
                         "; no manifest was written there, so it holds no checkpoint");
  }
  // The manifest last: from this PUT on the checkpoint is complete and durable in the store.
  fault_point(fault::kUploadManifest);
  // Absent in both cases (a replacement removed the old one above): a manifest there now is
  // another writer's, whose checkpoint must not be taken for this one.
  if (!s3_.put_if_absent(url_.bucket, url_.key(kManifestName), manifest))
    throw Error(Errc::kExists, url_.str() +
                                   " received another writer's manifest during this "
                                   "upload; this checkpoint was not published");
  // A store that ignores the condition: the manifest read back must be this one.
  if (s3_.get(url_.bucket, url_.key(kManifestName), image::kMaxManifestBytes) != manifest)
    throw Error(Errc::kExists, url_.str() +
                                   " holds another writer's manifest: this checkpoint "
                                   "was overwritten, so it does not count as written");
  st_.requests += 4;
  st_.bytes += seal.size() + manifest.size();
  std::set<std::string> kept;
  for (const auto& b : m.blobs) kept.insert(b.name);
  for (const auto& name : old_blobs_) {
    if (kept.count(name) || name == kSealName) continue;
    try {
      s3_.remove(url_.bucket, url_.key(name));
      ++st_.requests;
    } catch (const Error& e) {
      spdlog::warn("could not remove {} of the replaced checkpoint: {}", url_.key(name), e.what());
    }
  }
  // Held until here: a writer let in earlier could write blobs that these removals then take.
  release_claim();
  st_.objects = m.blobs.size() + 2;
  if (first_ == std::chrono::steady_clock::time_point{}) first_ = t0;
  st_.seconds = since(first_);
  return st_;
}

TransferStats download_manifest(const S3Client& s3, const S3Url& url, const fs::path& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  TransferStats st;
  st.connections = 1;
  std::string manifest;
  try {
    manifest = s3.get(url.bucket, url.key(kManifestName), image::kMaxManifestBytes);
  } catch (const Error& e) {
    if (e.code() == Errc::kInvalidInput &&
        std::string_view(e.what()).find("HTTP 404") != std::string_view::npos)
      throw Error(Errc::kInvalidInput,
                  url.str() + " is not a gpuckpt checkpoint (no " + kManifestName + ")");
    throw;
  }
  st.bytes += manifest.size();
  std::optional<std::string> seal;
  if (s3.head(url.bucket, url.key(kSealName))) {
    seal = s3.get(url.bucket, url.key(kSealName), image::kMaxSealBytes);
    st.bytes += seal->size();
    ++st.objects;
  }
  auto write = [&](const char* name, const std::string& data) {
    const fs::path p = dir / name;
    UniqueFd fd = create_private(p);
    if (const int err = write_fully(fd.get(), data.data(), data.size()))
      throw_syserr(Errc::kIo, err, "write ", p);
  };
  write(kManifestName, manifest);
  if (seal) write(kSealName, *seal);
  st.objects += 1;
  st.requests = seal ? 3 : 2;
  st.seconds = since(t0);
  return st;
}

TransferStats download_checkpoint(const S3Client& s3, const S3Url& url, const fs::path& dir,
                                  const TransferOptions& o) {
  Download d(s3, url, dir, o);
  d.start();
  return d.join();
}

Download::Download(const S3Client& s3, const S3Url& url, const fs::path& dir,
                   const TransferOptions& o)
    : s3_(s3), url_(url), o_(o), t0_(std::chrono::steady_clock::now()) {
  st_ = download_manifest(s3, url, dir);
  st_.connections = resolve_connections(o.connections);
  // The seal and the format are checked before a byte of the blobs is fetched.
  m_ = image::load_manifest(dir);
  const std::uint64_t step = std::max(o.part_bytes, kMinPart);
  for (std::size_t b = 0; b < m_.blobs.size(); ++b) {
    const fs::path p = dir / m_.blobs[b].name;
    fds_.push_back(create_private(p));
    if (::ftruncate(fds_.back().get(), static_cast<off_t>(m_.blobs[b].size)) != 0)
      throw_errno(Errc::kIo, "size ", p);
    for (std::uint64_t off = 0; off < m_.blobs[b].size; off += step)
      ranges_.push_back({b, off, std::min(step, m_.blobs[b].size - off)});
    total_ += m_.blobs[b].size;
  }
  // The ranges holding what a restore reads first go first; then the rest in blob order,
  // which is the order the dump wrote the pages in, and the order the restore reads them.
  const auto first = image::ranges_needed_first(m_);
  std::stable_partition(ranges_.begin(), ranges_.end(), [&](const Range& r) {
    return std::any_of(first.begin(), first.end(), [&](const image::BlobRange& f) {
      return f.blob == r.blob && f.begin < r.offset + r.len && r.offset < f.end;
    });
  });
  arrival_ = std::make_unique<image::BlobArrival>(m_.blobs.size());
}

Download::~Download() {
  cancel();
  if (thread_.joinable()) thread_.join();
}

void Download::start() {
  thread_ = std::thread([this] {
    try {
      run();
      ended_ = std::chrono::steady_clock::now();
      arrival_->finish();
    } catch (const std::exception& e) {
      error_ = std::current_exception();
      arrival_->fail(std::string("the download of ") + url_.str() + " failed: " + e.what());
    }
  });
}

void Download::run() {
  Meter meter(o_.progress, "download", total_);
  // Taken in the order listed, on `connections` threads.
  parallel_for(ranges_.size(), st_.connections, [&](std::size_t i) {
    if (cancelled_) throw Error(Errc::kIo, "cancelled");
    const Range& r = ranges_[i];
    s3_.get_range_to_fd(url_.bucket, url_.key(m_.blobs[r.blob].name), r.offset, r.len,
                        fds_[r.blob].get(), r.offset, &cancelled_);
    meter.add(r.len);
    arrival_->add(r.blob, r.offset, r.offset + r.len);
  });
  st_.bytes += total_;
  st_.objects += m_.blobs.size();
  st_.requests += ranges_.size();
}

TransferStats Download::join() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(error_);
  st_.seconds = since(t0_);
  return st_;
}

fs::path spool_root(const fs::path& given) {
  if (!given.empty()) return given;
  const char* t = std::getenv("TMPDIR");
  return t && *t ? fs::path(t) : fs::path("/var/tmp");
}

TempDir make_spool(const fs::path& root, const std::string& prefix) {
  remove_abandoned(spool_root(root), {prefix + "-"});
  TempDir d(spool_root(root), prefix);
  if (::chmod(d.path().c_str(), 0700) != 0) throw_errno(Errc::kIo, "chmod ", d.path());
  return d;
}

LocalView::LocalView(const std::string& where, Fetch what, const fs::path& spool_root,
                     const TransferOptions& o) {
  if (!is_s3_url(where)) {
    path_ = where;
    return;
  }
  const S3Url url = parse_s3_url(where);
  const S3Client s3(S3Config::from_environment());
  spool_.emplace(make_spool(spool_root, "gpuckpt-fetch"));
  path_ = spool_->path();
  stats_ = what == Fetch::kManifest ? download_manifest(s3, url, path_)
                                    : download_checkpoint(s3, url, path_, o);
}

}  // namespace gpuckpt::remote
