// `gpuckpt devices` (the GPUs and what the driver supports) and `gpuckpt cuda-checkpoint` (one
// step of the CUDA checkpoint API on a live process, for scripts and debugging).
#include <cstdio>
#include <iostream>

#include "commands.h"

namespace gpuckpt::cli {

namespace {

nlohmann::json driver_json(const DriverStatus& d) {
  return {{"loaded", d.loaded},
          {"error", d.error},
          {"library", d.library},
          {"cuda_version", d.driver_version},
          {"cuda_version_string", d.driver_version ? cuda_version_string(d.driver_version) : ""},
          {"kernel_module_version", d.kernel_module_version},
          {"checkpoint_api", d.checkpoint_api},
          {"gpu_remap", d.gpu_remap},
          {"checkpoint_error", d.checkpoint_error}};
}

nlohmann::json gpu_json(const GpuInfo& g) {
  nlohmann::json j = {{"index", g.index},
                      {"name", g.name},
                      {"uuid", g.uuid},
                      {"pci_bus_id", g.pci_bus_id},
                      {"total_memory", g.total_memory},
                      {"used_memory", nullptr},
                      {"compute_capability",
                       std::to_string(g.compute_major) + "." + std::to_string(g.compute_minor)},
                      {"multiprocessors", g.multiprocessors}};
  if (g.used_memory) j["used_memory"] = *g.used_memory;
  return j;
}

}  // namespace

nlohmann::json devices_json(const DeviceList& list) {
  const bool none = !list.driver.loaded || list.gpus.empty();
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : list.gpus) gpus.push_back(gpu_json(g));
  nlohmann::json j = {{"ok", !none}, {"driver", driver_json(list.driver)}, {"gpus", gpus}};
  if (none) j["reason"] = "no NVIDIA GPU: " + list.driver.error;
  return j;
}

namespace {

void run_devices(Context& ctx) {
  const DeviceList list = list_devices();
  const bool none = !list.driver.loaded || list.gpus.empty();
  if (ctx.json) {
    ctx.emit(devices_json(list));
  } else if (none) {
    std::cerr << "no NVIDIA GPU: " << list.driver.error << "\n";
  } else {
    const auto& d = list.driver;
    std::printf(
        "driver: %s%s, checkpoint API: %s, GPU remap: %s\n",
        cuda_version_string(d.driver_version).c_str(),
        d.kernel_module_version.empty() ? "" : (", NVIDIA " + d.kernel_module_version).c_str(),
        d.checkpoint_api ? "yes" : "no", d.gpu_remap ? "yes" : "no");
    if (!d.checkpoint_error.empty()) std::printf("note: %s\n", d.checkpoint_error.c_str());
    std::printf("%-4s %-24s %-41s %-12s %-12s %-5s %-5s %s\n", "IDX", "NAME", "UUID", "MEMORY",
                "USED", "CC", "SMS", "PCI");
    for (const auto& g : list.gpus) {
      const std::string cc =
          std::to_string(g.compute_major) + "." + std::to_string(g.compute_minor);
      std::printf("%-4d %-24s %-41s %-12s %-12s %-5s %-5d %s\n", g.index, g.name.c_str(),
                  g.uuid.c_str(), human_bytes(g.total_memory).c_str(),
                  g.used_memory ? human_bytes(*g.used_memory).c_str() : "-", cc.c_str(),
                  g.multiprocessors, g.pci_bus_id.c_str());
    }
  }
  // No GPU is this command's answer, not an engine error: it exits with kNoDevice after its
  // own output (one JSON document with --json), instead of main's generic error.
  if (none) ctx.exit_code = static_cast<int>(Errc::kNoDevice);
}

std::string optional_bytes(const std::optional<std::uint64_t>& b) {
  return b ? human_bytes(*b) : "unknown (no NVML)";
}

}  // namespace

void add_device_commands(CLI::App& app, Context& ctx) {
  auto* devices = app.add_subcommand(
      "devices", "List NVIDIA GPUs and the driver's checkpoint support (exit 7 without a GPU)");
  devices->callback([&ctx] { run_devices(ctx); });

  struct CkptOpts {
    pid_t pid = 0;
    std::string action, gpu_map;
    long timeout_ms = 10000;
  };
  auto o = std::make_shared<CkptOpts>();
  auto* ck = app.add_subcommand(
      "cuda-checkpoint",
      "One step of the CUDA checkpoint API on a live process (debugging, scripts)");
  ck->add_option("--pid,-p", o->pid, "The CUDA process")->required()->check(CLI::PositiveNumber);
  ck->add_option("--action,-a", o->action, "state|lock|checkpoint|restore|unlock|suspend|resume")
      ->required();
  ck->add_option("--timeout-ms", o->timeout_ms, "Lock timeout in ms (0 = wait indefinitely)")
      ->check(CLI::NonNegativeNumber);
  ck->add_option("--gpu-map", o->gpu_map,
                 "Restore onto other GPUs: OLD=NEW[,...] (UUIDs or indices)");
  ck->callback([&ctx, o] {
    CudaActionOptions opts;
    opts.pid = o->pid;
    opts.action = parse_cuda_action(o->action);
    opts.lock_timeout = std::chrono::milliseconds(o->timeout_ms);
    if (!o->gpu_map.empty()) {
      if (opts.action != CudaAction::kRestore && opts.action != CudaAction::kResume)
        throw Error(Errc::kUsage, "--gpu-map applies to the restore and resume actions only");
      opts.gpu_map = parse_gpu_map(o->gpu_map);
    }
    const CudaActionResult r = run_cuda_action(opts);
    if (ctx.json) {
      nlohmann::json j = {{"ok", true},
                          {"pid", r.pid},
                          {"action", std::string(to_string(opts.action))},
                          {"state_before", to_string(r.state_before)},
                          {"state_after", to_string(r.state_after)},
                          {"restore_tid", r.restore_tid},
                          {"gpu_memory_used_before", nullptr},
                          {"gpu_memory_used_after", nullptr},
                          {"timeline", timeline_json(r.timeline)}};
      if (r.gpu_memory_used_before) j["gpu_memory_used_before"] = *r.gpu_memory_used_before;
      if (r.gpu_memory_used_after) j["gpu_memory_used_after"] = *r.gpu_memory_used_after;
      if (!opts.gpu_map.empty()) j["gpu_map"] = opts.gpu_map.to_string();
      ctx.emit(j);
      return;
    }
    std::printf("process %d: %s -> %s\n", r.pid, std::string(to_string(r.state_before)).c_str(),
                std::string(to_string(r.state_after)).c_str());
    if (!r.timeline.stages().empty()) print_stages(r.timeline);
    std::printf("GPU memory used (all GPUs): %s -> %s\n",
                optional_bytes(r.gpu_memory_used_before).c_str(),
                optional_bytes(r.gpu_memory_used_after).c_str());
  });
}

}  // namespace gpuckpt::cli
