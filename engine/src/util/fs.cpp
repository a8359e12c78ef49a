#include "util/fs.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>

#include "gpuckpt/error.h"
#include "util/unique_fd.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;

namespace gpuckpt {

void fsync_dir(const fs::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw_errno(Errc::kIo, "open directory ", dir);
  if (::fsync(fd.get()) != 0) throw_errno(Errc::kIo, "fsync directory ", dir);
}

fs::path temp_sibling(const fs::path& final_path, std::string_view tag) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const fs::path parent =
      final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  for (int i = 0; i < 100; ++i) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
    fs::path p =
        parent / ("." + final_path.filename().string() + "." + std::string(tag) + "-" + suffix);
    std::error_code ec;
    if (!fs::exists(p, ec)) return p;
  }
  throw Error(Errc::kInternal, "cannot find a free temporary name beside " + final_path.string());
}

void write_file_atomic(const fs::path& path, std::string_view data) {
  const fs::path tmp = temp_sibling(path);
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) throw_errno(Errc::kIo, "create ", tmp);
    if (const int err = write_fully(fd.get(), data.data(), data.size())) {
      ::unlink(tmp.c_str());
      throw_syserr(Errc::kIo, err, "write ", tmp);
    }
    if (::fsync(fd.get()) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      throw_syserr(Errc::kIo, err, "fsync ", tmp);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw_syserr(Errc::kIo, err, "rename to ", path);
  }
  fsync_dir(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

std::string read_file(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw_errno(Errc::kInvalidInput, "open ", path);
  return read_rest(fd.get(), path);
}

std::string read_rest(int fd, const fs::path& name) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(Errc::kIo, "read ", name);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

namespace {

// Every live TempDir of this process, for remove_live_temp_dirs(). Never destroyed: a TempDir
// may outlive static destruction.
struct LiveDirs {
  std::mutex mu;
  std::set<fs::path> paths;
  std::set<fs::path> handed_over;  // a guard removes these: hand_over_temp_dir()
  bool leave_handed_over = false;  // leave_handed_over_temp_dirs() was called
};
LiveDirs& live_dirs() {
  static auto* d = new LiveDirs;
  return *d;
}

// A lock of a directory: shared for its owners (the TempDir, a guard that still needs it),
// exclusive for a sweep. LOCK_NB, so that neither a sweep nor a creator ever waits.
UniqueFd lock_dir(const fs::path& path, int mode) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd && ::flock(fd.get(), mode | LOCK_NB) != 0) {
    const int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

class LostRace : public Error {
 public:
  explicit LostRace(const fs::path& p)
      : Error(Errc::kIo, "temporary directory " + p.string() +
                             " was removed by another gpuckpt's cleanup as it was created") {}
};

// PREFIX, then mkdtemp's 6 or temp_sibling's 16 random characters, then maybe ".gone"
// (remove_live_temp_dirs): a temporary directory of ours, not a user's that shares a prefix.
bool temp_name(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& prefix : prefixes) {
    if (!name.starts_with(prefix)) continue;
    std::string_view rest = std::string_view(name).substr(prefix.size());
    if (rest.ends_with(".gone")) rest.remove_suffix(5);
    if ((rest.size() == 6 || rest.size() == 16) &&
        std::all_of(rest.begin(), rest.end(), [](unsigned char c) { return std::isalnum(c) != 0; }))
      return true;
  }
  return false;
}

// Only what a gpuckpt made and never published: its marker, and no manifest with its seal
// (image/manifest.h's names), whatever the directory is called.
bool ours_to_sweep(const fs::path& dir) {
  struct stat st {};
  if (::lstat((dir / kTempMarker).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const bool manifest = ::lstat((dir / "manifest.json").c_str(), &st) == 0;
  const bool seal = ::lstat((dir / "manifest.seal").c_str(), &st) == 0;
  return !(manifest && seal);
}

// flock on these is local to one host, so another host's live directory would look abandoned.
bool network_filesystem(const fs::path& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return true;  // unknown: do not sweep
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0x6969:      // NFS
    case 0xFF534D42:  // CIFS
    case 0xFE534D42:  // SMB2
    case 0x517B:      // SMB
    case 0x65735546:  // FUSE (sshfs, s3fs, ...)
    case 0x00C36400:  // Ceph
    case 0x47504653:  // GPFS
    case 0x0BD00BD0:  // Lustre
      return true;
    default:
      return false;
  }
}

}  // namespace

UniqueFd hold_dir(const fs::path& path) {
  UniqueFd fd = lock_dir(path, LOCK_SH);
  if (!fd) throw_errno(Errc::kIo, "hold ", path);
  return fd;
}

void hand_over_temp_dir(const fs::path& path) {
  auto& live = live_dirs();
  std::lock_guard lk(live.mu);
  live.handed_over.insert(path);
}

void leave_handed_over_temp_dirs() {
  auto& live = live_dirs();
  std::lock_guard lk(live.mu);
  live.leave_handed_over = true;
}

void take_back_temp_dir(const fs::path& path) {
  auto& live = live_dirs();
  std::lock_guard lk(live.mu);
  live.handed_over.erase(path);
}

void TempDir::take(fs::path path) {
  UniqueFd fd = lock_dir(path, LOCK_SH);
  if (!fd) {
    const int err = errno;
    if (err == EWOULDBLOCK || err == ENOENT) throw LostRace(path);
    std::error_code ec;
    fs::remove(path, ec);
    throw_syserr(Errc::kIo, err, "lock ", path);
  }
  if (!still_at(fd, path)) throw LostRace(path);
  try {
    mark(path);
  } catch (const Error&) {
    std::error_code ec;
    fs::remove_all(path, ec);
    throw;
  }
  {
    auto& live = live_dirs();
    std::lock_guard lk(live.mu);
    live.paths.insert(path);
  }
  path_ = std::move(path);
  lock_ = std::move(fd);
}

void TempDir::mark(const fs::path& dir) {
  const fs::path marker = dir / kTempMarker;
  UniqueFd fd(::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) throw_errno(Errc::kIo, "create ", marker);
  // Who made it, for an operator who finds it: the sweep goes by the marker and the lock.
  const std::string who = "gpuckpt pid " + std::to_string(::getpid()) + "\n";
  if (const int err = write_fully(fd.get(), who.data(), who.size()))
    throw_syserr(Errc::kIo, err, "write ", marker);
}

void TempDir::unmark() const {
  const fs::path marker = path_ / kTempMarker;
  if (::unlink(marker.c_str()) != 0 && errno != ENOENT) throw_errno(Errc::kIo, "remove ", marker);
}

void TempDir::forget() noexcept {
  auto& live = live_dirs();
  std::lock_guard lk(live.mu);
  live.paths.erase(path_);
}

void TempDir::drop() noexcept {
  if (path_.empty()) return;
  bool leave = false;
  {
    auto& live = live_dirs();
    std::lock_guard lk(live.mu);
    leave = live.leave_handed_over && live.handed_over.contains(path_);
  }
  forget();
  if (leave) {
    // Still locked until this process ends, so that no sweep takes it before the guard.
    (void)lock_.release();
  } else {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  path_.clear();
  lock_.reset();
}

TempDir::TempDir(const fs::path& parent, std::string_view prefix) {
  for (int attempt = 0;; ++attempt) {
    std::string tmpl = (parent / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw_errno(Errc::kIo, "mkdtemp in ", parent);
    try {
      take(tmpl);
      return;
    } catch (const LostRace&) {
      if (attempt == 9) throw;
    }
  }
}

TempDir TempDir::at(const fs::path& path) {
  if (::mkdir(path.c_str(), 0755) != 0) throw_errno(Errc::kIo, "mkdir ", path);
  TempDir t;
  t.take(path);
  return t;
}

TempDir TempDir::beside(const fs::path& final_path,
                        const std::function<void(const fs::path&)>& before_create) {
  const fs::path parent =
      final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  remove_abandoned(parent, {"." + final_path.filename().string() + ".tmp-"});
  for (int attempt = 0;; ++attempt) {
    const fs::path p = temp_sibling(final_path);
    if (before_create) before_create(p);
    try {
      TempDir t = at(p);
      if (::chmod(t.path().c_str(), 0700) != 0) throw_errno(Errc::kIo, "chmod ", t.path());
      return t;
    } catch (const LostRace&) {
      if (attempt == 9) throw;
    }
  }
}

TempDir::TempDir(TempDir&& o) noexcept : path_(std::move(o.path_)), lock_(std::move(o.lock_)) {
  o.path_.clear();
}

TempDir& TempDir::operator=(TempDir&& o) noexcept {
  if (this != &o) {
    drop();
    path_ = std::move(o.path_);
    lock_ = std::move(o.lock_);
    o.path_.clear();
  }
  return *this;
}

TempDir::~TempDir() {
  drop();
}

fs::path TempDir::release() {
  forget();
  fs::path p = std::move(path_);
  path_.clear();
  lock_.reset();
  return p;
}

std::vector<RemovedDir> remove_abandoned(const fs::path& parent,
                                         const std::vector<std::string>& prefixes) noexcept {
  std::vector<RemovedDir> removed;
  try {
    if (network_filesystem(parent)) {
      spdlog::debug("not sweeping {}: a lock there does not tell another host's use",
                    parent.string());
      return removed;
    }
    std::error_code ec;
    for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
      const fs::path p = it->path();
      if (!temp_name(p.filename().string(), prefixes)) continue;
      std::error_code sec;
      if (it->is_symlink(sec) || !it->is_directory(sec)) continue;
      if (!ours_to_sweep(p)) continue;
      // Held while it is removed, so that nobody else takes it for theirs meanwhile.
      const UniqueFd lock = lock_dir(p, LOCK_EX);
      if (!lock || !still_at(lock, p)) continue;  // in use, or gone already
      RemovedDir r{p, allocated_bytes(p)};
      fs::remove_all(p, sec);
      if (sec) {
        spdlog::warn("cannot remove {}, left by a gpuckpt that was killed: {}", p.string(),
                     sec.message());
      } else {
        spdlog::warn("removed {} ({} MiB), left by a gpuckpt that was killed", p.string(),
                     r.bytes >> 20);
        removed.push_back(std::move(r));
      }
    }
  } catch (const std::exception& e) {
    // A cleanup of what others left never fails the operation that runs it.
    spdlog::warn("sweeping {}: {}", parent.string(), e.what());
  }
  return removed;
}

std::vector<RemovedDir> remove_live_temp_dirs() {
  std::vector<fs::path> paths;
  {
    auto& live = live_dirs();
    std::lock_guard lk(live.mu);
    for (const auto& p : live.paths)
      if (!live.handed_over.contains(p)) paths.push_back(p);
  }
  std::vector<RemovedDir> removed;
  for (const auto& p : paths) {
    // Renamed within its own name's family (PATH.gone), so that a sweep still matches it.
    const fs::path gone = p.string() + ".gone";
    if (::rename(p.c_str(), gone.c_str()) != 0) continue;  // published, or removed, already
    RemovedDir r{p, allocated_bytes(gone)};
    std::error_code ec;
    fs::remove_all(gone, ec);
    if (!ec) removed.push_back(std::move(r));
  }
  return removed;
}

std::uint64_t allocated_bytes(const fs::path& dir) {
  std::uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      n += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  return n;
}

bool still_at(const UniqueFd& fd, const fs::path& path) {
  struct stat a {};
  struct stat b {};
  return ::fstat(fd.get(), &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

std::uint64_t tree_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return fs::file_size(dir);
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (fs::is_regular_file(it->symlink_status(ec))) total += it->file_size(ec);
  }
  return total;
}

}  // namespace gpuckpt
