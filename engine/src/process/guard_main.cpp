// gpuckpt-guard's loop: it reads gpuckpt's commands into its plan, and recovers when gpuckpt
// aborts or dies before the operation is done.
#include "process/guard.h"

#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "util/fd_passing.h"
#include "util/write_fully.h"

#include "process/guard_plan.h"

using nlohmann::json;

namespace fs = std::filesystem;

namespace gpuckpt::process {

namespace {

bool write_all(int fd, const std::string& s) {
  return write_fully(fd, s.data(), s.size()) == 0;
}

// How long gpuckpt may stay stopped (SIGSTOP, a Ctrl-Z) while its service waits on it:
// $GPUCKPT_STOPPED_LIMIT seconds, 30 unless set, at most a day; 0: no bound.
std::chrono::seconds stopped_limit() {
  constexpr long kDay = 24 * 3600;
  if (const char* e = std::getenv("GPUCKPT_STOPPED_LIMIT"); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end && *end == '\0' && v >= 0) return std::chrono::seconds(std::min(v, kDay));
  }
  return std::chrono::seconds(30);
}

// A stopped gpuckpt neither finishes nor fails, so its service would wait for as long as
// nobody continues it. Called about once a second: past the bound, gpuckpt is killed, and the
// guard recovers as from any death of gpuckpt.
class StoppedWatch {
 public:
  StoppedWatch(pid_t gpuckpt, std::chrono::seconds limit) : gpuckpt_(gpuckpt), limit_(limit) {}
  void check(const Plan& p) {
    const auto info = limit_.count() > 0 && !killed_ ? read_proc(gpuckpt_) : std::nullopt;
    const std::string waits = info && info->state == 'T' ? what_waits(p) : std::string();
    if (waits.empty()) {
      waiting_ = false;
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!waiting_) since_ = now;
    waiting_ = true;
    if (now - since_ < limit_) return;
    killed_ = true;
    ::kill(gpuckpt_, SIGKILL);
    write_all(2, "gpuckpt-guard: gpuckpt (pid " + std::to_string(gpuckpt_) + ") was stopped for " +
                     std::to_string(limit_.count()) + " s while " + waits +
                     ": it was killed, and its guard recovers ($GPUCKPT_STOPPED_LIMIT sets the "
                     "bound)\n");
  }

 private:
  pid_t gpuckpt_;
  std::chrono::seconds limit_;
  // Since when the service has waited on a stopped gpuckpt (a plain pair: GCC 12 takes an
  // optional time_point here for maybe uninitialized).
  bool waiting_ = false;
  std::chrono::steady_clock::time_point since_;
  bool killed_ = false;
};

}  // namespace

int guard_main(int in_fd, int out_fd, const fs::path& journal) {
  // spdlog's default logger writes to stdout, which is the summary pipe in gpuckpt-guard: a log
  // line of its recovery (a restore's) would then be read as the summary, and the operator of
  // an interrupted gpuckpt would never learn what the guard did. Its diagnostics go to stderr.
  // Read once: a guard re-parented after gpuckpt's death must never take its new parent (a
  // subreaper) for gpuckpt.
  const pid_t gpuckpt = ::getppid();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "gpuckpt-guard", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  spdlog::set_pattern("%^[%l]%$ gpuckpt-guard: %v");
  spdlog::set_level(spdlog::level::warn);  // its summary says what it did; --quiet holds
  // The fault hooks stop gpuckpt under test. The guard inherits its environment, and its own
  // recovery (a restore) passes the same points: it must run through, not pause for good.
  for (const char* var : {"GPUCKPT_FAULT_PAUSE", "GPUCKPT_FAULT_MARK", "GPUCKPT_FAULT_RESUME"})
    ::unsetenv(var);
  // Terminal and termination signals are gpuckpt's business; the guard must outlive them. A
  // SIGPIPE (gpuckpt gone before reading the summary) must not kill it mid-recovery either.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) ::signal(sig, SIG_IGN);
  // Held from before "ready" (gpuckpt holds it until then): no run recovers what this guard
  // may still recover.
  const UniqueFd held = journal.empty() ? UniqueFd() : hold_journal(journal);
  if (!journal.empty() && !held) {
    // Not "ready": gpuckpt freezes nothing. A journal this guard did not hold would be
    // recovered by another run while this one recovers too.
    const std::string msg = "gpuckpt-guard: cannot hold the journal " + journal.string() + "\n";
    write_all(2, msg);
    return 1;
  }
  // The operation is over once this returns (done, or undone): nothing is left to recover.
  auto over = [&] {
    if (!journal.empty()) ::unlink(journal.c_str());
  };
  // A lock for each process of the tree arrives here: room for as many as the hard limit allows.
  if (rlimit r{}; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &r);
  }
  if (!write_all(out_fd, "ready\n")) return 1;
  Plan plan;
  std::string buf;
  bool aborted = false;
  // gpuckpt's process locks (Guard::hold_locks), held until the operation is over: a gpuckpt
  // killed meanwhile leaves them to this guard, so no other takes the processes it resumes.
  std::vector<UniqueFd> locks;
  bool locks_lost = false;
  StoppedWatch watch(gpuckpt, stopped_limit());
  for (;;) {
    pollfd pfd{in_fd, POLLIN, 0};
    // An error (EINTR, ENOMEM) is no sign that gpuckpt is gone: recv says that.
    if (::poll(&pfd, 1, 1000) <= 0) {
      watch.check(plan);
      continue;
    }
    char chunk[4096];
    bool truncated = false;
    const ssize_t n = recv_with_fds(in_fd, chunk, sizeof chunk, locks, &truncated);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // gpuckpt is gone
    if (truncated && !locks_lost) {
      locks_lost = true;  // said once: the recovery goes on, only without those locks
      write_all(2,
                "gpuckpt-guard: the kernel dropped some of the process locks passed to it (out "
                "of descriptors): another gpuckpt may take those processes up meanwhile\n");
    }
    buf.append(chunk, static_cast<std::size_t>(n));
    for (std::size_t nl; (nl = buf.find('\n')) != std::string::npos;) {
      const json m = json::parse(buf.substr(0, nl), nullptr, false);
      buf.erase(0, nl + 1);
      try {
        const GuardOp op = op_of(m);
        if (op == GuardOp::kDone) {
          over();
          return 0;
        }
        if (op == GuardOp::kAbort) {
          aborted = true;
          break;
        }
        apply(plan, m, /*hold_dirs=*/true);
      } catch (const Error& e) {
        // gpuckpt and its guard are built together: a line it cannot read is a bug, said where
        // the operator sees it; the recovery goes on with what it could read.
        write_all(2, "gpuckpt-guard: ignored a line from gpuckpt: " + std::string(e.what()) + "\n");
      }
    }
    if (aborted) break;
  }
  const std::string summary = recover(plan).summary;
  over();
  if (!aborted) {
    // gpuckpt died: nobody reads the pipe, so tell the operator on the inherited stderr.
    const std::string msg =
        "gpuckpt-guard: gpuckpt ended in the middle of an operation; " + summary + "\n";
    write_all(2, msg);
  }
  write_all(out_fd, summary + "\n");
  return 0;
}

}  // namespace gpuckpt::process
