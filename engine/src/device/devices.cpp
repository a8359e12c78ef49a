// list_devices(): what `gpuckpt devices` shows and what dump records about the GPUs.
#include <string>

#include "device/cuda_driver.h"
#include "device/nvml.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"

namespace gpuckpt {

DeviceList list_devices() {
  using device::CudaDriver;
  const CudaDriver& d = CudaDriver::instance();
  DeviceList out;
  out.driver = d.status();
  if (!d.loaded()) return out;

  const auto& api = d.api();
  int count = 0;
  d.check(api.device_get_count(&count), "cuDeviceGetCount");
  for (int i = 0; i < count; ++i) {
    const std::string at = "(device " + std::to_string(i) + ")";
    CUdevice dev = 0;
    d.check(api.device_get(&dev, i), "cuDeviceGet" + at);
    GpuInfo g;
    g.index = i;
    char name[256] = {};
    d.check(api.device_get_name(name, sizeof name - 1, dev), "cuDeviceGetName" + at);
    g.name = name;
    CUuuid uuid{};
    d.check(api.device_get_uuid(&uuid, dev), "cuDeviceGetUuid" + at);
    g.uuid = device::format_gpu_uuid(reinterpret_cast<const unsigned char*>(uuid.bytes));
    char bus[32] = {};
    if (api.device_get_pci_bus_id(bus, sizeof bus - 1, dev) == CUDA_SUCCESS) g.pci_bus_id = bus;
    size_t total = 0;
    d.check(api.device_total_mem(&total, dev), "cuDeviceTotalMem" + at);
    g.total_memory = total;
    d.check(api.device_get_attribute(&g.compute_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                     dev),
            "cuDeviceGetAttribute" + at);
    d.check(api.device_get_attribute(&g.compute_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                     dev),
            "cuDeviceGetAttribute" + at);
    d.check(
        api.device_get_attribute(&g.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
        "cuDeviceGetAttribute" + at);
    if (auto m = device::nvml_memory_use(g.uuid)) g.used_memory = m->used;
    out.gpus.push_back(std::move(g));
  }
  if (count == 0) {
    // cuInit normally fails with CUDA_ERROR_NO_DEVICE first; keep the invariant anyway.
    out.driver.loaded = false;
    out.driver.error = "the CUDA driver reports no devices";
  }
  return out;
}

}  // namespace gpuckpt
