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

// ---- Floors: each transient number, and each stage that moves bytes, against the path ----

// What a timeline's bytes went through, beyond its stages: how much its image bytes compressed
// on the way to storage (0: the path's zstd sample ratio), and whether the restore filled
// huge pages (RestoreResult::huge_page_bytes > 0).
struct FloorContext {
  double zstd_ratio = 0;
  bool huge_pages = false;
  // The dump could store chunks uncompressed (Compression::kAdaptive): its floor is then that of
  // the best share of compress_write's bytes left raw, and counts the stored bytes at the
  // better of zstd_ratio and the path's sample ratio, since the checkpoint's own ratio fell by
  // what the dump chose not to compress.
  bool adaptive_compression = false;
};

struct Floor {
  double seconds = 0;  // the stage's (or transient's) bytes through the slowest ceiling
  std::string bound;   // which: "disk write", "disk read", "zstd", "memory fill", "memcpy", ...
  // floor / measured time: 100% is at the floor.
  double percent_of(double measured_seconds) const {
    return measured_seconds > 0 ? 100 * seconds / measured_seconds : 0;
  }
};

// A stage's floor, from its name and bytes: compress_write (durable disk write of the stored
// bytes, or zstd on every core; with FloorContext::adaptive_compression, at the best share of
// raw chunks), criu_dump/memdump/memwrite (memcpy), read_decompress (disk
// read, or zstd decompression on every core), criu_restore_tasks (memory fill, or the fill and
// CRIU's copy sharing the cores), transfer, receive, upload, download (network),
// device_checkpoint/device_restore (PCIe). nullopt for stages that move no bytes or whose
// ceiling was not measured.
std::optional<Floor> stage_floor(const Stage& s, const PathCeilings& p, const FloorContext& c = {});
// A transient's floor. Streaming overlaps the stages of a dump (CRIU, zstd, the disk, the
// network), and those of a restore (the disk, zstd, the fill): each group is bounded by its
// slowest stage, or by the CPU work of all its stages on the path's cores ("CPU (zstd + fill +
// memcpy on 2 cores)": zstd at one core's rate, one memcpy of the bytes, the fill's time on each
// thread it was measured on), whichever is longer. A restore cannot begin before its dump has
// ended (CRIU reads inventory.img, which the dump writes last), so for a migration the two
// groups add. The network (a transfer, an upload or download) streams beside both: the floor is
// the larger of that sum and the network stage. nullopt without byte stages.
std::optional<Floor> transient_floor(const Timeline& t, const PathCeilings& p,
                                     const FloorContext& c = {});

struct TransientReport {
  Ceilings ceilings;  // target empty: not measured (the chart says so)
  // The checkpoint path's ceilings (`gpuckpt roofline --transient`): each number's floor.
  std::optional<PathCeilings> path;
  FloorContext cold_start_context, restore_context, migration_context;
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
// The checkpoint path's ceilings as the table prints them (also `gpuckpt roofline --transient`).
std::string render_path(const PathCeilings& p);
// Its members in the order written (an ordered_json): diffs and eyes read them so.
nlohmann::ordered_json render_json(const TransientReport& r);
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
// With `path` (`gpuckpt roofline --transient`): "path":{...}, the checkpoint path's ceilings.
nlohmann::ordered_json roofline_json(const Ceilings& c,
                                     const std::optional<RooflinePlacement>& placement,
                                     const std::optional<KernelMeasurement>& kernel = {},
                                     const std::optional<PathCeilings>& path = {});
// The "path" member of those documents.
nlohmann::ordered_json path_json(const PathCeilings& p);
// Reads a roofline document into r.ceilings, r.workload and (if present) r.path.
void load_roofline_json(const std::string& text, TransientReport& r,
                        const std::string& source = "roofline");

// `gpuckpt bench coldstart|restore|migrate --json`: {"kind":KIND,"timeline":<median run>,
// "runs":[...],"summary":{"runs","min_seconds","median_seconds","max_seconds"}, ...extra}.
// `extra` is a JSON object whose members are merged in (command, pid, ...).
nlohmann::ordered_json bench_json(const std::string& kind, const std::vector<Timeline>& runs,
                                  const nlohmann::json& extra = nlohmann::json::object());
// The run with the median total (the lower one for an even count); `runs` must not be empty.
const Timeline& median_run(const std::vector<Timeline>& runs);
// Reads a bench document into the matching member of `r` (by its "kind": coldstart, restore,
// migrate). `expected_kind`, if not empty, must match. Returns the kind.
std::string load_bench_json(const std::string& text, TransientReport& r,
                            const std::string& expected_kind = "",
                            const std::string& source = "bench");

}  // namespace gpuckpt
