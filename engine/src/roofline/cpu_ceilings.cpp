// CPU ceilings and the built-in CPU kernels: every core at once (ThreadTeam), best of N.
#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "roofline/cpu_info.h"
#include "roofline/cpu_kernels.h"
#include "roofline/measure.h"
#include "roofline/thread_team.h"

namespace gpuckpt {

namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// Page-aligned anonymous memory, transparently huge where possible (fewer TLB misses and page
// faults while streaming). Not touched here: each worker first-touches its own part.
class Buffer {
 public:
  explicit Buffer(std::size_t bytes) : bytes_(bytes) {
    p_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p_ == MAP_FAILED)
      throw_errno(Errc::kInternal, "cannot allocate ", bytes / kMiB, " MiB for the roofline");
    ::madvise(p_, bytes, MADV_HUGEPAGE);  // advisory
  }
  ~Buffer() { ::munmap(p_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_;
  std::size_t bytes_;
};

// Worker i's slice of an array of `n` elements: equal slices of whole 64-element groups (so
// every slice is a multiple of 64 bytes and stays vector-aligned).
struct Slices {
  std::size_t per = 0;
  Slices(std::size_t n, unsigned workers) : per((n / workers) / 64 * 64) {}
  std::size_t begin(unsigned i) const { return i * per; }
  std::size_t total(unsigned workers) const { return per * workers; }
};

// Per array: well beyond the last-level cache so the loops stream from DRAM, bounded by what
// the machine can spare.
std::size_t array_bytes(bool quick) {
  const std::uint64_t llc = last_level_cache_bytes();
  // Floors, because a virtual machine's sysfs may show a fraction of the host's real LLC
  // (64 MiB arrays measured cache, not DRAM, on such a VM).
  std::uint64_t b = quick ? std::max<std::uint64_t>(128 * kMiB, 4 * llc)
                          : std::max<std::uint64_t>(256 * kMiB, 8 * llc);
  if (const auto avail = mem_available_bytes(); avail > 0)
    b = std::min<std::uint64_t>(b, avail / 8);
  b = std::min<std::uint64_t>(b, 4096 * kMiB);
  return static_cast<std::size_t>(std::max<std::uint64_t>(b, 16 * kMiB) / kMiB * kMiB);
}

// Sinks results into memory so that no kernel's work is dead code.
volatile double g_sink;

struct Bandwidth {
  double copy_gbps = 0, triad_gbps = 0, read_gbps = 0, triad_seconds = 0;
  std::size_t array_bytes = 0, elements = 0;
};

Bandwidth measure_bandwidth(ThreadTeam& team, const CpuKernels& k, bool quick) {
  Bandwidth bw;
  bw.array_bytes = array_bytes(quick);
  const std::size_t n = bw.array_bytes / sizeof(double);
  Buffer a(bw.array_bytes), b(bw.array_bytes), c(bw.array_bytes);
  double *pa = a.as<double>(), *pb = b.as<double>(), *pc = c.as<double>();
  const unsigned t = team.size();
  const Slices s(n, t);
  bw.elements = s.total(t);
  team.run([&](unsigned i) {
    for (std::size_t j = s.begin(i); j < s.begin(i) + s.per; ++j) {
      pa[j] = 0;
      pb[j] = 1.0 + static_cast<double>(j & 1023) * 1e-3;
      pc[j] = 2.0;
    }
  });
  const int reps = quick ? 3 : 5;
  const double bytes = static_cast<double>(bw.elements) * sizeof(double);
  const double t_copy =
      team.best_of(reps, [&](unsigned i) { k.copy(pa + s.begin(i), pb + s.begin(i), s.per); });
  bw.triad_seconds = team.best_of(reps, [&](unsigned i) {
    k.triad(pa + s.begin(i), pb + s.begin(i), pc + s.begin(i), 3.0, s.per);
  });
  std::vector<double> sums(t);
  // All three arrays, so that the read working set is as large as the triad's.
  const double t_read = team.best_of(reps, [&](unsigned i) {
    sums[i] = k.read(pa + s.begin(i), s.per) + k.read(pb + s.begin(i), s.per) +
              k.read(pc + s.begin(i), s.per);
  });
  for (double v : sums) g_sink = g_sink + v;
  bw.copy_gbps = 2 * bytes / t_copy / 1e9;
  bw.triad_gbps = 3 * bytes / bw.triad_seconds / 1e9;
  bw.read_gbps = 3 * bytes / t_read / 1e9;
  return bw;
}

struct FmaPeak {
  double gflops = 0, seconds = 0;
  long iters = 0;
};

FmaPeak measure_fma_peak(ThreadTeam& team, const CpuKernels& k, bool quick) {
  const unsigned t = team.size();
  // One 4 KiB-aligned, cache-line-padded block per worker: no false sharing of the outputs.
  constexpr std::size_t kBlock = 4096;
  Buffer out(kBlock * t);
  for (unsigned i = 0; i < t; ++i) {
    float* o = out.as<float>() + i * kBlock / sizeof(float);
    std::fill(o, o + kBlock / sizeof(float), 1e-3f * static_cast<float>(i + 1));
  }
  // Calibrate on one thread so each timed run lasts long enough to dwarf the barrier, yet is
  // short: many short runs catch the quiet moments of a shared (virtualised) core.
  const double target = quick ? 0.003 : 0.005;
  FmaPeak f;
  f.iters = 1 << 12;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    k.fma_peak(out.as<float>(), f.iters);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= target ||
        f.iters >= (1L << 34))
      break;
    f.iters *= 2;
  }
  f.seconds = team.best_of(quick ? 6 : 20, [&](unsigned i) {
    k.fma_peak(out.as<float>() + i * kBlock / sizeof(float), f.iters);
  });
  g_sink = g_sink + out.as<float>()[0];
  f.gflops = static_cast<double>(t) * static_cast<double>(f.iters) * k.peak_flops_per_iter /
             f.seconds / 1e9;
  return f;
}

std::string mib(std::size_t bytes) {
  return std::to_string(bytes / kMiB) + " MiB";
}

}  // namespace

Ceilings measure_cpu_ceilings(const MeasureOptions& opts) {
  ThreadTeam team(opts.threads);
  const CpuKernels& k = cpu_kernels(best_isa());
  const auto t0 = std::chrono::steady_clock::now();
  const FmaPeak fma = measure_fma_peak(team, k, opts.quick);
  const auto t1 = std::chrono::steady_clock::now();
  const Bandwidth bw = measure_bandwidth(team, k, opts.quick);
  spdlog::debug(
      "roofline: FP32 peak {:.1f} GFLOP/s in {:.2f} s; bandwidth {:.1f}/{:.1f}/{:.1f} "
      "GB/s (copy/triad/read) in {:.2f} s",
      fma.gflops, std::chrono::duration<double>(t1 - t0).count(), bw.copy_gbps, bw.triad_gbps,
      bw.read_gbps, std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());

  Ceilings c;
  c.target = "cpu";
  c.device_name = cpu_model_name();
  c.fp32_gflops = fma.gflops;
  c.bandwidth_gbps = std::max({bw.copy_gbps, bw.triad_gbps, bw.read_gbps});
  const int chains = k.peak_flops_per_iter / (k.vector_bytes / 4) / 2;
  c.method = std::to_string(team.size()) + " threads; FP32: " + isa_name(k.isa) + " FMA, " +
             std::to_string(chains) + " register-resident chains per thread; bandwidth: best of " +
             "read/copy/triad over 3 x " + mib(bw.array_bytes) + " arrays" +
             (opts.quick ? " (quick)" : "");
  nlohmann::json d = {{"isa", isa_name(k.isa)},        {"threads", team.size()},
                      {"quick", opts.quick},           {"llc_bytes", last_level_cache_bytes()},
                      {"array_bytes", bw.array_bytes}, {"copy_gbps", bw.copy_gbps},
                      {"triad_gbps", bw.triad_gbps},   {"read_gbps", bw.read_gbps},
                      {"fma_chains", chains},          {"fma_iterations", fma.iters},
                      {"fma_seconds", fma.seconds}};
  c.details = std::move(d);
  return c;
}

std::vector<std::string> cpu_kernel_names() {
  return {"triad", "fma", "matmul"};
}

KernelMeasurement run_cpu_kernel(const std::string& name, const MeasureOptions& opts) {
  const auto names = cpu_kernel_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw Error(Errc::kUsage, "unknown kernel '" + name + "': expected triad, fma or matmul");
  ThreadTeam team(opts.threads);
  const unsigned t = team.size();
  const CpuKernels& k = cpu_kernels(best_isa());
  const int reps = opts.quick ? 3 : 5;
  KernelMeasurement m;
  m.name = name;

  if (name == "triad") {
    const Bandwidth bw = measure_bandwidth(team, k, opts.quick);
    m.flops = 2 * bw.elements;
    m.bytes = 3 * sizeof(double) * bw.elements;
    m.seconds = bw.triad_seconds;
    m.description = "a[i] = b[i] + s*c[i] over 3 x " + mib(bw.array_bytes) +
                    " fp64 arrays: 2 FLOP per 24 bytes (write-allocate not counted)";
  } else if (name == "fma") {
    const std::size_t bytes = array_bytes(opts.quick);
    const std::size_t n = bytes / sizeof(float);
    Buffer x(bytes);
    float* px = x.as<float>();
    const Slices s(n, t);
    team.run([&](unsigned i) {
      for (std::size_t j = s.begin(i); j < s.begin(i) + s.per; ++j)
        px[j] = static_cast<float>(j % 901) * 1e-3f;  // in [0, 0.9]: the chains stay bounded
    });
    std::vector<float> sums(t);
    m.seconds =
        team.best_of(reps, [&](unsigned i) { sums[i] = k.fma_stream(px + s.begin(i), s.per); });
    for (float v : sums) g_sink = g_sink + v;
    m.flops = 32 * s.total(t);
    m.bytes = sizeof(float) * s.total(t);
    m.description = "16 FMAs on every fp32 element streamed from a " + mib(bytes) +
                    " array: 32 FLOP per 4 bytes";
  } else {  // matmul
    const int n = opts.quick ? 512 : 1024;
    const std::size_t bytes = sizeof(float) * n * n;
    Buffer a(bytes), b(bytes), c(bytes);
    float *pa = a.as<float>(), *pb = b.as<float>(), *pc = c.as<float>();
    for (int i = 0; i < n * n; ++i) {
      pa[i] = static_cast<float>(i % 17) * 0.01f;
      pb[i] = static_cast<float>(i % 13) * 0.01f;
      pc[i] = 0;
    }
    const int blocks = n / 4;  // row blocks of 4, split evenly among workers
    m.seconds = team.best_of(reps, [&](unsigned i) {
      const int r0 = static_cast<int>(static_cast<long>(blocks) * i / t) * 4;
      const int r1 = static_cast<int>(static_cast<long>(blocks) * (i + 1) / t) * 4;
      if (r1 > r0) k.sgemm_rows(pa, pb, pc, n, r0, r1);
    });
    g_sink = g_sink + pc[n * n - 1];
    m.flops = 2ULL * n * n * n;
    m.bytes = 4 * bytes;  // read A, B, C and write C once: the compulsory traffic
    m.description = "C += A*B, fp32, n = " + std::to_string(n) +
                    ", register-blocked: 2n^3 FLOP per 16n^2 bytes of compulsory traffic";
  }
  m.intensity = static_cast<double>(m.flops) / static_cast<double>(m.bytes);
  m.achieved_gflops = static_cast<double>(m.flops) / m.seconds / 1e9;
  m.description += std::string("; ") + isa_name(k.isa) + ", " + std::to_string(t) + " threads";
  return m;
}

}  // namespace gpuckpt
