// GPUs and the CUDA driver checkpoint API. The driver is loaded at run time, so every function
// here works (and says "no GPU") on machines without one. Driver requirements: docs/GPU.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpuckpt/timing.h"

namespace gpuckpt {

struct GpuInfo {
  int index = 0;           // CUDA device ordinal (as CUDA_VISIBLE_DEVICES leaves them)
  std::string name;        // e.g. "NVIDIA H200"
  std::string uuid;        // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (lower-case hex)
  std::string pci_bus_id;  // "0000:17:00.0", to match nvidia-smi
  std::uint64_t total_memory = 0;
  std::optional<std::uint64_t> used_memory;  // all processes, via NVML; unset without NVML
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
};

struct DriverStatus {
  bool loaded = false;                // libcuda.so.1 found and cuInit succeeded
  std::string error;                  // why not, when !loaded (human-readable)
  int driver_version = 0;             // cuDriverGetVersion, e.g. 13000 (= CUDA 13.0)
  std::string kernel_module_version;  // NVIDIA kernel module, e.g. "580.65.06"; "" if unknown
  std::string library;                // the driver library that was loaded (absolute path
                                      // once loaded, from dlinfo; else the name tried)
  bool checkpoint_api = false;        // cuCheckpointProcess* entry points present
  bool gpu_remap = false;        // restore onto other GPUs (gpuPairs): CUDA 13.0 driver (r580)+
  std::string checkpoint_error;  // why !checkpoint_api (or why !gpu_remap), when loaded
  // What loading cost this process (paid once per process: the driver is a singleton):
  // dlopen + entry points, and cuInit(0) alone, which dominates on GPU hosts.
  double load_seconds = 0;
  double cuinit_seconds = 0;
};

struct DeviceList {
  DriverStatus driver;
  std::vector<GpuInfo> gpus;
};

// Never throws for "no driver / no GPU": that is reported in DriverStatus (loaded == false).
// Throws Error(kDevice) only if a loaded driver fails to describe a device it reported.
DeviceList list_devices();

// "CUDA 13.0" for 13000.
std::string cuda_version_string(int driver_version);

// Restore-time GPU remapping: checkpointed GPU UUID -> GPU UUID to restore onto.
struct GpuMap {
  std::vector<std::pair<std::string, std::string>> pairs;
  bool empty() const { return pairs.empty(); }
  std::string to_string() const;  // "OLD=NEW,OLD=NEW", parseable by parse_gpu_map
};
// Parses "OLD=NEW[,OLD=NEW...]" where each side is a UUID or a device index ("0=1"). Indices
// are resolved against list_devices() (so they need the driver); UUIDs are only checked for
// syntax. An empty spec is an empty map (restore on the same GPUs). Throws Error(kUsage) on bad
// syntax, unknown indices, duplicates, and on pairs of two local GPUs of different chip types
// (cuCheckpointProcessRestore only restores onto the same chip type).
GpuMap parse_gpu_map(const std::string& spec);

// Checks a map against the GPUs recorded at dump time and the GPUs of this machine: every
// target exists here and has the chip type (name and compute capability) of its source, and
// every source was recorded. Throws Error(kUsage) with the offending pair.
void validate_gpu_map(const GpuMap& map, const std::vector<GpuInfo>& checkpointed_gpus);

// A GPU of a checkpoint, as the dump recorded it: what a restore checks its target against.
struct RecordedGpu {
  std::string uuid;
  std::string name;  // "" when the dump could not describe it (no NVML): not checked then
  int compute_major = 0, compute_minor = 0;
  std::uint64_t total_memory = 0;
  std::uint64_t process_memory = 0;  // VRAM the dumped tree held on it; 0 = unknown
};

// At dump time, through NVML (no CUDA context, no cuInit): the GPUs `uuids` with the VRAM the
// processes `pids` hold on each. A GPU NVML cannot describe keeps only its UUID.
std::vector<RecordedGpu> describe_checkpointed_gpus(const std::vector<std::string>& uuids,
                                                    const std::vector<pid_t>& pids);
// The VRAM the processes `pids` hold on all GPUs (NVML); 0 when unknown or none. A checkpoint
// moves it into their host memory, so a dump must stage it as well.
std::uint64_t gpu_memory_of(const std::vector<pid_t>& pids);

// Before anything is restored (cuda-checkpoint#44: a restore that runs out of GPU memory can
// leave the process checkpointed for good): every recorded GPU must be mapped (an empty map
// restores each in place), each target must be a GPU of this machine of the same chip type
// (name and compute capability) with at least the recorded process memory free. Uses NVML
// and, without it, list_devices(). Throws Error(kUsage) for a map or a machine that cannot
// take the checkpoint, Error(kDevice) when a target lacks the free memory.
void check_restore_targets(const std::vector<RecordedGpu>& recorded, const GpuMap& map);

// Direct access to the CUDA checkpoint API of one live process, for scripts and debugging
// (`gpuckpt cuda-checkpoint`); dump/restore use the same calls internally.
enum class CudaAction {
  kState,       // report only
  kLock,        // running -> locked: CUDA calls block, in-flight work completes
  kCheckpoint,  // locked -> checkpointed: VRAM copied to host memory, GPU released
  kRestore,     // checkpointed -> locked: VRAM back on the (optionally remapped) GPUs
  kUnlock,      // locked -> running
  kSuspend,     // lock + checkpoint
  kResume,      // restore + unlock
};
// Throws Error(kUsage) for an unknown name.
CudaAction parse_cuda_action(std::string_view name);
std::string_view to_string(CudaAction a);

struct CudaActionOptions {
  pid_t pid = 0;
  CudaAction action = CudaAction::kState;
  std::chrono::milliseconds lock_timeout{10000};  // 0 = wait indefinitely
  GpuMap gpu_map;                                 // for kRestore/kResume
};

// A process's state in the CUDA checkpoint API: running -lock-> locked -checkpoint->
// checkpointed -restore-> locked -unlock-> running.
enum class CudaProcState { kRunning, kLocked, kCheckpointed, kFailed };
std::string_view to_string(CudaProcState s);  // "running", "locked", "checkpointed", "failed"
// As above, and "none" for a process without a CUDA context.
std::string_view to_string(const std::optional<CudaProcState>& s);

struct CudaActionResult {
  pid_t pid = 0;
  // nullopt: the process has no CUDA context.
  std::optional<CudaProcState> state_before, state_after;
  pid_t restore_tid = 0;  // cuCheckpointProcessGetRestoreThreadId, 0 if none
  // Stages cuda_lock, cuda_checkpoint, cuda_restore, cuda_unlock. Checkpoint/restore stages
  // carry the VRAM moved, as NVML's used-memory delta (0 when NVML is unavailable).
  Timeline timeline;
  std::optional<std::uint64_t> gpu_memory_used_before, gpu_memory_used_after;  // all GPUs
};

// Throws Error(kNoDevice) without the checkpoint API, Error(kProcess) for a missing process or
// a wrong state, Error(kTimeout) when the lock times out, Error(kDevice) for driver failures.
CudaActionResult run_cuda_action(const CudaActionOptions& opts);

}  // namespace gpuckpt
