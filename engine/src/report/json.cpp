// The JSON documents of the roofline, the benchmarks and the report, written and read back.
// Timelines use the same shape as the CLI's --json everywhere:
//   {"total_seconds": T, "stages": [{"name", "seconds", "start", "bytes", "gbps"}...]}
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "gpuckpt/bench.h"
#include "gpuckpt/error.h"
#include "gpuckpt/report.h"

namespace gpuckpt {

namespace {

using Json = nlohmann::ordered_json;  // members in the order written: diffs and eyes like it

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(Errc::kInvalidInput, source + ": " + what);
}

Json parse(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    bad(source, std::string("not valid JSON (") + e.what() + ")");
  }
}

// An error document printed by `gpuckpt ... --json` that failed: say so rather than "bad input".
void reject_error_document(const Json& j, const std::string& source) {
  if (j.is_object() && j.contains("ok") && j["ok"] == false) {
    std::string msg = "unknown error";
    if (j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
        j["error"]["message"].is_string())
      msg = j["error"]["message"].get<std::string>();
    bad(source, "is the error report of a failed gpuckpt command: " + msg);
  }
}

double number(const Json& j, const char* key, const std::string& source, bool required = true,
              double fallback = 0) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) bad(source, std::string("missing number '") + key + "'");
    return fallback;
  }
  if (!j[key].is_number() || !std::isfinite(j[key].get<double>()))
    bad(source, std::string("'") + key + "' is not a number");
  return j[key].get<double>();
}

// A boolean that may be missing (`fallback`); anything else is refused by name.
bool boolean(const Json& j, const char* key, const std::string& source, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) bad(source, std::string("'") + key + "' is not true or false");
  return j[key].get<bool>();
}

std::string string(const Json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

Json ceilings_to_json(const Ceilings& c) {
  const Json details(c.details);
  return {{"target", c.target},
          {"device_name", c.device_name},
          {"bandwidth_gbps", c.bandwidth_gbps},
          {"fp32_gflops", c.fp32_gflops},
          {"tensor_gflops", c.tensor_gflops ? Json(*c.tensor_gflops) : Json(nullptr)},
          {"ridge_point", c.ridge_point()},
          {"method", c.method},
          {"note", c.note},
          {"details", details}};
}

Ceilings ceilings_from_json(const Json& j, const std::string& source) {
  if (!j.is_object()) bad(source, "'ceilings' is not an object");
  Ceilings c;
  c.target = string(j, "target");
  if (c.target != "cpu" && c.target != "gpu") bad(source, "ceilings 'target' must be cpu or gpu");
  c.device_name = string(j, "device_name");
  c.bandwidth_gbps = number(j, "bandwidth_gbps", source);
  c.fp32_gflops = number(j, "fp32_gflops", source);
  if (!(c.bandwidth_gbps > 0) || !(c.fp32_gflops > 0))
    bad(source, "ceilings must have a positive bandwidth and FP32 peak");
  if (j.contains("tensor_gflops") && !j["tensor_gflops"].is_null())
    c.tensor_gflops = number(j, "tensor_gflops", source);
  c.method = string(j, "method");
  c.note = string(j, "note");
  c.details = j.contains("details") && j["details"].is_object() ? nlohmann::json(j["details"])
                                                                : nlohmann::json::object();
  return c;
}

Json placement_to_json(const RooflinePlacement& p) {
  return {{"label", p.label},
          {"intensity", p.intensity},
          {"attainable_gflops", p.attainable_gflops},
          {"memory_bound", p.memory_bound},
          {"achieved_gflops", p.achieved_gflops ? Json(*p.achieved_gflops) : Json(nullptr)}};
}

RooflinePlacement placement_from_json(const Json& j, const std::string& source) {
  if (!j.is_object()) bad(source, "'placement' is not an object");
  RooflinePlacement p;
  p.label = string(j, "label");
  p.intensity = number(j, "intensity", source);
  if (!(p.intensity > 0)) bad(source, "placement 'intensity' must be positive");
  p.attainable_gflops = number(j, "attainable_gflops", source);
  p.memory_bound = boolean(j, "memory_bound", source, false);
  if (j.contains("achieved_gflops") && !j["achieved_gflops"].is_null())
    p.achieved_gflops = number(j, "achieved_gflops", source);
  return p;
}

Json opt(const std::optional<double>& v) {
  return v ? Json(*v) : Json(nullptr);
}

}  // namespace

Json path_json(const PathCeilings& p) {
  return {{"dir", p.dir},
          {"cores", p.cores},
          {"disk_write_gbps", p.disk_write_gbps},
          {"disk_read_gbps", p.disk_read_gbps},
          {"fill_gbps", p.fill_gbps},
          {"fill_huge_gbps", p.fill_huge_gbps},
          {"fill_huge_warm_gbps", p.fill_huge_warm_gbps},
          {"fill_huge_threads", p.fill_huge_threads},
          {"memcpy_gbps", p.memcpy_gbps},
          {"zstd_compress_gbps", p.zstd_compress_gbps},
          {"zstd_decompress_gbps", p.zstd_decompress_gbps},
          {"zstd_ratio", p.zstd_ratio},
          {"zstd_level", p.zstd_level},
          {"sample", p.sample},
          {"network_gbps", opt(p.network_gbps)},
          {"pcie_h2d_gbps", opt(p.pcie_h2d_gbps)},
          {"pcie_d2h_gbps", opt(p.pcie_d2h_gbps)}};
}

namespace {

PathCeilings path_from_json(const Json& j, const std::string& source) {
  if (!j.is_object()) bad(source, "'path' is not an object");
  PathCeilings p;
  p.dir = string(j, "dir");
  p.cores = static_cast<unsigned>(number(j, "cores", source, false, 1));
  p.disk_write_gbps = number(j, "disk_write_gbps", source);
  p.disk_read_gbps = number(j, "disk_read_gbps", source);
  p.fill_gbps = number(j, "fill_gbps", source);
  p.fill_huge_gbps = number(j, "fill_huge_gbps", source, false, 0);
  p.fill_huge_warm_gbps = number(j, "fill_huge_warm_gbps", source, false, 0);
  const double fill_threads = number(j, "fill_huge_threads", source, false, 1);
  if (!(fill_threads >= 1 && fill_threads <= 4096) || fill_threads != std::floor(fill_threads))
    bad(source, "'fill_huge_threads' must be a whole number between 1 and 4096");
  p.fill_huge_threads = static_cast<unsigned>(fill_threads);
  p.memcpy_gbps = number(j, "memcpy_gbps", source);
  p.zstd_compress_gbps = number(j, "zstd_compress_gbps", source);
  p.zstd_decompress_gbps = number(j, "zstd_decompress_gbps", source);
  p.zstd_ratio = number(j, "zstd_ratio", source, false, 1);
  p.zstd_level = static_cast<int>(number(j, "zstd_level", source, false, 1));
  p.sample = string(j, "sample");
  const auto optional = [&](const char* key) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    return number(j, key, source);
  };
  p.network_gbps = optional("network_gbps");
  p.pcie_h2d_gbps = optional("pcie_h2d_gbps");
  p.pcie_d2h_gbps = optional("pcie_d2h_gbps");
  for (double v :
       {p.disk_write_gbps, p.disk_read_gbps, p.fill_gbps, p.fill_huge_gbps, p.fill_huge_warm_gbps,
        p.memcpy_gbps, p.zstd_compress_gbps, p.zstd_decompress_gbps})
    if (v < 0) bad(source, "path ceilings must not be negative");
  return p;
}

Json context_to_json(const FloorContext& c) {
  return {{"zstd_ratio", c.zstd_ratio},
          {"huge_pages", c.huge_pages},
          {"adaptive_compression", c.adaptive_compression}};
}

FloorContext context_from_json(const Json& j, const std::string& source) {
  FloorContext c;
  if (!j.is_object()) return c;
  c.zstd_ratio = number(j, "zstd_ratio", source, false, 0);
  c.huge_pages = boolean(j, "huge_pages", source, false);
  c.adaptive_compression = boolean(j, "adaptive_compression", source, false);
  return c;
}

Json floor_json(const std::optional<Floor>& f, double seconds) {
  if (!f) return nullptr;
  return {{"seconds", f->seconds}, {"bound", f->bound}, {"percent", f->percent_of(seconds)}};
}

// Each number and each of its byte stages beside its floor (when the path was measured).
Json floors_json(const Timeline& t, const TransientReport& r, const FloorContext& c) {
  if (!r.path) return nullptr;
  Json stages = Json::array();
  for (const auto& s : t.stages())
    if (const auto f = stage_floor(s, *r.path, c))
      stages.push_back(
          {{"name", s.name}, {"seconds", s.seconds}, {"floor", floor_json(f, s.seconds)}});
  return {{"floor", floor_json(transient_floor(t, *r.path, c), t.total_seconds())},
          {"stages", stages}};
}

Json runs_json(const std::optional<Timeline>& t, const std::vector<double>& runs,
               const TransientReport& r, const FloorContext& c) {
  if (!t) return nullptr;
  return {{"timeline", Json(timeline_json(*t))},
          {"runs", runs},
          {"context", context_to_json(c)},
          {"floors", floors_json(*t, r, c)}};
}

void runs_from_json(const Json& j, const char* key, std::optional<Timeline>& t,
                    std::vector<double>& runs, FloorContext& ctx, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return;
  const Json& m = j[key];
  if (!m.is_object() || !m.contains("timeline"))
    bad(source, std::string("'") + key + "' lacks a timeline");
  t = timeline_from_json(m["timeline"], source + " " + key);
  if (m.contains("context")) ctx = context_from_json(m["context"], source);
  runs.clear();
  if (m.contains("runs") && m["runs"].is_array())
    for (const auto& v : m["runs"])
      if (v.is_number()) runs.push_back(v.get<double>());
}

}  // namespace

Json roofline_json(const Ceilings& c, const std::optional<RooflinePlacement>& placement,
                   const std::optional<KernelMeasurement>& kernel,
                   const std::optional<PathCeilings>& path) {
  Json j = {{"ok", true},
            {"kind", "roofline"},
            {"ceilings", ceilings_to_json(c)},
            {"placement", placement ? placement_to_json(*placement) : Json(nullptr)},
            {"kernel", nullptr},
            {"path", path ? path_json(*path) : Json(nullptr)}};
  if (kernel)
    j["kernel"] = {{"name", kernel->name},           {"description", kernel->description},
                   {"intensity", kernel->intensity}, {"achieved_gflops", kernel->achieved_gflops},
                   {"seconds", kernel->seconds},     {"flops", kernel->flops},
                   {"bytes", kernel->bytes}};
  return j;
}

void load_roofline_json(const std::string& text, TransientReport& r, const std::string& source) {
  const Json j = parse(text, source);
  reject_error_document(j, source);
  if (!j.is_object() || string(j, "kind") != "roofline" || !j.contains("ceilings"))
    bad(source, "not a roofline document (expected the output of `gpuckpt roofline --json`)");
  r.ceilings = ceilings_from_json(j["ceilings"], source);
  r.workload.reset();
  if (j.contains("placement") && !j["placement"].is_null())
    r.workload = placement_from_json(j["placement"], source);
  if (j.contains("path") && !j["path"].is_null()) r.path = path_from_json(j["path"], source);
}

const Timeline& median_run(const std::vector<Timeline>& runs) {
  if (runs.empty()) throw Error(Errc::kInternal, "median_run: no runs");
  std::vector<const Timeline*> sorted;
  for (const auto& t : runs) sorted.push_back(&t);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Timeline* a, const Timeline* b) {
    return a->total_seconds() < b->total_seconds();
  });
  return *sorted[(sorted.size() - 1) / 2];
}

Json bench_json(const std::string& kind, const std::vector<Timeline>& runs,
                const nlohmann::json& extra) {
  if (runs.empty()) throw Error(Errc::kInternal, "bench_json: no runs");
  std::vector<double> totals;
  Json all = Json::array();
  for (const auto& t : runs) {
    totals.push_back(t.total_seconds());
    all.push_back(Json(timeline_json(t)));
  }
  const auto [lo, hi] = std::minmax_element(totals.begin(), totals.end());
  Json j = {{"ok", true},
            {"kind", kind},
            {"timeline", Json(timeline_json(median_run(runs)))},
            {"runs", all},
            {"summary",
             {{"runs", totals.size()},
              {"min_seconds", *lo},
              {"median_seconds", median(totals)},
              {"max_seconds", *hi}}}};
  if (!extra.is_null() && !extra.is_object())
    throw Error(Errc::kInternal, "bench_json: extra must be a JSON object");
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = Json(it.value());
  return j;
}

std::string load_bench_json(const std::string& text, TransientReport& r,
                            const std::string& expected_kind, const std::string& source) {
  const Json j = parse(text, source);
  reject_error_document(j, source);
  if (!j.is_object()) bad(source, "not a JSON object");
  const std::string kind = string(j, "kind");
  if (kind != "coldstart" && kind != "restore" && kind != "migrate")
    bad(source,
        "not a benchmark document (expected 'kind' coldstart, restore or migrate; "
        "the output of `gpuckpt bench ... --json`)");
  if (!expected_kind.empty() && kind != expected_kind)
    bad(source, "is a '" + kind + "' benchmark, expected '" + expected_kind + "'");
  if (!j.contains("timeline")) bad(source, "missing 'timeline'");
  Timeline t = timeline_from_json(j["timeline"], source);
  std::vector<double> totals;
  if (j.contains("runs") && j["runs"].is_array())
    for (const auto& run : j["runs"])
      totals.push_back(timeline_from_json(run, source).total_seconds());
  if (totals.empty()) totals.push_back(t.total_seconds());
  // What the floors need beyond the stages (bench restore/migrate write these).
  FloorContext ctx;
  const double image = number(j, "image_bytes", source, false, 0);
  const double stored = number(j, "checkpoint_bytes", source, false, 0);
  // Of the chunks zstd was tried on: those stored raw to keep up would count twice as raw in the
  // floor of an adaptive dump, which weighs every share of raw chunks itself.
  const double skipped = number(j, "skipped_compression_bytes", source, false, 0);
  if (image > skipped && stored > skipped) ctx.zstd_ratio = (image - skipped) / (stored - skipped);
  ctx.huge_pages = number(j, "huge_page_bytes", source, false, 0) > 0;
  ctx.adaptive_compression = boolean(j, "adaptive_compression", source, false);
  if (kind == "coldstart") {
    r.cold_start_context = ctx;
    r.cold_start = std::move(t);
    r.cold_start_runs = std::move(totals);
  } else if (kind == "restore") {
    r.restore_context = ctx;
    r.restore = std::move(t);
    r.restore_runs = std::move(totals);
  } else {
    r.migration_context = ctx;
    r.migration = std::move(t);
    r.migration_runs = std::move(totals);
  }
  return kind;
}

Json render_json(const TransientReport& r) {
  const auto speedup = restore_speedup(r);
  Json j = {{"ok", true},
            {"kind", "transient_report"},
            {"ceilings", r.ceilings.target.empty() ? Json(nullptr) : ceilings_to_json(r.ceilings)},
            {"workload", r.workload ? placement_to_json(*r.workload) : Json(nullptr)},
            {"path", r.path ? path_json(*r.path) : Json(nullptr)},
            {"cold_start", runs_json(r.cold_start, r.cold_start_runs, r, r.cold_start_context)},
            {"restore", runs_json(r.restore, r.restore_runs, r, r.restore_context)},
            {"migration", runs_json(r.migration, r.migration_runs, r, r.migration_context)},
            {"restore_speedup", speedup ? Json(*speedup) : Json(nullptr)}};
  return j;
}

TransientReport parse_report_json(const std::string& text, const std::string& source) {
  const Json j = parse(text, source);
  reject_error_document(j, source);
  if (!j.is_object() || string(j, "kind") != "transient_report")
    bad(source, "not a transient report (expected the output of `gpuckpt report --json`)");
  TransientReport r;
  if (j.contains("ceilings") && !j["ceilings"].is_null())
    r.ceilings = ceilings_from_json(j["ceilings"], source);
  if (j.contains("workload") && !j["workload"].is_null())
    r.workload = placement_from_json(j["workload"], source);
  if (j.contains("path") && !j["path"].is_null()) r.path = path_from_json(j["path"], source);
  runs_from_json(j, "cold_start", r.cold_start, r.cold_start_runs, r.cold_start_context, source);
  runs_from_json(j, "restore", r.restore, r.restore_runs, r.restore_context, source);
  runs_from_json(j, "migration", r.migration, r.migration_runs, r.migration_context, source);
  return r;
}

}  // namespace gpuckpt
