#include "device/nvml.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>

#include "device/cuda_driver.h"

namespace gpuckpt::device {

namespace {

// The few NVML declarations we use; NVML keeps these ABIs stable (nvml.h is not part of the
// CUDA toolkit we build with).
using NvmlReturn = int;  // nvmlReturn_t, NVML_SUCCESS == 0
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlMemory {  // nvmlMemory_t (v1)
  unsigned long long total, free, used;
};

class Nvml {
 public:
  static Nvml& instance() {
    static Nvml* n = new Nvml();  // never unloaded, like libcuda
    return *n;
  }

  std::optional<GpuMemoryUse> memory_use(const std::string& uuid) {
    if (!ok_) return std::nullopt;
    std::lock_guard lock(mu_);  // NVML is thread-safe, but keep our calls simple to reason about
    NvmlDevice dev = nullptr;
    if (by_uuid_(uuid.c_str(), &dev) != 0 || !dev) return std::nullopt;
    NvmlMemory m{};
    if (memory_info_(dev, &m) != 0) return std::nullopt;
    return GpuMemoryUse{m.total, m.free, m.used};
  }

 private:
  Nvml() {
    std::string err;
    lib_ = DlLibrary::open("libnvidia-ml.so.1", &err);
    if (!lib_) {
      spdlog::debug("NVML unavailable: {}", err);
      return;
    }
    init_ = reinterpret_cast<NvmlReturn (*)()>(lib_.symbol("nvmlInit_v2"));
    by_uuid_ = reinterpret_cast<NvmlReturn (*)(const char*, NvmlDevice*)>(
        lib_.symbol("nvmlDeviceGetHandleByUUID"));
    memory_info_ = reinterpret_cast<NvmlReturn (*)(NvmlDevice, NvmlMemory*)>(
        lib_.symbol("nvmlDeviceGetMemoryInfo"));
    if (!init_ || !by_uuid_ || !memory_info_) {
      spdlog::debug("NVML lacks the entry points we use");
      return;
    }
    if (const NvmlReturn r = init_(); r != 0) {
      spdlog::debug("nvmlInit_v2 failed: NVML error {}", r);
      return;
    }
    ok_ = true;
  }

  DlLibrary lib_;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*by_uuid_)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*memory_info_)(NvmlDevice, NvmlMemory*) = nullptr;
  bool ok_ = false;
  std::mutex mu_;
};

}  // namespace

std::optional<GpuMemoryUse> nvml_memory_use(const std::string& uuid) {
  return Nvml::instance().memory_use(uuid);
}

}  // namespace gpuckpt::device
