#include "util/fault.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "util/unique_fd.h"

namespace gpuckpt {

namespace {
std::atomic<bool> g_guard_recovery_begun{false};
}  // namespace

void guard_recovery_begun() {
  g_guard_recovery_begun.store(true);
  g_guard_recovery_begun.notify_all();
}

bool fault_point_armed(std::string_view name) {
  const char* want = std::getenv("GPUCKPT_FAULT_PAUSE");
  return want && name == want;
}

void fault_point(std::string_view name) {
  if (!fault_point_armed(name)) return;
  const char* mark = std::getenv("GPUCKPT_FAULT_MARK");
  if (mark && *mark) {
    const int fd = ::open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
  }
  const char* resume = std::getenv("GPUCKPT_FAULT_RESUME");
  if (resume && std::strcmp(resume, "interrupt") == 0) {
    g_guard_recovery_begun.wait(false);
    return;
  }
  if (resume && std::strcmp(resume, "unmark") == 0 && mark && *mark) {
    // Woken by the removal itself, so that a test looks at a phase for as long as it likes
    // without a sleep on either side. The watch is added before the check: a removal between
    // the two is seen by the check.
    const std::string m = mark;
    const std::string dir = m.find('/') == std::string::npos ? "." : m.substr(0, m.rfind('/') + 1);
    const UniqueFd in(::inotify_init1(IN_CLOEXEC));
    if (in && ::inotify_add_watch(in.get(), dir.c_str(), IN_DELETE | IN_MOVED_FROM) >= 0) {
      alignas(inotify_event) char events[4096];
      while (::access(mark, F_OK) == 0)
        if (::read(in.get(), events, sizeof events) < 0 && errno != EINTR) break;
      return;
    }
  }
  for (;;) ::pause();
}

}  // namespace gpuckpt
