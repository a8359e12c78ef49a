// run_cuda_action(): one checkpoint-API step (or lock+checkpoint, restore+unlock) on a live
// process, timed, with the VRAM it moved measured by NVML.
#include <optional>

#include "device/cuda_checkpoint.h"
#include "device/cuda_driver.h"
#include "device/nvml.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "gpuckpt/names.h"

namespace gpuckpt {

namespace {

std::optional<std::uint64_t> vram_used(const DeviceList& devices) {
  if (devices.gpus.empty()) return std::nullopt;
  std::uint64_t sum = 0;
  for (const auto& g : devices.gpus) {
    auto m = device::nvml_memory_use(g.uuid);
    if (!m) return std::nullopt;
    sum += m->used;
  }
  return sum;
}

std::uint64_t delta(std::optional<std::uint64_t> a, std::optional<std::uint64_t> b) {
  if (!a || !b) return 0;
  return *a > *b ? *a - *b : *b - *a;
}

}  // namespace

CudaAction parse_cuda_action(std::string_view name) {
  for (CudaAction a :
       {CudaAction::kState, CudaAction::kLock, CudaAction::kCheckpoint, CudaAction::kRestore,
        CudaAction::kUnlock, CudaAction::kSuspend, CudaAction::kResume})
    if (to_string(a) == name) return a;
  throw Error(Errc::kUsage, "unknown CUDA action '" + std::string(name) +
                                "': expected state, lock, checkpoint, restore, unlock, suspend "
                                "or resume");
}

std::string_view to_string(CudaAction a) {
  switch (a) {
    case CudaAction::kState:
      return "state";
    case CudaAction::kLock:
      return "lock";
    case CudaAction::kCheckpoint:
      return "checkpoint";
    case CudaAction::kRestore:
      return "restore";
    case CudaAction::kUnlock:
      return "unlock";
    case CudaAction::kSuspend:
      return "suspend";
    case CudaAction::kResume:
      return "resume";
  }
  return "unknown";
}

CudaActionResult run_cuda_action(const CudaActionOptions& o) {
  CudaActionResult r;  // its timeline starts before the driver loads, to show that as a stage
  const device::CudaDriver& d = device::CudaDriver::instance();
  // Each step in its own gpuckpt process pays cuInit once: shown as "cuda_init" when it was
  // paid by this call (not when the process had loaded the driver before).
  if (d.load_start() >= r.timeline.origin())
    r.timeline.add(stage::kCudaInit, d.load_start(), d.load_end());
  d.require_checkpoint_api();
  r.pid = o.pid;
  r.state_before = device::process_state(o.pid);
  if (!r.state_before && o.action != CudaAction::kState)
    throw Error(Errc::kProcess, "process " + std::to_string(o.pid) +
                                    " has no CUDA context (not a CUDA process, or it has not "
                                    "initialised CUDA yet)");
  if (r.state_before) r.restore_tid = device::restore_thread_id(o.pid);

  const DeviceList devices = list_devices();
  r.gpu_memory_used_before = vram_used(devices);

  const bool do_lock = o.action == CudaAction::kLock || o.action == CudaAction::kSuspend;
  const bool do_ckpt = o.action == CudaAction::kCheckpoint || o.action == CudaAction::kSuspend;
  const bool do_restore = o.action == CudaAction::kRestore || o.action == CudaAction::kResume;
  const bool do_unlock = o.action == CudaAction::kUnlock || o.action == CudaAction::kResume;

  std::optional<std::uint64_t> used = r.gpu_memory_used_before;
  if (do_lock) {
    auto s = r.timeline.scope(stage::kCudaLock);
    device::lock(o.pid, o.lock_timeout);
  }
  if (do_ckpt) {
    try {
      auto s = r.timeline.scope(stage::kCudaCheckpoint);
      device::checkpoint(o.pid);
      const auto after = vram_used(devices);
      s.set_bytes(delta(used, after));
      used = after;
    } catch (...) {
      // suspend must not leave a process locked because the checkpoint failed
      if (do_lock) {
        try {
          device::unlock(o.pid);
        } catch (...) {
        }
      }
      throw;
    }
  }
  if (do_restore) {
    auto s = r.timeline.scope(stage::kCudaRestore);
    device::restore(o.pid, o.gpu_map);
    const auto after = vram_used(devices);
    s.set_bytes(delta(used, after));
    used = after;
  }
  if (do_unlock) {
    auto s = r.timeline.scope(stage::kCudaUnlock);
    device::unlock(o.pid);
  }
  r.gpu_memory_used_after = vram_used(devices);
  r.state_after = device::process_state(o.pid);
  return r;
}

}  // namespace gpuckpt
