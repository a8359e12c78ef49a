// TODO(owner): report commands.
#include "commands.h"

namespace gpuckpt::cli {
void add_report_commands(CLI::App& app, Context& ctx) {
  (void)app;
  (void)ctx;
}
}  // namespace gpuckpt::cli
