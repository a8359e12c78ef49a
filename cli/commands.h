// Each command group registers its subcommands on the root app. One file per group.
#pragma once

#include <CLI/CLI.hpp>

#include "context.h"

namespace gpuckpt::cli {

void add_image_commands(CLI::App& app, Context& ctx);     // pack, unpack, inspect, verify
void add_process_commands(CLI::App& app, Context& ctx);   // dump, restore, migrate, recover
void add_device_commands(CLI::App& app, Context& ctx);    // devices
void add_roofline_commands(CLI::App& app, Context& ctx);  // roofline
void add_bench_commands(CLI::App& app, Context& ctx);     // bench io|coldstart|restore|migrate
void add_report_commands(CLI::App& app, Context& ctx);    // report
void add_keygen_command(CLI::App& app, Context& ctx);     // keygen

// What `gpuckpt --json devices` prints; also the target's first line in a migration.
nlohmann::json devices_json(const DeviceList& list);

}  // namespace gpuckpt::cli
