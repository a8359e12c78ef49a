// The part of a dump that migrate shares: everything up to a durable checkpoint, with the
// process left stopped (or running, for a snapshot). The caller decides when it ends.
#pragma once

#include <vector>

#include "gpuckpt/process.h"
#include "image/stream_pack.h"
#include "process/record.h"
#include "process/support.h"
#include "util/unique_fd.h"

namespace gpuckpt::process {

struct DumpOutcome {
  DumpResult result;
  ProcessRecord record;
};

class Guard;

// The tree's processes are locked against another gpuckpt's dump or migration of them
// (lock_processes) until `guard` is done or has undone the operation (Guard::hold_locks).
// On any failure the tree is running again when this throws (the guard has resumed it), and
// the message says so. On success the checkpoint is durable and the tree still stopped (or
// running, for a snapshot): the caller decides its end and tells the guard.
// `copy`: where else a streamed dump's checkpoint goes while it is written (a staged dump,
// result.staging_mode kStaged, ignores it: its checkpoint is whole only at the end).
// `container`: what a whole container's dump adds (container::plan_dump), or null for a tree.
DumpOutcome dump_keep_stopped(const DumpOptions& opts, Guard& guard, image::PackCopy copy = {},
                              const container::DumpPlan* container = nullptr);

}  // namespace gpuckpt::process
