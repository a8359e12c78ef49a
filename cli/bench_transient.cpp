// TODO(owner): bench transient.
#include "commands.h"

namespace gpuckpt::cli {
void add_bench_transient(CLI::App& bench, Context& ctx) {
  (void)bench;
  (void)ctx;
}
}  // namespace gpuckpt::cli
