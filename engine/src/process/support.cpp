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

bool kill_and_wait(pid_t pid, int timeout_ms) {
  if (::kill(pid, SIGKILL) != 0 && errno == ESRCH) return true;
  return wait_ended(pid, std::chrono::milliseconds(timeout_ms));
}

TempDir make_staging(const fs::path& root, const std::string& prefix) {
  remove_abandoned(
      root, {"gpuckpt-dump-", "gpuckpt-restore-", "gpuckpt-dump-spool-", "gpuckpt-restore-spool-"});
  return TempDir(root, prefix);
}

namespace {

// The pids of `tree` (with their pidfds, where there are any) that are still there at
// `deadline`. A pidfd alone says when its process has ended; without one, /proc is polled.
std::vector<pid_t> still_there(const std::vector<pid_t>& tree, const std::vector<UniqueFd>& pidfds,
                               std::chrono::steady_clock::time_point deadline) {
  auto rest_ms = [&] { return std::max(poll_timeout_ms(deadline), 1); };
  std::vector<pid_t> left;
  for (std::size_t i = 0; i < tree.size(); ++i) {
    if (tree[i] <= 0) continue;
    if (!pidfds[i]) {
      if (!wait_ended(tree[i], std::chrono::milliseconds(rest_ms()))) left.push_back(tree[i]);
      continue;
    }
    pollfd pfd{pidfds[i].get(), POLLIN, 0};
    int n;
    while ((n = ::poll(&pfd, 1, rest_ms())) < 0 && errno == EINTR) {
    }
    if (n <= 0) left.push_back(tree[i]);
  }
  return left;
}

void send(pid_t pid, const UniqueFd& pidfd, int sig) {
  if (!pidfd || ::syscall(SYS_pidfd_send_signal, pidfd.get(), sig, nullptr, 0) != 0)
    ::kill(pid, sig);
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
  // A pidfd names the process itself, and says when all of it has ended without polling /proc
  // (where a pid may already name another process). Where the kernel has none, kill() and
  // wait_ended() do the job. Pids <= 0 are skipped: kill(0 or -1) would reach far more than
  // the tree.
  std::vector<UniqueFd> pidfds;
  pidfds.reserve(tree.size());
  for (pid_t p : tree)
    pidfds.emplace_back(p > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, p, 0)) : -1);
  std::vector<pid_t> kill = tree;
  if (grace.count() > 0) {
    // The service's own shutdown first; what is still there after the grace is killed.
    for (std::size_t i = 0; i < tree.size(); ++i)
      if (tree[i] > 0) send(tree[i], pidfds[i], SIGTERM);
    kill = still_there(tree, pidfds, Clock::now() + grace);
    if (kill.empty()) return {};
    spdlog::info("{} process(es) still there {} ms after SIGTERM; killing them", kill.size(),
                 grace.count());
  }
  std::vector<int> reap;  // duplicates, owned by the reaper thread below
  for (std::size_t i = 0; i < tree.size(); ++i) {
    const pid_t p = tree[i];
    if (p <= 0 || std::find(kill.begin(), kill.end(), p) == kill.end()) continue;
    send(p, pidfds[i], SIGKILL);
    const bool cuda = std::find(gpu.begin(), gpu.end(), p) != gpu.end();
    if (pidfds[i] && !cuda)
      if (const int dup = ::fcntl(pidfds[i].get(), F_DUPFD_CLOEXEC, 0); dup >= 0)
        reap.push_back(dup);
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
  return still_there(tree, pidfds, deadline);
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
