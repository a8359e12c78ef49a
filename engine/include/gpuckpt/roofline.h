// Roofline ceilings measured by our own kernels (GPU) or loops (CPU), never looked up.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuckpt {

struct Ceilings {
  std::string target;                   // "gpu" or "cpu"
  std::string device_name;              // e.g. "NVIDIA H200" or the CPU model
  double bandwidth_gbps = 0;            // peak streaming memory bandwidth, GB/s
  double fp32_gflops = 0;               // peak FMA throughput, GFLOP/s
  std::optional<double> tensor_gflops;  // bf16/fp16 tensor-core peak, GFLOP/s (GPU only)
  std::string method;                   // how the numbers were measured, one line
  std::string note;  // why this target was chosen (e.g. the auto fallback's reason)
  nlohmann::json details = nlohmann::json::object();  // the per-kernel numbers
  double ridge_point() const { return bandwidth_gbps > 0 ? fp32_gflops / bandwidth_gbps : 0; }
};

enum class RooflineTarget { kAuto, kCpu, kGpu };
// "auto" | "cpu" | "gpu"; throws Error(kUsage).
RooflineTarget parse_roofline_target(const std::string& s);

struct MeasureOptions {
  bool quick = false;    // smaller arrays, fewer repetitions (< 1 s on a CPU); for tests
  unsigned threads = 0;  // CPU worker threads; 0 = every CPU this process may run on
  int gpu_index = 0;     // CUDA device measured by gpuckpt-roofline-gpu
  std::chrono::seconds gpu_timeout{300};
};

// kGpu runs gpuckpt-roofline-gpu (next to the running binary, or $GPUCKPT_ROOFLINE_GPU) and
// throws Error(kNoDevice) without a GPU, Error(kDevice) if it fails. kCpu measures this host's
// cores. kAuto is the GPU when that binary succeeds, else the CPU, with the reason in `note`.
Ceilings measure_ceilings(RooflineTarget target = RooflineTarget::kAuto,
                          const MeasureOptions& opts = {});

struct RooflinePlacement {
  double intensity = 0;  // FLOP/byte
  double attainable_gflops = 0;
  bool memory_bound = false;
  std::optional<double> achieved_gflops;  // when measured
  std::string label;                      // what was placed: "workload" or a built-in kernel's name
};
// attainable = min(peak FP32, intensity x bandwidth); memory-bound left of the ridge point.
// Throws Error(kUsage) for a non-positive intensity or a negative achieved rate.
RooflinePlacement place_on_roofline(const Ceilings& c, double intensity,
                                    std::optional<double> achieved_gflops = {});

// ---- The checkpoint path's own ceilings (docs/PERFORMANCE.md, "Floors") -------------------
//
// A roofline bounds a workload that runs; a transient is bounded by the path its bytes take:
// the disk (durable writes, cold reads), zstd on this machine's cores, the memory a restore
// fills, the network to a migration target and, on a GPU, the copy engines. Each transient
// number's floor is its bytes through the slowest of these (gpuckpt/report.h, floors).
struct PathCeilings {
  std::string dir;             // the filesystem measured (where checkpoints are written)
  unsigned cores = 0;          // CPUs this process may use: zstd's parallelism
  double disk_write_gbps = 0;  // O_DIRECT writes, then fdatasync: durable bytes per second
  double disk_read_gbps = 0;   // O_DIRECT reads (no page cache of this host)
  // First touch of fresh anonymous memory, as a restore meets it (the first try: on a VM that
  // returns free memory to its host, that memory costs a host fault too): 4 KiB pages on one
  // thread, as CRIU reads them; transparent huge pages on the threads a huge-page fill uses
  // (0: THP off here). The floors use these.
  double fill_gbps = 0;
  double fill_huge_gbps = 0;
  double fill_huge_warm_gbps = 0;   // the same memory rewarmed (best of 3): shown, not a floor
  unsigned fill_huge_threads = 1;   // the threads fill_huge_gbps was measured on
  double memcpy_gbps = 0;           // one core, between touched buffers
  double zstd_compress_gbps = 0;    // one core, raw bytes per second, at zstd_level
  double zstd_decompress_gbps = 0;  // one core, raw bytes per second
  double zstd_ratio = 1;            // raw / stored bytes of the sample
  int zstd_level = 1;
  std::string sample;                                  // what zstd was measured on
  std::optional<double> network_gbps;                  // to a migration target, when known
  std::optional<double> pcie_h2d_gbps, pcie_d2h_gbps;  // pinned host<->GPU copies, on a GPU
};

struct PathMeasureOptions {
  std::filesystem::path dir;  // a directory on the checkpoints' filesystem (a temporary file)
  // zstd's sample: a checkpoint (chunks of its largest file) or any file; "" = generated
  // content, half incompressible and half fp16-like (SampleContent).
  std::filesystem::path sample;
  std::uint64_t bytes = 1ull << 30;  // written and read back; fills use up to 512 MiB
  int zstd_level = 1;
  // A migration target, ssh://[USER@]HOST[:PORT] (with ssh's -F `ssh_config`): up to 512 MiB
  // of incompressible bytes through one OpenSSH connection into /dev/null there, as
  // `migrate --to ssh://` sends a checkpoint. "": the network is not measured.
  std::string network;
  std::filesystem::path ssh_config;
  // At most this long waiting for free page reporting to settle before the memory fill
  // (settle_free_memory, gpuckpt/support.h); 0: the memory as found.
  double settle_limit_s = 30;
};

// Measures the ceilings above (PCIe comes from a GPU roofline's details:
// path_from_gpu_ceilings). Throws Error(kInvalidInput) for a missing directory or sample,
// Error(kIo) when the disk cannot be written or the target cannot be reached.
PathCeilings measure_path_ceilings(const PathMeasureOptions& opts);
// The GPU roofline's pinned copy rates (details h2d_pinned_gbps, d2h_pinned_gbps) into `p`.
void path_from_gpu_ceilings(const Ceilings& gpu, PathCeilings& p);

// A built-in CPU kernel run to completion, to place on the CPU roofline.
struct KernelMeasurement {
  std::string name;         // "triad", "fma", "matmul"
  std::string description;  // what it computes and how its bytes are counted
  double intensity = 0;     // FLOP per byte of compulsory memory traffic
  double achieved_gflops = 0;
  double seconds = 0;                  // best repetition
  std::uint64_t flops = 0, bytes = 0;  // per repetition
};
std::vector<std::string> cpu_kernel_names();
// Throws Error(kUsage) for an unknown name.
KernelMeasurement run_cpu_kernel(const std::string& name, const MeasureOptions& opts = {});

}  // namespace gpuckpt
