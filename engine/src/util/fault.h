// Test hooks: fault_point (declared in gpuckpt/support.h, which the CLI uses too), and the
// resumption of a paused point once a guard recovers.
#pragma once

#include "gpuckpt/support.h"

namespace gpuckpt {

// With $GPUCKPT_FAULT_RESUME=interrupt as well, the paused point returns once a guard has been
// told to recover (an interrupt's rollback), so that the operation's thread unwinds while the
// guard recovers, as it does when a signal lands between two fault points. Guard::abort calls
// guard_recovery_begun.
void guard_recovery_begun();

}  // namespace gpuckpt
