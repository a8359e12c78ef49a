#include "util/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <random>

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

fs::path temp_sibling(const fs::path& final_path) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const fs::path parent =
      final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  for (int i = 0; i < 100; ++i) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
    fs::path p = parent / ("." + final_path.filename().string() + ".tmp-" + suffix);
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

TempDir::TempDir(const fs::path& parent, std::string_view prefix) {
  std::string tmpl = (parent / (std::string(prefix) + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw_errno(Errc::kIo, "mkdtemp in ", parent);
  path_ = tmpl;
}

TempDir TempDir::at(const fs::path& path) {
  if (::mkdir(path.c_str(), 0755) != 0) throw_errno(Errc::kIo, "mkdir ", path);
  TempDir t;
  t.path_ = path;
  return t;
}

TempDir::TempDir(TempDir&& o) noexcept : path_(std::move(o.path_)) {
  o.path_.clear();
}

TempDir& TempDir::operator=(TempDir&& o) noexcept {
  if (this != &o) {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
    path_ = std::move(o.path_);
    o.path_.clear();
  }
  return *this;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) fs::remove_all(path_, ec);
}

fs::path TempDir::release() {
  fs::path p = std::move(path_);
  path_.clear();
  return p;
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
