// GPUs and the CUDA driver checkpoint API. The driver is loaded at run time, so every function
// here works (and says "no GPU") on machines without one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpuckpt {

struct GpuInfo {
  int index = 0;
  std::string name;
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::uint64_t total_memory = 0;
  int compute_major = 0, compute_minor = 0;
};

struct DriverStatus {
  bool loaded = false;          // libcuda.so.1 found and cuInit succeeded
  std::string error;            // why not, when !loaded (human-readable)
  int driver_version = 0;       // cuDriverGetVersion, e.g. 13000
  bool checkpoint_api = false;  // cuCheckpointProcess* entry points present
};

struct DeviceList {
  DriverStatus driver;
  std::vector<GpuInfo> gpus;
};

// Never throws for "no driver / no GPU": that is reported in DriverStatus.
DeviceList list_devices();

// Restore-time GPU remapping: checkpointed GPU UUID -> GPU UUID to restore onto.
struct GpuMap {
  std::vector<std::pair<std::string, std::string>> pairs;
  bool empty() const { return pairs.empty(); }
};
// Parses "OLD=NEW[,OLD=NEW...]" where each side is a UUID or a device index ("0=1").
// Indices are resolved against list_devices(). Throws Error(kUsage) on bad syntax.
GpuMap parse_gpu_map(const std::string& spec);

}  // namespace gpuckpt
