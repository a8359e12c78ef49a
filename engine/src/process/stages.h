// Turning what CRIU and the plugin measured into timeline stages (names: docs/PROCESS.md).
// Plugin hooks carry CLOCK_MONOTONIC timestamps, so they land exactly on the timeline; CRIU's
// stats carry durations only, so those stages are placed inside the criu run by what is known
// of CRIU's order (freeze, then frozen, memdump and memwrite within it): durations exact,
// positions approximate.
#pragma once

#include <optional>

#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "criu/stats.h"
#include "gpuckpt/timing.h"

namespace gpuckpt::process {

void add_dump_stages(Timeline& tl, const criu::Run& run, std::uint64_t image_bytes,
                     const std::optional<criu::DumpStats>& stats,
                     const std::optional<criu::PluginReport>& plugin);

// `spans`: the huge-page fill and the parallel copy as CRIU's log timed them, stages of their
// own (memory_fill, memory_copy) inside criu_restore_tasks.
void add_restore_stages(Timeline& tl, const criu::Run& run,
                        const std::optional<criu::RestoreStats>& stats,
                        const std::optional<criu::PluginReport>& plugin,
                        const criu::RestoreLogSpans& spans = {});

}  // namespace gpuckpt::process
