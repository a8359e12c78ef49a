#include <spdlog/spdlog.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "roofline/measure.h"
#include "util/fs.h"
#include "util/subprocess.h"

namespace fs = std::filesystem;

namespace gpuckpt {

namespace {
constexpr const char* kGpuBinary = "gpuckpt-roofline-gpu";
constexpr int kExitNoGpu = 7;  // gpuckpt-roofline-gpu's "no GPU" (= Errc::kNoDevice)

std::string last_line(const std::string& s) {
  auto end = s.find_last_not_of("\n \t");
  if (end == std::string::npos) return "";
  auto begin = s.rfind('\n', end);
  return s.substr(begin == std::string::npos ? 0 : begin + 1,
                  end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}
}  // namespace

std::optional<fs::path> find_roofline_gpu_binary() {
  if (const char* env = std::getenv("GPUCKPT_ROOFLINE_GPU"); env && *env) return fs::path(env);
  const fs::path dir = self_exe_dir();
  for (const fs::path& cand : {dir / kGpuBinary, dir.parent_path() / "bin" / kGpuBinary}) {
    if (auto p = find_executable(cand.string())) return p;
  }
  return std::nullopt;
}

Ceilings parse_gpu_ceilings_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::kDevice, std::string(kGpuBinary) + " printed no valid JSON: " + e.what());
  }
  auto number = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number() || j[key].get<double>() <= 0)
      throw Error(Errc::kDevice,
                  std::string(kGpuBinary) + " output lacks a positive '" + key + "'");
    return j[key].get<double>();
  };
  if (!j.is_object() || !j.contains("device_name") || !j["device_name"].is_string())
    throw Error(Errc::kDevice, std::string(kGpuBinary) + " output lacks 'device_name'");
  Ceilings c;
  c.target = "gpu";
  c.device_name = j["device_name"].get<std::string>();
  c.bandwidth_gbps = number("bandwidth_gbps");
  c.fp32_gflops = number("fp32_gflops");
  if (j.contains("tensor_gflops") && j["tensor_gflops"].is_number() &&
      j["tensor_gflops"].get<double>() > 0)
    c.tensor_gflops = j["tensor_gflops"].get<double>();
  const auto details = j.value("details", nlohmann::json::object());
  c.details = details.is_object() ? details : nlohmann::json::object();
  c.method = std::string("GPU kernels (") + kGpuBinary + "): streaming copy/triad bandwidth, " +
             "FP32 FMA chains" +
             (c.tensor_gflops ? ", bf16 tensor-core mma.sync (not wgmma: understates Hopper)" : "");
  return c;
}

Ceilings measure_gpu_ceilings(const MeasureOptions& opts) {
  const auto bin = find_roofline_gpu_binary();
  if (!bin)
    throw Error(Errc::kNoDevice, std::string(kGpuBinary) + " not found next to " +
                                     self_exe_dir().string() +
                                     " (it is built only where nvcc is available)");
  std::vector<std::string> argv{bin->string(), "--device", std::to_string(opts.gpu_index)};
  if (opts.quick) argv.push_back("--quick");
  TempDir tmp(fs::temp_directory_path(), "gpuckpt-roofline");
  SpawnOptions so;
  so.stderr_file = tmp.path() / "stderr";
  spdlog::debug("roofline: running {}", bin->string());
  RunResult r;
  try {
    r = run_capture(argv, opts.gpu_timeout, so);
  } catch (const Error& e) {
    if (e.code() == Errc::kInvalidInput) throw Error(Errc::kNoDevice, e.what());  // cannot exec
    throw;
  }
  std::string err;
  std::error_code ec;
  if (fs::exists(so.stderr_file, ec)) err = last_line(read_file(so.stderr_file));
  if (r.status.exited && r.status.code == kExitNoGpu)
    throw Error(Errc::kNoDevice, "no GPU" + (err.empty() ? "" : ": " + err));
  if (!r.status.ok())
    throw Error(Errc::kDevice, std::string(kGpuBinary) + " failed (" + r.status.describe() + ")" +
                                   (err.empty() ? "" : ": " + err));
  Ceilings c = parse_gpu_ceilings_json(r.output);
  c.method += ", CUDA device " + std::to_string(opts.gpu_index);
  return c;
}

}  // namespace gpuckpt
