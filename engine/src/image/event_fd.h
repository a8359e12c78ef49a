// An eventfd used as a thread's single wake-up source: io_uring signals it on every
// completion (io_uring_register_eventfd) and the channels feeding the thread signal it on
// every push, so the I/O threads sleep in one place for both kinds of event.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "gpuckpt/error.h"
#include "util/unique_fd.h"

namespace gpuckpt::image {

class EventFd {
 public:
  EventFd() : fd_(::eventfd(0, EFD_CLOEXEC)) {
    if (!fd_) throw_errno(Errc::kInternal, "eventfd");
  }
  int fd() const { return fd_.get(); }
  void notify() {
    const std::uint64_t one = 1;
    while (::write(fd_.get(), &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
  // Blocks until notify() was called (or an io_uring completion posted) since the last wait.
  void wait() {
    std::uint64_t v;
    while (::read(fd_.get(), &v, sizeof v) < 0 && errno == EINTR) {
    }
  }

 private:
  UniqueFd fd_;
};

}  // namespace gpuckpt::image
