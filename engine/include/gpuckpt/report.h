// The transient report: cold start, restore and migration wall-clock numbers, per stage,
// beside the roofline ceilings. Also the JSON documents that `gpuckpt roofline --json` and
// `gpuckpt bench coldstart|restore|migrate --json` print and `gpuckpt report` reads back.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpuckpt/process.h"
#include "gpuckpt/roofline.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {

struct TransientReport {
  Ceilings ceilings;  // target empty: not measured (the chart says so)
  std::optional<RooflinePlacement> workload;
  std::optional<Timeline> cold_start;  // decision -> first token
  std::optional<Timeline> restore;     // interruption -> serving
  std::optional<Timeline> migration;   // decision -> answering elsewhere
  // Wall clock of every run behind each timeline (the timeline is the median run); the table
  // prints min/median when there is more than one.
  std::vector<double> cold_start_runs, restore_runs, migration_runs;
};

// "restore is N x faster than cold start": cold start total / restore total, when both exist.
std::optional<double> restore_speedup(const TransientReport& r);

std::string render_table(const TransientReport& r);
std::string render_json(const TransientReport& r);
std::string render_svg(const TransientReport& r);
std::string render_html(const TransientReport& r);  // self-contained, embeds the SVG
// Inverse of render_json. Throws Error(kInvalidInput) naming `source` on a bad document.
TransientReport parse_report_json(const std::string& text, const std::string& source = "report");

// Files for the CLI (which has no access to the engine's internals): a report input read
// whole (Error(kInvalidInput) if missing), and an output written atomically (temporary
// sibling, fsync, rename), so a chart on disk is always a complete one.
std::string read_report_input(const std::filesystem::path& path);
void write_report_output(const std::filesystem::path& path, const std::string& content);

// ---- Documents exchanged between commands -----------------------------------------------

// `gpuckpt roofline --json`: {"kind":"roofline","ceilings":{...},"placement":{...}|null,
// "kernel":{...}|null}.
nlohmann::json roofline_json(const Ceilings& c, const std::optional<RooflinePlacement>& placement,
                             const std::optional<KernelMeasurement>& kernel = {});
// Reads a roofline document into r.ceilings and r.workload.
void load_roofline_json(const std::string& text, TransientReport& r,
                        const std::string& source = "roofline");

// `gpuckpt bench coldstart|restore|migrate --json`: {"kind":KIND,"timeline":<median run>,
// "runs":[...],"summary":{"runs","min_seconds","median_seconds","max_seconds"}, ...extra}.
// `extra` is a JSON object whose members are merged in (command, pid, ...).
nlohmann::json bench_json(const std::string& kind, const std::vector<Timeline>& runs,
                          const nlohmann::json& extra = nlohmann::json::object());
// The run with the median total (the lower one for an even count); `runs` must not be empty.
const Timeline& median_run(const std::vector<Timeline>& runs);
// Reads a bench document into the matching member of `r` (by its "kind": coldstart, restore,
// migrate). `expected_kind`, if not empty, must match. Returns the kind.
std::string load_bench_json(const std::string& text, TransientReport& r,
                            const std::string& expected_kind = "",
                            const std::string& source = "bench");

}  // namespace gpuckpt
