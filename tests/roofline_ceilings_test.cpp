// Roofline: real CPU measurements (quick mode), exact placement math, the per-ISA kernels'
// results, and the GPU path through stand-in binaries (no GPU here) and the real one if built.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "gpuckpt/roofline.h"
#include "gpuckpt/support.h"
#include "roofline/cpu_info.h"
#include "roofline/cpu_kernels.h"
#include "roofline/measure.h"
#include "roofline/thread_team.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

MeasureOptions quick() {
  MeasureOptions o;
  o.quick = true;
  return o;
}

// Points $GPUCKPT_ROOFLINE_GPU at a shell script for the test's duration.
class FakeGpuBinary {
 public:
  explicit FakeGpuBinary(const std::string& body) : dir_(test::scratch_dir("gpuckpt-roofline")) {
    path_ = dir_.path() / "gpuckpt-roofline-gpu";
    write_file_atomic(path_, "#!/bin/sh\n" + body + "\n");
    ::chmod(path_.c_str(), 0755);
    ::setenv("GPUCKPT_ROOFLINE_GPU", path_.c_str(), 1);
  }
  ~FakeGpuBinary() { ::unsetenv("GPUCKPT_ROOFLINE_GPU"); }
  const fs::path& path() const { return path_; }

 private:
  TempDir dir_;
  fs::path path_;
};

}  // namespace

TEST(RooflineCpu, CeilingsArePositiveAndPlausible) {
  const Ceilings c = measure_ceilings(RooflineTarget::kCpu, quick());
  EXPECT_EQ(c.target, "cpu");
  EXPECT_FALSE(c.device_name.empty());
  EXPECT_GT(c.bandwidth_gbps, 0.1);
  EXPECT_LT(c.bandwidth_gbps, 10000);
  EXPECT_GT(c.fp32_gflops, 0.1);
  EXPECT_LT(c.fp32_gflops, 1e6);
  EXPECT_FALSE(c.tensor_gflops.has_value());
  EXPECT_GT(c.ridge_point(), 0);
  EXPECT_NE(c.method.find(isa_name(best_isa())), std::string::npos) << c.method;
  const auto& d = c.details;
  EXPECT_EQ(d.at("threads").get<size_t>(), usable_cpus());
  // The streaming arrays must dwarf the last-level cache, or this measured the cache.
  EXPECT_GE(d.at("array_bytes").get<std::uint64_t>(), 2 * last_level_cache_bytes());
  EXPECT_DOUBLE_EQ(c.bandwidth_gbps,
                   std::max({d.at("copy_gbps").get<double>(), d.at("triad_gbps").get<double>(),
                             d.at("read_gbps").get<double>()}));
}

TEST(RooflineCpu, HostFactsAreRead) {
  EXPECT_NE(cpu_model_name(), "");
  EXPECT_GE(usable_cpus(), 1u);
  EXPECT_GT(mem_available_bytes(), 0u);
}

TEST(RooflinePlacement, MathOnKnownNumbers) {
  Ceilings c;
  c.bandwidth_gbps = 100;
  c.fp32_gflops = 1000;
  EXPECT_EQ(c.ridge_point(), 10);

  auto low = place_on_roofline(c, 2);
  EXPECT_EQ(low.attainable_gflops, 200);
  EXPECT_TRUE(low.memory_bound);
  EXPECT_FALSE(low.achieved_gflops);
  EXPECT_EQ(low.intensity, 2);

  auto high = place_on_roofline(c, 50, 640.0);
  EXPECT_EQ(high.attainable_gflops, 1000);
  EXPECT_FALSE(high.memory_bound);
  EXPECT_EQ(*high.achieved_gflops, 640);

  auto ridge = place_on_roofline(c, 10);
  EXPECT_EQ(ridge.attainable_gflops, 1000);
  EXPECT_FALSE(ridge.memory_bound);

  auto tiny = place_on_roofline(c, 0.125);
  EXPECT_EQ(tiny.attainable_gflops, 12.5);
  EXPECT_TRUE(tiny.memory_bound);
}

TEST(RooflinePlacement, RejectsBadNumbers) {
  Ceilings c;
  c.bandwidth_gbps = 100;
  c.fp32_gflops = 1000;
  for (double bad : {0.0, -1.0, std::nan(""), double(INFINITY)}) {
    try {
      place_on_roofline(c, bad);
      ADD_FAILURE() << "accepted intensity " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kUsage);
    }
  }
  EXPECT_THROW(place_on_roofline(c, 1, -5.0), Error);
  try {
    place_on_roofline(Ceilings{}, 1);
    FAIL() << "no ceilings";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidInput);
  }
}

TEST(RooflineTargetParse, Names) {
  EXPECT_EQ(parse_roofline_target("auto"), RooflineTarget::kAuto);
  EXPECT_EQ(parse_roofline_target("cpu"), RooflineTarget::kCpu);
  EXPECT_EQ(parse_roofline_target("gpu"), RooflineTarget::kGpu);
  try {
    parse_roofline_target("tpu");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
  }
}

TEST(RooflineGpu, AutoFallsBackToCpuWithTheReasonWhenTheGpuBinarySaysNoGpu) {
  FakeGpuBinary fake("echo 'gpuckpt-roofline-gpu: no CUDA device found' >&2; exit 7");
  const Ceilings c = measure_ceilings(RooflineTarget::kAuto, quick());
  EXPECT_EQ(c.target, "cpu");
  EXPECT_GT(c.bandwidth_gbps, 0);
  EXPECT_NE(c.note.find("no CUDA device found"), std::string::npos) << c.note;
  try {
    measure_ceilings(RooflineTarget::kGpu, quick());
    FAIL() << "kGpu without a GPU must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kNoDevice);
    EXPECT_NE(std::string(e.what()).find("no CUDA device found"), std::string::npos);
  }
}

TEST(RooflineGpu, MissingBinaryFallsBackAndIsNoDeviceWhenRequested) {
  ::setenv("GPUCKPT_ROOFLINE_GPU", "/nonexistent/gpuckpt-roofline-gpu", 1);
  const Ceilings c = measure_ceilings(RooflineTarget::kAuto, quick());
  EXPECT_EQ(c.target, "cpu");
  EXPECT_NE(c.note.find("/nonexistent/gpuckpt-roofline-gpu"), std::string::npos) << c.note;
  try {
    measure_ceilings(RooflineTarget::kGpu, quick());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kNoDevice);
  }
  ::unsetenv("GPUCKPT_ROOFLINE_GPU");
}

TEST(RooflineGpu, ParsesTheKernelsBinaryOutputAndPassesQuick) {
  // The stand-in checks it was called the way gpuckpt-roofline-gpu expects.
  FakeGpuBinary fake(
      "[ \"$1 $2 $3\" = '--device 0 --quick' ] || { echo \"bad args: $*\" >&2; exit 2; }\n"
      "echo '{\"device_name\": \"NVIDIA H200\", \"bandwidth_gbps\": 4315.2, \"fp32_gflops\": "
      "59000.5, \"tensor_gflops\": 480000.0, \"details\": {\"copy_gbps\": 4315.2}}'");
  const Ceilings c = measure_ceilings(RooflineTarget::kAuto, quick());
  EXPECT_EQ(c.target, "gpu");
  EXPECT_EQ(c.device_name, "NVIDIA H200");
  EXPECT_EQ(c.bandwidth_gbps, 4315.2);
  EXPECT_EQ(c.fp32_gflops, 59000.5);
  ASSERT_TRUE(c.tensor_gflops);
  EXPECT_EQ(*c.tensor_gflops, 480000.0);
  EXPECT_EQ(c.details.at("copy_gbps").get<double>(), 4315.2);
}

TEST(RooflineGpu, BrokenGpuBinaryIsADeviceErrorAndAutoStillAnswers) {
  {
    FakeGpuBinary fake("echo 'not json'");
    try {
      measure_ceilings(RooflineTarget::kGpu, quick());
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kDevice);
    }
  }
  FakeGpuBinary fake("echo 'cudaMalloc: out of memory' >&2; exit 8");
  try {
    measure_ceilings(RooflineTarget::kGpu, quick());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kDevice);
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  }
  EXPECT_EQ(measure_ceilings(RooflineTarget::kAuto, quick()).target, "cpu");
  EXPECT_THROW(parse_gpu_ceilings_json("{\"device_name\": \"x\", \"bandwidth_gbps\": 0}"), Error);
}

TEST(RooflineGpu, RealKernelsBinaryWithoutAGpuFallsBack) {
  const fs::path real = test::bin_dir() / "gpuckpt-roofline-gpu";
  if (!fs::exists(real)) GTEST_SKIP() << "gpuckpt-roofline-gpu not built (no nvcc)";
  if (!list_devices().gpus.empty()) GTEST_SKIP() << "a GPU is present: the fallback is not taken";
  ::setenv("GPUCKPT_ROOFLINE_GPU", real.c_str(), 1);
  const Ceilings c = measure_ceilings(RooflineTarget::kAuto, quick());
  ::unsetenv("GPUCKPT_ROOFLINE_GPU");
  EXPECT_EQ(c.target, "cpu");
  EXPECT_NE(c.note.find("auto: CPU"), std::string::npos) << c.note;
}

TEST(RooflineGpu, RealKernelsBinaryOnAGpu) {
  const fs::path real = test::bin_dir() / "gpuckpt-roofline-gpu";
  if (!fs::exists(real)) GTEST_SKIP() << "gpuckpt-roofline-gpu not built (no nvcc)";
  if (list_devices().gpus.empty()) GTEST_SKIP() << "no GPU on this machine";
  ::setenv("GPUCKPT_ROOFLINE_GPU", real.c_str(), 1);
  const Ceilings c = measure_ceilings(RooflineTarget::kGpu, quick());
  ::unsetenv("GPUCKPT_ROOFLINE_GPU");
  EXPECT_EQ(c.target, "gpu");
  EXPECT_GT(c.bandwidth_gbps, 10);
  EXPECT_GT(c.fp32_gflops, 100);
}

TEST(RooflineKernels, EveryIsaComputesTheSameResults) {
  std::vector<Isa> isas{Isa::kBaseline};
  if (best_isa() >= Isa::kAvx2Fma) isas.push_back(Isa::kAvx2Fma);
  if (best_isa() >= Isa::kAvx512) isas.push_back(Isa::kAvx512);
  constexpr int n = 128;  // multiple of 64; rows in blocks of 4
  alignas(64) static float a[n * n], b[n * n], c[n * n], ref[n * n];
  for (int i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.25f;
    b[i] = static_cast<float>(i % 5) * 0.5f;
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 1;  // C starts at 1: the kernel accumulates into C
      for (int k = 0; k < n; ++k) s += static_cast<double>(a[i * n + k]) * b[k * n + j];
      ref[i * n + j] = static_cast<float>(s);
    }
  alignas(64) static double x[1024], y[1024], z[1024];
  alignas(64) static float f[1024];
  for (int i = 0; i < 1024; ++i) {
    y[i] = i;
    z[i] = 2 * i;
    f[i] = static_cast<float>(i % 10) * 0.05f;
  }
  // fma_stream's checksum: 8 chains per vector lane, acc = acc*v + 1e-3 twice per element; lane l
  // of an L-lane vector sees elements l, l+L, l+2L, ...
  auto fma_stream_ref = [&](int lanes) {
    double sum = 0;
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < lanes; ++l) {
        double acc = 1e-3 * (j + 1);
        for (int i = l; i < 1024; i += lanes)
          for (int r = 0; r < 2; ++r) acc = acc * f[i] + 1e-3;
        sum += acc;
      }
    return sum;
  };
  for (Isa isa : isas) {
    const CpuKernels& k = cpu_kernels(isa);
    ASSERT_EQ(k.isa, isa);
    std::fill(c, c + n * n, 1.0f);
    k.sgemm_rows(a, b, c, n, 0, n / 2);
    k.sgemm_rows(a, b, c, n, n / 2, n);
    for (int i = 0; i < n * n; ++i) ASSERT_FLOAT_EQ(c[i], ref[i]) << isa_name(isa) << " at " << i;
    k.triad(x, y, z, 0.5, 1024);
    for (int i = 0; i < 1024; ++i) ASSERT_EQ(x[i], 2.0 * i) << isa_name(isa);
    k.copy(x, z, 1024);
    EXPECT_EQ(x[1023], 2046.0);
    EXPECT_EQ(k.read(y, 1024), 1023.0 * 1024 / 2) << isa_name(isa);
    const double want = fma_stream_ref(k.vector_bytes / 4);
    EXPECT_NEAR(k.fma_stream(f, 1024), want, 1e-4 * want) << isa_name(isa);
    alignas(64) float out[16 * 16];
    std::fill(out, out + 256, 0.5f);
    k.fma_peak(out, 1000);
    EXPECT_TRUE(std::isfinite(out[0]));
    EXPECT_NE(out[0], 0.5f);
    EXPECT_GT(k.peak_flops_per_iter, 0);
  }
}

TEST(RooflineKernels, BuiltInKernelsReportTheirIntensity) {
  auto triad = run_cpu_kernel("triad", quick());
  EXPECT_DOUBLE_EQ(triad.intensity, 2.0 / 24);
  EXPECT_GT(triad.achieved_gflops, 0);
  auto fma = run_cpu_kernel("fma", quick());
  EXPECT_DOUBLE_EQ(fma.intensity, 8);
  EXPECT_GT(fma.achieved_gflops, 0);
  auto mm = run_cpu_kernel("matmul", quick());
  EXPECT_DOUBLE_EQ(mm.intensity, 512.0 / 8);
  EXPECT_EQ(mm.flops, 2ULL * 512 * 512 * 512);
  EXPECT_GT(mm.achieved_gflops, 0);
  try {
    run_cpu_kernel("gemv", quick());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
  }
}

TEST(RooflineThreadTeam, RunsEveryWorkerOncePerRun) {
  ThreadTeam team(3);
  ASSERT_EQ(team.size(), 3u);
  std::atomic<int> mask{0}, calls{0};
  const double s = team.best_of(4, [&](unsigned i) {
    mask |= 1 << i;
    ++calls;
  });
  EXPECT_EQ(mask.load(), 0b111);
  EXPECT_EQ(calls.load(), 12);
  EXPECT_GE(s, 0);
}
