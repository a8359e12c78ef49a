// TODO(owner): roofline commands.
#include "commands.h"

namespace gpuckpt::cli {
void add_roofline_commands(CLI::App& app, Context& ctx) {
  (void)app;
  (void)ctx;
}
}  // namespace gpuckpt::cli
