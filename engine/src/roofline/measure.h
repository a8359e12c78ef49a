// The measurements behind measure_ceilings(): this host's CPUs, or a GPU through the
// gpuckpt-roofline-gpu kernels binary.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "gpuckpt/roofline.h"

namespace gpuckpt {

Ceilings measure_cpu_ceilings(const MeasureOptions& opts);

// $GPUCKPT_ROOFLINE_GPU if set, else gpuckpt-roofline-gpu beside the running binary (or in the
// sibling bin/ directory, where the test binaries of a build tree find it).
std::optional<std::filesystem::path> find_roofline_gpu_binary();
// Runs it. Throws Error(kNoDevice) when it is missing or finds no GPU (its exit code 7),
// Error(kDevice) when it fails otherwise or prints something unparsable.
Ceilings measure_gpu_ceilings(const MeasureOptions& opts);
// Parses its stdout: {"device_name","bandwidth_gbps","fp32_gflops","tensor_gflops","details"}.
Ceilings parse_gpu_ceilings_json(const std::string& text);

}  // namespace gpuckpt
