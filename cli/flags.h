// Option groups shared by the process commands (dump/restore/migrate) and their benchmarks.
#pragma once

#include <chrono>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "commands.h"

namespace gpuckpt::cli {

// --copy-streams, for restore and bench restore.
inline void add_copy_streams(CLI::App* c, unsigned& streams) {
  c->add_option(
       "--copy-streams", streams,
       "Streams each restored process's pages are copied by, side by side (streamed "
       "restores; docs/CRIU.md \"Parallel copy\"). 1: one, as upstream CRIU reads them "
       "(default 0: half the CPUs, at most 9, fewer where the restore's buffer budget could not "
       "feed them all at once)")
      ->check(CLI::Range(0u, 9u));
}

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
         "Extra argument passed to criu (repeatable), e.g. --criu-opt=--file-locks; only "
         "options that cannot change which processes are dumped, where their images go or how "
         "they end are accepted (docs/PROCESS.md)")
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

// What dump and migrate take: the root of a live process tree (--pid) or a whole runc
// container (--container), one of the two.
struct TargetFlags {
  int pid = 0;
  std::string container;

  // Returns the --container option, for options that need it.
  CLI::Option* add(CLI::App* c, const std::string& pid_help, const std::string& container_help) {
    auto* p = c->add_option("--pid", pid, pid_help)->check(CLI::PositiveNumber);
    auto* box = c->add_option("--container", container, container_help);
    p->excludes(box);
    return box;
  }
  void require(const std::string& command) const {
    if (pid <= 0 && container.empty())
      throw Error(Errc::kUsage, command + " needs --pid PID or --container ID");
  }
};

// A time in seconds, more than 0 and at most `max_s`: CLI::PositiveNumber admits 1e300 (and
// inf), which overflow the millisecond count they become.
inline CLI::Validator seconds_check(double max_s) {
  return CLI::Validator(
      [max_s](std::string& in) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(in, v) && v > 0 && v <= max_s) return {};
        return "must be a number of seconds, more than 0 and at most " +
               std::to_string(static_cast<long long>(max_s)) + ", not '" + in + "'";
      },
      "SECONDS", "SECONDS");
}

// A process id: a positive integer. CLI::PositiveNumber admits "1.5" and words its refusal of
// "abc" as a floating-point range.
inline CLI::Validator pid_check() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        int v = 0;
        if (CLI::detail::lexical_cast(in, v) && v > 0) return {};
        return "must be a positive integer pid, not '" + in + "'";
      },
      "PID", "PID");
}

// An option bound to an enum, taking the names that the engine gives its values (through its
// NAME_name function): exactly those, listed in the help and in the refusal of any other word.
// One table, the engine's.
template <typename E>
CLI::Validator enum_option(std::initializer_list<E> values, const char* (*name)(E)) {
  std::vector<std::pair<std::string, E>> table;
  std::string names;
  for (const E v : values) {
    table.emplace_back(name(v), v);
    names += (names.empty() ? "" : ", ") + std::string(name(v));
  }
  return CLI::Validator(
      [table, names](std::string& in) -> std::string {
        for (const auto& [n, v] : table)
          if (in == n) {
            // CLI11 then reads the enum from its number.
            in = std::to_string(static_cast<std::underlying_type_t<E>>(v));
            return {};
          }
        return "'" + in + "' is none of " + names;
      },
      "one of: " + names);
}

// A readiness probe waits at most this long: longer is a typo, not a plan.
inline constexpr double kMaxProbeSeconds = 86400;

// --compress for the commands that write a checkpoint (pack, dump, migrate).
struct CompressFlag {
  Compression mode = Compression::kAuto;

  // `auto_means`: what the default does for this command.
  void add(CLI::App* c, const std::string& auto_means) {
    c->add_option("--compress", mode,
                  "Which chunks zstd is tried on. always: every one; adaptive: a chunk is "
                  "stored uncompressed while the compression workers are the bound and the "
                  "writes would wait for them (a larger checkpoint, durable sooner on a node "
                  "short of CPU); auto (default): " +
                      auto_means)
        ->transform(enum_option({Compression::kAlways, Compression::kAdaptive, Compression::kAuto},
                                compression_name));
  }
  Compression value() const { return mode; }
};

// What --compress auto does for a dump or a migration.
inline constexpr const char* kCompressAutoForDumps =
    "adaptive, except always where the checkpoint goes over a network as it is written (s3://, "
    "ssh://)";

// --sign-key KEY for the commands that write a checkpoint (pack, dump, migrate).
struct SignFlags {
  std::string key;

  void add(CLI::App* c) {
    c->add_option("--sign-key", key,
                  "ed25519 secret key (gpuckpt keygen) that signs the manifest (default: "
                  "sign_key in the gpuckpt config; none: unsigned)");
  }
  std::filesystem::path path() const {
    return key.empty() ? load_security_config().sign_key : std::filesystem::path(key);
  }
};

// Who may have written a checkpoint that is restored (restore, migrate) or verified.
struct TrustFlags {
  bool allow_untrusted = false, require_signature = false;
  std::string trusted_keys;

  // `restore`: also --allow-untrusted, and the config's require_signature applies.
  void add(CLI::App* c, bool restore = true) {
    restore_ = restore;
    if (restore)
      c->add_flag("--allow-untrusted", allow_untrusted,
                  "Restore a checkpoint not owned by root (or you), or writable by others");
    c->add_flag(
        "--require-signature", require_signature,
        "Refuse a checkpoint not signed by a trusted key" +
            std::string(restore ? " (default: require_signature in the gpuckpt config)" : ""));
    c->add_option("--trusted-keys", trusted_keys,
                  "Public key file, or directory of *.pub files, trusted to sign checkpoints "
                  "(default: trusted_keys in the gpuckpt config, else /etc/gpuckpt/trusted-keys)");
  }
  TrustOptions options() const {
    const SecurityConfig cfg = load_security_config();
    TrustOptions t;
    t.allow_untrusted = allow_untrusted;
    t.require_signature = require_signature || (restore_ && cfg.require_signature);
    t.trusted_keys = trusted_keys.empty() ? cfg.trusted_keys : std::filesystem::path(trusted_keys);
    return t;
  }

 private:
  bool restore_ = true;
};

// Readiness probe options: --probe SPEC [--request LINE] [--probe-timeout S].
struct ProbeFlags {
  std::string spec, request;
  double timeout_s = 60;

  // `required`: the command cannot run without a probe; only then is stdout:TEXT offered (a
  // restored or migrated process's stdout is not ours to read).
  void add(CLI::App* c, bool required = false) {
    auto* o = c->add_option("--probe", spec,
                            "Readiness probe, timed as first_answer: unix:PATH, tcp:HOST:PORT, "
                            "http://HOST:PORT/PATH (GET until 2xx; with --request, POSTs it)" +
                                std::string(required ? " or stdout:TEXT" : ""));
    if (required) o->required();
    c->add_option("--request", request,
                  "Line sent once connected (e.g. PING); the reply line is the first answer");
    c->add_option("--probe-timeout", timeout_s, "Seconds to wait for the first answer")
        ->check(seconds_check(kMaxProbeSeconds));
  }
  ReadinessProbe probe() const {
    ReadinessProbe p;
    if (spec.empty()) {
      if (!request.empty()) throw Error(Errc::kUsage, "--request needs --probe");
      return p;
    }
    p = parse_probe(spec);
    p.request = request;
    if (!(timeout_s > 0 && timeout_s <= kMaxProbeSeconds))  // also for defaults set in code
      throw Error(Errc::kUsage, "--probe-timeout must be more than 0 and at most " +
                                    std::to_string(static_cast<int>(kMaxProbeSeconds)) +
                                    " seconds (1 day)");
    p.timeout = std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
    return p;
  }
};

// The namespaces a restored container joins instead of its pod's (restore, migrate):
// --join-ns TYPE=PATH, repeated, and --netns PATH for the network alone.
struct PodNamespaceFlags {
  std::vector<std::string> join;
  std::string netns;

  void add(CLI::App* c, const std::string& whose) {
    c->add_option("--join-ns", join,
                  "With --container, for one that joined namespaces by path (a Kubernetes "
                  "pod's): TYPE=PATH, the " +
                      whose +
                      " joins instead (a new pod's), for each TYPE it joined (network, ipc, "
                      "uts), as /proc/PID/ns/net, ipc or uts of the new pod's sandbox or a bind "
                      "mount of one (/run/netns/NAME)")
        ->type_name("TYPE=PATH")
        ->allow_extra_args(false);
    c->add_option("--netns", netns,
                  "--join-ns network=PATH, for a container that joined no other namespace by "
                  "path");
  }
  PodNamespaces resolve() const {
    PodNamespaces out;
    auto put = [&out](PodNamespace t, const std::string& path) {
      if (path.empty())
        throw Error(Errc::kUsage,
                    std::string("--join-ns ") + pod_namespace_name(t) + "= names no path");
      if (!out.emplace(t, path).second)
        throw Error(Errc::kUsage, std::string("the ") + pod_namespace_name(t) +
                                      " namespace to join is named twice");
    };
    if (!netns.empty()) put(PodNamespace::kNetwork, netns);
    for (const auto& j : join) {
      const auto eq = j.find('=');
      const auto type =
          eq == std::string::npos ? std::nullopt : pod_namespace_from(j.substr(0, eq));
      if (!type)
        throw Error(
            Errc::kUsage,
            "--join-ns takes TYPE=PATH with TYPE network (or net), ipc or uts, not '" + j + "'");
      put(*type, j.substr(eq + 1));
    }
    return out;
  }
};

}  // namespace gpuckpt::cli
