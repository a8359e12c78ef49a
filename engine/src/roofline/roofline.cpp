#include "gpuckpt/roofline.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "gpuckpt/error.h"
#include "roofline/measure.h"

namespace gpuckpt {

RooflineTarget parse_roofline_target(const std::string& s) {
  if (s == "auto") return RooflineTarget::kAuto;
  if (s == "cpu") return RooflineTarget::kCpu;
  if (s == "gpu") return RooflineTarget::kGpu;
  throw Error(Errc::kUsage, "bad roofline target '" + s + "': expected auto, cpu or gpu");
}

Ceilings measure_ceilings(RooflineTarget target, const MeasureOptions& opts) {
  switch (target) {
    case RooflineTarget::kCpu: {
      Ceilings c = measure_cpu_ceilings(opts);
      c.note = "CPU requested";
      return c;
    }
    case RooflineTarget::kGpu: {
      Ceilings c = measure_gpu_ceilings(opts);
      c.note = "GPU requested";
      return c;
    }
    case RooflineTarget::kAuto:
      break;
  }
  try {
    Ceilings c = measure_gpu_ceilings(opts);
    c.note = "auto: the GPU kernels ran";
    return c;
  } catch (const Error& e) {
    // Any GPU failure (no binary, no GPU, a driver error, a timeout) falls back to the host.
    spdlog::debug("roofline: GPU not measured ({}); measuring the CPU", e.what());
    Ceilings c = measure_cpu_ceilings(opts);
    c.note = std::string("auto: CPU, because the GPU could not be measured: ") + e.what();
    return c;
  }
}

RooflinePlacement place_on_roofline(const Ceilings& c, double intensity,
                                    std::optional<double> achieved_gflops) {
  if (!(intensity > 0) || !std::isfinite(intensity))
    throw Error(Errc::kUsage, "arithmetic intensity must be a positive number of FLOP/byte");
  if (achieved_gflops && (!(*achieved_gflops >= 0) || !std::isfinite(*achieved_gflops)))
    throw Error(Errc::kUsage, "achieved GFLOP/s must be a non-negative number");
  if (!(c.bandwidth_gbps > 0) || !(c.fp32_gflops > 0))
    throw Error(Errc::kInvalidInput, "roofline ceilings are missing (bandwidth and FP32 peak)");
  RooflinePlacement p;
  p.intensity = intensity;
  const double memory_roof = intensity * c.bandwidth_gbps;
  p.attainable_gflops = std::min(c.fp32_gflops, memory_roof);
  p.memory_bound = memory_roof < c.fp32_gflops;
  p.achieved_gflops = achieved_gflops;
  p.label = "workload";
  return p;
}

}  // namespace gpuckpt
