#pragma once

#include "context.h"

namespace gpuckpt::cli {

// Blocks SIGINT, SIGTERM and SIGHUP and handles them in a thread of their own: the operation in
// flight is rolled back (interrupt_operations), then gpuckpt dies of that signal (exit status 128 +
// N in a shell). Call before any other thread starts. `json`: --json is on the command line, as
// read from argv; a signal may come before the command line is parsed, and the interrupt's JSON
// must still be printed then.
void install_interrupt_handler(const Context& ctx, bool json);

// For the operation's thread on its way out: once a signal is being handled, it must not print
// its own ending or exit under the rollback (the guards, the context): it waits here to die of
// the signal. Returns at once otherwise.
void stop_here_if_interrupted();

}  // namespace gpuckpt::cli
