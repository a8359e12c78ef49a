#include "trust/secure_file.h"
#include "gpuckpt/support.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt::trust {

std::optional<std::string> read_regular_file(const fs::path& path, const std::string& what,
                                             const ReadLimits& limits, struct stat* st_out) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  int flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  if (!limits.follow_symlink) flags |= O_NOFOLLOW;
  UniqueFd fd(::open(path.c_str(), flags));
  if (!fd) {
    const int err = errno;
    if (err == ENOENT) return std::nullopt;
    if (err == ELOOP && !limits.follow_symlink)
      throw Error(limits.errc, what + " is a symbolic link; it must be a regular file");
    // Not ours to read is bad input; anything else is the system failing us.
    throw_syserr(err == EACCES || err == EPERM ? Errc::kInvalidInput : Errc::kIo, err, "open ",
                 what);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno(Errc::kIo, "stat ", what);
  if (!S_ISREG(st.st_mode)) throw Error(limits.errc, what + " is not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > limits.max_bytes)
    throw Error(limits.errc, what + " is larger than the " +
                                 std::to_string(limits.max_bytes >> 10) + " KiB allowed (" +
                                 std::to_string(st.st_size) + " bytes)");
  // Regular files ignore O_NONBLOCK; clear it anyway so reads never return EAGAIN.
  ::fcntl(fd.get(), F_SETFL, 0);
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t off = 0;
  for (;;) {
    if (off == out.size()) {
      // The file may have grown since fstat; read one byte more to tell.
      char probe = 0;
      const ssize_t n = ::read(fd.get(), &probe, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno(Errc::kIo, "read ", what);
      if (n == 0) break;
      throw Error(limits.errc, what + " changed while it was read");
    }
    const ssize_t n = ::read(fd.get(), out.data() + off, out.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(Errc::kIo, "read ", what);
    }
    if (n == 0) throw Error(limits.errc, what + " changed while it was read");
    off += static_cast<std::size_t>(n);
  }
  if (st_out) *st_out = st;
  return out;
}

std::string untrusted_because(const struct stat& st, bool sticky_ok) {
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    return "is owned by uid " + std::to_string(st.st_uid) + " (not root" +
           (::geteuid() != 0 ? " or uid " + std::to_string(::geteuid()) : std::string()) + ")";
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 &&
      !(sticky_ok && S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX)))
    return "is writable by group or others (mode " + format_mode(st.st_mode) + ")";
  return {};
}

namespace {

std::optional<Untrusted> check_dirs_above(fs::path p) {
  while (p.has_relative_path()) {
    p = p.parent_path();
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) throw_errno(Errc::kInvalidInput, "stat ", p);
    if (auto why = untrusted_because(st, true); !why.empty()) return Untrusted{p, why};
  }
  return std::nullopt;
}

}  // namespace

std::optional<Untrusted> untrusted_path(const fs::path& path) {
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  if (ec) throw Error(Errc::kInvalidInput, "cannot resolve " + path.string() + ": " + ec.message());
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0) throw_errno(Errc::kInvalidInput, "stat ", real);
  if (auto why = untrusted_because(st); !why.empty()) return Untrusted{real, why};
  if (auto u = check_dirs_above(real)) return u;
  const fs::path given = fs::absolute(path).lexically_normal();
  if (given != real) {
    if (auto u = check_dirs_above(given)) return u;
  }
  return std::nullopt;
}

}  // namespace gpuckpt::trust
