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

// On any failure the process is running again when this throws (CRIU resumes it after a failed
// criu dump; after a failed write it is resumed here), and the message says so.
DumpOutcome dump_keep_stopped(const DumpOptions& opts);

}  // namespace gpuckpt::process
