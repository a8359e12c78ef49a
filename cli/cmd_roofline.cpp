// `gpuckpt roofline`: measures the device's ceilings and places a workload (or a built-in CPU
// kernel) under them.
#include <cstdio>

#include "commands.h"

namespace gpuckpt::cli {

namespace {

struct RooflineArgs {
  std::string target = "auto";
  std::optional<double> intensity;
  std::optional<double> achieved;
  std::string kernel;
  bool quick = false;
  unsigned threads = 0;
  int gpu = 0;
  // --transient: the checkpoint path's ceilings too (floors of the transient report).
  bool transient = false;
  std::string dir = "/var/tmp", sample, bytes = "1G", network, ssh_config;
  int level = 1;
  double settle_s = 30;
};

std::string sig3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : v >= 1 ? "%.2f" : "%.3g", v);
  return b;
}

void print_human(const Ceilings& c, const std::optional<RooflinePlacement>& p,
                 const std::optional<KernelMeasurement>& k) {
  std::printf("roofline (%s): %s\n", c.target.c_str(), c.device_name.c_str());
  std::printf("  %-20s %s GB/s\n", "memory bandwidth", sig3(c.bandwidth_gbps).c_str());
  std::printf("  %-20s %s GFLOP/s\n", "FP32 peak", sig3(c.fp32_gflops).c_str());
  if (c.tensor_gflops)
    // Our kernel uses mma.sync, which understates Hopper (wgmma reaches ~790 TFLOP/s bf16).
    std::printf("  %-20s %s GFLOP/s (bf16 mma.sync, not wgmma)\n", "tensor peak",
                sig3(*c.tensor_gflops).c_str());
  std::printf("  %-20s %s FLOP/byte (memory-bound left of it)\n", "ridge point",
              sig3(c.ridge_point()).c_str());
  std::printf("  %-20s %s\n", "measured", c.method.c_str());
  if (!c.note.empty()) std::printf("  %-20s %s\n", "note", c.note.c_str());
  if (k) {
    std::printf("kernel %s: %s\n", k->name.c_str(), k->description.c_str());
    std::printf("  %-20s %s GFLOP/s in %s s\n", "achieved", sig3(k->achieved_gflops).c_str(),
                sig3(k->seconds).c_str());
  }
  if (p) {
    std::printf("%s at %s FLOP/byte: %s, attainable %s GFLOP/s", p->label.c_str(),
                sig3(p->intensity).c_str(), p->memory_bound ? "memory-bound" : "compute-bound",
                sig3(p->attainable_gflops).c_str());
    if (p->achieved_gflops && p->attainable_gflops > 0)
      std::printf(", achieved %s GFLOP/s (%.0f%% of attainable)", sig3(*p->achieved_gflops).c_str(),
                  100 * *p->achieved_gflops / p->attainable_gflops);
    std::printf("\n");
  }
}

void run_roofline(const RooflineArgs& a, Context& ctx) {
  const RooflineTarget target = parse_roofline_target(a.target);
  if (!a.kernel.empty() && a.intensity)
    throw Error(Errc::kUsage, "--kernel measures its own intensity: drop --intensity");
  if (a.achieved && !a.intensity)
    throw Error(Errc::kUsage, "--achieved needs --intensity (where the workload sits)");
  MeasureOptions mo;
  mo.quick = a.quick;
  mo.threads = a.threads;
  mo.gpu_index = a.gpu;
  const Ceilings c = measure_ceilings(target, mo);
  std::optional<KernelMeasurement> kernel;
  std::optional<RooflinePlacement> placement;
  if (!a.kernel.empty()) {
    if (c.target != "cpu")
      throw Error(Errc::kUsage,
                  "--kernel runs a CPU kernel; place it on the CPU roofline with "
                  "--target cpu");
    kernel = run_cpu_kernel(a.kernel, mo);
    placement = place_on_roofline(c, kernel->intensity, kernel->achieved_gflops);
    placement->label = kernel->name;
  } else if (a.intensity) {
    placement = place_on_roofline(c, *a.intensity, a.achieved);
  }
  std::optional<PathCeilings> path;
  if (a.transient) {
    PathMeasureOptions po;
    po.dir = a.dir;
    po.sample = a.sample;
    po.bytes = parse_bytes(a.bytes);
    po.zstd_level = a.level;
    po.network = a.network;
    po.ssh_config = a.ssh_config;
    po.settle_limit_s = a.settle_s;
    path = measure_path_ceilings(po);
    if (c.target == "gpu") path_from_gpu_ceilings(c, *path);
  }
  if (ctx.json) {
    ctx.emit_ordered(roofline_json(c, placement, kernel, path));
  } else {
    print_human(c, placement, kernel);
    if (path) std::printf("%s", render_path(*path).c_str());
  }
}

}  // namespace

void add_roofline_commands(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<RooflineArgs>();
  auto* cmd = app.add_subcommand(
      "roofline",
      "Measure the roofline ceilings (memory bandwidth, FP32/tensor peak) and place a "
      "workload under them");
  cmd->add_option("--target", args->target, "auto (GPU if one answers, else CPU), cpu or gpu")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}));
  cmd->add_option("--intensity", args->intensity,
                  "Workload arithmetic intensity, FLOP per byte of memory traffic")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--achieved", args->achieved, "Workload's measured GFLOP/s (needs --intensity)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kernel", args->kernel, "Run and place a built-in CPU kernel")
      ->check(CLI::IsMember(cpu_kernel_names()));
  cmd->add_flag("--quick", args->quick, "Smaller, faster measurement (less precise)");
  cmd->add_option("--threads", args->threads, "CPU threads (default: every allowed CPU)");
  cmd->add_option("--gpu", args->gpu, "CUDA device index to measure")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--transient", args->transient,
                "Also measure the checkpoint path's ceilings, the floors of the transient "
                "report: durable O_DIRECT write and read on --dir, memory fill (4 KiB and huge "
                "pages), memcpy, zstd per core on --sample (and PCIe from a GPU roofline)");
  cmd->add_option("--dir", args->dir,
                  "--transient: a directory on the checkpoints' filesystem (a scratch file of "
                  "--bytes is written there and removed)");
  cmd->add_option("--sample", args->sample,
                  "--transient: zstd's sample, a checkpoint or any file (default: generated, "
                  "half incompressible, half fp16-like)");
  cmd->add_option("--bytes", args->bytes, "--transient: bytes written and read back (e.g. 1G)");
  cmd->add_option("--level", args->level, "--transient: zstd level, as dump --level")
      ->check(CLI::Range(-7, 22));
  cmd->add_option("--network", args->network,
                  "--transient: a migration target, ssh://[USER@]HOST[:PORT]: up to 512 MiB "
                  "through one OpenSSH connection into /dev/null there (the link's ceiling)");
  cmd->add_option("--ssh-config", args->ssh_config, "--network: ssh configuration file (ssh -F)");
  cmd->add_option("--settle", args->settle_s,
                  "--transient: at most this many seconds waiting for the VM's free page "
                  "reporting to settle before the memory fill, so that it meets memory as a "
                  "restore on an idle node does (0: memory as found)")
      ->check(CLI::NonNegativeNumber);
  cmd->fallthrough();  // global flags (--json, -q) may also follow the command
  cmd->callback([args, &ctx] { run_roofline(*args, ctx); });
}

}  // namespace gpuckpt::cli
