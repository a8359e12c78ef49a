#include "util/fault.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace gpuckpt {

namespace {
std::atomic<bool> g_guard_recovery_begun{false};
}  // namespace

void guard_recovery_begun() {
  g_guard_recovery_begun.store(true);
  g_guard_recovery_begun.notify_all();
}

void fault_point(std::string_view name) {
  const char* want = std::getenv("GPUCKPT_FAULT_PAUSE");
  if (!want || name != want) return;
  if (const char* mark = std::getenv("GPUCKPT_FAULT_MARK"); mark && *mark) {
    const int fd = ::open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
  }
  if (const char* resume = std::getenv("GPUCKPT_FAULT_RESUME");
      resume && std::strcmp(resume, "interrupt") == 0) {
    g_guard_recovery_begun.wait(false);
    return;
  }
  for (;;) ::pause();
}

}  // namespace gpuckpt
