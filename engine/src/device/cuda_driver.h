// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1"): one gpuckpt binary runs
// on machines with and without a GPU, and never depends on the toolkit's link stub. Entry
// points are resolved with cuGetProcAddress at the ABI version our cuda.h declares, so
// versioned symbols (cuDeviceTotalMem_v2, cuDeviceGetUuid_v2, ...) match their prototypes.
// This file and cuda_checkpoint.cpp depend on nothing else of the engine but error.cpp: the
// CRIU plugin compiles them in (criu_plugin/CMakeLists.txt).
#pragma once

#include <cuda.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/device.h"

namespace gpuckpt::device {

// Owns a dlopen() handle.
class DlLibrary {
 public:
  DlLibrary() = default;
  explicit DlLibrary(void* handle) noexcept : handle_(handle) {}
  DlLibrary(DlLibrary&& o) noexcept;
  DlLibrary& operator=(DlLibrary&& o) noexcept;
  DlLibrary(const DlLibrary&) = delete;
  DlLibrary& operator=(const DlLibrary&) = delete;
  ~DlLibrary();

  // Opens `name` with RTLD_NOW|RTLD_LOCAL; on failure returns an empty object and sets *error.
  static DlLibrary open(const std::string& name, std::string* error);
  void* symbol(const char* name) const;  // nullptr if absent
  // The absolute path the loader resolved the library to (dlinfo), "" if unknown.
  std::string path() const;
  explicit operator bool() const noexcept { return handle_ != nullptr; }

 private:
  void* handle_ = nullptr;
};

class CudaDriver {
 public:
  // The process-wide driver, loaded and cuInit()ed on first use (thread-safe). Never throws:
  // failures are recorded in status(). Libraries tried, first that opens wins (see
  // driver_candidates()): $GPUCKPT_LIBCUDA (an override, tests use the stub), then
  // $GPUCKPT_LIBCUDA_PATH (criu::kEnvLibcuda: the path gpuckpt loaded, handed to criu so the
  // plugin loads the same driver), then "libcuda.so.1".
  static const CudaDriver& instance();
  // Whether instance() has been constructed (without constructing it).
  static bool instantiated();
  // When the driver was loaded (steady clock): for callers that time the load as a stage.
  std::chrono::steady_clock::time_point load_start() const { return load_start_; }
  std::chrono::steady_clock::time_point load_end() const { return load_end_; }

  const DriverStatus& status() const { return status_; }
  bool loaded() const { return status_.loaded; }
  bool checkpoint_api() const { return status_.checkpoint_api; }
  bool gpu_remap() const { return status_.gpu_remap; }

  // Throw Error(kNoDevice) with the reason ("no NVIDIA GPU: ...") when unusable.
  void require_loaded() const;
  void require_checkpoint_api() const;
  void require_gpu_remap() const;

  // "CUDA_ERROR_INVALID_VALUE (invalid argument)"; works before/without cuInit.
  std::string describe(CUresult r) const;
  // Throws Error(kDevice, "<what>: <describe(r)>") unless r == CUDA_SUCCESS.
  void check(CUresult r, std::string_view what) const;

  // UUIDs of the visible GPUs, in device order ("GPU-..."). Requires loaded().
  std::vector<std::string> gpu_uuids() const;

  // Entry points. All non-null when loaded(); the checkpoint ones when checkpoint_api().
  struct Api {
    decltype(&::cuGetErrorName) get_error_name = nullptr;
    decltype(&::cuGetErrorString) get_error_string = nullptr;
    decltype(&::cuInit) init = nullptr;
    decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
    decltype(&::cuDeviceGetCount) device_get_count = nullptr;
    decltype(&::cuDeviceGet) device_get = nullptr;
    decltype(&::cuDeviceGetName) device_get_name = nullptr;
    decltype(&::cuDeviceGetUuid) device_get_uuid = nullptr;    // the _v2 ABI (11.4+)
    decltype(&::cuDeviceTotalMem) device_total_mem = nullptr;  // the _v2 ABI (size_t)
    decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
    decltype(&::cuDeviceGetPCIBusId) device_get_pci_bus_id = nullptr;
    decltype(&::cuCheckpointProcessGetState) ckpt_get_state = nullptr;
    decltype(&::cuCheckpointProcessGetRestoreThreadId) ckpt_get_restore_tid = nullptr;
    decltype(&::cuCheckpointProcessLock) ckpt_lock = nullptr;
    decltype(&::cuCheckpointProcessCheckpoint) ckpt_checkpoint = nullptr;
    decltype(&::cuCheckpointProcessRestore) ckpt_restore = nullptr;
    decltype(&::cuCheckpointProcessUnlock) ckpt_unlock = nullptr;
  };
  const Api& api() const { return api_; }

  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

 private:
  CudaDriver();
  void load();
  void* resolve(const char* name, int version, const char* fallback_symbol) const;

  DlLibrary lib_;
  std::chrono::steady_clock::time_point load_start_, load_end_;
  using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult*);
  GetProcAddressFn get_proc_address_ = nullptr;
  Api api_;
  DriverStatus status_;
};

// The libraries CudaDriver tries, in order (see instance()).
std::vector<std::string> driver_candidates();
// The absolute path of the libcuda this process uses or would use, found with dlopen + dlinfo
// but without cuInit (cheap): what gpuckpt hands to criu's plugin. "" when there is none.
std::string driver_library_path();
// Whether this machine's driver has the checkpoint API, judged without cuInit (the loader, the
// driver version, the kernel module): a preflight for a restore whose real CUDA work happens
// in criu's plugin, so that the operation pays for cuInit once, there. If the driver was
// already initialised in this process, its full answer.
bool probe_checkpoint_api(std::string* why);

// What CUDA state dumped on a host is bound to: the driver's checkpoint is the driver build's
// own, so a restore needs the same kernel module and the same libcuda. Read without cuInit;
// an empty field is unknown.
struct DriverIdentity {
  std::string module_version;  // /proc/driver/nvidia/version, e.g. "580.159"
  std::string library;         // the libcuda.so.1 the loader resolves (for the message)
  std::string library_sha256;  // that file's SHA-256, hex
};
DriverIdentity driver_identity();
// Why CUDA state dumped under `dumped` cannot come back under `here`, naming both sides; "" if
// it can, or if what would differ is unknown on either side.
std::string driver_mismatch(const DriverIdentity& dumped, const DriverIdentity& here);

// The NVIDIA kernel module version from /proc/driver/nvidia/version ("" if not loaded); tests
// name another file in $GPUCKPT_TEST_NVIDIA_VERSION_FILE.
std::string kernel_module_version();
std::string parse_kernel_module_version(const std::string& first_line);

// Formats the 16 UUID bytes the driver returns as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string format_gpu_uuid(const unsigned char bytes[16]);
// Parses that form back (case-insensitive); false if malformed.
bool parse_gpu_uuid(std::string_view text, unsigned char bytes[16]);

}  // namespace gpuckpt::device
