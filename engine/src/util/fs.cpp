#include "util/fs.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(Errc::kIo, "read ", path);
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
};
LiveDirs& live_dirs() {
  static auto* d = new LiveDirs;
  return *d;
}

// The lock of a directory: LOCK_NB, so that neither a sweep nor a creator ever waits.
UniqueFd lock_dir(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

// Whether `fd` (locked) is still the directory at `path`: a sweep by another process may have
// locked and removed it between our mkdir and our lock.
bool still_at(const UniqueFd& fd, const fs::path& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd.get(), &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

class LostRace : public Error {
 public:
  explicit LostRace(const fs::path& p)
      : Error(Errc::kIo, "temporary directory " + p.string() +
                             " was removed by another gpuckpt's cleanup as it was created") {}
};

}  // namespace

void TempDir::take(fs::path path) {
  UniqueFd fd = lock_dir(path);
  if (!fd) {
    const int err = errno;
    if (err == EWOULDBLOCK || err == ENOENT) throw LostRace(path);
    std::error_code ec;
    fs::remove(path, ec);
    throw_syserr(Errc::kIo, err, "lock ", path);
  }
  if (!still_at(fd, path)) throw LostRace(path);
  {
    auto& live = live_dirs();
    std::lock_guard lk(live.mu);
    live.paths.insert(path);
  }
  path_ = std::move(path);
  lock_ = std::move(fd);
}

void TempDir::drop() noexcept {
  if (path_.empty()) return;
  {
    auto& live = live_dirs();
    std::lock_guard lk(live.mu);
    live.paths.erase(path_);
  }
  std::error_code ec;
  fs::remove_all(path_, ec);
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
  const std::string mine = "." + final_path.filename().string() + ".tmp-";
  const fs::path parent =
      final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  for (const auto& r :
       remove_abandoned(parent, [&](const std::string& name) { return name.starts_with(mine); }))
    spdlog::warn("removed {} ({} MiB): an unfinished output of a gpuckpt that was killed",
                 r.path.string(), r.bytes >> 20);
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
  {
    auto& live = live_dirs();
    std::lock_guard lk(live.mu);
    live.paths.erase(path_);
  }
  fs::path p = std::move(path_);
  path_.clear();
  lock_.reset();
  return p;
}

std::vector<RemovedDir> remove_abandoned(const fs::path& parent,
                                         const std::function<bool(const std::string&)>& match) {
  std::vector<RemovedDir> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    if (!match(e.path().filename().string())) continue;
    if (e.is_symlink(ec) || !e.is_directory(ec)) continue;
    // Held while it is removed, so that nobody else takes it for theirs meanwhile.
    const UniqueFd lock = lock_dir(e.path());
    if (!lock || !still_at(lock, e.path())) continue;  // in use, or gone already
    RemovedDir r{e.path(), allocated_bytes(e.path())};
    fs::remove_all(e.path(), ec);
    if (!ec) removed.push_back(std::move(r));
  }
  return removed;
}

std::vector<RemovedDir> remove_live_temp_dirs() {
  std::vector<fs::path> paths;
  {
    auto& live = live_dirs();
    std::lock_guard lk(live.mu);
    paths.assign(live.paths.begin(), live.paths.end());
  }
  std::vector<RemovedDir> removed;
  for (const auto& p : paths) {
    // Renamed within its own name's family (PATH.gone), so that a sweep still matches it.
    const fs::path gone = p.string() + ".gone";
    if (::rename(p.c_str(), gone.c_str()) != 0) continue;  // published, or removed, already
    RemovedDir r{p, allocated_bytes(gone)};
    std::error_code ec;
    fs::remove_all(gone, ec);
    removed.push_back(std::move(r));
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

std::uint64_t tree_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return fs::file_size(dir);
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  return total;
}

}  // namespace gpuckpt
