// `gpuckpt bench ...`: end-to-end measurements, each against what a user would use instead.
#include "commands.h"

namespace gpuckpt::cli {

void add_bench_io(CLI::App& bench, Context& ctx);           // bench_io.cpp
void add_bench_transient(CLI::App& bench, Context& ctx);    // bench_transient.cpp
void add_bench_dumprestore(CLI::App& bench, Context& ctx);  // bench_dumprestore.cpp

void add_bench_commands(CLI::App& app, Context& ctx) {
  auto* bench =
      app.add_subcommand("bench", "Benchmarks, reported as ratios against the usual tools");
  bench->require_subcommand(1);
  bench->fallthrough();  // global flags (--json) may follow `bench` and its subcommands
  add_bench_io(*bench, ctx);
  add_bench_transient(*bench, ctx);
  add_bench_dumprestore(*bench, ctx);
}

}  // namespace gpuckpt::cli
