// gpuckpt: GPU checkpoint/restore. Errors from the engine surface here, at one boundary, as a
// message on stderr (or a JSON object with --json) and the documented exit code.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "context.h"

int main(int argc, char** argv) {
  using namespace gpuckpt;
  cli::Context ctx;
  CLI::App app{"gpuckpt: checkpoint, restore and migrate GPU serving processes"};
  app.set_version_flag("--version", std::string("gpuckpt ") + version());
  app.require_subcommand(1);
  app.add_flag("--json", ctx.json, "Machine-readable JSON on stdout");
  app.add_flag("-q,--quiet", ctx.quiet, "No progress output");
  app.add_option("--log-level", ctx.log_level, "trace|debug|info|warn|error|off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  cli::add_image_commands(app, ctx);
  cli::add_process_commands(app, ctx);
  cli::add_device_commands(app, ctx);
  cli::add_roofline_commands(app, ctx);
  cli::add_bench_commands(app, ctx);
  cli::add_report_commands(app, ctx);

  // Logs go to stderr so that stdout stays clean for --json.
  auto logger = spdlog::stderr_color_mt("gpuckpt");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%^[%l]%$ %v");
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(ctx.log_level)); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help/--version exit 0; every usage error exits 2 (CLI11's own codes are >100).
    const int rc = app.exit(e);
    return rc == 0 ? 0 : static_cast<int>(Errc::kUsage);
  } catch (const Error& e) {
    ctx.progress_done();
    if (ctx.json) {
      ctx.emit({{"ok", false},
                {"error", {{"code", std::string(errc_name(e.code()))}, {"message", e.what()}}}});
    }
    std::cerr << "gpuckpt: error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    ctx.progress_done();
    std::cerr << "gpuckpt: internal error: " << e.what() << "\n";
    return static_cast<int>(Errc::kInternal);
  }
  return ctx.exit_code;
}
