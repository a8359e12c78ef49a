// Writing to a pipe or socket whose reader may be gone, without dying of SIGPIPE.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <ctime>

namespace gpuckpt {

// Holds SIGPIPE blocked in this thread while it writes to a pipe whose reader may be gone, so
// that the write fails with EPIPE instead of killing gpuckpt; a SIGPIPE raised meanwhile is
// consumed before the mask is restored.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe_, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_{}, old_{};
};

}  // namespace gpuckpt
