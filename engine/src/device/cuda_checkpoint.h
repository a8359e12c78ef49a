// The CUDA driver checkpoint API (cuCheckpointProcess*) on another process, with errors that
// say what to do. States: running -lock-> locked -checkpoint-> checkpointed -restore-> locked
// -unlock-> running. Used by dump/restore, the CRIU plugin and `gpuckpt cuda-checkpoint`.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string_view>
#include <vector>

#include "gpuckpt/device.h"

namespace gpuckpt::device {

using gpuckpt::CudaProcState;  // public (gpuckpt/device.h): cuda-checkpoint reports it

// Whether the driver with the checkpoint API is usable here; if not, *why says why (no driver,
// no GPU, too old).
bool checkpoint_api_available(std::string* why = nullptr);

// nullopt: `pid` is not a CUDA process (no CUDA context). Throws Error(kNoDevice) if the API is
// unavailable, Error(kProcess) if pid does not exist (or names a thread, not a process).
// "Not a CUDA process" is CRIU's cuda plugin's test: any failure of
// cuCheckpointProcessGetRestoreThreadId on a live pid (the driver's codes for "no CUDA here"
// vary with its version; a stricter test would fail every dump of a non-CUDA process).
std::optional<CudaProcState> process_state(pid_t pid);

// Whether `pid` has a device file under `prefix` open (/proc/PID/fd) or mapped
// (/proc/PID/maps): a process with CUDA state holds /dev/nvidiactl, /dev/nvidiaN, ...
// False for a missing pid. The prefix is a parameter for tests.
bool holds_device_files(pid_t pid, std::string_view prefix = "/dev/nvidia");

// running -> locked. Further CUDA calls of the process block; submitted work completes.
// Error(kTimeout) when the lock is not obtained within `timeout` (the process keeps running);
// a zero timeout waits indefinitely.
void lock(pid_t pid, std::chrono::milliseconds timeout);
// locked -> checkpointed: VRAM -> host memory of the process; its GPU memory is released.
void checkpoint(pid_t pid);
// checkpointed -> locked, on the same GPUs (empty map) or remapped ones (UUID pairs; needs the
// CUDA 13.0 driver, every checkpointed GPU listed, targets of the same chip type).
void restore(pid_t pid, const GpuMap& map);
// locked -> running.
void unlock(pid_t pid);
// cuCheckpointProcessGetRestoreThreadId: the thread the driver uses to restore `pid` (CRIU
// must let it run while the rest of the process is frozen).
pid_t restore_thread_id(pid_t pid);
// The same, with CRIU's reading: nullopt (no CUDA state) on any failure for a live pid.
// Throws Error(kNoDevice) without the API, Error(kProcess) if the pid does not exist.
std::optional<pid_t> find_restore_thread(pid_t pid);

// Best effort, before SIGKILLing processes that may be live CUDA processes (restored ones in
// particular): killing a running CUDA process right after a restore has crashed hosts on some
// drivers (NVIDIA/cuda-checkpoint#53), a locked one is safe. Locks each pid of `pids` that
// holds /dev/nvidia* and is `running`, within `budget` in all; never throws, and touches the
// driver only when some pid holds a GPU. Returns the pids it locked; `holders`, if given, gets
// every pid that holds /dev/nvidia* (locked or not), so that a caller need not read /proc again.
std::vector<pid_t> lock_before_kill(const std::vector<pid_t>& pids,
                                    std::chrono::milliseconds budget = std::chrono::seconds(10),
                                    std::vector<pid_t>* holders = nullptr);

// What return_to_running did.
enum class Returned { kNothing, kUnlocked, kRestoredAndUnlocked };

// Brings a process the caller itself locked back to running CUDA (it would undo anyone's lock),
// from whatever state the driver reports now, since a step cut short may have moved it:
// checkpointed -> restore (same GPUs) -> unlock, locked -> unlock. Nothing for a running
// process, a missing one (e.g. CRIU killed it after a dump) or one without CUDA state. The process
// must not be held stopped by a tracer: the driver does the work in its restore thread. Throws
// Error(kDevice) for the failed state (its GPU state is lost) and the driver's errors,
// Error(kNoDevice) without the API.
Returned return_to_running(pid_t pid);

// RAII: locks in the constructor; the destructor unlocks if still locked (e.g. a dump failed
// midway), restoring first if it was checkpointed, so an error never leaves a process frozen on
// the GPU. Call unlock() on success, or release() when nothing must be undone (the process was
// dumped and killed, or it is meant to stay checkpointed).
class ProcessLock {
 public:
  ProcessLock(pid_t pid, std::chrono::milliseconds timeout);
  ProcessLock(ProcessLock&& o) noexcept;
  ProcessLock& operator=(ProcessLock&&) = delete;
  ProcessLock(const ProcessLock&) = delete;
  ProcessLock& operator=(const ProcessLock&) = delete;
  ~ProcessLock();

  pid_t pid() const { return pid_; }
  // What this lock last put the process in: kLocked, kCheckpointed, or kRunning once unlocked
  // or released.
  CudaProcState state() const { return state_; }

  void checkpoint();                     // locked -> checkpointed
  void restore(const GpuMap& map = {});  // checkpointed -> locked
  void unlock();                         // -> running (restores first if checkpointed)
  void release() noexcept;               // forget the process: the destructor does nothing

 private:
  pid_t pid_ = 0;
  CudaProcState state_ = CudaProcState::kRunning;
  bool owned_ = false;
};

}  // namespace gpuckpt::device
