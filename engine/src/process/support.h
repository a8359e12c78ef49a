// Small pieces shared by dump, restore and migrate.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpuckpt/device.h"
#include "gpuckpt/progress.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace gpuckpt::process {

// While alive, reports the bytes under `dir` to `fn` (phase `phase`) a few times a second:
// CRIU gives no progress of its own, but its images grow as it dumps.
class DirProgress {
 public:
  // `total`: expected bytes (an estimate; 0 = unknown).
  DirProgress(ProgressFn fn, std::string phase, std::filesystem::path dir, std::uint64_t total = 0);
  ~DirProgress();
  DirProgress(const DirProgress&) = delete;
  DirProgress& operator=(const DirProgress&) = delete;

 private:
  ProgressFn fn_;
  std::string phase_;
  std::filesystem::path dir_;
  std::uint64_t total_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A staging directory PREFIX-XXXXXX under `root` for one operation. It first removes the
// staging directories that no live gpuckpt holds (TempDir's lock): what a SIGKILL of both
// gpuckpt and its guard, or a host that went down, left behind.
// The CUDA checkpoint copies a process's GPU memory into its host memory, while the tree is
// locked: with less host memory available than that, it would fail in the freeze or bring the
// OOM killer. Error(kDevice) naming both amounts; `available` 0 (unknown) passes.
void require_host_room_for_vram(std::uint64_t vram_bytes, std::uint64_t available_bytes);

TempDir make_staging(const std::filesystem::path& root, const std::string& prefix);

// SIGKILLs every process of a tree (not our children) and waits for each to end; returns those
// still there after `timeout_ms` (counted after the grace, if any). Live CUDA processes are
// locked first (device::lock_before_kill: best effort, bounded). `grace` > 0: SIGTERM first,
// and SIGKILL only for what is still there `grace` later (a service's own shutdown), and for
// what those processes started meanwhile (stopped first, so that they start nothing more).
std::vector<pid_t> end_tree(const std::vector<pid_t>& tree, int timeout_ms = 30000,
                            std::chrono::milliseconds grace = {});

// Error(kUsage) unless `path` (named `what` in the message) is UTF-8: every path gpuckpt hands
// its guard or writes into a record is checked with this before anything is frozen.
void require_utf8_path(const std::filesystem::path& path, const std::string& what);

// An exclusive flock held on a file that goes with it: the file is removed, still locked, when
// this is destroyed, so that it does not outlive the lock (one that a SIGKILL left is taken
// over by the next lock of the same name).
class HeldLockFile {
 public:
  HeldLockFile(std::filesystem::path path, UniqueFd fd)
      : path_(std::move(path)), fd_(std::move(fd)) {}
  explicit HeldLockFile(UniqueFd fd) : fd_(std::move(fd)) {}  // a lock on no file of ours
  ~HeldLockFile() { release(); }
  HeldLockFile(HeldLockFile&& o) noexcept : path_(std::move(o.path_)), fd_(std::move(o.fd_)) {
    o.path_.clear();
  }
  HeldLockFile& operator=(HeldLockFile&& o) noexcept {
    if (this != &o) {
      release();
      path_ = std::move(o.path_);
      o.path_.clear();
      fd_ = std::move(o.fd_);
    }
    return *this;
  }
  HeldLockFile(const HeldLockFile&) = delete;
  HeldLockFile& operator=(const HeldLockFile&) = delete;

  int fd() const { return fd_.get(); }
  // Lets go without removing the file: another holder of the same open file (a guard still
  // recovering) keeps the lock, and the next lock of this name takes the file over after it.
  void leave() noexcept {
    path_.clear();
    fd_.reset();
  }

 private:
  void release() noexcept;
  std::filesystem::path path_;
  UniqueFd fd_;
};

// One gpuckpt at a time may dump or migrate a process: two at once fought over it inside criu
// ("was stopped by 5 unexpectedly") and both failed. Each process of `tree` is locked: an
// exclusive flock on a file of its own in the run directory (run_directory in journal.h:
// /run/gpuckpt for root, this user's alone), named by its pid namespace, pid and start tick, so
// that a later process with the same pid is another file, and dropped with the lock's holder
// however it ends. Not on its /proc directory, as before: any local user may flock that, and so
// held off every dump of a root service. Only without a run directory (a user other than root
// without $XDG_RUNTIME_DIR) is /proc/PID flocked instead. Error(kProcess) if another gpuckpt holds
// one: nothing is frozen yet. Processes that ended meanwhile are skipped.
std::vector<HeldLockFile> lock_processes(const std::vector<pid_t>& tree);
// A restore in place gives the processes their checkpointed pids: two restores of one
// checkpoint at once raced inside criu, and the loser failed with criu's "Can't fork". Each pid
// is locked for the restore (.restore-PIDNS-PID in the run directory), so the loser is refused
// before criu runs, with Error(kProcess) as for a pid in use. Without a run directory nothing
// is locked (the pid check that follows still tells most races).
std::vector<HeldLockFile> lock_restored_pids(const std::vector<pid_t>& pids);
// An exclusive flock on `path` (created if missing, unless `create` is false); nullopt if another
// holds it, or if it is missing and not to be created. Errors are kIo: a full tmpfs is not
// "being dumped" (exit 10), which a script may retry for good.
std::optional<HeldLockFile> try_lock_file(const std::filesystem::path& path, bool create = true);

// Removes the lock files of lock_processes left by a gpuckpt that was SIGKILLed, once their
// process has ended (one of a live process is taken over by its next lock): every guarded
// operation and `gpuckpt recover` does this after undoing the journals. Never throws.
void remove_abandoned_locks() noexcept;

// Environment handed to criu for the plugin (its GPU map is GpuMap::to_string()).
// The device part of it (criu/plugin_report.h): the libcuda path this process found and, for a
// restore, the pids recorded with CUDA state. Costs no cuInit.
std::vector<std::string> plugin_device_env(const std::vector<pid_t>& cuda_pids);

}  // namespace gpuckpt::process
