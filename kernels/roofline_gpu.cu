// gpuckpt-roofline-gpu: measures the roofline ceilings of one GPU with our own kernels and
// prints one JSON object on stdout:
//   {"device_name", "bandwidth_gbps", "fp32_gflops", "tensor_gflops", "details": {...}}
// `gpuckpt roofline` runs it and parses that object; keep the keys stable.
//   - HBM bandwidth: streaming copy (2 streams) and triad (3 streams) over arrays much larger
//     than L2, vectorised 16-byte accesses, grid sized to full occupancy; best of N.
//   - FP32: register-resident chains of independent FMAs (ILP 8), every SM fully occupied.
//   - Tensor: bf16 mma.sync.m16n8k16 with fp32 accumulation, 8 independent accumulators per
//     warp (Hopper's wgmma reaches higher; mma.sync is what runs on every GPU >= sm_80).
//   - Host<->device copies over pinned memory: the ceiling of the CUDA checkpoint's VRAM moves.
// Exit codes: 0 ok, 2 usage, 7 no GPU, 8 CUDA error.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_common.cuh"

using namespace gpuckpt_kernels;

namespace {

struct Options {
  int device = 0;
  int repeats = 10;
  std::size_t array_mib = 1024;  // per array; three arrays
  std::size_t host_mib = 1024;   // pinned transfer size
  double min_kernel_ms = 20;     // compute kernels are scaled to run at least this long
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: gpuckpt-roofline-gpu [--device N] [--repeats N] [--array-mib MiB] "
               "[--host-mib MiB] [--quick]\n",
               msg);
  std::exit(kExitUsage);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](long min) -> long {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (!end || *end || v < min || v > (1L << 30)) usage(("bad value for " + a).c_str());
      return v;
    };
    if (a == "--device") {
      o.device = static_cast<int>(value(0));
    } else if (a == "--repeats") {
      o.repeats = static_cast<int>(value(1));
    } else if (a == "--array-mib") {
      o.array_mib = static_cast<std::size_t>(value(1));
    } else if (a == "--host-mib") {
      o.host_mib = static_cast<std::size_t>(value(1));
    } else if (a == "--quick") {
      o.repeats = 3;
      o.array_mib = 256;
      o.host_mib = 256;
      o.min_kernel_ms = 5;
    } else if (a == "--help" || a == "-h") {
      usage("gpuckpt-roofline-gpu: GPU roofline ceilings as JSON");
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  return o;
}

// ---- kernels ------------------------------------------------------------------------------

__global__ void init_kernel(float4* a, float4* b, float4* c, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float v = static_cast<float>(i & 1023) * 1e-3f;
    a[i] = make_float4(v, v, v, v);
    b[i] = make_float4(1.f, 1.f, 1.f, 1.f);
    c[i] = make_float4(2.f, 2.f, 2.f, 2.f);
  }
}

__global__ void copy_kernel(const float4* __restrict__ a, float4* __restrict__ b, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    b[i] = a[i];
}

__global__ void triad_kernel(float4* __restrict__ a, const float4* __restrict__ b,
                             const float4* __restrict__ c, float s, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float4 x = b[i], y = c[i];
    a[i] = make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w);
  }
}

constexpr int kFmaIlp = 8;
constexpr int kFmaUnroll = 16;

// Each thread runs kFmaIlp independent FMA chains; a and b are run-time values, so nothing
// folds. The impossible store keeps the chains alive.
__global__ void fma_kernel(float* out, float a, float b, int iters) {
  float x[kFmaIlp];
#pragma unroll
  for (int j = 0; j < kFmaIlp; ++j) x[j] = threadIdx.x * 1e-7f + j;
  for (int i = 0; i < iters; i += kFmaUnroll) {
#pragma unroll
    for (int u = 0; u < kFmaUnroll; ++u) {
#pragma unroll
      for (int j = 0; j < kFmaIlp; ++j) x[j] = fmaf(x[j], a, b);
    }
  }
  float s = 0;
#pragma unroll
  for (int j = 0; j < kFmaIlp; ++j) s += x[j];
  if (s == -1.2345f) out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

constexpr int kMmaAcc = 8;
constexpr int kMmaUnroll = 4;

// bf16 m16n8k16 mma.sync with fp32 accumulation; kMmaAcc independent accumulators per warp
// hide the tensor pipe latency. Fragments stay in registers: this measures the tensor cores,
// not memory.
__global__ void mma_kernel(float* out, unsigned seed, int iters) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Small bf16 values (~2^-7) so the accumulators stay finite over millions of steps.
  const unsigned a0 = 0x3c003c00u ^ (seed & 0x00070007u), a1 = a0 ^ 0x00010000u, a2 = a0 ^ 1u,
                 a3 = a0;
  const unsigned b0 = 0x3c003c00u, b1 = b0 ^ (threadIdx.x & 1u);
  float acc[kMmaAcc][4];
#pragma unroll
  for (int k = 0; k < kMmaAcc; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[k][r] = 0.f;
  for (int i = 0; i < iters; i += kMmaUnroll) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < kMmaAcc; ++k) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(acc[k][0]), "+f"(acc[k][1]), "+f"(acc[k][2]), "+f"(acc[k][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
      }
    }
  }
  float s = 0;
#pragma unroll
  for (int k = 0; k < kMmaAcc; ++k) s += acc[k][0] + acc[k][1] + acc[k][2] + acc[k][3];
  if (s == -1.2345f) out[blockIdx.x * blockDim.x + threadIdx.x] = s;
#else
  if (iters < 0) out[0] = static_cast<float>(seed);  // no tensor cores below sm_80
#endif
}

// ---- measurement helpers ------------------------------------------------------------------

class EventTimer {
 public:
  EventTimer() {
    GPUCKPT_CUDA_CHECK(cudaEventCreate(&start_));
    GPUCKPT_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  template <typename F>
  double seconds(F&& launch) {
    GPUCKPT_CUDA_CHECK(cudaEventRecord(start_));
    launch();
    GPUCKPT_CUDA_CHECK(cudaGetLastError());
    GPUCKPT_CUDA_CHECK(cudaEventRecord(stop_));
    GPUCKPT_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    GPUCKPT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms / 1e3;
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

template <typename F>
double best_seconds(EventTimer& t, int repeats, F&& launch) {
  t.seconds(launch);  // warm-up: clocks up, code loaded
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) best = std::min(best, t.seconds(launch));
  return best;
}

// Doubles `iters` (a multiple of `step`) until one launch runs at least min_ms.
template <typename F>
int calibrate(EventTimer& t, double min_ms, int step, F&& launch_with) {
  int iters = step * 16;
  for (;;) {
    const double s = t.seconds([&] { launch_with(iters); });
    if (s * 1e3 >= min_ms || iters >= (1 << 28)) return iters;
    iters *= 2;
  }
}

int grid_for(const void* kernel, int block, int sms) {
  int per_sm = 0;
  GPUCKPT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0));
  return std::max(1, per_sm) * sms;
}

int attribute(cudaDeviceAttr a, int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, a, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  require_gpu(o.device);

  cudaDeviceProp prop{};
  GPUCKPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
  const int sms = prop.multiProcessorCount;
  int driver_version = 0, runtime_version = 0;
  cudaDriverGetVersion(&driver_version);
  cudaRuntimeGetVersion(&runtime_version);
  const int clock_khz = attribute(cudaDevAttrClockRate, o.device);
  const int mem_clock_khz = attribute(cudaDevAttrMemoryClockRate, o.device);
  const int bus_width = attribute(cudaDevAttrGlobalMemoryBusWidth, o.device);

  EventTimer timer;
  constexpr int kBlock = 256;

  // Bandwidth. n float4 per array; three arrays.
  std::size_t free_b = 0, total_b = 0;
  GPUCKPT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  std::size_t array_bytes = o.array_mib << 20;
  array_bytes = std::min(array_bytes, (free_b / 4) & ~std::size_t(0xffff));  // leave headroom
  const std::size_t n = array_bytes / sizeof(float4);
  float4 *a = nullptr, *b = nullptr, *c = nullptr;
  GPUCKPT_CUDA_CHECK(cudaMalloc(&a, n * sizeof(float4)));
  GPUCKPT_CUDA_CHECK(cudaMalloc(&b, n * sizeof(float4)));
  GPUCKPT_CUDA_CHECK(cudaMalloc(&c, n * sizeof(float4)));
  const int g_init = grid_for(reinterpret_cast<const void*>(init_kernel), kBlock, sms);
  init_kernel<<<g_init, kBlock>>>(a, b, c, n);
  GPUCKPT_CUDA_CHECK(cudaGetLastError());
  GPUCKPT_CUDA_CHECK(cudaDeviceSynchronize());

  const int g_copy = grid_for(reinterpret_cast<const void*>(copy_kernel), kBlock, sms);
  const int g_triad = grid_for(reinterpret_cast<const void*>(triad_kernel), kBlock, sms);
  const double t_copy =
      best_seconds(timer, o.repeats, [&] { copy_kernel<<<g_copy, kBlock>>>(a, b, n); });
  const double t_triad =
      best_seconds(timer, o.repeats, [&] { triad_kernel<<<g_triad, kBlock>>>(a, b, c, 3.0f, n); });
  const double bytes = static_cast<double>(n * sizeof(float4));
  const double copy_gbps = 2 * bytes / t_copy / 1e9;
  const double triad_gbps = 3 * bytes / t_triad / 1e9;
  GPUCKPT_CUDA_CHECK(cudaFree(a));
  GPUCKPT_CUDA_CHECK(cudaFree(b));
  GPUCKPT_CUDA_CHECK(cudaFree(c));

  float* sink = nullptr;
  GPUCKPT_CUDA_CHECK(cudaMalloc(&sink, 1 << 24));

  // FP32 FMA.
  const int g_fma = grid_for(reinterpret_cast<const void*>(fma_kernel), kBlock, sms);
  auto fma_launch = [&](int iters) { fma_kernel<<<g_fma, kBlock>>>(sink, 0.999f, 1e-4f, iters); };
  const int fma_iters = calibrate(timer, o.min_kernel_ms, kFmaUnroll, fma_launch);
  const double t_fma = best_seconds(timer, o.repeats, [&] { fma_launch(fma_iters); });
  const double fma_flops = 2.0 * g_fma * kBlock * double(fma_iters) * kFmaIlp;
  const double fp32_gflops = fma_flops / t_fma / 1e9;

  // Tensor cores (bf16 -> fp32).
  const bool tensor = prop.major >= 8;
  double tensor_gflops = 0, t_mma = 0;
  int mma_iters = 0, g_mma = 0;
  if (tensor) {
    g_mma = grid_for(reinterpret_cast<const void*>(mma_kernel), kBlock, sms);
    auto mma_launch = [&](int iters) { mma_kernel<<<g_mma, kBlock>>>(sink, 1u, iters); };
    mma_iters = calibrate(timer, o.min_kernel_ms, kMmaUnroll, mma_launch);
    t_mma = best_seconds(timer, o.repeats, [&] { mma_launch(mma_iters); });
    const double warps = double(g_mma) * kBlock / 32;
    const double mma_flops = warps * double(mma_iters) * kMmaAcc * (2.0 * 16 * 8 * 16);
    tensor_gflops = mma_flops / t_mma / 1e9;
  }
  GPUCKPT_CUDA_CHECK(cudaFree(sink));

  // Host <-> device over pinned memory.
  const std::size_t host_bytes = o.host_mib << 20;
  void* host = nullptr;
  void* dev = nullptr;
  GPUCKPT_CUDA_CHECK(cudaMallocHost(&host, host_bytes));
  GPUCKPT_CUDA_CHECK(cudaMalloc(&dev, host_bytes));
  std::memset(host, 0x5a, host_bytes);
  const int host_repeats = std::max(2, o.repeats / 3);
  const double t_h2d = best_seconds(timer, host_repeats, [&] {
    GPUCKPT_CUDA_CHECK(cudaMemcpyAsync(dev, host, host_bytes, cudaMemcpyHostToDevice));
  });
  const double t_d2h = best_seconds(timer, host_repeats, [&] {
    GPUCKPT_CUDA_CHECK(cudaMemcpyAsync(host, dev, host_bytes, cudaMemcpyDeviceToHost));
  });
  GPUCKPT_CUDA_CHECK(cudaFreeHost(host));
  GPUCKPT_CUDA_CHECK(cudaFree(dev));
  const double h2d_gbps = host_bytes / t_h2d / 1e9;
  const double d2h_gbps = host_bytes / t_d2h / 1e9;

  // Nominal peaks, for context only (the ceilings above are the measured ones): 64 FP32 lanes
  // per SM on sm_80 (A100), 128 on sm_86/89/90 (Hopper included). DDR: two transfers a clock.
  const int fp32_lanes = prop.major == 8 && prop.minor == 0 ? 64 : 128;
  const double nominal_fp32 = double(sms) * fp32_lanes * 2 * clock_khz / 1e6;
  const double nominal_bw = 2.0 * mem_clock_khz * 1e3 * (bus_width / 8) / 1e9;

  std::printf(
      "{\"device_name\": \"%s\", \"bandwidth_gbps\": %.1f, \"fp32_gflops\": %.1f, "
      "\"tensor_gflops\": %s, \"details\": {"
      "\"uuid\": \"%s\", \"compute_capability\": \"%d.%d\", \"multiprocessors\": %d, "
      "\"total_memory\": %zu, \"clock_mhz\": %d, \"memory_clock_mhz\": %d, "
      "\"memory_bus_width\": %d, \"cuda_driver_version\": %d, \"cuda_runtime_version\": %d, "
      "\"repeats\": %d, \"array_bytes\": %zu, "
      "\"copy_gbps\": %.1f, \"triad_gbps\": %.1f, \"copy_seconds\": %.6f, "
      "\"triad_seconds\": %.6f, \"bandwidth_method\": \"best of copy (2 streams) and triad (3 "
      "streams), float4, best of %d\", "
      "\"fp32_method\": \"fmaf chains, ILP %d, grid %d x %d, %d iterations\", "
      "\"fp32_seconds\": %.6f, \"nominal_fp32_gflops\": %.1f, \"nominal_bandwidth_gbps\": %.1f, "
      "\"tensor_method\": \"%s\", \"tensor_seconds\": %.6f, "
      "\"h2d_pinned_gbps\": %.2f, \"d2h_pinned_gbps\": %.2f, \"host_copy_bytes\": %zu}}\n",
      json_escape(prop.name).c_str(), std::max(copy_gbps, triad_gbps), fp32_gflops,
      tensor ? std::to_string(tensor_gflops).c_str() : "null", uuid_string(prop.uuid).c_str(),
      prop.major, prop.minor, sms, prop.totalGlobalMem, clock_khz / 1000, mem_clock_khz / 1000,
      bus_width, driver_version, runtime_version, o.repeats, n * sizeof(float4), copy_gbps,
      triad_gbps, t_copy, t_triad, o.repeats, kFmaIlp, g_fma, kBlock, fma_iters, t_fma,
      nominal_fp32, nominal_bw,
      tensor ? "mma.sync (not wgmma): m16n8k16 bf16->fp32, 8 accumulators per warp; a lower "
               "bound on Hopper, whose wgmma reaches more"
             : "none (sm < 80)",
      t_mma, h2d_gbps, d2h_gbps, host_bytes);
  return 0;
}
