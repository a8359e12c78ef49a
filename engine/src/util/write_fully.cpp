#include "util/write_fully.h"

#include <unistd.h>

#include <cerrno>

namespace gpuckpt {

int write_fully(int fd, const void* data, std::size_t n, std::atomic<std::uint64_t>* moved) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
    if (moved) *moved += static_cast<std::uint64_t>(w);
  }
  return 0;
}

int pwrite_fully(int fd, const void* data, std::size_t n, std::uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
  return 0;
}

}  // namespace gpuckpt
