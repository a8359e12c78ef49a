#include "device/nvml.h"

#include <spdlog/spdlog.h>

#include <algorithm>
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
// nvmlProcessInfo_t, as nvmlDeviceGetComputeRunningProcesses_v3 (and _v2) fill it.
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;  // NVML_VALUE_NOT_AVAILABLE (~0ull) when unknown
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr NvmlReturn kNvmlInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE

std::string lower(std::string s) {
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return s;
}

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

  std::vector<NvmlGpu> gpus() {
    std::vector<NvmlGpu> out;
    if (!ok_ || !count_ || !by_index_ || !uuid_) return out;
    std::lock_guard lock(mu_);
    unsigned n = 0;
    if (count_(&n) != 0) return out;
    for (unsigned i = 0; i < n; ++i) {
      NvmlDevice dev = nullptr;
      if (by_index_(i, &dev) != 0 || !dev) continue;
      NvmlGpu g;
      char buf[96] = {};
      if (uuid_(dev, buf, sizeof buf - 1) != 0) continue;
      g.uuid = lower(buf);
      char name[96] = {};
      if (name_ && name_(dev, name, sizeof name - 1) == 0) g.name = name;
      if (cc_) cc_(dev, &g.compute_major, &g.compute_minor);
      NvmlMemory m{};
      if (memory_info_(dev, &m) == 0) g.memory = GpuMemoryUse{m.total, m.free, m.used};
      out.push_back(std::move(g));
    }
    return out;
  }

  std::optional<std::map<std::string, std::uint64_t>> process_memory(
      const std::vector<pid_t>& pids) {
    if (!ok_ || !count_ || !by_index_ || !uuid_ || !procs_) return std::nullopt;
    std::lock_guard lock(mu_);
    unsigned n = 0;
    if (count_(&n) != 0) return std::nullopt;
    std::map<std::string, std::uint64_t> out;
    for (unsigned i = 0; i < n; ++i) {
      NvmlDevice dev = nullptr;
      char buf[96] = {};
      if (by_index_(i, &dev) != 0 || !dev || uuid_(dev, buf, sizeof buf - 1) != 0) continue;
      std::vector<NvmlProcessInfo> infos(16);
      unsigned count = 0;
      NvmlReturn r = 0;
      for (int attempt = 0; attempt < 4; ++attempt) {  // the list can grow between calls
        count = static_cast<unsigned>(infos.size());
        r = procs_(dev, &count, infos.data());
        if (r != kNvmlInsufficientSize) break;
        infos.resize(count + 16);
      }
      if (r != 0) return std::nullopt;
      for (unsigned k = 0; k < count && k < infos.size(); ++k) {
        const auto& p = infos[k];
        if (std::find(pids.begin(), pids.end(), static_cast<pid_t>(p.pid)) == pids.end()) continue;
        if (p.used_gpu_memory == ~0ull) return std::nullopt;  // not available to us
        out[lower(buf)] += p.used_gpu_memory;
      }
    }
    return out;
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
    // Optional ones: without them only nvml_memory_use() works.
    count_ = reinterpret_cast<NvmlReturn (*)(unsigned*)>(lib_.symbol("nvmlDeviceGetCount_v2"));
    by_index_ = reinterpret_cast<NvmlReturn (*)(unsigned, NvmlDevice*)>(
        lib_.symbol("nvmlDeviceGetHandleByIndex_v2"));
    uuid_ = reinterpret_cast<NvmlReturn (*)(NvmlDevice, char*, unsigned)>(
        lib_.symbol("nvmlDeviceGetUUID"));
    name_ = reinterpret_cast<NvmlReturn (*)(NvmlDevice, char*, unsigned)>(
        lib_.symbol("nvmlDeviceGetName"));
    cc_ = reinterpret_cast<NvmlReturn (*)(NvmlDevice, int*, int*)>(
        lib_.symbol("nvmlDeviceGetCudaComputeCapability"));
    procs_ = reinterpret_cast<NvmlReturn (*)(NvmlDevice, unsigned*, NvmlProcessInfo*)>(
        lib_.symbol("nvmlDeviceGetComputeRunningProcesses_v3"));
    if (!procs_)  // r470..r510: same layout under _v2
      procs_ = reinterpret_cast<NvmlReturn (*)(NvmlDevice, unsigned*, NvmlProcessInfo*)>(
          lib_.symbol("nvmlDeviceGetComputeRunningProcesses_v2"));
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
  NvmlReturn (*count_)(unsigned*) = nullptr;
  NvmlReturn (*by_index_)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*uuid_)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*name_)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*cc_)(NvmlDevice, int*, int*) = nullptr;
  NvmlReturn (*procs_)(NvmlDevice, unsigned*, NvmlProcessInfo*) = nullptr;
  bool ok_ = false;
  std::mutex mu_;
};

}  // namespace

std::optional<GpuMemoryUse> nvml_memory_use(const std::string& uuid) {
  return Nvml::instance().memory_use(uuid);
}

std::vector<NvmlGpu> nvml_gpus() {
  return Nvml::instance().gpus();
}

std::optional<std::map<std::string, std::uint64_t>> nvml_process_memory(
    const std::vector<pid_t>& pids) {
  return Nvml::instance().process_memory(pids);
}

}  // namespace gpuckpt::device
