// Test hook: deterministic places to interrupt gpuckpt. When $GPUCKPT_FAULT_PAUSE names a point
// that an operation reaches, gpuckpt creates the file $GPUCKPT_FAULT_MARK and then blocks there
// forever, so that a test can send its signal (or SIGKILL) at exactly that phase. Unset, a
// fault point costs one getenv. docs/PROCESS.md ("Faults") lists the points.
#pragma once

#include <string_view>

namespace gpuckpt {

void fault_point(std::string_view name);

// With $GPUCKPT_FAULT_RESUME=interrupt as well, the paused point returns once a guard has been
// told to recover (an interrupt's rollback), so that the operation's thread unwinds while the
// guard recovers, as it does when a signal lands between two fault points. Guard::abort calls
// guard_recovery_begun.
void guard_recovery_begun();

}  // namespace gpuckpt
