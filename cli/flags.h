// Option groups shared by the process commands (dump/restore/migrate) and their benchmarks.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "commands.h"

namespace gpuckpt::cli {

// CRIU options.
struct CriuFlags {
  std::string binary;
  std::vector<std::string> extra;
  int timeout_s = 1800;
  bool no_check = false;

  void add(CLI::App* c) {
    c->add_option("--criu", binary,
                  "criu binary (default: $GPUCKPT_CRIU, else the install prefix)");
    c->add_option(
         "--criu-opt", extra,
         "Extra argument passed verbatim to criu (repeatable), e.g. --criu-opt=--tcp-established")
        ->allow_extra_args(false);
    c->add_option("--criu-timeout", timeout_s, "Kill criu if a run takes longer (seconds)")
        ->check(CLI::PositiveNumber);
    c->add_flag("--no-criu-check", no_check, "Skip the `criu check` preflight");
  }
  CriuSettings settings() const {
    CriuSettings s;
    s.binary = binary;
    s.extra_args = extra;
    s.timeout = std::chrono::seconds(timeout_s);
    s.check = !no_check;
    return s;
  }
};

// Readiness probe options: --probe SPEC [--request LINE] [--probe-timeout S].
struct ProbeFlags {
  std::string spec, request;
  double timeout_s = 60;

  // `required`: the command cannot run without a probe; only then is stdout:TEXT offered (a
  // restored or migrated process's stdout is not ours to read).
  void add(CLI::App* c, bool required = false) {
    auto* o = c->add_option("--probe", spec,
                            "Readiness probe, timed as first_answer: unix:PATH, tcp:HOST:PORT" +
                                std::string(required ? " or stdout:TEXT" : ""));
    if (required) o->required();
    c->add_option("--request", request,
                  "Line sent once connected (e.g. PING); the reply line is the first answer");
    c->add_option("--probe-timeout", timeout_s, "Seconds to wait for the first answer")
        ->check(CLI::PositiveNumber);
  }
  ReadinessProbe probe() const {
    ReadinessProbe p;
    if (spec.empty()) {
      if (!request.empty()) throw Error(Errc::kUsage, "--request needs --probe");
      return p;
    }
    p = parse_probe(spec);
    p.request = request;
    p.timeout = std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
    return p;
  }
};

}  // namespace gpuckpt::cli
