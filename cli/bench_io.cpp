// TODO(owner): bench io.
#include "commands.h"

namespace gpuckpt::cli {
void add_bench_io(CLI::App& bench, Context& ctx) {
  (void)bench;
  (void)ctx;
}
}  // namespace gpuckpt::cli
