// gpuckpt's CRIU plugin: loaded by criu (--libdir) during dump and restore, it moves a task's
// CUDA state with the driver's checkpoint API at CRIU's device hooks and times each step:
//
//   dump:    PAUSE_DEVICES       -> lock        (task still running; CRIU freezes it next)
//            CHECKPOINT_DEVICES  -> checkpoint  (VRAM to host memory, after the freeze)
//            exit hook           -> restore + unlock, only if the task keeps running
//                                   (--leave-running) or the dump failed
//   restore: RESUME_DEVICES_LATE -> restore (GPU remap from $GPUCKPT_GPU_MAP) + unlock
//
// Without a GPU, or for a task without CUDA state, every hook is timed and marked skipped.
// The report (criu/plugin_report.h) goes to $GPUCKPT_PLUGIN_REPORT or the images directory.
//
// The driver does the device work in a helper thread of the target (its "restore thread"),
// which CRIU has ptrace-stopped with the rest of the task; criu is its tracer and the hooks
// run on criu's main thread, so the plugin lets that one thread run with plain ptrace calls
// while the driver works, then stops it again.
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

extern "C" {
#include <criu-plugin.h>
}

#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "util/fs.h"

namespace fs = std::filesystem;
namespace dev = gpuckpt::device;
using gpuckpt::criu::PluginHook;
using gpuckpt::criu::PluginReport;

namespace {

struct Tracked {
  dev::CudaProcState initial = dev::CudaProcState::kRunning;
  bool locked_by_us = false;
  bool checkpointed = false;
};

struct State {
  bool active = false;  // dump or restore (not pre-dump)
  int stage = -1;
  bool api = false;
  PluginReport report;
  fs::path report_path;
  std::string final_state = "killed";
  std::chrono::milliseconds lock_timeout{10000};
  gpuckpt::GpuMap gpu_map;
  std::map<pid_t, Tracked> tracked;
};

State g;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

void save_report() {
  if (g.report_path.empty()) return;
  try {
    gpuckpt::write_file_atomic(g.report_path, gpuckpt::criu::to_json_text(g.report));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpuckpt plugin: cannot write %s: %s\n", g.report_path.c_str(), e.what());
  }
}

// Runs `fn` as one timed hook entry. fn returns false when there was nothing to do.
int timed(const char* name, pid_t pid, const std::function<bool()>& fn) {
  PluginHook h;
  h.name = name;
  h.pid = pid;
  h.start_ns = now_ns();
  int rc = 0;
  try {
    h.skipped = !fn();
    rc = h.skipped ? -ENOTSUP : 0;
  } catch (const std::exception& e) {
    h.ok = false;
    h.error = e.what();
    rc = -1;
    std::fprintf(stderr, "gpuckpt plugin: %s (pid %d) failed: %s\n", name, pid, e.what());
  }
  h.end_ns = now_ns();
  g.report.hooks.push_back(std::move(h));
  save_report();
  return rc;
}

[[noreturn]] void ptrace_fail(const char* what, pid_t tid) {
  throw gpuckpt::Error(gpuckpt::Errc::kDevice, std::string(what) + " on CUDA restore thread " +
                                                   std::to_string(tid) + ": " +
                                                   std::strerror(errno));
}

// Lets the task's CUDA restore thread run (all signals but SIGTRAP blocked, so none of the
// task's handlers run) for the duration of `fn`, then stops it again as CRIU left it.
void with_restore_thread(pid_t pid, const std::function<void()>& fn) {
  const pid_t tid = dev::restore_thread_id(pid);
  std::uint64_t saved = 0;
  if (::ptrace(PTRACE_GETSIGMASK, tid, sizeof saved, &saved) != 0) {
    // Not stopped under us: a dump that failed before CRIU seized the task (e.g. while
    // freezing) leaves it running, and then the driver needs no help.
    if (errno == ESRCH) {
      fn();
      return;
    }
    ptrace_fail("PTRACE_GETSIGMASK", tid);
  }
  std::uint64_t block = ~0ull & ~(1ull << (SIGTRAP - 1));
  if (::ptrace(PTRACE_SETSIGMASK, tid, sizeof block, &block) != 0)
    ptrace_fail("PTRACE_SETSIGMASK", tid);
  if (::ptrace(PTRACE_SETOPTIONS, tid, nullptr, 0) != 0) ptrace_fail("PTRACE_SETOPTIONS", tid);
  if (::ptrace(PTRACE_CONT, tid, nullptr, 0) != 0) ptrace_fail("PTRACE_CONT", tid);
  std::exception_ptr failure;
  try {
    fn();
  } catch (...) {
    failure = std::current_exception();
  }
  if (::ptrace(PTRACE_INTERRUPT, tid, nullptr, 0) != 0) ptrace_fail("PTRACE_INTERRUPT", tid);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(tid, &status, __WALL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) ptrace_fail("waitpid", tid);
    if (WIFSTOPPED(status)) break;
    if (WIFEXITED(status) || WIFSIGNALED(status))
      throw gpuckpt::Error(gpuckpt::Errc::kDevice,
                           "CUDA restore thread " + std::to_string(tid) + " exited");
  }
  if (::ptrace(PTRACE_SETOPTIONS, tid, nullptr, PTRACE_O_SUSPEND_SECCOMP | PTRACE_O_TRACESYSGOOD) !=
      0)
    ptrace_fail("PTRACE_SETOPTIONS", tid);
  if (::ptrace(PTRACE_SETSIGMASK, tid, sizeof saved, &saved) != 0)
    ptrace_fail("PTRACE_SETSIGMASK", tid);
  if (failure) std::rethrow_exception(failure);
}

gpuckpt::GpuMap parse_map(const char* spec) {
  gpuckpt::GpuMap m;
  if (!spec) return m;
  std::string s = spec;
  for (std::size_t start = 0; start < s.size();) {
    auto end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const auto item = s.substr(start, end - start);
    const auto eq = item.find('=');
    if (eq != std::string::npos) m.pairs.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    start = end + 1;
  }
  return m;
}

fs::path images_dir() {
  const int fd = criu_get_image_dir();
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  return ec ? fs::path() : p;
}

int plugin_init(int stage) {
  g = State{};
  g.stage = stage;
  if (stage != CR_PLUGIN_STAGE__DUMP && stage != CR_PLUGIN_STAGE__RESTORE) return 0;
  g.active = true;
  g.report.stage = stage == CR_PLUGIN_STAGE__DUMP ? "dump" : "restore";
  if (const char* p = env(gpuckpt::criu::kEnvReport))
    g.report_path = p;
  else if (auto dir = images_dir(); !dir.empty())
    g.report_path = dir / (stage == CR_PLUGIN_STAGE__DUMP ? gpuckpt::criu::kDumpReportName
                                                          : gpuckpt::criu::kRestoreReportName);
  if (const char* f = env(gpuckpt::criu::kEnvFinalState)) g.final_state = f;
  if (const char* t = env(gpuckpt::criu::kEnvLockTimeoutMs))
    g.lock_timeout = std::chrono::milliseconds(std::atoll(t));
  g.gpu_map = parse_map(env(gpuckpt::criu::kEnvGpuMap));
  g.report.gpu_map = env(gpuckpt::criu::kEnvGpuMap) ? env(gpuckpt::criu::kEnvGpuMap) : "";
  try {
    std::string why;
    g.api = dev::checkpoint_api_available(&why);
    g.report.api_available = g.api;
    g.report.api_error = why;
  } catch (const std::exception& e) {
    g.report.api_error = e.what();
  }
  save_report();
  return 0;
}

// The task's CUDA state, or nullopt if it has none or there is no checkpoint API here.
std::optional<dev::CudaProcState> cuda_state(pid_t pid) {
  if (!g.api) return std::nullopt;
  return dev::process_state(pid);
}

void note_cuda(pid_t pid) {
  g.report.cuda = true;
  for (pid_t p : g.report.cuda_pids)
    if (p == pid) return;
  g.report.cuda_pids.push_back(pid);
}

int pause_devices(int pid) {
  if (!g.active) return -ENOTSUP;
  return timed("device_lock", pid, [pid] {
    const auto st = cuda_state(pid);
    if (!st) return false;
    if (*st == dev::CudaProcState::kFailed)
      throw gpuckpt::Error(gpuckpt::Errc::kDevice, "CUDA reports the process in a failed state");
    note_cuda(pid);
    Tracked t;
    t.initial = *st;
    if (*st == dev::CudaProcState::kRunning) {
      dev::lock(pid, g.lock_timeout);
      t.locked_by_us = true;
    }
    t.checkpointed = *st == dev::CudaProcState::kCheckpointed;
    g.tracked[pid] = t;
    return true;
  });
}

int checkpoint_devices(int pid) {
  if (!g.active) return -ENOTSUP;
  return timed("device_checkpoint", pid, [pid] {
    auto it = g.tracked.find(pid);
    if (it == g.tracked.end()) return false;
    if (it->second.checkpointed) return true;  // it was already checkpointed before the dump
    with_restore_thread(pid, [pid] { dev::checkpoint(pid); });
    it->second.checkpointed = true;
    return true;
  });
}

// Undoes the dump's device work: the task continues (leave-running, or the dump failed).
void resume_after_dump() {
  if (g.tracked.empty()) {
    // Nothing was locked: still time the step for every dumped task, as the other hooks are.
    std::vector<pid_t> seen;
    for (const auto& h : g.report.hooks)
      if (h.name == "device_lock") seen.push_back(h.pid);
    for (pid_t p : seen) timed("device_resume", p, [] { return false; });
    return;
  }
  for (auto& [pid, t] : g.tracked) {
    const pid_t p = pid;
    Tracked& tr = t;
    timed("device_resume", p, [p, &tr] {
      if (!tr.checkpointed && !tr.locked_by_us) return false;
      with_restore_thread(p, [p, &tr] {
        if (tr.checkpointed && tr.initial != dev::CudaProcState::kCheckpointed) {
          dev::restore(p, gpuckpt::GpuMap{});
          tr.checkpointed = false;
        }
        if (tr.locked_by_us) {
          dev::unlock(p);
          tr.locked_by_us = false;
        }
      });
      return true;
    });
  }
}

int resume_devices_late(int pid) {
  if (!g.active) return -ENOTSUP;
  bool cuda = false;
  int rc = timed("device_restore", pid, [pid, &cuda] {
    const auto st = cuda_state(pid);
    if (!st) return false;
    cuda = true;
    note_cuda(pid);
    with_restore_thread(pid, [pid, st] {
      if (*st == dev::CudaProcState::kCheckpointed) dev::restore(pid, g.gpu_map);
    });
    return true;
  });
  if (rc < 0 && rc != -ENOTSUP) return rc;
  return timed("unlock", pid, [pid, cuda] {
    if (!cuda) return false;
    with_restore_thread(pid, [pid] {
      if (dev::process_state(pid) == dev::CudaProcState::kLocked) dev::unlock(pid);
    });
    return true;
  });
}

void plugin_exit(int stage, int ret) {
  if (!g.active) return;
  if (stage == CR_PLUGIN_STAGE__DUMP && (g.final_state == "running" || ret != 0))
    resume_after_dump();
  g.report.criu_result = ret;
  g.report.finished = true;
  save_report();
}

}  // namespace

// CRIU finds the plugin through this descriptor (dlsym "CR_PLUGIN_DESC"); the hooks are filled
// in by the constructors CR_PLUGIN_REGISTER_HOOK generates.
extern "C" {
CR_PLUGIN_REGISTER("gpuckpt", plugin_init, plugin_exit)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__PAUSE_DEVICES, pause_devices)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__CHECKPOINT_DEVICES, checkpoint_devices)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__RESUME_DEVICES_LATE, resume_devices_late)
}
