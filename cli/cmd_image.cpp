// TODO(owner): image commands.
#include "commands.h"

namespace gpuckpt::cli {
void add_image_commands(CLI::App& app, Context& ctx) {
  (void)app;
  (void)ctx;
}
}  // namespace gpuckpt::cli
