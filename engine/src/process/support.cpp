#include "process/support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>

#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "device/cuda_driver.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "gpuckpt/process.h"
#include "process/journal.h"
#include "process/proc_info.h"
#include "util/fs.h"
#include "util/poll_timeout.h"
#include "util/unique_fd.h"
#include "util/utf8.h"

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

void require_utf8_path(const fs::path& path, const std::string& what) {
  if (!is_utf8(path.native()))
    throw Error(Errc::kUsage, "the " + what + " " + path.string() +
                                  " is not UTF-8: gpuckpt's guard, which undoes an operation cut "
                                  "short, and its records name paths in JSON, which holds UTF-8 "
                                  "only (nothing was frozen)");
}

void HeldLockFile::release() noexcept {
  if (fd_ && !path_.empty()) ::unlink(path_.c_str());
  fd_.reset();
  path_.clear();
}

namespace {

constexpr std::string_view kLockPrefix = ".lock-";  // .lock-PIDNS-PID-TICK in the run directory

[[noreturn]] void throw_being_dumped(pid_t q, const std::string& what) {
  throw Error(Errc::kProcess, "process " + std::to_string(q) +
                                  " is being dumped or migrated by another gpuckpt (" + what +
                                  " is locked); nothing was frozen (wait for that one to finish)");
}

// Ours: a pid number names a process only within its namespace.
std::uint64_t own_pid_namespace() {
  const auto ns = pid_namespace_inode(0);
  if (!ns) throw Error(Errc::kIo, "cannot read /proc/self/ns/pid");
  return *ns;
}

// ".lock-PIDNS-": the start of this pid namespace's lock file names. A run directory shared
// with another namespace (a bind mount, $GPUCKPT_RUN_DIR) names other processes by the same
// pids.
std::string lock_prefix() {
  return std::string(kLockPrefix) + std::to_string(own_pid_namespace()) + "-";
}

// ".restore-PIDNS-": the start of the names of a restore's locks on the pids it restores.
std::string restore_lock_prefix() {
  return ".restore-" + std::to_string(own_pid_namespace()) + "-";
}

// The lock file's name for process `q` started at `ticks`.
std::string lock_name(const std::string& prefix, pid_t q, std::uint64_t ticks) {
  return prefix + std::to_string(q) + "-" + std::to_string(ticks);
}

}  // namespace

std::optional<HeldLockFile> try_lock_file(const fs::path& path, bool create) {
  for (;;) {
    UniqueFd fd(
        ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600));
    if (!fd) {
      if (!create && errno == ENOENT) return std::nullopt;
      throw_errno(Errc::kIo, "open the lock ", path);
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) return std::nullopt;
      throw_errno(Errc::kIo, "lock ", path);
    }
    // The holder before us removes the file while it still holds it: the lock just taken may be
    // on a name that is gone, beside which a third run would create and lock a new file.
    struct stat held = {};
    struct stat named = {};
    if (::fstat(fd.get(), &held) != 0) throw_errno(Errc::kIo, "stat ", path);
    if (::stat(path.c_str(), &named) != 0) {
      if (errno != ENOENT) throw_errno(Errc::kIo, "stat ", path);
      if (!create) return std::nullopt;
      continue;
    }
    if (named.st_ino == held.st_ino && named.st_dev == held.st_dev)
      return HeldLockFile(path, std::move(fd));
    // The name holds a new file now: a dump's, which a sweep must leave to it.
    if (!create) return std::nullopt;
  }
}

void remove_abandoned_locks() noexcept try {
  std::string why;
  const std::optional<fs::path> run = run_directory(why);
  if (!run) return;
  const std::string prefix = lock_prefix();
  const std::string restoring = restore_lock_prefix();
  std::error_code ec;
  fs::directory_iterator it(*run, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    try {
      const std::string name = it->path().filename().string();
      // A restore's pid lock names no process of its own: one nobody holds is left by a
      // restore killed with its guard.
      if (name.starts_with(restoring)) {
        (void)try_lock_file(it->path(), /*create=*/false);
        continue;
      }
      // Only the file of a process of this namespace that has ended: one of a live process is
      // its next lock's to take over, a sweep must never hold a name a dump is about to lock,
      // and another namespace's pids are not ours to judge.
      if (!name.starts_with(prefix)) continue;
      const std::string rest = name.substr(prefix.size());
      const auto dash = rest.find('-');
      if (dash == std::string::npos) continue;
      const auto q = static_cast<pid_t>(std::stoll(rest.substr(0, dash)));
      const std::uint64_t ticks = std::stoull(rest.substr(dash + 1));
      if (q <= 0 || name != lock_name(prefix, q, ticks)) continue;  // not one we wrote
      const auto now = start_ticks(q);
      if (now && *now == ticks) continue;
      // No tick read: gone only if the kernel says so (a read may fail for other reasons).
      if (!now && !(::kill(q, 0) != 0 && errno == ESRCH)) continue;
      // Taken only if nobody holds it, and removed as the lock goes out of scope.
      (void)try_lock_file(it->path(), /*create=*/false);
    } catch (const std::exception& e) {
      spdlog::debug("lock file {}: {}", it->path().string(), e.what());
    }
  }
} catch (...) {
  // Best effort: what is left is swept by a later run, or taken over by the next lock.
}

std::vector<HeldLockFile> lock_restored_pids(const std::vector<pid_t>& pids) {
  std::string why;
  const std::optional<fs::path> run = run_directory(why);
  std::vector<HeldLockFile> locks;
  if (!run) return locks;
  const std::string prefix = restore_lock_prefix();
  for (pid_t q : pids) {
    const fs::path path = *run / (prefix + std::to_string(q));
    auto lock = try_lock_file(path);
    // A sweep (remove_abandoned_locks) holds an unheld file for a moment while it removes it.
    for (int i = 0; i < 5 && !lock; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      lock = try_lock_file(path);
    }
    if (!lock)
      throw Error(Errc::kProcess,
                  "pid " + std::to_string(q) + " is being restored by another gpuckpt (" +
                      path.string() +
                      " is locked): CRIU restores a process with its checkpointed pid, so one "
                      "restore at a time; wait for it, or restore into a new pid namespace "
                      "(--new-pidns)");
    locks.push_back(std::move(*lock));
  }
  return locks;
}

std::vector<HeldLockFile> lock_processes(const std::vector<pid_t>& tree) {
  std::string why;
  const std::optional<fs::path> run = run_directory(why);
  if (!run && !tree.empty())
    spdlog::warn(
        "{}: the processes are locked on their /proc directories instead, which any "
        "local user can hold to keep this dump off",
        why);
  const std::string prefix = run ? lock_prefix() : std::string();
  std::vector<HeldLockFile> locks;
  for (pid_t q : tree) {
    if (run) {
      const auto started = start_ticks(q);
      if (!started) continue;  // ended since the scan
      const fs::path path = *run / lock_name(prefix, q, *started);
      auto lock = try_lock_file(path);
      if (!lock) throw_being_dumped(q, path.string());
      locks.push_back(std::move(*lock));
      continue;
    }
    const std::string dir = "/proc/" + std::to_string(q);
    UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) {
      if (errno == ENOENT || errno == ESRCH) continue;  // ended since the scan
      throw_errno(Errc::kProcess, "open ", dir);
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) throw_being_dumped(q, "its " + dir);
      throw_syserr(Errc::kProcess, err, "lock ", dir);
    }
    locks.emplace_back(std::move(fd));
  }
  return locks;
}

void require_host_room_for_vram(std::uint64_t vram_bytes, std::uint64_t available_bytes) {
  if (available_bytes == 0 || vram_bytes <= available_bytes) return;
  throw Error(Errc::kDevice,
              "the tree holds " + std::to_string(vram_bytes >> 20) +
                  " MiB of GPU memory, which the CUDA checkpoint moves into host memory, but "
                  "this host has only " +
                  std::to_string(available_bytes >> 20) +
                  " MiB available: nothing was frozen. Free host memory first");
}

TempDir make_staging(const fs::path& root, const std::string& prefix) {
  // Absolute: criu takes the paths under it (its log, its pidfile) relative to its images
  // directory, not to gpuckpt's working directory.
  if (root.empty()) throw Error(Errc::kUsage, "an empty staging or spool directory was given");
  const fs::path dir = fs::absolute(root);
  require_utf8_path(dir, "staging or spool directory");
  remove_abandoned(
      dir, {"gpuckpt-dump-", "gpuckpt-restore-", "gpuckpt-dump-spool-", "gpuckpt-restore-spool-"});
  return TempDir(dir, prefix);
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

  Target() = default;
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

// True once every thread of `pid` is stopped (or the process has ended): a process whose
// threads are all stopped forks no more. A thread is stopped by SIGSTOP only once it leaves the
// kernel, so the main thread's state alone does not say it.
bool stopped_or_ended(pid_t pid) {
  std::error_code ec;  // no task directory: the process has ended
  for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec))
    if (const auto info = read_proc(std::stoi(t.path().filename().string()));
        info && std::string_view("TtZX").find(info->state) == std::string_view::npos)
      return false;
  return true;
}

bool has_ended(const Target& t) {
  if (!t.fd) return !alive(t.pid);
  pollfd pfd{t.fd.get(), POLLIN, 0};
  return ::poll(&pfd, 1, 0) > 0;
}

// The processes a graceful stop has stopped and not yet killed. They were on their way out:
// if gpuckpt is interrupted meanwhile, its OnInterrupt hook kills them rather than leave them
// stopped for good. The hook runs a copy of itself on the signal-handling thread, possibly after
// end_tree has returned, so this is shared, and it holds its own pidfds.
struct StoppedSet {
  std::mutex mu;
  std::vector<Target> procs;
  bool interrupted = false;

  // Stops `t` and keeps a duplicate of its pidfd; once interrupted, kills it instead.
  void stop(const Target& t) {
    std::lock_guard lk(mu);
    if (interrupted) {
      t.send(SIGKILL);
      return;
    }
    t.send(SIGSTOP);
    Target& kept = procs.emplace_back();
    kept.pid = t.pid;
    if (t.fd) kept.fd = UniqueFd(::fcntl(t.fd.get(), F_DUPFD_CLOEXEC, 0));
  }
  std::string kill_all() {
    std::lock_guard lk(mu);
    interrupted = true;
    std::string ids;
    for (const Target& t : procs) {
      if (has_ended(t)) continue;  // end_tree's own SIGKILL came first: nothing to say
      t.send(SIGKILL);
      ids += (ids.empty() ? "" : ",") + std::to_string(t.pid);
    }
    if (ids.empty()) return {};
    return "killed " + ids + ", which a graceful stop had stopped";
  }
};

// What a tree started during a graceful stop's grace got no SIGTERM, and the SIGKILL of its
// parent would orphan it out of reach: the next restore of the same pids would then find them in
// use. So the survivors (`kill`) are stopped, and what they started is taken in (into `targets`
// and `kill`) and stopped too, until a scan made after every one of them was seen stopped finds
// nothing new, or `deadline`. (A fork under way when SIGSTOP arrives still completes before its
// thread stops: hence a scan after, not before, the check.) A newcomer that holds a GPU is
// locked first, while it runs, and joins `gpu`. Returns how many were taken in. A process whose
// parent ended during the grace was orphaned already: only a pid namespace's init reaches it.
std::size_t stop_and_take_in(std::vector<Target>& targets, std::vector<pid_t>& kill,
                             std::vector<pid_t>& gpu, StoppedSet& stopped,
                             std::chrono::steady_clock::time_point deadline) {
  auto target = [&](pid_t p) -> Target* {
    for (Target& t : targets)
      if (t.pid == p) return &t;
    return nullptr;
  };
  auto settled = [&](pid_t p) {
    const Target* t = target(p);
    return !t || !t->signalled() || has_ended(*t) || stopped_or_ended(p);
  };
  for (pid_t p : kill)
    if (const Target* t = target(p); t && t->signalled()) stopped.stop(*t);
  std::size_t taken = 0;
  std::vector<pid_t> passed;  // zombies, and pids that named no child of the tree
  auto pause = std::chrono::milliseconds(1);
  while (std::chrono::steady_clock::now() < deadline) {
    const bool all_stopped = std::all_of(kill.begin(), kill.end(), settled);
    std::vector<pid_t> fresh;
    for (std::size_t i = 0; i < kill.size(); ++i) {
      const Target* t = target(kill[i]);
      // An ended process's pid may name another process by now: its children are not ours.
      if (!t || !t->signalled() || has_ended(*t)) continue;
      for (pid_t q : process_tree(kill[i]))
        if (!target(q) && std::find(fresh.begin(), fresh.end(), q) == fresh.end() &&
            std::find(passed.begin(), passed.end(), q) == passed.end())
          fresh.push_back(q);
    }
    if (fresh.empty() && all_stopped) break;
    if (!fresh.empty()) {
      std::vector<pid_t> held;
      device::lock_before_kill(fresh,
                               std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            deadline - std::chrono::steady_clock::now()),
                                        std::chrono::milliseconds(1)),
                               &held);
      gpu.insert(gpu.end(), held.begin(), held.end());
      for (pid_t q : fresh) {
        Target t(q);
        // Only a live child of the tree: a zombie needs no signal, and a pid reaped and reused
        // since the scan names someone else (its parent is not in the tree).
        const auto info = t.signalled() ? read_proc(q) : std::nullopt;
        if (!info || info->state == 'Z' || !target(info->ppid)) {
          passed.push_back(q);
          continue;
        }
        stopped.stop(t);
        targets.push_back(std::move(t));
        kill.push_back(q);
        ++taken;
      }
      continue;
    }
    std::this_thread::sleep_for(pause);  // a stop takes effect as each thread leaves the kernel
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
  return taken;
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
  std::optional<OnInterrupt> kill_stopped;  // only a graceful stop stops anything
  if (grace.count() > 0) {
    // The service's own shutdown first; what is still there after the grace is killed.
    for (const Target& t : targets) t.send(SIGTERM);
    kill = still_there(targets, Clock::now() + grace);
    if (kill.empty()) return {};
    const std::size_t left = kill.size();
    const auto stopped = std::make_shared<StoppedSet>();
    kill_stopped.emplace([stopped] { return stopped->kill_all(); });
    std::size_t started = 0;
    try {
      started = stop_and_take_in(targets, kill, gpu, *stopped,
                                 std::min(deadline, Clock::now() + std::chrono::seconds(2)));
    } catch (const std::exception& e) {
      // What was stopped is killed below all the same.
      spdlog::warn("could not look for what the stopping processes started: {}", e.what());
    }
    spdlog::info(
        "{} process(es) still there {} ms after SIGTERM, and {} they started meanwhile; "
        "killing them",
        left, grace.count(), started);
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
  // An operator's fallback, which a runtime's CRIU would not inherit from gpuckpt.
  if (const char* serial = std::getenv(criu::kEnvDeviceSerial); serial && *serial)
    env.push_back(std::string(criu::kEnvDeviceSerial) + "=" + serial);
  return env;
}

}  // namespace gpuckpt::process
