// TODO(owner): device commands.
#include "commands.h"

namespace gpuckpt::cli {
void add_device_commands(CLI::App& app, Context& ctx) {
  (void)app;
  (void)ctx;
}
}  // namespace gpuckpt::cli
