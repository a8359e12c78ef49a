// NVML (libnvidia-ml.so.1), loaded at run time: GPU memory use without creating a CUDA context
// in our own process (a context would itself take hundreds of MiB on the GPU we measure).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gpuckpt::device {

struct GpuMemoryUse {
  std::uint64_t total = 0;
  std::uint64_t free = 0;
  std::uint64_t used = 0;
};

// Memory use of the GPU with this UUID ("GPU-..."); nullopt when NVML or the GPU is
// unavailable (this is a measurement aid, never a reason to fail).
std::optional<GpuMemoryUse> nvml_memory_use(const std::string& uuid);

// A GPU as NVML describes it, without a CUDA context or cuInit.
struct NvmlGpu {
  std::string uuid;  // "GPU-..." (lower case, as gpuckpt writes UUIDs)
  std::string name;  // "NVIDIA H200", the same string as cuDeviceGetName
  int compute_major = 0, compute_minor = 0;
  GpuMemoryUse memory;
};
// Every GPU NVML sees; empty when NVML is unavailable.
std::vector<NvmlGpu> nvml_gpus();

// VRAM the processes `pids` hold, per GPU UUID (compute processes, as NVML accounts them);
// nullopt when NVML is unavailable or cannot tell (e.g. no permission to see the processes).
std::optional<std::map<std::string, std::uint64_t>> nvml_process_memory(
    const std::vector<pid_t>& pids);

}  // namespace gpuckpt::device
