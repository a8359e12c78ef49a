#pragma once

#include "context.h"

namespace gpuckpt::cli {

// Blocks SIGINT, SIGTERM and SIGHUP and handles them in a thread of their own: the operation in
// flight is rolled back (interrupt_operations), then gpuckpt dies of that signal (exit status 128 +
// N in a shell). Call before any other thread starts.
void install_interrupt_handler(const Context& ctx);

}  // namespace gpuckpt::cli
