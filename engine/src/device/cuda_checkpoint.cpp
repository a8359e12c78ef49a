#include "device/cuda_checkpoint.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda_driver.h"
#include "gpuckpt/error.h"

namespace gpuckpt::device {

namespace {

const CudaDriver& api_driver() {
  const CudaDriver& d = CudaDriver::instance();
  d.require_checkpoint_api();
  return d;
}

std::string pid_str(pid_t pid) {
  return std::to_string(pid);
}

// Throws Error(kProcess) unless `pid` is a live process (not a thread, not a zombie). The driver
// talks to the process through /proc/<pid>, which also exists for every thread id: passing a
// thread id would act on its whole process, so we refuse it.
void require_process(pid_t pid) {
  if (pid <= 0) throw Error(Errc::kProcess, "invalid process id " + pid_str(pid));
  if (::kill(pid, 0) != 0 && errno == ESRCH)
    throw Error(Errc::kProcess, "process " + pid_str(pid) + " does not exist");
  std::ifstream status("/proc/" + pid_str(pid) + "/status");
  std::string line;
  while (status && std::getline(status, line)) {
    if (line.rfind("State:", 0) == 0 && line.find('Z') != std::string::npos &&
        line.find("zombie") != std::string::npos)
      throw Error(Errc::kProcess, "process " + pid_str(pid) + " has exited (zombie)");
    if (line.rfind("Tgid:", 0) == 0) {
      const long tgid = std::strtol(line.c_str() + 5, nullptr, 10);
      if (tgid > 0 && tgid != pid)
        throw Error(Errc::kProcess, "pid " + pid_str(pid) + " is a thread of process " +
                                        std::to_string(tgid) + ": give the process id");
    }
  }
}

// A process that may still hold CUDA state: one that has ended (a zombie, or dead and not yet
// reaped) holds none, and the driver reports none for it.
bool process_exists(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;  // reaped meanwhile
  // The state follows the command name, which may itself hold ") ".
  const auto close = stat.rfind(") ");
  return close == std::string::npos || close + 2 >= stat.size() ||
         (stat[close + 2] != 'Z' && stat[close + 2] != 'X');
}

// Codes with which the driver says "this process has no CUDA state to act on".
bool means_no_cuda(CUresult r) {
  return r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_INVALID_VALUE ||
         r == CUDA_ERROR_NOT_FOUND;
}

std::optional<CudaProcState> from_cu(int s) {
  switch (s) {
    case CU_PROCESS_STATE_RUNNING:
      return CudaProcState::kRunning;
    case CU_PROCESS_STATE_LOCKED:
      return CudaProcState::kLocked;
    case CU_PROCESS_STATE_CHECKPOINTED:
      return CudaProcState::kCheckpointed;
    case CU_PROCESS_STATE_FAILED:
      return CudaProcState::kFailed;
    default:
      return std::nullopt;
  }
}

// The state as the driver reports it, without the pid checks; nullopt on any failure.
std::optional<CudaProcState> raw_state(const CudaDriver& d, pid_t pid) {
  int tid = 0;
  if (d.api().ckpt_get_restore_tid(pid, &tid) != CUDA_SUCCESS) return std::nullopt;
  CUprocessState s{};
  if (d.api().ckpt_get_state(pid, &s) != CUDA_SUCCESS) return std::nullopt;
  return from_cu(static_cast<int>(s));
}

// Turns a failed checkpoint call into the most useful error.
[[noreturn]] void fail(const CudaDriver& d, std::string_view op, pid_t pid, CUresult r,
                       std::string_view needs, const std::string& hint = {}) {
  if (!process_exists(pid))
    throw Error(Errc::kProcess, "CUDA " + std::string(op) + " of process " + pid_str(pid) +
                                    " failed: the process no longer exists");
  std::string msg =
      "CUDA " + std::string(op) + " of process " + pid_str(pid) + " failed: " + d.describe(r);
  const auto state = raw_state(d, pid);
  if (r == CUDA_ERROR_ILLEGAL_STATE) {
    msg += state ? std::string(": it is ") + std::string(to_string(*state)) + ", " +
                       std::string(op) + " needs " + std::string(needs)
                 : std::string(": the process is not in a state that allows it");
    throw Error(Errc::kProcess, msg);
  }
  if (means_no_cuda(r) && !state)
    throw Error(Errc::kProcess, "process " + pid_str(pid) +
                                    " has no CUDA context (not a CUDA process, or it has not "
                                    "initialised CUDA yet)");
  if (r == CUDA_ERROR_NOT_PERMITTED)
    msg += ": checkpointing another process needs its user or root";
  if (!hint.empty()) msg += ": " + hint;
  throw Error(Errc::kDevice, msg);
}

// Logs how long a driver call took (the timelines of callers have the authoritative numbers).
class CallTimer {
 public:
  CallTimer(std::string_view op, pid_t pid)
      : op_(op), pid_(pid), start_(std::chrono::steady_clock::now()) {}
  ~CallTimer() {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    spdlog::debug("cuCheckpointProcess{}({}) took {:.3f} s", op_, pid_, s);
  }

 private:
  std::string_view op_;
  pid_t pid_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

bool checkpoint_api_available(std::string* why) {
  const CudaDriver& d = CudaDriver::instance();
  if (d.checkpoint_api()) return true;
  if (why) *why = d.loaded() ? d.status().checkpoint_error : "no NVIDIA GPU: " + d.status().error;
  return false;
}

std::optional<CudaProcState> process_state(pid_t pid) {
  const CudaDriver& d = api_driver();
  require_process(pid);
  // Like CRIU's cuda plugin: a process without a restore thread has no CUDA state, whatever
  // code the driver gives for it. (GetState alone is not reliable for that: it has returned
  // garbage states for non-CUDA pids.)
  if (!find_restore_thread(pid)) return std::nullopt;
  CUprocessState s{};
  d.check(d.api().ckpt_get_state(pid, &s), "cuCheckpointProcessGetState(" + pid_str(pid) + ")");
  const auto state = from_cu(static_cast<int>(s));
  if (!state)
    throw Error(Errc::kDevice, "cuCheckpointProcessGetState(" + pid_str(pid) +
                                   ") returned an unknown state " +
                                   std::to_string(static_cast<int>(s)));
  return state;
}

void lock(pid_t pid, std::chrono::milliseconds timeout) {
  const CudaDriver& d = api_driver();
  require_process(pid);
  if (timeout.count() < 0) throw Error(Errc::kUsage, "negative CUDA lock timeout");
  CUcheckpointLockArgs args;
  std::memset(&args, 0, sizeof args);  // reserved fields must be zero
  args.timeoutMs = timeout.count() > UINT_MAX ? UINT_MAX : static_cast<unsigned>(timeout.count());
  CUresult r;
  {
    CallTimer t("Lock", pid);
    r = d.api().ckpt_lock(pid, &args);
  }
  if (r == CUDA_SUCCESS) return;
  if (r == CUDA_ERROR_NOT_READY || r == CUDA_ERROR_TIMEOUT) {
    if (!process_exists(pid))
      throw Error(Errc::kProcess, "process " + pid_str(pid) + " exited while being locked");
    throw Error(Errc::kTimeout,
                "could not lock CUDA process " + pid_str(pid) + " within " +
                    std::to_string(timeout.count()) +
                    " ms: its submitted GPU work did not finish (it keeps running; retry with "
                    "a longer lock timeout)");
  }
  fail(d, "lock", pid, r, "running");
}

void checkpoint(pid_t pid) {
  const CudaDriver& d = api_driver();
  require_process(pid);
  CUcheckpointCheckpointArgs args;
  std::memset(&args, 0, sizeof args);
  CUresult r;
  {
    CallTimer t("Checkpoint", pid);
    r = d.api().ckpt_checkpoint(pid, &args);
  }
  if (r != CUDA_SUCCESS)
    fail(d, "checkpoint", pid, r, "locked",
         r == CUDA_ERROR_NOT_SUPPORTED
             ? "the process uses something the driver cannot checkpoint (UVM/managed or IPC "
               "memory?)"
             : std::string{});
}

void restore(pid_t pid, const GpuMap& map) {
  const CudaDriver& d = map.empty() ? api_driver() : CudaDriver::instance();
  if (!map.empty()) d.require_gpu_remap();
  require_process(pid);

  std::vector<CUcheckpointGpuPair> pairs;
  if (!map.empty()) {
    const std::vector<std::string> local = d.gpu_uuids();
    for (const auto& [from, to] : map.pairs) {
      CUcheckpointGpuPair p;
      std::memset(&p, 0, sizeof p);
      if (!parse_gpu_uuid(from, reinterpret_cast<unsigned char*>(p.oldUuid.bytes)) ||
          !parse_gpu_uuid(to, reinterpret_cast<unsigned char*>(p.newUuid.bytes)))
        throw Error(Errc::kUsage, "GPU map pair " + from + "=" + to +
                                      " is not a UUID pair (resolve indices with parse_gpu_map)");
      const std::string canonical =
          format_gpu_uuid(reinterpret_cast<const unsigned char*>(p.newUuid.bytes));
      if (std::find(local.begin(), local.end(), canonical) == local.end())
        throw Error(Errc::kUsage, "cannot restore onto " + to + ": no such GPU on this machine");
      pairs.push_back(p);
    }
  }
  CUcheckpointRestoreArgs args;
  std::memset(&args, 0, sizeof args);
  if (!pairs.empty()) {
    args.gpuPairs = pairs.data();
    args.gpuPairsCount = static_cast<unsigned>(pairs.size());
  }
  CUresult r;
  {
    CallTimer t("Restore", pid);
    r = d.api().ckpt_restore(pid, &args);
  }
  if (r == CUDA_SUCCESS) return;
  std::string hint;
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    hint =
        "not enough free memory on the target GPU (the process stays checkpointed; the "
        "driver may refuse later retries, see docs/GPU.md)";
  else if (r == CUDA_ERROR_INVALID_VALUE && !map.empty())
    hint =
        "the GPU map must name every GPU the process used, onto GPUs of the same chip "
        "type, with no GPU hidden by CUDA_VISIBLE_DEVICES";
  fail(d, "restore", pid, r, "checkpointed", hint);
}

void unlock(pid_t pid) {
  const CudaDriver& d = api_driver();
  require_process(pid);
  CUcheckpointUnlockArgs args;
  std::memset(&args, 0, sizeof args);
  CUresult r;
  {
    CallTimer t("Unlock", pid);
    r = d.api().ckpt_unlock(pid, &args);
  }
  if (r != CUDA_SUCCESS) fail(d, "unlock", pid, r, "locked");
}

bool holds_device_files(pid_t pid, std::string_view prefix) {
  if (pid <= 0) return false;
  const std::string proc = "/proc/" + pid_str(pid);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    std::error_code ec2;
    const std::string target = std::filesystem::read_symlink(e.path(), ec2).string();
    if (!ec2 && target.compare(0, prefix.size(), prefix) == 0) return true;
  }
  // Mappings outlive closed descriptors (and fds may be unreadable where maps are not).
  std::ifstream maps(proc + "/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash != std::string::npos && line.compare(slash, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

std::vector<pid_t> lock_before_kill(const std::vector<pid_t>& pids,
                                    std::chrono::milliseconds budget, std::vector<pid_t>* holders) {
  std::vector<pid_t> gpu, locked;
  for (pid_t p : pids)
    if (holds_device_files(p)) gpu.push_back(p);
  if (holders) *holders = gpu;
  if (gpu.empty()) return locked;
  try {
    std::string why;
    if (!checkpoint_api_available(&why)) {
      spdlog::debug("cannot lock CUDA processes before killing them: {}", why);
      return locked;
    }
    const auto deadline = std::chrono::steady_clock::now() + budget;
    for (pid_t p : gpu) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        spdlog::warn("no time left to lock CUDA process {} before killing it", p);
        break;
      }
      try {
        const auto st = process_state(p);
        if (!st || *st != CudaProcState::kRunning) continue;  // locked/checkpointed: safe
        // A timeout of 0 would wait indefinitely.
        lock(p, std::max(std::min(left, std::chrono::milliseconds(5000)),
                         std::chrono::milliseconds(1)));
        locked.push_back(p);
      } catch (const std::exception& e) {
        spdlog::warn("could not lock CUDA process {} before killing it: {}", p, e.what());
      }
    }
  } catch (const std::exception& e) {
    spdlog::warn("could not lock CUDA processes before killing them: {}", e.what());
  }
  return locked;
}

pid_t restore_thread_id(pid_t pid) {
  const CudaDriver& d = api_driver();
  require_process(pid);
  int tid = 0;
  const CUresult r = d.api().ckpt_get_restore_tid(pid, &tid);
  if (r != CUDA_SUCCESS) fail(d, "restore thread query", pid, r, "a CUDA context");
  return static_cast<pid_t>(tid);
}

std::optional<pid_t> find_restore_thread(pid_t pid) {
  const CudaDriver& d = api_driver();
  require_process(pid);
  int tid = 0;
  if (const CUresult r = d.api().ckpt_get_restore_tid(pid, &tid); r != CUDA_SUCCESS) {
    if (!process_exists(pid))
      throw Error(Errc::kProcess, "process " + pid_str(pid) + " does not exist");
    if (!means_no_cuda(r))
      spdlog::debug("cuCheckpointProcessGetRestoreThreadId({}): {}: taken as no CUDA state", pid,
                    d.describe(r));
    return std::nullopt;
  }
  return static_cast<pid_t>(tid);
}

// ---- ProcessLock ------------------------------------------------------------------------

ProcessLock::ProcessLock(pid_t pid, std::chrono::milliseconds timeout) : pid_(pid) {
  device::lock(pid, timeout);
  state_ = CudaProcState::kLocked;
  owned_ = true;
}

ProcessLock::ProcessLock(ProcessLock&& o) noexcept
    : pid_(o.pid_), state_(o.state_), owned_(std::exchange(o.owned_, false)) {
  o.state_ = CudaProcState::kRunning;
}

void ProcessLock::checkpoint() {
  if (!owned_ || state_ != CudaProcState::kLocked)
    throw Error(Errc::kInternal, "ProcessLock::checkpoint needs a locked process");
  device::checkpoint(pid_);
  state_ = CudaProcState::kCheckpointed;
}

void ProcessLock::restore(const GpuMap& map) {
  if (!owned_ || state_ != CudaProcState::kCheckpointed)
    throw Error(Errc::kInternal, "ProcessLock::restore needs a checkpointed process");
  device::restore(pid_, map);
  state_ = CudaProcState::kLocked;
}

void ProcessLock::unlock() {
  if (!owned_) return;
  if (state_ == CudaProcState::kCheckpointed) restore();
  device::unlock(pid_);
  state_ = CudaProcState::kRunning;
  owned_ = false;
}

void ProcessLock::release() noexcept {
  owned_ = false;
  state_ = CudaProcState::kRunning;
}

Returned return_to_running(pid_t pid) {
  if (!process_exists(pid)) return Returned::kNothing;
  const auto s = process_state(pid);
  if (!s) return Returned::kNothing;
  switch (*s) {
    case CudaProcState::kRunning:
      return Returned::kNothing;
    case CudaProcState::kFailed:
      throw Error(Errc::kDevice, "CUDA process " + std::to_string(pid) +
                                     " is in the failed state: its GPU state is lost");
    case CudaProcState::kCheckpointed:
      restore(pid, GpuMap{});
      unlock(pid);
      return Returned::kRestoredAndUnlocked;
    case CudaProcState::kLocked:
      unlock(pid);
      return Returned::kUnlocked;
  }
  return Returned::kNothing;
}

ProcessLock::~ProcessLock() {
  if (!owned_) return;
  try {
    // Asks the driver rather than trusting state_: a call that failed midway may have moved it.
    switch (return_to_running(pid_)) {
      case Returned::kRestoredAndUnlocked:
        spdlog::warn("restored the CUDA state of process {} and unlocked it after an error", pid_);
        break;
      case Returned::kUnlocked:
        spdlog::warn("unlocked CUDA process {} after an error", pid_);
        break;
      case Returned::kNothing:
        break;
    }
  } catch (const std::exception& e) {
    spdlog::error(
        "could not return CUDA process {} to running: {} (it may stay frozen; try `gpuckpt "
        "cuda-checkpoint --pid {} --action resume`)",
        pid_, e.what(), pid_);
  }
}

}  // namespace gpuckpt::device

namespace gpuckpt {

std::string_view to_string(CudaProcState s) {
  switch (s) {
    case CudaProcState::kRunning:
      return "running";
    case CudaProcState::kLocked:
      return "locked";
    case CudaProcState::kCheckpointed:
      return "checkpointed";
    case CudaProcState::kFailed:
      return "failed";
  }
  return "unknown";
}

std::string_view to_string(const std::optional<CudaProcState>& s) {
  return s ? to_string(*s) : "none";
}

}  // namespace gpuckpt
