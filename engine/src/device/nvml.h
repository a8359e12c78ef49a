// NVML (libnvidia-ml.so.1), loaded at run time: GPU memory use without creating a CUDA context
// in our own process (a context would itself take hundreds of MiB on the GPU we measure).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace gpuckpt::device {

struct GpuMemoryUse {
  std::uint64_t total = 0;
  std::uint64_t free = 0;
  std::uint64_t used = 0;
};

// Memory use of the GPU with this UUID ("GPU-..."); nullopt when NVML or the GPU is
// unavailable (this is a measurement aid, never a reason to fail).
std::optional<GpuMemoryUse> nvml_memory_use(const std::string& uuid);

}  // namespace gpuckpt::device
