// gpuckpt's CRIU plugin: loaded by criu (--libdir) during dump and restore, it moves a task's
// CUDA state with the driver's checkpoint API at CRIU's device hooks and times each step:
//
//   dump:    PAUSE_DEVICES       -> lock        (task still running; CRIU freezes it next)
//            CHECKPOINT_DEVICES  -> checkpoint  (VRAM to host memory, after the freeze)
//            exit hook           -> restore + unlock, only if the task keeps running
//                                   (--leave-running) or the dump failed
//   restore: RESUME_DEVICES_LATE -> restore (GPU remap from $GPUCKPT_GPU_MAP) + unlock
//
// Without a GPU, or for a task without CUDA state, every hook is timed and marked skipped. A
// task that holds /dev/nvidia* (dump) or that the checkpoint recorded with CUDA state
// ($GPUCKPT_CUDA_PIDS, restore) is never skipped: without a usable driver its hook fails with
// the reason. The driver is loaded once per criu run, at the first hook that needs it, from
// $GPUCKPT_LIBCUDA_PATH (the library gpuckpt found) first; the load and its cuInit are timed
// as the "cuda_init" hook. The report (criu/plugin_report.h) goes to $GPUCKPT_PLUGIN_REPORT or
// the images directory.
//
// The driver does the device work in a helper thread of the target (its "restore thread"),
// which CRIU has ptrace-stopped with the rest of the task; criu is its tracer and the hooks
// run on criu's main thread, so the plugin lets that one thread run with plain ptrace calls
// while the driver works, then stops it again. On restore, as in CRIU's own cuda plugin, the
// state is asked only while that thread runs. Like that plugin, it switches CRIU to
// interrupt-only seizing (set_compel_interrupt_only_mode): a thread frozen by the cgroup
// freezer could not be let run.
//
// CRIU calls CHECKPOINT_DEVICES and RESUME_DEVICES_LATE once per task, one after the other. A
// serving tree has one CUDA worker per GPU, and each worker's device step takes seconds, so
// the plugin does them together: at the first of those calls it lets every CUDA task's restore
// thread run (ptrace requests must come from criu's main thread, the tracer), calls the driver
// for all of them at once, one thread each, then stops the threads again; the later calls
// return what their task's step gave. The tasks are all known by then: every PAUSE_DEVICES
// came before the freeze, and every task is restored before the late hooks.
// $GPUCKPT_DEVICE_SERIAL=1 keeps CRIU's order.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include <criu-plugin.h>

// Exported by criu (criu/seize.c) since 4.0 but not declared in the installed criu-plugin.h.
// Weak, so that the plugin still loads into a criu without it (then cgroup-frozen dumps are
// not supported; the report says interrupt_only: false).
void set_compel_interrupt_only_mode(void) __attribute__((weak));
}
// criu's exports that the header declares: weak too, so that the plugin links with
// --no-undefined (criu_plugin/CMakeLists.txt) and they are resolved by criu at load time.
#pragma weak criu_get_image_dir

#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "device/cuda_driver.h"
#include "device/gpu_map.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "util/fs.h"
#include "util/unique_fd.h"

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
  bool gpu_host = false;   // the NVIDIA kernel module sees GPUs here
  bool api_tried = false;  // the driver was loaded (once per criu run)
  bool api = false;
  std::vector<pid_t> expected_cuda;  // restore: recorded with CUDA state ($GPUCKPT_CUDA_PIDS)
  std::string device_prefix = "/dev/nvidia";  // files that mark a task as holding a GPU
  PluginReport report;
  fs::path report_path;
  std::string final_state = "killed";
  std::chrono::milliseconds lock_timeout{10000};
  gpuckpt::GpuMap gpu_map;
  std::map<pid_t, Tracked> tracked;
  bool serial = false;          // $GPUCKPT_DEVICE_SERIAL: CRIU's one-by-one order
  bool together_tried = false;  // the first CHECKPOINT_DEVICES / RESUME_DEVICES_LATE came
  std::map<pid_t, int> done;    // tasks whose step ran together: the hook's return code
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

// False (and said on stderr) when the report could not be written.
bool save_report() {
  if (g.report_path.empty()) return true;
  try {
    gpuckpt::write_file_atomic(g.report_path, gpuckpt::criu::to_json_text(g.report));
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpuckpt plugin: cannot write %s: %s\n", g.report_path.c_str(), e.what());
    return false;
  }
}

// Runs `fn` as one timed hook entry and returns it; touches no global state, so that the
// threads of a tree's concurrent device steps can use it. fn returns false when there was
// nothing to do.
PluginHook run_hook(const char* name, pid_t pid, const std::function<bool()>& fn) {
  PluginHook h;
  h.name = name;
  h.pid = pid;
  h.start_ns = now_ns();
  try {
    h.skipped = !fn();
  } catch (const std::exception& e) {
    h.ok = false;
    h.error = e.what();
    std::fprintf(stderr, "gpuckpt plugin: %s (pid %d) failed: %s\n", name, pid, e.what());
  } catch (...) {
    // Nothing may escape a worker thread: std::terminate would end criu with the tree frozen.
    h.ok = false;
    h.error = "an unknown exception";
    std::fprintf(stderr, "gpuckpt plugin: %s (pid %d) failed\n", name, pid);
  }
  h.end_ns = now_ns();
  return h;
}

int return_code(const PluginHook& h) {
  return !h.ok ? -1 : h.skipped ? -ENOTSUP : 0;
}

// Adds a hook entry to the report and saves it; returns the hook's code for CRIU.
int record(PluginHook h) {
  const int rc = return_code(h);
  g.report.hooks.push_back(std::move(h));
  save_report();
  return rc;
}

// Runs `fn` as one timed hook entry, recorded.
int timed(const char* name, pid_t pid, const std::function<bool()>& fn) {
  return record(run_hook(name, pid, fn));
}

[[noreturn]] void ptrace_fail(const char* what, pid_t tid) {
  throw gpuckpt::Error(gpuckpt::Errc::kDevice, std::string(what) + " on CUDA restore thread " +
                                                   std::to_string(tid) + ": " +
                                                   std::strerror(errno));
}

// Lets the task's CUDA restore thread run (all signals but SIGTRAP blocked, so none of the
// task's handlers run) while alive, and stops it again as CRIU left it in stop() or, after an
// error, in the destructor. Mirrors resume_restore_thread()/interrupt_restore_thread() of
// CRIU's cuda plugin.
class RunningRestoreThread {
 public:
  explicit RunningRestoreThread(pid_t tid) : tid_(tid) {
    if (::ptrace(PTRACE_GETSIGMASK, tid_, sizeof saved_, &saved_) != 0) {
      // Not stopped under us: a dump that failed before CRIU seized the task (e.g. while
      // freezing) leaves it running, and then the driver needs no help.
      if (errno == ESRCH) return;
      ptrace_fail("PTRACE_GETSIGMASK", tid_);
    }
    std::uint64_t block = ~0ull & ~(1ull << (SIGTRAP - 1));
    if (::ptrace(PTRACE_SETSIGMASK, tid_, sizeof block, &block) != 0)
      ptrace_fail("PTRACE_SETSIGMASK", tid_);
    if (::ptrace(PTRACE_SETOPTIONS, tid_, nullptr, 0) != 0) ptrace_fail("PTRACE_SETOPTIONS", tid_);
    if (::ptrace(PTRACE_CONT, tid_, nullptr, 0) != 0) {
      const int e = errno;
      ::ptrace(PTRACE_SETSIGMASK, tid_, sizeof saved_, &saved_);  // undo what we can
      errno = e;
      ptrace_fail("PTRACE_CONT", tid_);
    }
    running_ = true;
  }
  RunningRestoreThread(const RunningRestoreThread&) = delete;
  RunningRestoreThread& operator=(const RunningRestoreThread&) = delete;
  ~RunningRestoreThread() {
    try {
      stop();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpuckpt plugin: %s\n", e.what());
    }
  }

  pid_t tid() const { return tid_; }

  void stop() {
    if (!running_) return;
    running_ = false;
    if (::ptrace(PTRACE_INTERRUPT, tid_, nullptr, 0) != 0) ptrace_fail("PTRACE_INTERRUPT", tid_);
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(tid_, &status, __WALL);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) ptrace_fail("waitpid", tid_);
      if (WIFSTOPPED(status)) break;
      if (WIFEXITED(status) || WIFSIGNALED(status))
        throw gpuckpt::Error(gpuckpt::Errc::kDevice,
                             "CUDA restore thread " + std::to_string(tid_) + " exited");
    }
    if (::ptrace(PTRACE_SETOPTIONS, tid_, nullptr,
                 PTRACE_O_SUSPEND_SECCOMP | PTRACE_O_TRACESYSGOOD) != 0)
      ptrace_fail("PTRACE_SETOPTIONS", tid_);
    if (::ptrace(PTRACE_SETSIGMASK, tid_, sizeof saved_, &saved_) != 0)
      ptrace_fail("PTRACE_SETSIGMASK", tid_);
  }

 private:
  pid_t tid_;
  std::uint64_t saved_ = 0;
  bool running_ = false;
};

// Runs `fn` while the task's restore thread runs; fn's error wins over a failure to stop it.
void with_restore_thread(pid_t pid, const std::function<void()>& fn) {
  RunningRestoreThread t(dev::restore_thread_id(pid));
  fn();
  t.stop();
}

// Blocks every signal on this thread while alive: the threads started meanwhile inherit the
// full mask, so criu's handlers (SIGCHLD, its timeout's SIGALRM) keep running on its own
// threads only.
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t all;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &saved_);
  }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;
  ~SignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

 private:
  sigset_t saved_;
};

// One task's part of a step that runs together: its restore thread and the hooks it recorded.
struct TaskStep {
  pid_t pid = 0;
  pid_t restore_tid = 0;
  std::vector<PluginHook> hooks;
  bool stepped = false;  // the driver did the step (whatever came after)
};

// Runs work(task) for every task at once, one thread each, while each task's restore thread
// runs. This thread lets those threads run first and stops them after, since only the tracer
// thread may make ptrace requests; a task whose thread cannot be let run gets the error as its
// hook `failed_name` and no worker. A stop that fails goes into the task's last hook.
void run_together(std::vector<TaskStep>& tasks, const char* failed_name,
                  const std::function<void(TaskStep&)>& work) {
  std::vector<std::unique_ptr<RunningRestoreThread>> running(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    PluginHook h = run_hook(failed_name, tasks[i].pid, [&] {
      running[i] = std::make_unique<RunningRestoreThread>(tasks[i].restore_tid);
      return true;
    });
    if (!h.ok) tasks[i].hooks.push_back(std::move(h));
  }
  {
    std::vector<std::jthread> workers;  // joined when this scope ends
    SignalsBlocked blocked;
    workers.reserve(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (!running[i]) continue;
      try {
        workers.emplace_back([&work, &task = tasks[i]] { work(task); });
      } catch (const std::exception&) {
        work(tasks[i]);  // no thread to be had (EAGAIN): the step runs here, one after the other
      }
    }
  }
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!running[i]) continue;
    try {
      running[i]->stop();
    } catch (const std::exception& e) {
      // The step did not end as CRIU needs it: the task's last hook fails with the reason.
      auto& hooks = tasks[i].hooks;
      if (hooks.empty()) hooks.push_back(run_hook(failed_name, tasks[i].pid, [] { return true; }));
      hooks.back().ok = false;
      hooks.back().error += (hooks.back().error.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  g.report.together = std::max(g.report.together, static_cast<int>(tasks.size()));
  for (auto& t : tasks) {
    int rc = 0;
    for (auto& h : t.hooks) {
      if (!h.ok) rc = -1;
      g.report.hooks.push_back(std::move(h));
    }
    g.done[t.pid] = rc;
  }
  save_report();
}

fs::path images_dir() {
  if (!criu_get_image_dir) return {};
  const int fd = criu_get_image_dir();
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  return ec ? fs::path() : p;
}

// A settings file's text: a regular file of at most 64 KiB, not followed through a link (it
// sits among a checkpoint's images, and a FIFO or /dev/zero there must not hang criu).
std::string read_settings(const fs::path& file) {
  constexpr std::size_t kMax = 64 << 10;
  gpuckpt::UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  struct stat st = {};
  if (!fd || ::fstat(fd.get(), &st) != 0)
    throw gpuckpt::Error(gpuckpt::Errc::kIo,
                         std::string("cannot open it: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode) || static_cast<std::size_t>(st.st_size) > kMax)
    throw gpuckpt::Error(gpuckpt::Errc::kInvalidInput, "not a regular file of at most 64 KiB");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

// The settings a restore's runtime could not pass in criu's environment (dockerd's, containerd
// 2.0's shims), from the images directory: set where criu's environment lacks them. Only a
// criu that gpuckpt did not give its environment reads the file (gpuckpt always names the
// report), and only the settings that choose nothing outside the restore are taken: the file
// sits among a checkpoint's images, which must not name the library criu loads or a file it
// writes. The report then goes to the images directory, where gpuckpt reads it. False (and
// said) when the file is there but unreadable: the restore must not go on without its GPU map.
bool adopt_env_file(const fs::path& dir) {
  namespace c = gpuckpt::criu;
  std::error_code ec;
  const fs::path file = dir / c::kEnvFileName;
  if (dir.empty() || env(c::kEnvReport) || !fs::exists(fs::symlink_status(file, ec))) return true;
  static constexpr const char* kTaken[] = {c::kEnvLockTimeoutMs, c::kEnvGpuMap, c::kEnvCudaPids,
                                           c::kEnvDeviceSerial, c::kEnvThpFill};
  try {
    const auto j = nlohmann::json::parse(read_settings(file));
    for (const char* name : kTaken)
      if (const auto it = j.find(name); it != j.end() && it->is_string())
        ::setenv(name, it->get<std::string>().c_str(), /*overwrite=*/0);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpuckpt plugin: cannot read %s: %s\n", file.c_str(), e.what());
    return false;
  }
}

int plugin_init(int stage) {
  g = State{};
  g.stage = stage;
  if (stage != CR_PLUGIN_STAGE__DUMP && stage != CR_PLUGIN_STAGE__RESTORE) return 0;
  g.active = true;
  if (stage == CR_PLUGIN_STAGE__RESTORE && !adopt_env_file(images_dir())) return -1;
  g.report.stage = stage == CR_PLUGIN_STAGE__DUMP ? "dump" : "restore";
  if (const char* p = env(gpuckpt::criu::kEnvReport))
    g.report_path = p;
  else if (auto dir = images_dir(); !dir.empty())
    g.report_path = dir / (stage == CR_PLUGIN_STAGE__DUMP ? gpuckpt::criu::kDumpReportName
                                                          : gpuckpt::criu::kRestoreReportName);
  if (const char* f = env(gpuckpt::criu::kEnvFinalState)) g.final_state = f;
  if (const char* t = env(gpuckpt::criu::kEnvLockTimeoutMs))
    g.lock_timeout = std::chrono::milliseconds(std::atoll(t));
  if (const char* map = env(gpuckpt::criu::kEnvGpuMap)) g.report.gpu_map = map;
  try {
    // gpuckpt hands over a map of UUIDs (GpuMap::to_string); it is read by the same parser as
    // --gpu-map, with no devices to resolve indices against.
    g.gpu_map = dev::parse_gpu_map(g.report.gpu_map, [] { return gpuckpt::DeviceList{}; });
  } catch (const gpuckpt::Error& e) {
    std::fprintf(stderr, "gpuckpt plugin: bad %s: %s\n", gpuckpt::criu::kEnvGpuMap, e.what());
    return -1;
  }
  if (const char* pids = env(gpuckpt::criu::kEnvCudaPids))
    for (const char* q = pids; *q;) {
      char* end = nullptr;
      const long v = std::strtol(q, &end, 10);
      if (end == q) break;
      if (v > 0) g.expected_cuda.push_back(static_cast<pid_t>(v));
      q = *end ? end + 1 : end;
    }
  if (const char* prefix = env(gpuckpt::criu::kEnvTestDevicePrefix)) g.device_prefix = prefix;
  if (const char* serial = env(gpuckpt::criu::kEnvDeviceSerial))
    g.serial = std::string(serial) == "1";
  std::error_code ec;
  g.gpu_host = fs::is_directory("/proc/driver/nvidia/gpus", ec);
  if (g.gpu_host || !g.expected_cuda.empty()) {
    // As CRIU's cuda plugin does once it is enabled: seize by interrupts only, never through
    // the cgroup freezer, whose frozen restore thread could not run the driver's work.
    if (set_compel_interrupt_only_mode) {
      set_compel_interrupt_only_mode();
      g.report.interrupt_only = true;
    } else {
      std::fprintf(stderr,
                   "gpuckpt plugin: this criu lacks set_compel_interrupt_only_mode(): do not "
                   "use --freeze-cgroup with CUDA tasks\n");
    }
  }
  g.report.api_error = g.gpu_host ? "not loaded yet (loaded at the first task that needs it)"
                                  : "no NVIDIA GPU here (/proc/driver/nvidia/gpus is missing): "
                                    "the CUDA driver was not loaded";
  save_report();
  return 0;
}

// Loads the CUDA driver once per criu run, timed as a "cuda_init" hook of the task that
// needed it first: cuInit is the one big fixed cost of the device work (seconds on a cold
// GPU host), so it is reported on its own rather than hidden in the first lock or restore.
void load_api(pid_t pid) {
  if (g.api_tried) return;
  g.api_tried = true;
  PluginHook h;
  h.name = "cuda_init";
  h.pid = pid;
  h.start_ns = now_ns();
  try {
    std::string why;
    g.api = dev::checkpoint_api_available(&why);
    g.report.api_error = why;
    const auto& st = dev::CudaDriver::instance().status();
    g.report.driver_library = st.loaded ? st.library : "";
    g.report.driver_load_seconds = st.load_seconds;
    g.report.cuinit_seconds = st.cuinit_seconds;
  } catch (const std::exception& e) {
    g.api = false;
    g.report.api_error = e.what();
  }
  g.report.api_available = g.api;
  h.end_ns = now_ns();
  h.skipped = !g.api;
  if (!g.api) h.error = g.report.api_error;  // not a failure by itself: see cuda_task()
  g.report.hooks.push_back(std::move(h));
  save_report();
}

bool expected_cuda(pid_t pid) {
  for (pid_t p : g.expected_cuda)
    if (p == pid) return true;
  return false;
}

// The task's CUDA restore thread, or nullopt if it has no CUDA state (CRIU's test: no restore
// thread). Throws when the task needs the driver (it holds /dev/nvidia*, or the checkpoint
// recorded it with CUDA state) and the driver or its checkpoint API is unusable: skipping it
// would dump a task whose GPU state is lost, or restore one that hangs at its next CUDA call.
std::optional<pid_t> cuda_task(pid_t pid) {
  const bool recorded = expected_cuda(pid);
  const bool holds = !recorded && dev::holds_device_files(pid, g.device_prefix);
  if (!recorded && !holds && !g.gpu_host) return std::nullopt;  // no GPU: never load a driver
  load_api(pid);
  if (!g.api) {
    if (recorded || holds)
      throw gpuckpt::Error(
          gpuckpt::Errc::kNoDevice,
          "task " + std::to_string(pid) +
              (recorded ? " was checkpointed with CUDA state" : " has NVIDIA device files open") +
              ", but the CUDA checkpoint API is unusable inside criu: " + g.report.api_error);
    return std::nullopt;
  }
  try {
    return dev::find_restore_thread(pid);
  } catch (const gpuckpt::Error& e) {
    // A task that has ended (a zombie of the tree) holds no CUDA state; one the checkpoint
    // recorded with it still fails.
    if (e.code() == gpuckpt::Errc::kProcess && !recorded) return std::nullopt;
    throw;
  }
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
    if (!cuda_task(pid)) return false;
    // PAUSE_DEVICES comes before the freeze: the task runs, its state can be asked.
    const auto st = dev::process_state(pid);
    if (!st) return false;
    if (*st == dev::CudaProcState::kFailed)
      throw gpuckpt::Error(gpuckpt::Errc::kDevice, "CUDA reports the process in a failed state");
    note_cuda(pid);
    Tracked t;
    t.initial = *st;
    if (*st == dev::CudaProcState::kRunning) {
      // In the report before the lock: if gpuckpt and criu die from then on, the guard reads
      // it to give the CUDA state back (process/guard.cpp). A task listed but never locked
      // costs nothing there (it runs); one locked but not listed would stay frozen.
      g.report.locked_pids.push_back(pid);
      if (!save_report())
        throw gpuckpt::Error(gpuckpt::Errc::kIo,
                             "cannot record the task in the plugin's report before locking it, "
                             "so a recovery could not unlock it");
      dev::lock(pid, g.lock_timeout);
      t.locked_by_us = true;
    }
    t.checkpointed = *st == dev::CudaProcState::kCheckpointed;
    g.tracked[pid] = t;
    return true;
  });
}

// The restore of a task's device state, if the driver holds it checkpointed; the task's restore
// thread must run (the state is asked through it, as in CRIU's cuda plugin).
void restore_device(pid_t pid) {
  const auto st = dev::process_state(pid);
  if (!st)
    throw gpuckpt::Error(gpuckpt::Errc::kDevice,
                         "the task has a CUDA restore thread but no CUDA state");
  if (*st == dev::CudaProcState::kFailed)
    throw gpuckpt::Error(gpuckpt::Errc::kDevice, "CUDA reports the process in a failed state");
  if (*st == dev::CudaProcState::kCheckpointed) dev::restore(pid, g.gpu_map);
}

void unlock_device(pid_t pid) {
  if (dev::process_state(pid) == dev::CudaProcState::kLocked) dev::unlock(pid);
}

// The first CHECKPOINT_DEVICES: the device checkpoints of every task that PAUSE_DEVICES locked,
// together.
void checkpoint_together() {
  std::vector<TaskStep> tasks;
  for (const auto& [pid, t] : g.tracked)
    if (!t.checkpointed) tasks.push_back({pid, dev::restore_thread_id(pid), {}, false});
  if (tasks.size() < 2) return;
  run_together(tasks, "device_checkpoint", [](TaskStep& t) {
    const pid_t pid = t.pid;
    t.hooks.push_back(run_hook("device_checkpoint", pid, [&t, pid] {
      dev::checkpoint(pid);
      t.stepped = true;
      return true;
    }));
  });
  // Checkpointed even where stopping its restore thread failed after: the exit hook must give
  // that task its device state back.
  for (const auto& t : tasks)
    if (t.stepped) g.tracked[t.pid].checkpointed = true;
}

int checkpoint_devices(int pid) {
  if (!g.active) return -ENOTSUP;
  if (!g.together_tried && !g.serial) {
    g.together_tried = true;
    try {
      checkpoint_together();
    } catch (const std::exception& e) {
      // A restore thread that could not be found: each task's own hook says which.
      std::fprintf(stderr, "gpuckpt plugin: device checkpoints one by one: %s\n", e.what());
    }
  }
  if (auto d = g.done.find(pid); d != g.done.end()) return d->second;
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

// The first RESUME_DEVICES_LATE, called for the tree's root: the device restore and unlock of
// every CUDA task of the restored tree, together.
void restore_together(pid_t root) {
  std::vector<TaskStep> tasks;
  for (pid_t pid : gpuckpt::process::process_tree(root)) {
    try {
      if (const auto tid = cuda_task(pid)) tasks.push_back({pid, *tid, {}, false});
    } catch (const std::exception&) {
      // Its own RESUME_DEVICES_LATE says why (a task that cannot be restored fails there).
    }
  }
  if (tasks.size() < 2) return;
  for (const auto& t : tasks) note_cuda(t.pid);
  run_together(tasks, "device_restore", [](TaskStep& t) {
    const pid_t pid = t.pid;
    t.hooks.push_back(run_hook("device_restore", pid, [pid] {
      restore_device(pid);
      return true;
    }));
    if (!t.hooks.back().ok) return;
    t.hooks.push_back(run_hook("unlock", pid, [pid] {
      unlock_device(pid);
      return true;
    }));
  });
}

int resume_devices_late(int pid) {
  if (!g.active) return -ENOTSUP;
  if (!g.together_tried && !g.serial) {
    g.together_tried = true;
    try {
      restore_together(pid);
    } catch (const std::exception& e) {
      // The driver is unusable or a task vanished: each task's own hook says so.
      std::fprintf(stderr, "gpuckpt plugin: device restores one by one: %s\n", e.what());
    }
  }
  if (auto d = g.done.find(pid); d != g.done.end()) return d->second;
  // As CRIU's cuda plugin: the restore thread id, then let that thread run, then restore; the
  // state is asked only while it runs (the driver answers through it).
  std::optional<RunningRestoreThread> running;
  int rc = timed("device_restore", pid, [pid, &running] {
    const auto tid = cuda_task(pid);
    if (!tid) return false;
    note_cuda(pid);
    running.emplace(*tid);
    restore_device(pid);
    return true;
  });
  if (rc < 0 && rc != -ENOTSUP) return rc;  // `running` stops the thread again
  return timed("unlock", pid, [pid, &running] {
    if (!running) return false;
    unlock_device(pid);
    running->stop();
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
