#include "device/cuda_driver.h"

#include <dlfcn.h>
#include <link.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <utility>

#include "criu/plugin_report.h"
#include "gpuckpt/error.h"

namespace gpuckpt::device {

// ---- DlLibrary --------------------------------------------------------------------------

DlLibrary::DlLibrary(DlLibrary&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}

DlLibrary& DlLibrary::operator=(DlLibrary&& o) noexcept {
  if (this != &o) {
    if (handle_) ::dlclose(handle_);
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

DlLibrary::~DlLibrary() {
  if (handle_) ::dlclose(handle_);
}

DlLibrary DlLibrary::open(const std::string& name, std::string* error) {
  ::dlerror();
  void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h && error) {
    const char* e = ::dlerror();
    *error = e ? e : ("cannot load " + name);
  }
  return DlLibrary(h);
}

void* DlLibrary::symbol(const char* name) const {
  return handle_ ? ::dlsym(handle_, name) : nullptr;
}

std::string DlLibrary::path() const {
  if (!handle_) return {};
  link_map* lm = nullptr;
  if (::dlinfo(handle_, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name || !*lm->l_name) return {};
  // l_name is what the loader opened: absolute when found through the search path; make a
  // relative name (given as such by the user) absolute so another process can open it.
  std::error_code ec;
  const auto abs = std::filesystem::absolute(lm->l_name, ec);
  return ec ? std::string(lm->l_name) : abs.lexically_normal().string();
}

// ---- helpers ----------------------------------------------------------------------------

namespace {

// Names of the codes the checkpoint path meets, for drivers whose cuGetErrorName is unusable
// (the toolkit's link stub answers every call with CUDA_ERROR_STUB_LIBRARY).
const char* fallback_error_name(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE:
      return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED:
      return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED:
      return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY:
      return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
      return "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER";
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case CUDA_ERROR_NO_DEVICE:
      return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE:
      return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_OPERATING_SYSTEM:
      return "CUDA_ERROR_OPERATING_SYSTEM";
    case CUDA_ERROR_ILLEGAL_STATE:
      return "CUDA_ERROR_ILLEGAL_STATE";
    case CUDA_ERROR_NOT_FOUND:
      return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_READY:
      return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_NOT_PERMITTED:
      return "CUDA_ERROR_NOT_PERMITTED";
    case CUDA_ERROR_NOT_SUPPORTED:
      return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_SYSTEM_NOT_READY:
      return "CUDA_ERROR_SYSTEM_NOT_READY";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    case CUDA_ERROR_TIMEOUT:
      return "CUDA_ERROR_TIMEOUT";
    default:
      return nullptr;
  }
}

// What an operator should do about a failed cuInit.
std::string cuinit_hint(CUresult r) {
  switch (r) {
    case CUDA_ERROR_NO_DEVICE:
      return "no CUDA-capable GPU is visible (check CUDA_VISIBLE_DEVICES)";
    case CUDA_ERROR_STUB_LIBRARY:
      return "the loaded libcuda is the CUDA toolkit's link stub, not the NVIDIA driver";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      return "libcuda and the NVIDIA kernel module are different versions (reboot or reload "
             "the module)";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      return "the forward-compatibility driver is not supported on this GPU";
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      return "the GPU is busy or in exclusive-process mode";
    case CUDA_ERROR_NOT_PERMITTED:
      return "not permitted (device node permissions?)";
    case CUDA_ERROR_OPERATING_SYSTEM:
      return "the NVIDIA kernel module did not answer (is it loaded? see dmesg)";
    default:
      return {};
  }
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

}  // namespace

std::string kernel_module_version() {
  // Tests that load the test driver (tests/support/fake_cuda_driver.cpp) give the module's
  // version file too: without a GPU there is no /proc/driver/nvidia.
  const char* test_file = std::getenv("GPUCKPT_TEST_NVIDIA_VERSION_FILE");
  return parse_kernel_module_version(
      read_first_line(test_file && *test_file ? test_file : "/proc/driver/nvidia/version"));
}

std::string parse_kernel_module_version(const std::string& line) {
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..." or, for the
  // open modules, "... NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build ...":
  // the first dotted number after "Kernel Module".
  const auto pos = line.find("Kernel Module");
  if (pos == std::string::npos) return {};
  std::istringstream rest(line.substr(pos + 13));
  std::string token;
  while (rest >> token)
    if (std::isdigit(static_cast<unsigned char>(token[0])) && token.find('.') != std::string::npos)
      return token;
  return {};
}

std::string format_gpu_uuid(const unsigned char b[16]) {
  char s[48];
  std::snprintf(s, sizeof s,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return s;
}

bool parse_gpu_uuid(std::string_view t, unsigned char b[16]) {
  auto lower = [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); };
  if (t.size() != 40 || lower(t[0]) != 'g' || lower(t[1]) != 'p' || lower(t[2]) != 'u' ||
      t[3] != '-')
    return false;
  t.remove_prefix(4);  // 8-4-4-4-12
  int n = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = lower(t[i]);
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
      continue;
    }
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else
      return false;
    if (n % 2 == 0)
      b[n / 2] = static_cast<unsigned char>(v << 4);
    else
      b[n / 2] = static_cast<unsigned char>(b[n / 2] | v);
    ++n;
  }
  return n == 32;
}

}  // namespace gpuckpt::device

namespace gpuckpt {

std::string cuda_version_string(int v) {
  if (v <= 0) return "unknown";
  return "CUDA " + std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace gpuckpt

namespace gpuckpt::device {

// ---- CudaDriver -------------------------------------------------------------------------

namespace {
std::atomic<bool> g_instantiated{false};
}  // namespace

const CudaDriver& CudaDriver::instance() {
  // Deliberately never destroyed: unloading libcuda during static destruction races with the
  // driver's own exit handlers and threads. Error paths inside load() still close it (RAII).
  static const CudaDriver* driver = [] {
    auto* d = new CudaDriver();
    g_instantiated = true;
    return d;
  }();
  return *driver;
}

bool CudaDriver::instantiated() {
  return g_instantiated.load();
}

std::vector<std::string> driver_candidates() {
  // $GPUCKPT_LIBCUDA is an override: when set it is the only candidate (tests point it at the
  // stub or at nothing, and must not fall through to a real driver).
  if (const char* o = std::getenv("GPUCKPT_LIBCUDA"); o && *o) return {o};
  std::vector<std::string> v;
  if (const char* e = std::getenv(criu::kEnvLibcuda); e && *e && std::string(e) != "libcuda.so.1")
    v.emplace_back(e);
  v.emplace_back("libcuda.so.1");
  return v;
}

namespace {

// libcuda opened with the loader only (no cuInit), kept open for good (like the driver).
struct Located {
  DlLibrary lib;
  std::string path;
  std::string error;
};

const Located& located() {
  static const Located* l = [] {
    auto* r = new Located();
    for (const auto& name : driver_candidates()) {
      std::string err;
      r->lib = DlLibrary::open(name, &err);
      if (r->lib) {
        r->path = r->lib.path();
        if (r->path.empty()) r->path = name;
        r->error.clear();
        break;
      }
      r->error += (r->error.empty() ? "" : "; ") + err;
    }
    return r;
  }();
  return *l;
}

}  // namespace

std::string driver_library_path() {
  if (CudaDriver::instantiated()) {
    const CudaDriver& d = CudaDriver::instance();
    if (d.loaded()) return d.status().library;
  }
  // Only the loader's answer, no cuInit: dump and restore hand this to criu without paying for
  // a CUDA initialisation of their own.
  return located().path;
}

bool probe_checkpoint_api(std::string* why) {
  auto say = [why](std::string s) {
    if (why) *why = std::move(s);
    return false;
  };
  if (CudaDriver::instantiated()) {
    const CudaDriver& d = CudaDriver::instance();
    if (d.checkpoint_api()) return true;
    return say(d.loaded() ? d.status().checkpoint_error : "no NVIDIA GPU: " + d.status().error);
  }
  const Located& l = located();
  if (!l.lib) return say("no NVIDIA GPU: NVIDIA driver not installed (" + l.error + ")");
  // cuDriverGetVersion needs no cuInit; the public checkpoint API came with the CUDA 12.8
  // driver (r570), see load().
  auto get_version = reinterpret_cast<CUresult (*)(int*)>(l.lib.symbol("cuDriverGetVersion"));
  int version = 0;
  if (!get_version) return say("no NVIDIA GPU: " + l.path + " is not an NVIDIA driver");
  if (const CUresult r = get_version(&version); r != CUDA_SUCCESS)
    return say("no NVIDIA GPU: cuDriverGetVersion failed (CUDA error " +
               std::to_string(static_cast<int>(r)) +
               (r == CUDA_ERROR_STUB_LIBRARY ? ": the CUDA toolkit's link stub" : "") + ")");
  if (kernel_module_version().empty())
    return say(
        "no NVIDIA GPU: no NVIDIA kernel module loaded (/proc/driver/nvidia/version is "
        "missing)");
  if (version < 12080)
    return say("the CUDA driver (" + cuda_version_string(version) +
               ") lacks the checkpoint API (cuCheckpointProcess*): it needs NVIDIA driver 570 "
               "(CUDA 12.8) or newer");
  return true;
}

CudaDriver::CudaDriver() {
  load();
}

void* CudaDriver::resolve(const char* name, int version, const char* fallback_symbol) const {
  if (get_proc_address_) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (get_proc_address_(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &q) == CUDA_SUCCESS &&
        q == CU_GET_PROC_ADDRESS_SUCCESS && fn)
      return fn;
  }
  // Drivers before CUDA 12.0 (or the stub): plain symbols, with the explicit ABI suffix.
  return fallback_symbol ? lib_.symbol(fallback_symbol) : nullptr;
}

void CudaDriver::load() {
  load_start_ = std::chrono::steady_clock::now();
  struct Done {  // records the load's end on every return path
    CudaDriver& d;
    ~Done() {
      d.load_end_ = std::chrono::steady_clock::now();
      d.status_.load_seconds = std::chrono::duration<double>(d.load_end_ - d.load_start_).count();
    }
  } done{*this};
  status_.kernel_module_version = kernel_module_version();

  // The first candidate that opens. Inside criu, $GPUCKPT_LIBCUDA_PATH names the very library
  // gpuckpt found, so the plugin does not depend on criu's library search path.
  std::string dl_error;
  DlLibrary lib;
  for (const auto& name : driver_candidates()) {
    std::string err;
    status_.library = name;
    lib = DlLibrary::open(name, &err);
    if (lib) break;
    dl_error += (dl_error.empty() ? "" : "; ") + err;
  }
  if (!lib) {
    status_.error = "NVIDIA driver not installed (" + dl_error + ")";
    return;
  }
  if (auto p = lib.path(); !p.empty()) status_.library = p;
  lib_ = std::move(lib);
  get_proc_address_ = reinterpret_cast<GetProcAddressFn>(lib_.symbol("cuGetProcAddress_v2"));

  // The versions are those at which the prototypes in our cuda.h appeared.
  auto get = [&](auto& slot, const char* name, int version, const char* fallback) {
    slot =
        reinterpret_cast<std::remove_reference_t<decltype(slot)>>(resolve(name, version, fallback));
    return slot != nullptr;
  };
  bool ok = true;
  ok &= get(api_.get_error_name, "cuGetErrorName", 6000, "cuGetErrorName");
  ok &= get(api_.get_error_string, "cuGetErrorString", 6000, "cuGetErrorString");
  ok &= get(api_.init, "cuInit", 2000, "cuInit");
  ok &= get(api_.driver_get_version, "cuDriverGetVersion", 2020, "cuDriverGetVersion");
  ok &= get(api_.device_get_count, "cuDeviceGetCount", 2000, "cuDeviceGetCount");
  ok &= get(api_.device_get, "cuDeviceGet", 2000, "cuDeviceGet");
  ok &= get(api_.device_get_name, "cuDeviceGetName", 2000, "cuDeviceGetName");
  ok &= get(api_.device_get_uuid, "cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2");
  ok &= get(api_.device_total_mem, "cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2");
  ok &= get(api_.device_get_attribute, "cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute");
  ok &= get(api_.device_get_pci_bus_id, "cuDeviceGetPCIBusId", 4010, "cuDeviceGetPCIBusId");
  if (!ok) {
    status_.error = status_.library +
                    " lacks basic CUDA driver entry points (not an NVIDIA "
                    "driver, or one older than CUDA 11.4)";
    api_ = {};
    lib_ = {};
    return;
  }

  int version = 0;
  if (api_.driver_get_version(&version) == CUDA_SUCCESS) status_.driver_version = version;

  const auto init_start = std::chrono::steady_clock::now();
  const CUresult init_rc = api_.init(0);
  status_.cuinit_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - init_start).count();
  if (const CUresult r = init_rc; r != CUDA_SUCCESS) {
    std::string msg = "cuInit failed: " + describe(r);
    if (auto hint = cuinit_hint(r); !hint.empty()) msg += ": " + hint;
    if (status_.kernel_module_version.empty() && r != CUDA_ERROR_STUB_LIBRARY)
      msg += " (no NVIDIA kernel module loaded: /proc/driver/nvidia/version is missing)";
    status_.error = msg;
    api_ = {};
    lib_ = {};
    return;
  }
  status_.loaded = true;

  // Only through cuGetProcAddress: the public checkpoint entry points appeared with the CUDA
  // 12.8 driver (r570); r550 exposed checkpointing only to NVIDIA's cuda-checkpoint utility,
  // through private interfaces whose ABI we must not guess. See docs/GPU.md.
  auto get_ckpt = [&](auto& slot, const char* name) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(resolve(name, 12080, nullptr));
    return slot != nullptr;
  };
  bool ckpt = true;
  ckpt &= get_ckpt(api_.ckpt_get_state, "cuCheckpointProcessGetState");
  ckpt &= get_ckpt(api_.ckpt_get_restore_tid, "cuCheckpointProcessGetRestoreThreadId");
  ckpt &= get_ckpt(api_.ckpt_lock, "cuCheckpointProcessLock");
  ckpt &= get_ckpt(api_.ckpt_checkpoint, "cuCheckpointProcessCheckpoint");
  ckpt &= get_ckpt(api_.ckpt_restore, "cuCheckpointProcessRestore");
  ckpt &= get_ckpt(api_.ckpt_unlock, "cuCheckpointProcessUnlock");
  const std::string driver_desc =
      cuda_version_string(status_.driver_version) +
      (status_.kernel_module_version.empty() ? "" : ", NVIDIA " + status_.kernel_module_version);
  if (!ckpt) {
    api_.ckpt_get_state = nullptr;
    api_.ckpt_get_restore_tid = nullptr;
    api_.ckpt_lock = nullptr;
    api_.ckpt_checkpoint = nullptr;
    api_.ckpt_restore = nullptr;
    api_.ckpt_unlock = nullptr;
    status_.checkpoint_error = "the CUDA driver (" + driver_desc +
                               ") lacks the checkpoint API (cuCheckpointProcess*): it needs "
                               "NVIDIA driver 570 (CUDA 12.8) or newer";
    return;
  }
  status_.checkpoint_api = true;
  // CUcheckpointRestoreArgs::gpuPairs is honoured from the CUDA 13.0 driver (r580) on; older
  // drivers require those bytes to be zero (reserved) and reject the call.
  status_.gpu_remap = status_.driver_version >= 13000;
  if (!status_.gpu_remap)
    status_.checkpoint_error = "the CUDA driver (" + driver_desc +
                               ") cannot restore onto other GPUs: GPU remapping needs NVIDIA "
                               "driver 580 (CUDA 13.0) or newer";
  spdlog::debug("cuda driver: {} ({}), checkpoint API: {}, GPU remap: {}, cuInit {:.3f} s",
                status_.library, driver_desc, status_.checkpoint_api, status_.gpu_remap,
                status_.cuinit_seconds);
}

void CudaDriver::require_loaded() const {
  if (!status_.loaded) throw Error(Errc::kNoDevice, "no NVIDIA GPU: " + status_.error);
}

void CudaDriver::require_checkpoint_api() const {
  require_loaded();
  if (!status_.checkpoint_api) throw Error(Errc::kNoDevice, status_.checkpoint_error);
}

void CudaDriver::require_gpu_remap() const {
  require_checkpoint_api();
  if (!status_.gpu_remap) throw Error(Errc::kNoDevice, status_.checkpoint_error);
}

std::string CudaDriver::describe(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_.get_error_name && api_.get_error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (api_.get_error_string && api_.get_error_string(r, &text) != CUDA_SUCCESS) text = nullptr;
  if (!name) name = fallback_error_name(r);
  std::string s = name ? name : "CUDA error " + std::to_string(static_cast<int>(r));
  if (text && *text) s += std::string(" (") + text + ")";
  return s;
}

std::vector<std::string> CudaDriver::gpu_uuids() const {
  require_loaded();
  int count = 0;
  check(api_.device_get_count(&count), "cuDeviceGetCount");
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    check(api_.device_get(&dev, i), "cuDeviceGet");
    CUuuid uuid{};
    check(api_.device_get_uuid(&uuid, dev), "cuDeviceGetUuid");
    out.push_back(format_gpu_uuid(reinterpret_cast<const unsigned char*>(uuid.bytes)));
  }
  return out;
}

void CudaDriver::check(CUresult r, std::string_view what) const {
  if (r != CUDA_SUCCESS) throw Error(Errc::kDevice, std::string(what) + ": " + describe(r));
}

}  // namespace gpuckpt::device
