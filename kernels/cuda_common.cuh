// Shared by the gpuckpt CUDA programs: exit codes that match gpuckpt's (docs/GPU.md), a clear
// "no GPU" message, and CUDA error checking.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace gpuckpt_kernels {

constexpr int kExitUsage = 2;     // Errc::kUsage
constexpr int kExitNoDevice = 7;  // Errc::kNoDevice
constexpr int kExitDevice = 8;    // Errc::kDevice

[[noreturn]] inline void die(int code, const std::string& msg) {
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::exit(code);
}

#define GPUCKPT_CUDA_CHECK(call)                                                                \
  do {                                                                                          \
    const cudaError_t err_ = (call);                                                            \
    if (err_ != cudaSuccess)                                                                    \
      ::gpuckpt_kernels::die(::gpuckpt_kernels::kExitDevice,                                    \
                             std::string(#call) + " failed: " + cudaGetErrorName(err_) + " (" + \
                                 cudaGetErrorString(err_) + ")");                               \
  } while (0)

// Exits 7 with "no NVIDIA GPU: <reason>" unless a usable GPU is present. cudart is linked
// statically and loads libcuda.so.1 itself; probing the library first gives a plainer reason
// than cudaErrorInsufficientDriver when no driver is installed at all.
inline int require_gpu(int device) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    die(kExitNoDevice, std::string("no NVIDIA GPU: NVIDIA driver not installed (") +
                           (e ? e : "libcuda.so.1 not found") + ")");
  }
  dlclose(lib);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorInsufficientDriver)
    die(kExitNoDevice, std::string("no NVIDIA GPU: the NVIDIA driver is older than this "
                                   "program's CUDA runtime (") +
                           std::to_string(CUDART_VERSION / 1000) + "." +
                           std::to_string(CUDART_VERSION % 1000 / 10) + "): update the driver");
  if (err != cudaSuccess)
    die(kExitNoDevice, std::string("no NVIDIA GPU: ") + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ")");
  if (count == 0) die(kExitNoDevice, "no NVIDIA GPU: the CUDA runtime reports no devices");
  if (device < 0 || device >= count)
    die(kExitUsage, "device " + std::to_string(device) + " does not exist (" +
                        std::to_string(count) + " GPU(s))");
  GPUCKPT_CUDA_CHECK(cudaSetDevice(device));
  return count;
}

// The UUID in nvidia-smi's form.
inline std::string uuid_string(const cudaUUID_t& u) {
  char s[48];
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(s, sizeof s,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return s;
}

// JSON string escaping for the few strings we print (device names).
inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace gpuckpt_kernels
