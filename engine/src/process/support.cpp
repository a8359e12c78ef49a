#include "process/support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <system_error>
#include <thread>

#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "device/cuda_driver.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "util/fs.h"
#include "util/poll_timeout.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt::process {

DirProgress::DirProgress(ProgressFn fn, std::string phase, fs::path dir, std::uint64_t total)
    : fn_(std::move(fn)), phase_(std::move(phase)), dir_(std::move(dir)), total_(total) {
  if (!fn_) return;
  thread_ = std::thread([this] {
    const auto start = std::chrono::steady_clock::now();
    while (!stop_.load()) {
      Progress p;
      p.phase = phase_;
      p.total_bytes = total_;
      try {
        p.done_bytes = tree_bytes(dir_);
      } catch (...) {
        // files come and go while CRIU writes; the next sample will do
      }
      p.elapsed_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fn_(p);
      for (int i = 0; i < 5 && !stop_.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

DirProgress::~DirProgress() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

TempDir make_staging(const fs::path& root, const std::string& prefix) {
  remove_abandoned(
      root, {"gpuckpt-dump-", "gpuckpt-restore-", "gpuckpt-dump-spool-", "gpuckpt-restore-spool-"});
  return TempDir(root, prefix);
}

namespace {

// One process to end. A pidfd names the process itself, and says when all of it has ended
// without polling /proc (where a pid may already name another process). Where the kernel has
// none, kill() and wait_ended() do the job. A pid that pidfd_open finds gone (ESRCH) had ended
// already: its number is never signalled, since it may name another process by now.
struct Target {
  pid_t pid = 0;
  UniqueFd fd;
  bool gone = false;

  explicit Target(pid_t p) : pid(p) {
    if (p <= 0) return;  // kill(0 or -1) would reach far more than the tree
    const int r = static_cast<int>(::syscall(SYS_pidfd_open, p, 0));
    gone = r < 0 && errno == ESRCH;
    fd = UniqueFd(r);
  }
  bool signalled() const { return pid > 0 && !gone; }
  void send(int sig) const {
    if (!signalled()) return;
    // A pidfd that cannot take the signal names a process that has ended (ESRCH).
    if (fd)
      (void)::syscall(SYS_pidfd_send_signal, fd.get(), sig, nullptr, 0);
    else
      ::kill(pid, sig);
  }
};

// The pids of `targets` still there at `deadline`.
std::vector<pid_t> still_there(const std::vector<Target>& targets,
                               std::chrono::steady_clock::time_point deadline) {
  auto rest_ms = [&] { return std::max(poll_timeout_ms(deadline), 1); };
  std::vector<pid_t> left;
  for (const Target& t : targets) {
    if (!t.signalled()) continue;
    if (!t.fd) {
      if (!wait_ended(t.pid, std::chrono::milliseconds(rest_ms()))) left.push_back(t.pid);
      continue;
    }
    pollfd pfd{t.fd.get(), POLLIN, 0};
    int n;
    while ((n = ::poll(&pfd, 1, rest_ms())) < 0 && errno == EINTR) {
    }
    if (n <= 0) left.push_back(t.pid);
  }
  return left;
}

}  // namespace

std::vector<pid_t> end_tree(const std::vector<pid_t>& tree, int timeout_ms,
                            std::chrono::milliseconds grace) {
  using Clock = std::chrono::steady_clock;
  grace = std::max(grace, std::chrono::milliseconds(0));
  const auto deadline = Clock::now() + grace + std::chrono::milliseconds(timeout_ms);
  // A live CUDA process is locked before it is signalled (cuda-checkpoint#53): SIGTERM ends a
  // process without a handler for it as SIGKILL does. The budget is a part of the caller's: a
  // lock that cannot be had in time does not stop the kill.
  std::vector<pid_t> gpu;  // the processes holding /dev/nvidia*
  device::lock_before_kill(tree, std::chrono::milliseconds(std::min(timeout_ms / 3, 10000)), &gpu);
  std::vector<Target> targets;
  targets.reserve(tree.size());
  for (pid_t p : tree) targets.emplace_back(p);
  std::vector<pid_t> kill = tree;
  if (grace.count() > 0) {
    // The service's own shutdown first; what is still there after the grace is killed.
    for (const Target& t : targets) t.send(SIGTERM);
    kill = still_there(targets, Clock::now() + grace);
    if (kill.empty()) return {};
    spdlog::info("{} process(es) still there {} ms after SIGTERM; killing them", kill.size(),
                 grace.count());
  }
  std::vector<int> reap;  // duplicates, owned by the reaper thread below
  for (const Target& t : targets) {
    if (!t.signalled() || std::find(kill.begin(), kill.end(), t.pid) == kill.end()) continue;
    t.send(SIGKILL);
    const bool cuda = std::find(gpu.begin(), gpu.end(), t.pid) != gpu.end();
    if (t.fd && !cuda)
      if (const int dup = ::fcntl(t.fd.get(), F_DUPFD_CLOEXEC, 0); dup >= 0) reap.push_back(dup);
  }
  // A killed process frees its memory on its way out, on one CPU. process_mrelease frees it
  // from another at the same time (as the kernel's OOM reaper does): a process of 4 GiB was gone
  // in 0.16 s instead of 0.20 s (docs/PERFORMANCE.md). Unlike the OOM reaper it waits for the
  // process's memory lock, which a thread stuck in a driver could hold for good: so it runs on
  // a thread of its own that nothing waits for (the wait is killable, so it never holds up
  // gpuckpt's exit). A CUDA process's teardown is left to the driver (cuda-checkpoint#53).
  // Best effort: it fails for memory shared with a live process, and kernels before 5.15 lack
  // it.
  if (!reap.empty()) {
    try {
      std::thread([fds = reap] {
        for (int fd : fds) {
          (void)::syscall(SYS_process_mrelease, fd, 0);
          ::close(fd);
        }
      }).detach();
    } catch (const std::system_error&) {
      for (int fd : reap) ::close(fd);
    }
  }
  return still_there(targets, deadline);
}

std::vector<std::string> plugin_device_env(const std::vector<pid_t>& cuda_pids) {
  std::vector<std::string> env;
  if (const std::string lib = device::driver_library_path(); !lib.empty())
    env.push_back(std::string(criu::kEnvLibcuda) + "=" + lib);
  if (!cuda_pids.empty()) {
    std::string pids;
    for (pid_t p : cuda_pids) pids += (pids.empty() ? "" : ",") + std::to_string(p);
    env.push_back(std::string(criu::kEnvCudaPids) + "=" + pids);
  }
  return env;
}

}  // namespace gpuckpt::process
