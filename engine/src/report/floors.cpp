// Floors (gpuckpt/report.h): the bytes of each stage through the path ceilings they need.
#include <algorithm>
#include <string>
#include <vector>

#include "gpuckpt/names.h"
#include "gpuckpt/report.h"

namespace gpuckpt {

namespace {

enum class Side { kNone, kDump, kRestore, kNetwork };

// "target:read_decompress" (the target of an ssh migration) and "device_lock@1234" (one
// process of a tree) are the stages read_decompress and device_lock.
std::string base_name(std::string n) {
  if (const auto c = n.find(':'); c != std::string::npos) n = n.substr(c + 1);
  if (const auto a = n.find('@'); a != std::string::npos) n = n.substr(0, a);
  return n;
}

Side side_of(const std::string& name) {
  static const char* const dump[] = {stage::kCompressWrite, stage::kCriuDump, stage::kCriuMemdump,
                                     stage::kCriuMemwrite, stage::kDeviceCheckpoint};
  static const char* const restore[] = {stage::kReadDecompress, stage::kCriuRestoreTasks,
                                        stage::kDeviceRestore};
  static const char* const network[] = {stage::kTransfer, stage::kReceive, stage::kUpload,
                                        stage::kDownload};
  for (const char* d : dump)
    if (name == d) return Side::kDump;
  for (const char* r : restore)
    if (name == r) return Side::kRestore;
  for (const char* n : network)
    if (name == n) return Side::kNetwork;
  return Side::kNone;
}

// Seconds for `bytes` at `gbps`; 0 when either is (a ceiling not measured).
double cost(double bytes, double gbps) {
  return gbps > 0 && bytes > 0 ? bytes / (gbps * 1e9) : 0;
}

// CRIU's dump stages nest (criu_memwrite within criu_memdump within criu_dump): one copy.
bool is_criu_dump(const std::string& n) {
  return n == stage::kCriuDump || n == stage::kCriuMemdump || n == stage::kCriuMemwrite;
}

// The larger of candidate floors; a ceiling of 0 (not measured) gives none.
struct Slowest {
  std::optional<Floor> f;
  void add(double bytes, double gbps, const char* bound) { add_seconds(cost(bytes, gbps), bound); }
  void add_seconds(double s, const std::string& bound) {
    if (s > 0 && (!f || s > f->seconds)) f = Floor{s, bound};
  }
};

// The CPU time a stage's bytes need, in core-seconds, by kind of work. The copy out of CRIU's
// pipe (dump) and into the restored memory (restore) is one memcpy; zstd runs at one core's rate;
// the fill's threads are busy throughout its measurement (on a VM a host fault stalls its vCPU
// as well), so it costs its time on each of them.
struct CpuWork {
  double zstd = 0, memcpy = 0, fill = 0;
  double total() const { return zstd + memcpy + fill; }
  CpuWork& operator+=(const CpuWork& o) {
    zstd += o.zstd;
    memcpy += o.memcpy;
    fill += o.fill;
    return *this;
  }
};

CpuWork cpu_work(const std::string& n, double raw, const PathCeilings& p, const FloorContext& c) {
  CpuWork w;
  if (n == stage::kCompressWrite) {
    w.zstd = cost(raw, p.zstd_compress_gbps);
  } else if (is_criu_dump(n)) {
    w.memcpy = cost(raw, p.memcpy_gbps);
  } else if (n == stage::kReadDecompress) {
    w.zstd = cost(raw, p.zstd_decompress_gbps);
  } else if (n == stage::kCriuRestoreTasks) {
    w.memcpy = cost(raw, p.memcpy_gbps);
    if (c.huge_pages && p.fill_huge_gbps > 0)
      w.fill = cost(raw, p.fill_huge_gbps) *
               std::min(std::max(1u, p.fill_huge_threads), std::max(1u, p.cores));
    else
      w.fill = cost(raw, p.fill_gbps);
  }
  return w;
}

// "CPU (zstd + memcpy on 2 cores)": only work that two or more kinds share, since one kind alone
// on every core is never slower than its own ceiling's floor.
void add_cpu_budget(Slowest& w, const CpuWork& work, const PathCeilings& p) {
  std::string kinds;
  int n = 0;
  for (const auto& [seconds, name] : {std::pair{work.zstd, "zstd"}, std::pair{work.fill, "fill"},
                                      std::pair{work.memcpy, "memcpy"}})
    if (seconds > 0) kinds += (n++ ? " + " : "") + std::string(name);
  if (n < 2) return;
  const unsigned cores = std::max(1u, p.cores);
  w.add_seconds(work.total() / cores, "CPU (" + kinds + " on " + std::to_string(cores) +
                                          (cores == 1 ? " core)" : " cores)"));
}

// compress_write's own bounds when a share `r` of its `raw` bytes is stored uncompressed: the
// disk writes more as zstd has less to do.
void add_compress_write(Slowest& w, double raw, double ratio, double r, const PathCeilings& p) {
  const double stored = raw / ratio;
  w.add(stored + r * (raw - stored), p.disk_write_gbps, "disk write");
  w.add(raw * (1 - r), p.zstd_compress_gbps * std::max(1u, p.cores), "zstd");
}

// The lowest floor_at(r) over the shares r of compress_write's bytes stored uncompressed, when
// the dump may choose (every term is linear in r, so a 1% grid finds the balance); its bound
// names the share.
template <class F>
std::optional<Floor> best_share(bool adaptive, F floor_at) {
  std::optional<Floor> best = floor_at(0.0);
  if (!adaptive) return best;
  int best_pct = 0;
  for (int pct = 1; pct <= 100; ++pct) {
    const std::optional<Floor> f = floor_at(pct / 100.0);
    if (f && (!best || f->seconds < best->seconds)) {
      best = f;
      best_pct = pct;
    }
  }
  if (best && best_pct > 0)
    best->bound += " (" + std::to_string(best_pct) + "% stored uncompressed)";
  return best;
}

// How much the image bytes shrink on storage, and the ratio a dump's floor counts its stored
// bytes at (FloorContext::adaptive_compression).
double stored_ratio(const PathCeilings& p, const FloorContext& c) {
  return c.zstd_ratio > 0 ? c.zstd_ratio : std::max(1.0, p.zstd_ratio);
}
double dump_ratio(const PathCeilings& p, const FloorContext& c) {
  return c.adaptive_compression ? std::max(stored_ratio(p, c), p.zstd_ratio) : stored_ratio(p, c);
}

}  // namespace

std::optional<Floor> stage_floor(const Stage& s, const PathCeilings& p, const FloorContext& c) {
  if (s.bytes == 0) return std::nullopt;
  const std::string n = base_name(s.name);
  const double raw = static_cast<double>(s.bytes);
  const double ratio = stored_ratio(p, c);
  const double cores = std::max(1u, p.cores);
  Slowest w;
  if (n == stage::kCompressWrite) {
    // zstd is its only CPU work: no budget to add.
    return best_share(c.adaptive_compression, [&](double r) {
      Slowest m;
      add_compress_write(m, raw, dump_ratio(p, c), r, p);
      return m.f;
    });
  } else if (is_criu_dump(n)) {
    w.add(raw, p.memcpy_gbps, "memcpy");
  } else if (n == stage::kReadDecompress) {
    w.add(raw / ratio, p.disk_read_gbps, "disk read");
    w.add(raw, p.zstd_decompress_gbps * cores, "zstd");
  } else if (n == stage::kCriuRestoreTasks) {
    if (c.huge_pages && p.fill_huge_gbps > 0)
      w.add(raw, p.fill_huge_gbps, "memory fill (huge pages)");
    else
      w.add(raw, p.fill_gbps, "memory fill");
  } else if (n == stage::kMemoryFill) {
    // The populate threads alone, inside criu_restore_tasks (whose floor and CPU budget count
    // the fill already): how fast this restore met its memory against the ceiling.
    w.add(raw, p.fill_huge_gbps, "memory fill (huge pages)");
  } else if (n == stage::kMemoryCopy) {
    // The pages images copied by several streams, inside criu_restore_tasks: each copy also
    // faults in its pages, and the streams share the cores.
    w.add(raw, p.fill_huge_gbps, "memory fill (huge pages)");
    w.add(raw, p.memcpy_gbps * cores, "memcpy on every core");
  } else if (n == stage::kTransfer || n == stage::kReceive || n == stage::kUpload ||
             n == stage::kDownload) {
    if (p.network_gbps) w.add(raw, *p.network_gbps, "network");
  } else if (n == stage::kDeviceCheckpoint) {
    if (p.pcie_d2h_gbps) w.add(raw, *p.pcie_d2h_gbps, "PCIe D2H");
  } else if (n == stage::kDeviceRestore) {
    if (p.pcie_h2d_gbps) w.add(raw, *p.pcie_h2d_gbps, "PCIe H2D");
  }
  add_cpu_budget(w, cpu_work(n, raw, p, c), p);
  return w.f;
}

std::optional<Floor> transient_floor(const Timeline& t, const PathCeilings& p,
                                     const FloorContext& c) {
  std::optional<Floor> dump, restore, network;
  // The stages of one side overlap, and so share the cores: their CPU work adds; CRIU's nested
  // dump stages are one copy, counted once.
  CpuWork dump_cpu, restore_cpu;
  double criu_copy = 0;
  // An adaptive dump's compress_write bytes and their zstd, weighed after the loop at the best
  // share stored uncompressed.
  double mixed_raw = 0, mixed_zstd = 0;
  for (const auto& s : t.stages()) {
    const std::string n = base_name(s.name);
    const Side side = side_of(n);
    if (side == Side::kNone) continue;
    const CpuWork w = cpu_work(n, static_cast<double>(s.bytes), p, c);
    if (c.adaptive_compression && n == stage::kCompressWrite) {
      mixed_raw += static_cast<double>(s.bytes);
      mixed_zstd += w.zstd;
      continue;
    }
    if (is_criu_dump(n))
      criu_copy = std::max(criu_copy, w.memcpy);
    else if (side == Side::kDump)
      dump_cpu += w;
    else if (side == Side::kRestore)
      restore_cpu += w;
    const auto f = stage_floor(s, p, c);
    if (!f) continue;
    auto& group = side == Side::kDump ? dump : side == Side::kRestore ? restore : network;
    if (!group || f->seconds > group->seconds) group = f;
  }
  dump_cpu.memcpy += criu_copy;
  for (auto [group, work] : {std::pair{&dump, dump_cpu}, std::pair{&restore, restore_cpu}}) {
    if (!*group || (group == &dump && mixed_raw > 0)) continue;
    Slowest w{*group};
    add_cpu_budget(w, work, p);
    *group = w.f;
  }
  if (mixed_raw > 0)
    dump = best_share(true, [&](double r) {
      Slowest w{dump};
      add_compress_write(w, mixed_raw, dump_ratio(p, c), r, p);
      CpuWork work = dump_cpu;
      work.zstd += mixed_zstd * (1 - r);
      add_cpu_budget(w, work, p);
      return w.f;
    });
  std::optional<Floor> local = dump && restore ? Floor{dump->seconds + restore->seconds,
                                                       dump->bound + " + " + restore->bound}
                               : dump          ? dump
                                               : restore;
  if (!local || (network && network->seconds > local->seconds)) return network;
  return local;
}

}  // namespace gpuckpt
