// The part of a dump that migrate shares: everything up to a durable checkpoint, with the
// process left stopped (or running, for a snapshot). The caller decides when it ends.
#pragma once

#include "gpuckpt/process.h"
#include "process/record.h"

namespace gpuckpt::process {

struct DumpOutcome {
  DumpResult result;
  ProcessRecord record;
};

class Guard;

// On any failure the tree is running again when this throws (the guard has resumed it), and
// the message says so. On success the checkpoint is durable and the tree still stopped (or
// running, for a snapshot): the caller decides its end and tells the guard.
DumpOutcome dump_keep_stopped(const DumpOptions& opts, Guard& guard);

}  // namespace gpuckpt::process
