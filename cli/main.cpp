// gpuckpt: GPU checkpoint/restore. Errors from the engine surface here, at one boundary, as a
// message on stderr (or a JSON object with --json) and the documented exit code.
#include <fcntl.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <string_view>

#include "commands.h"
#include "context.h"
#include "flags.h"
#include "gpuckpt/names.h"
#include "gpuckpt/support.h"
#include "signals.h"

namespace {

// Whether --json was given, from argv itself, read as CLI11 reads the flag: the last one wins,
// and `--json=VALUE` takes CLI11's truth values. A parse error can stop CLI11 before it has
// stored the flag, and the interrupt handler runs on a thread of its own, so both ask argv
// rather than Context::json, which the parse writes.
bool json_requested(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--json") {
      json = true;
    } else if (arg.starts_with("--json=")) {
      try {
        json = CLI::detail::to_flag_value(std::string(arg.substr(7))) > 0;
      } catch (const std::exception&) {
        json = true;  // a usage error, which JSON was asked for with a value CLI11 rejects
      }
    }
  }
  return json;
}

// The first word that is neither an option (nor --log-level's value) nor a command: CLI11 says
// only "A subcommand is required" of `gpuckpt dumpp`.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return {};
    if (arg == "--log-level") {
      ++i;
      continue;
    }
    if (arg.starts_with("-")) continue;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      if (sub->check_name(std::string(arg))) return {};
    return std::string(arg);
  }
  return {};
}

// Every --pid takes a positive integer pid, with a message that says so, whichever command
// group registered it with CLI::PositiveNumber.
void check_pids(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (CLI::Option* o = sub->get_option_no_throw("--pid")) {
      bool replaced = false;
      try {
        for (int i = 0;; ++i) {
          CLI::Validator* v = o->get_validator(i);  // throws past the last one
          if (v->get_description() == "POSITIVE") {
            *v = gpuckpt::cli::pid_check();
            replaced = true;
          }
        }
      } catch (const CLI::OptionNotFound&) {
      }
      if (!replaced) o->check(gpuckpt::cli::pid_check());
    }
    check_pids(*sub);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gpuckpt;
  // Started with stdin, stdout or stderr closed, gpuckpt's first pipe (the guard's) would land
  // on that number, and the guard would start with a stdin it closes on exec: /dev/null takes
  // each closed one first.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF && ::open("/dev/null", O_RDWR) < 0) return 126;
  cli::Context ctx;
  cli::install_interrupt_handler(ctx, json_requested(argc, argv));
  CLI::App app{"gpuckpt: checkpoint, restore and migrate GPU serving processes"};
  app.set_version_flag("--version", std::string("gpuckpt ") + version());
  app.require_subcommand(1);
  // Inherited by every subcommand added below: global options may follow the subcommand
  // (`gpuckpt dump --json ...`), as docs/CLI.md promises.
  app.fallthrough();
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
  cli::add_keygen_command(app, ctx);
  check_pids(app);

  // Logs go to stderr so that stdout stays clean for --json.
  auto logger = spdlog::stderr_color_mt("gpuckpt");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%^[%l]%$ %v");
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(ctx.log_level)); });

  try {
    fault_point(fault::kParse);  // a signal before the command line is parsed: tests stop here
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    cli::stop_here_if_interrupted();  // the interrupt's JSON is the one printed
    // --help/--version exit 0; every usage error exits 2 (CLI11's own codes are >100).
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string what = e.what();
    if (const std::string word = unknown_command(app, argc, argv); !word.empty()) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      what = "unknown command '" + word + "' (commands: " + names + ")";
    }
    if (ctx.json || json_requested(argc, argv)) {
      ctx.emit({{"ok", false},
                {"error", {{"code", std::string(errc_name(Errc::kUsage))}, {"message", what}}}});
      std::cerr << "gpuckpt: usage error: " << what << "\n";
    } else if (what != e.what()) {
      std::cerr << "gpuckpt: usage error: " << what << "\nRun with --help for more information.\n";
    } else {
      app.exit(e);
    }
    return static_cast<int>(Errc::kUsage);
  } catch (const Error& e) {
    cli::stop_here_if_interrupted();
    ctx.progress_done();
    if (ctx.json) {
      ctx.emit({{"ok", false},
                {"error", {{"code", std::string(errc_name(e.code()))}, {"message", e.what()}}}});
    }
    std::cerr << "gpuckpt: error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    cli::stop_here_if_interrupted();
    ctx.progress_done();
    std::cerr << "gpuckpt: internal error: " << e.what() << "\n";
    return static_cast<int>(Errc::kInternal);
  }
  cli::stop_here_if_interrupted();
  if (const int sig = deferred_interrupt(); sig != 0)
    spdlog::warn("{} came after the operation had committed; it completed as reported",
                 sigabbrev_np(sig));
  return ctx.exit_code;
}
