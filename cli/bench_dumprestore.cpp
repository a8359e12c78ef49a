// `gpuckpt bench dump`: dump and restore side by side, gpuckpt streaming vs gpuckpt staged vs
// plain CRIU on the same disk (or, --container, gpuckpt vs runc's checkpoint and restore), as
// time ratios and peak extra host memory (docs/PERFORMANCE.md).
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "flags.h"
#include "gpuckpt/bench.h"
#include "gpuckpt/names.h"

namespace gpuckpt::cli {

namespace {

struct DumpBenchArgs {
  std::string dir, staging = "/dev/shm", size = "1G";
  DumpRestoreBenchOptions::Content content = DumpRestoreBenchOptions::Content::kMixed;
  DumpRestoreBenchOptions::Memory memory = DumpRestoreBenchOptions::Memory::kCold;
  unsigned runs = 3;
  bool container = false;
  CriuFlags criu;
};

// gpuckpt's floors in this run: its images, as compressed in it, through the path's ceilings; a
// restore into huge pages (the default) or 4 KiB ones (stream-4k, criu, runc).
struct Floors {
  std::optional<Floor> dump, restore, restore_4k;
  const std::optional<Floor>& restore_of(const std::string& m) const {
    return m == "stream" || m == "staged" || m == "container" ? restore : restore_4k;
  }
};

Floors floors_of(const DumpBenchArgs& a, const DumpRestoreBenchResult& r,
                 const PathCeilings& path) {
  FloorContext ctx_huge, ctx_small;
  const std::string streamed = a.container ? "container" : "stream";
  if (r.checkpoint_bytes.count(streamed) && r.checkpoint_bytes.at(streamed) > 0)
    ctx_huge.zstd_ratio = ctx_small.zstd_ratio =
        static_cast<double>(r.process_bytes) / static_cast<double>(r.checkpoint_bytes.at(streamed));
  ctx_huge.huge_pages = true;
  // The bench's dumps write to a local disk with the default --compress auto.
  ctx_huge.adaptive_compression = ctx_small.adaptive_compression =
      compression_adapts(Compression::kAuto, false);
  Timeline dump_tl, restore_tl;
  // A streamed dump copies the pages out of CRIU's pipe as well: part of its CPU budget.
  dump_tl.add_measured(stage::kCriuDump, 0, r.process_bytes);
  dump_tl.add_measured(stage::kCompressWrite, 0, r.process_bytes);
  restore_tl.add_measured(stage::kReadDecompress, 0, r.process_bytes);
  restore_tl.add_measured(stage::kCriuRestoreTasks, 0, r.process_bytes);
  return {transient_floor(dump_tl, path, ctx_huge), transient_floor(restore_tl, path, ctx_huge),
          transient_floor(restore_tl, path, ctx_small)};
}

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}
double pct(const std::optional<Floor>& f, double s) {
  return f ? f->percent_of(s) : 0.0;
}
nlohmann::json floor_json(const std::optional<Floor>& f) {
  return f ? nlohmann::json{{"seconds", f->seconds}, {"bound", f->bound}} : nlohmann::json();
}

nlohmann::json floors_beaten(const DumpRestoreBenchResult& r, const Floors& fl) {
  // A method faster than its floor means the ceilings measured less than the path did in this
  // run (a cache below this machine, such as a VM host's page cache under a virtual disk, or a
  // noisy measurement): that floor is not one here, and the ratios to plain CRIU are what hold.
  nlohmann::json beaten = nlohmann::json::array();
  for (const auto& m : r.methods)
    for (const auto& [side, p] :
         {std::pair{"dump", pct(fl.dump, m.dump_median)},
          std::pair{"restore", pct(fl.restore_of(m.name), m.restore_median)}})
      if (p > 100.5) {
        beaten.push_back({{"method", m.name}, {"side", side}, {"percent_of_floor", p}});
        spdlog::warn(
            "{}'s {} beat its floor ({:.0f}%): this run's path ceilings measured less than the "
            "path did (a cache below this machine, or a noisy measurement), so that floor is not "
            "one here; compare with plain CRIU instead",
            m.name, side, p);
      }
  return beaten;
}

void emit_json(const DumpBenchArgs& a, const DumpRestoreBenchResult& r, const PathCeilings& path,
               const Floors& fl, Context& ctx) {
  // What a user would use instead: plain criu, or runc for a container.
  const DumpRestoreBenchMethod* plain = &r.methods.back();
  nlohmann::json methods = nlohmann::json::array();
  for (const auto& m : r.methods)
    methods.push_back({{"name", m.name},
                       {"dump_seconds", m.dump_seconds},
                       {"dump_exit_seconds", m.dump_exit_seconds},
                       {"restore_seconds", m.restore_seconds},
                       {"dump_extra_bytes", m.dump_extra_bytes},
                       {"restore_extra_bytes", m.restore_extra_bytes},
                       {"dump_median_seconds", m.dump_median},
                       {"dump_exit_median_seconds", m.dump_exit_median},
                       {"restore_median_seconds", m.restore_median},
                       {"dump_extra_median_bytes", m.dump_extra_median},
                       {"restore_extra_median_bytes", m.restore_extra_median},
                       {"dump_time_vs_plain", ratio(m.dump_median, plain->dump_median)},
                       {"restore_time_vs_plain", ratio(m.restore_median, plain->restore_median)},
                       {"dump_percent_of_floor", pct(fl.dump, m.dump_median)},
                       {"restore_percent_of_floor", pct(fl.restore_of(m.name), m.restore_median)},
                       {"checkpoint_bytes",
                        r.checkpoint_bytes.count(m.name) ? r.checkpoint_bytes.at(m.name) : 0}});
  if (plain->name == "criu")  // the names of before the container methods
    for (auto& j : methods) {
      j["dump_time_vs_criu"] = j["dump_time_vs_plain"];
      j["restore_time_vs_criu"] = j["restore_time_vs_plain"];
    }
  ctx.emit({{"bench", "dump"},
            {"process_bytes", r.process_bytes},
            {"content", bench_content_name(a.content)},
            {"memory", bench_memory_name(a.memory)},
            {"runs", a.runs},
            {"plain", plain->name},
            {"floors",
             {{"dump", floor_json(fl.dump)},
              {"restore", floor_json(fl.restore)},
              {"restore_4k", floor_json(fl.restore_4k)}}},
            {"floors_beaten", floors_beaten(r, fl)},
            {"path", path_json(path)},
            {"methods", methods}});
}

void print_table(const DumpBenchArgs& a, const DumpRestoreBenchResult& r, const PathCeilings& path,
                 const Floors& fl) {
  const DumpRestoreBenchMethod* plain = &r.methods.back();
  std::printf(
      "dump and restore of a %s process%s (%s weights), median of %u runs, on %s, restores into "
      "%s memory:\n",
      human_bytes(r.process_bytes).c_str(), a.container ? " in a runc container" : "",
      bench_content_name(a.content), a.runs, a.dir.c_str(), bench_memory_name(a.memory));
  const std::string vs = "vs " + plain->name;
  std::printf("%-9s %10s %8s %8s %10s %12s %7s   %10s %8s %8s %12s %7s %11s\n", "method", "dump",
              vs.c_str(), "of floor", "exited", "extra mem", "of proc", "restore", vs.c_str(),
              "of floor", "extra mem", "of proc", "on disk");
  for (const auto& m : r.methods) {
    const double pb = static_cast<double>(r.process_bytes);
    std::printf(
        "%-9s %10s %7.2fx %7.0f%% %10s %12s %6.1f%%   %10s %7.2fx %7.0f%% %12s %6.1f%% %11s\n",
        m.name.c_str(), format_seconds(m.dump_median).c_str(),
        ratio(m.dump_median, plain->dump_median), pct(fl.dump, m.dump_median),
        format_seconds(m.dump_exit_median).c_str(), human_bytes(m.dump_extra_median).c_str(),
        100.0 * static_cast<double>(m.dump_extra_median) / pb,
        format_seconds(m.restore_median).c_str(), ratio(m.restore_median, plain->restore_median),
        pct(fl.restore_of(m.name), m.restore_median), human_bytes(m.restore_extra_median).c_str(),
        100.0 * static_cast<double>(m.restore_extra_median) / pb,
        human_bytes(r.checkpoint_bytes.count(m.name) ? r.checkpoint_bytes.at(m.name) : 0).c_str());
  }
  auto floor_line = [](const char* what, const std::optional<Floor>& f) {
    if (f)
      std::printf("  %-30s %s (%s)\n", what, format_seconds(f->seconds).c_str(), f->bound.c_str());
  };
  std::printf(
      "floors (this run's path ceilings on %s: write %.2f, read %.2f, fill %.2f / %.2f "
      "huge (%.2f rewarmed), zstd %.2f / %.2f GB/s per core x %u):\n",
      path.dir.c_str(), path.disk_write_gbps, path.disk_read_gbps, path.fill_gbps,
      path.fill_huge_gbps, path.fill_huge_warm_gbps, path.zstd_compress_gbps,
      path.zstd_decompress_gbps, path.cores);
  floor_line("dump (decision -> durable)", fl.dump);
  floor_line("restore, huge pages", fl.restore);
  floor_line("restore, 4 KiB pages", fl.restore_4k);
  std::printf(
      "dump: from its start until the checkpoint is durable; exited: until the command returned "
      "(gpuckpt ends the process once its checkpoint is durable, criu and runc before their "
      "images are)\n"
      "of floor = floor / time: 100%% is at the floor\n");
}

void run_dump_bench(const DumpBenchArgs& a, Context& ctx) {
  DumpRestoreBenchOptions o;
  o.dir = a.dir;
  o.staging_root = a.staging;
  o.size = parse_bytes(a.size);
  o.content = a.content;
  o.runs = a.runs;
  o.memory = a.memory;
  o.container = a.container;
  o.criu = a.criu.settings();
  o.log = [](const std::string& line) { spdlog::info("{}", line); };
  // The floors, measured in the same run, on the same disk, before the methods.
  PathMeasureOptions po;
  po.dir = a.dir;
  po.bytes = std::min<std::uint64_t>(o.size, 2ull << 30);
  PathCeilings path = measure_path_ceilings(po);
  // Restores into rewarmed memory are bound by the fill of rewarmed memory.
  if (o.memory == DumpRestoreBenchOptions::Memory::kWarm)
    path.fill_huge_gbps = path.fill_huge_warm_gbps;
  const DumpRestoreBenchResult r = bench_dump_restore(o);
  const Floors fl = floors_of(a, r, path);
  if (ctx.json)
    emit_json(a, r, path, fl, ctx);
  else
    print_table(a, r, path, fl);
}

}  // namespace

void add_bench_dumprestore(CLI::App& bench, Context& ctx) {
  auto a = std::make_shared<DumpBenchArgs>();
  auto* c = bench.add_subcommand(
      "dump",
      "Dump and restore a demo server three ways on the disk of DIR: gpuckpt streaming, gpuckpt "
      "staged through tmpfs, plain criu dump/restore -D; time and peak extra host memory");
  c->add_option("--dir", a->dir, "Directory on the disk under test (checkpoints, CRIU's images)")
      ->required();
  c->add_option("--size", a->size, "Process memory (weights), e.g. 4G");
  c->add_option("--content", a->content, "Weights: mixed (half random, half fp16-like) or bf16")
      ->transform(enum_option(
          {DumpRestoreBenchOptions::Content::kMixed, DumpRestoreBenchOptions::Content::kBf16},
          bench_content_name));
  c->add_option("--runs", a->runs, "Runs per method (medians reported)")->check(CLI::Range(1, 100));
  c->add_option("--staging", a->staging, "tmpfs for the staged method (and CRIU's socket)");
  c->add_option("--memory", a->memory,
                "The memory each restore meets: cold (what the dumped process freed has gone "
                "back to the VM's host, as on an idle node; the default) or warm (freed a moment "
                "before, as right after a process of that size ended here)")
      ->transform(enum_option(
          {DumpRestoreBenchOptions::Memory::kCold, DumpRestoreBenchOptions::Memory::kWarm},
          bench_memory_name));
  c->add_flag("--container", a->container,
              "Run the server in a runc container, and compare gpuckpt dump and restore "
              "--container with runc checkpoint and restore (the same CRIU)");
  a->criu.add(c);
  c->fallthrough();
  c->callback([a, &ctx] { run_dump_bench(*a, ctx); });
}

}  // namespace gpuckpt::cli
