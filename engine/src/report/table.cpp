#include <algorithm>
#include <cstdio>
#include <sstream>

#include "gpuckpt/report.h"
#include "gpuckpt/support.h"
#include "report/format.h"

namespace gpuckpt {

using namespace report;

std::optional<double> restore_speedup(const TransientReport& r) {
  if (!r.cold_start || !r.restore) return std::nullopt;
  const double c = r.cold_start->total_seconds(), s = r.restore->total_seconds();
  if (!(c > 0) || !(s > 0)) return std::nullopt;
  return c / s;
}

namespace {

std::string pad(const std::string& s, size_t w) {
  return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}
std::string lpad(const std::string& s, size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}

// "floor 1.20 s (disk write), 65% of it": the floor and how close the measured time came.
std::string floor_text(const std::optional<Floor>& f, double seconds) {
  if (!f) return "";
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", f->percent_of(seconds));
  return "floor " + format_seconds(f->seconds) + " (" + f->bound + "), at " + b + " of it";
}

void transient(std::ostringstream& o, const char* title, const std::optional<Timeline>& t,
               const std::vector<double>& runs, const TransientReport& r, const FloorContext& ctx) {
  if (!t) {
    o << title << ": not measured\n";
    return;
  }
  o << pad(std::string(title) + ":", 46) << lpad(format_seconds(t->total_seconds()), 10);
  if (runs.size() > 1) {
    std::vector<double> s = runs;
    std::sort(s.begin(), s.end());
    o << "  (median run of " << s.size() << "; min " << format_seconds(s.front()) << ", max "
      << format_seconds(s.back()) << ")";
  }
  o << "\n";
  if (r.path) {
    const auto f = transient_floor(*t, *r.path, ctx);
    o << "  " << (f ? floor_text(f, t->total_seconds()) : "floor: no stage moves bytes") << "\n";
  }
  for (const auto& st : t->stages()) {
    o << "  " << pad(st.name, 24) << lpad(format_seconds(st.seconds), 10) << "  at "
      << lpad(format_seconds(st.start_offset), 9);
    if (st.bytes) {
      char b[64];
      std::snprintf(b, sizeof b, "  %.1f MiB", static_cast<double>(st.bytes) / (1 << 20));
      o << b;
      if (st.seconds > 0) o << "  " << fmt_gbps(st.gbps());
      if (r.path)
        if (const auto f = stage_floor(st, *r.path, ctx)) o << "  " << floor_text(f, st.seconds);
    }
    o << "\n";
  }
}

}  // namespace

std::string render_path(const PathCeilings& p) {
  std::ostringstream o;
  char b[160];
  o << "checkpoint path (" << p.dir << ", " << p.cores << " cores):\n";
  std::snprintf(b, sizeof b, "  %-21s write %s (durable), read %s\n", "disk (O_DIRECT)",
                fmt_gbps(p.disk_write_gbps).c_str(), fmt_gbps(p.disk_read_gbps).c_str());
  o << b;
  std::snprintf(b, sizeof b,
                "  %-21s %s (4 KiB pages, 1 thread), %s (huge pages, %u thread%s; %s rewarmed)\n",
                "memory fill", fmt_gbps(p.fill_gbps).c_str(), fmt_gbps(p.fill_huge_gbps).c_str(),
                p.fill_huge_threads, p.fill_huge_threads == 1 ? "" : "s",
                fmt_gbps(p.fill_huge_warm_gbps).c_str());
  o << b;
  o << "  " << pad("memcpy", 22) << fmt_gbps(p.memcpy_gbps) << " (one core)\n";
  std::snprintf(b, sizeof b, "  %-21s level %d: compress %s, decompress %s per core, ratio %.2f\n",
                "zstd", p.zstd_level, fmt_gbps(p.zstd_compress_gbps).c_str(),
                fmt_gbps(p.zstd_decompress_gbps).c_str(), p.zstd_ratio);
  o << b;
  if (!p.sample.empty()) o << "  " << pad("zstd sample", 22) << p.sample << "\n";
  if (p.network_gbps)
    o << "  " << pad("network", 22) << fmt_gbps(*p.network_gbps) << " (ssh into /dev/null)\n";
  if (p.pcie_h2d_gbps || p.pcie_d2h_gbps)
    o << "  " << pad("PCIe (pinned)", 22) << "H2D "
      << (p.pcie_h2d_gbps ? fmt_gbps(*p.pcie_h2d_gbps) : "-") << ", D2H "
      << (p.pcie_d2h_gbps ? fmt_gbps(*p.pcie_d2h_gbps) : "-") << "\n";
  return o.str();
}

std::string render_table(const TransientReport& r) {
  std::ostringstream o;
  const Ceilings& c = r.ceilings;
  if (c.target.empty()) {
    o << "roofline: not measured\n";
  } else {
    o << "roofline (" << c.target << "): " << c.device_name << "\n";
    o << "  " << pad("memory bandwidth", 22) << fmt_gbps(c.bandwidth_gbps) << "\n";
    o << "  " << pad("FP32 peak", 22) << fmt_gflops(c.fp32_gflops) << "\n";
    if (c.tensor_gflops)
      o << "  " << pad("tensor peak", 22) << fmt_gflops(*c.tensor_gflops) << "\n";
    o << "  " << pad("ridge point", 22) << fmt_intensity(c.ridge_point()) << "\n";
    if (!c.method.empty()) o << "  " << pad("measured", 22) << c.method << "\n";
    if (!c.note.empty()) o << "  " << pad("note", 22) << c.note << "\n";
  }
  if (r.workload) {
    const auto& w = *r.workload;
    o << "  " << pad(w.label.empty() ? "workload" : w.label, 22) << fmt_intensity(w.intensity)
      << ": " << (w.memory_bound ? "memory-bound" : "compute-bound") << ", attainable "
      << fmt_gflops(w.attainable_gflops);
    if (w.achieved_gflops) {
      o << ", achieved " << fmt_gflops(*w.achieved_gflops);
      if (w.attainable_gflops > 0) {
        char b[32];
        std::snprintf(b, sizeof b, " (%.0f%% of attainable)",
                      100 * *w.achieved_gflops / w.attainable_gflops);
        o << b;
      }
    }
    o << "\n";
  }
  if (r.path) o << render_path(*r.path);
  o << "\n";
  transient(o, "cold start (decision -> first token)", r.cold_start, r.cold_start_runs, r,
            r.cold_start_context);
  transient(o, "restore (interruption -> serving)", r.restore, r.restore_runs, r,
            r.restore_context);
  transient(o, "migration (decision -> answering elsewhere)", r.migration, r.migration_runs, r,
            r.migration_context);
  if (const auto s = restore_speedup(r)) o << "\n" << speedup_sentence(*s) << "\n";
  return o.str();
}

}  // namespace gpuckpt
