// GPU remapping for restore: parsing "OLD=NEW,..." and checking pairs against the GPUs of the
// checkpoint and of this machine. The public functions (gpuckpt/device.h) call these with
// list_devices(); tests call them with made-up device lists.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpuckpt/device.h"

namespace gpuckpt::device {

// `local` is called at most once, only when the spec needs the devices of this machine.
GpuMap parse_gpu_map(const std::string& spec, const std::function<DeviceList()>& local);

void validate_gpu_map(const GpuMap& map, const std::vector<GpuInfo>& checkpointed,
                      const std::vector<GpuInfo>& local);

// cuCheckpointProcessRestore restores only onto the same chip type. The driver API exposes no
// chip id, so we compare what it does expose: the marketing name and the compute capability
// (conservative: two boards of one chip with different names are refused).
bool same_chip_type(const GpuInfo& a, const GpuInfo& b);

// A GPU of this machine for check_restore_targets(); free_memory unset when unknown.
struct LocalGpu {
  GpuInfo info;
  std::optional<std::uint64_t> free_memory;
};
// check_restore_targets() against a given machine (tests pass made-up ones).
void check_restore_targets(const std::vector<RecordedGpu>& recorded, const GpuMap& map,
                           const std::vector<LocalGpu>& local);
std::string describe_gpu(const GpuInfo& g);  // "GPU 0 (NVIDIA H200, sm_90, GPU-...)"

}  // namespace gpuckpt::device
