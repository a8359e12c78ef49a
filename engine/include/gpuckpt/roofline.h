// Roofline ceilings measured by our own kernels (GPU) or loops (CPU), never looked up.
#pragma once

#include <optional>
#include <string>

namespace gpuckpt {

struct Ceilings {
  std::string target;       // "gpu" or "cpu"
  std::string device_name;  // e.g. "NVIDIA H200" or the CPU model
  double bandwidth_gbps = 0;              // peak streaming memory bandwidth, GB/s
  double fp32_gflops = 0;                 // peak FMA throughput, GFLOP/s
  std::optional<double> tensor_gflops;    // bf16/fp16 tensor-core peak, GFLOP/s (GPU only)
  double ridge_point() const { return bandwidth_gbps > 0 ? fp32_gflops / bandwidth_gbps : 0; }
};

enum class RooflineTarget { kAuto, kCpu, kGpu };
Ceilings measure_ceilings(RooflineTarget target = RooflineTarget::kAuto);

struct RooflinePlacement {
  double intensity = 0;       // FLOP/byte
  double attainable_gflops = 0;
  bool memory_bound = false;
  std::optional<double> achieved_gflops;  // when measured
};
RooflinePlacement place_on_roofline(const Ceilings& c, double intensity,
                                    std::optional<double> achieved_gflops = {});

}  // namespace gpuckpt
