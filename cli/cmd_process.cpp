// TODO(owner): process commands.
#include "commands.h"

namespace gpuckpt::cli {
void add_process_commands(CLI::App& app, Context& ctx) {
  (void)app;
  (void)ctx;
}
}  // namespace gpuckpt::cli
