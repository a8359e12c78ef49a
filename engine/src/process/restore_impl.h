// restore() with its partial result visible to the caller on failure (migrate must kill a
// restored process whose probe failed).
#pragma once

#include "gpuckpt/process.h"

namespace gpuckpt::image {
class BlobArrival;
}

namespace gpuckpt::process {

// Fills `out` as it goes: out.pid is set as soon as the process exists. If this throws after
// that, the restored process is still running unless the message says it was killed.
class Guard;
// `guard` (may be null) learns criu's pid and the staging directory to remove; `provisional`:
// it also learns the restored copy, to kill it on recovery (a migration's copy until the
// handoff is complete). `arrival`: the checkpoint's blobs are still arriving
// (image/arrival.h); they are read as they come.
void restore_into(const RestoreOptions& opts, RestoreResult& out, Guard* guard = nullptr,
                  bool provisional = false, const image::BlobArrival* arrival = nullptr);

// Ends a restored process tree (and its pid namespace, if any): SIGKILL, or with `grace` > 0
// SIGTERM first and SIGKILL for what is left after it. Returns the pids still there.
std::vector<pid_t> kill_restored(const RestoreResult& r, std::chrono::milliseconds grace = {});

// The pid criu restore wrote to `pidfile`; Error(kCriu) if there is none.
pid_t read_pidfile(const std::filesystem::path& pidfile);

}  // namespace gpuckpt::process
