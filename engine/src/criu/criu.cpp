#include "criu/criu.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <fstream>
#include <sstream>
#include <string_view>

#include "gpuckpt/error.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt::criu {

namespace {

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

fs::path find_plugin_dir() {
  if (const char* d = env_or_null("GPUCKPT_CRIU_PLUGIN_DIR")) return d;
  const fs::path candidates[] = {
      self_exe_dir() / ".." / "lib" / "gpuckpt" / "criu",
      fs::path(GPUCKPT_INSTALL_LIB_DIR) / "criu",
  };
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::exists(c / kPluginFile, ec)) return fs::weakly_canonical(c, ec);
  }
  return {};
}

// Runs argv with stdout and stderr appended to `out_file`, killing it past `l.timeout`.
ExitStatus run_logged(const std::vector<std::string>& argv, const fs::path& out_file,
                      const std::string& what, const Launch& l) {
  SpawnOptions so;
  so.env = l.env;
  so.namespace_fds = l.namespace_fds;
  so.before_exec = l.before_start;
  so.stdout_file = out_file;
  so.stderr_file = out_file;
  // A Ctrl-C to gpuckpt's process group must not interrupt criu behind the guard's back: the
  // guard lets criu finish and then puts the tasks back (process/guard.h).
  so.new_process_group = true;
  Child c = spawn(argv, so);
  if (l.on_start) l.on_start(c.pid());
  if (auto st = c.wait_for(l.timeout)) return *st;
  // CRIU has no clean cancel: SIGTERM first so that it can detach from the tasks if it is
  // between stages, then SIGKILL. A task killed mid-dump is resumed by the kernel when its
  // tracer dies; see docs/PROCESS.md ("timeouts").
  c.kill(SIGTERM);
  if (!c.wait_for(std::chrono::seconds(5))) {
    c.kill(SIGKILL);
    c.wait();
  }
  throw Error(Errc::kTimeout, what + " did not finish within " + std::to_string(l.timeout.count()) +
                                  " s and was killed");
}

// The "patches HASH NAME..." line of scripts/install-criu.sh's build record, beside `binary`
// in its prefix. A CRIU built any other way has none, and is taken as unpatched.
std::vector<std::string> build_patches(const fs::path& binary) {
  std::ifstream in(binary.parent_path().parent_path() / "share" / "gpuckpt-criu" / "build.txt");
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string key, hash;
    if (!(words >> key >> hash) || key != "patches") continue;
    std::vector<std::string> names;
    for (std::string n; words >> n;) names.push_back(n);
    return names;
  }
  return {};
}

}  // namespace

std::string log_tail(const fs::path& file, std::size_t max_lines) {
  std::ifstream in(file);
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (last.size() > max_lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += "  " + l + "\n";
  return out;
}

Installation locate(const fs::path& override_binary) {
  Installation inst;
  if (!override_binary.empty())
    inst.binary = override_binary;
  else if (const char* e = env_or_null("GPUCKPT_CRIU"))
    inst.binary = e;
  else
    inst.binary = fs::path(GPUCKPT_CRIU_PREFIX) / "bin" / "criu";
  if (::access(inst.binary.c_str(), X_OK) != 0) {
    throw Error(Errc::kCriu, "CRIU not found at " + inst.binary.string() +
                                 "; run scripts/install-criu.sh (or set GPUCKPT_CRIU to a criu "
                                 "binary)");
  }
  inst.plugin_dir = find_plugin_dir();
  inst.patches = build_patches(inst.binary);
  return inst;
}

bool Installation::has_patch(std::string_view name) const {
  return std::find(patches.begin(), patches.end(), name) != patches.end();
}

std::string version(const Installation& inst) {
  RunResult r;
  try {
    r = run_capture({inst.binary.string(), "--version"}, std::chrono::seconds(30));
  } catch (const Error& e) {
    throw Error(Errc::kCriu, "cannot run " + inst.binary.string() + ": " + e.what());
  }
  if (!r.status.ok())
    throw Error(Errc::kCriu, inst.binary.string() + " --version failed (" + r.status.describe() +
                                 "):\n" + r.output);
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Version:", 0) == 0) {
      auto v = line.substr(8);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  throw Error(Errc::kCriu,
              "unexpected output of " + inst.binary.string() + " --version: " + r.output);
}

void check(const Installation& inst, std::chrono::seconds timeout) {
  // criu's output goes to an anonymous file: no temporary directory for a SIGKILL to leave.
  UniqueFd out(::memfd_create("gpuckpt-criu-check", MFD_CLOEXEC));
  if (!out) throw_errno(Errc::kInternal, "memfd_create");
  SpawnOptions so;
  so.stdout_fd = out.get();
  so.stderr_fd = out.get();
  so.new_process_group = true;
  Child c = spawn({inst.binary.string(), "check"}, so);
  auto st = c.wait_for(timeout);
  if (!st) {
    c.kill(SIGKILL);
    c.wait();
    throw Error(Errc::kTimeout,
                "criu check did not finish within " + std::to_string(timeout.count()) + " s");
  }
  if (!st->ok()) {
    const std::string tail = log_tail("/proc/self/fd/" + std::to_string(out.get()), 12);
    throw Error(Errc::kCriu, "criu check failed (" + st->describe() +
                                 "): this kernel or CRIU "
                                 "installation cannot checkpoint processes:\n" +
                                 tail + "See docs/CRIU.md.");
  }
}

std::vector<std::string> dump_argv(const Installation& inst, const DumpArgs& a,
                                   const fs::path& log) {
  std::vector<std::string> v{inst.binary.string(),
                             "dump",
                             "-t",
                             std::to_string(a.pid),
                             "-D",
                             a.images_dir.string(),
                             "-v4",
                             "-o",
                             log.string(),
                             "--timeout",
                             std::to_string(a.freeze_timeout.count())};
  if (a.shell_job) v.push_back("--shell-job");
  if (a.stream) v.push_back("--stream");
  if (a.final_state == FinalState::kRunning) v.push_back("--leave-running");
  if (a.final_state == FinalState::kStopped) v.push_back("--leave-stopped");
  if (!inst.plugin_dir.empty()) v.insert(v.end(), {"--libdir", inst.plugin_dir.string()});
  v.insert(v.end(), a.extra_args.begin(), a.extra_args.end());
  return v;
}

std::vector<std::string> restore_argv(const Installation& inst, const RestoreArgs& a,
                                      const fs::path& log) {
  std::vector<std::string> v{inst.binary.string(),
                             "restore",
                             "-D",
                             a.images_dir.string(),
                             "-d",  // detach: criu exits once the tree runs
                             "--pidfile",
                             a.pidfile.string(),
                             "-v4",
                             "-o",
                             log.string()};
  if (a.shell_job) v.push_back("--shell-job");
  if (a.stream) v.push_back("--stream");
  if (!inst.plugin_dir.empty()) v.insert(v.end(), {"--libdir", inst.plugin_dir.string()});
  v.insert(v.end(), a.extra_args.begin(), a.extra_args.end());
  return v;
}

std::string log_excerpt(const fs::path& log, std::size_t max_lines) {
  std::ifstream in(log);
  if (!in) return "  (no log at " + log.string() + ")\n";
  std::deque<std::string> errors;
  for (std::string line; std::getline(in, line);) {
    // CRIU's log lines look like "(00.012345) Error (criu/cr-dump.c:2088): ...".
    // CRIU logs a harmless "Can't setup RLIMIT_NOFILE" error on every run here: not a cause.
    if ((line.find("Error") != std::string::npos || line.find("FAIL") != std::string::npos) &&
        line.find("RLIMIT_NOFILE") == std::string::npos) {
      errors.push_back(line);
      if (errors.size() > max_lines) errors.pop_front();
    }
  }
  if (errors.empty()) return log_tail(log, max_lines);
  std::string out;
  for (const auto& l : errors) out += "  " + l + "\n";
  return out;
}

fs::path preserve_log(const fs::path& log, const std::string& tag) {
  const char* t = std::getenv("TMPDIR");
  const fs::path dir =
      fs::path(t && *t ? t : "/tmp") / ("gpuckpt-logs-" + std::to_string(::geteuid()));
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return log;
  struct stat st {};
  // Someone else's directory, or a link planted in a shared /tmp: keep the original path.
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0)
    return log;
  std::string name = (dir / (tag + "-" + std::to_string(::time(nullptr)) + "-XXXXXX.log")).string();
  UniqueFd out(::mkostemps(name.data(), 4, O_CLOEXEC | O_NOFOLLOW));
  if (!out) return log;
  UniqueFd in(::open(log.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!in) return log;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(in.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (::write(out.get(), buf, static_cast<std::size_t>(n)) != n) return log;
  }
  return name;
}

void check_exit(const std::string& what, const ExitStatus& st, const fs::path& log) {
  if (st.ok()) return;
  throw Error(Errc::kCriu, what + " failed (" + st.describe() + "):\n" + log_excerpt(log) +
                               "full log: " + log.string());
}

namespace {

Run run_op(const std::string& op, const std::vector<std::string>& argv, const fs::path& log,
           const Launch& l) {
  Run r{argv, log, {}, {}};
  const fs::path out = log.parent_path() / ("criu-" + op + ".out");
  r.start = std::chrono::steady_clock::now();
  ExitStatus st;
  try {
    st = run_logged(argv, out, "criu " + op, l);
  } catch (const Error& e) {
    if (e.code() != Errc::kTimeout) throw;
    const fs::path kept = preserve_log(log, "criu-" + op);
    if (l.on_end) l.on_end(ExitStatus{false, SIGKILL}, kept);
    throw Error(Errc::kTimeout,
                std::string(e.what()) + ":\n" + log_excerpt(kept) + "full log: " + kept.string());
  }
  r.end = std::chrono::steady_clock::now();
  if (st.ok() && l.on_end) l.on_end(st, log);
  if (!st.ok()) {
    const fs::path kept = preserve_log(log, "criu-" + op);
    if (l.on_end) l.on_end(st, kept);
    std::string msg = "criu " + op + " failed (" + st.describe() + "):\n" + log_excerpt(kept);
    std::error_code ec;
    if (fs::file_size(out, ec) > 0 && !ec) msg += "criu output:\n" + log_tail(out, 5);
    throw Error(Errc::kCriu, msg + "full log: " + kept.string());
  }
  return r;
}

}  // namespace

Run dump(const Installation& inst, const DumpArgs& a) {
  const fs::path log = a.images_dir / "dump.log";
  return run_op("dump", dump_argv(inst, a, log), log, a);
}

Run restore(const Installation& inst, const RestoreArgs& a) {
  // The log goes beside the pidfile, outside the images (which CRIU only reads).
  const fs::path log = a.pidfile.parent_path() / kRestoreLogName;
  return run_op("restore", restore_argv(inst, a, log), log, a);
}

namespace {

enum class Value { kNone, kRequired, kOptional };  // kOptional: only as --opt=VALUE, as CRIU
enum Ops : unsigned { kDumpOnly = 1, kRestoreOnly = 2, kBoth = 3 };

struct PassThrough {
  std::string_view name;
  Value value;
  unsigned ops;
};

// What CRIU may be told beyond what gpuckpt sets: options that let a dump or restore of the
// same tree succeed (external resources, locks, cgroups, LSM, ghost files), never ones that
// pick the tree, where images go, or how the tasks end.
constexpr PassThrough kAllowed[] = {
    {"--file-locks", Value::kNone, kBoth},
    {"--ext-unix-sk", Value::kOptional, kBoth},
    {"--link-remap", Value::kNone, kBoth},
    {"--ghost-limit", Value::kRequired, kBoth},
    {"--evasive-devices", Value::kNone, kBoth},
    {"--manage-cgroups", Value::kOptional, kBoth},
    {"--cgroup-root", Value::kRequired, kBoth},
    {"--external", Value::kRequired, kBoth},
    {"--ext-mount-map", Value::kRequired, kBoth},
    {"--enable-external-sharing", Value::kNone, kBoth},
    {"--enable-external-masters", Value::kNone, kBoth},
    {"--skip-mnt", Value::kRequired, kBoth},
    {"--enable-fs", Value::kRequired, kBoth},
    {"--skip-in-flight", Value::kNone, kDumpOnly},
    {"--force-irmap", Value::kNone, kDumpOnly},
    {"--irmap-scan-path", Value::kRequired, kDumpOnly},
    {"--weak-sysctls", Value::kNone, kRestoreOnly},
    {"--lsm-profile", Value::kRequired, kRestoreOnly},
    {"--lsm-mount-context", Value::kRequired, kRestoreOnly},
    {"--inherit-fd", Value::kRequired, kRestoreOnly},
    {"--file-validation", Value::kRequired, kRestoreOnly},
};

// Options that users reach for and gpuckpt has a flag of its own for.
struct Instead {
  std::string_view name, use;
};
constexpr Instead kInstead[] = {
    {"-t", "--pid"},
    {"--tree", "--pid"},
    {"--leave-running", "gpuckpt's --leave-running"},
    {"-R", "gpuckpt's --leave-running"},
    {"--tcp-established", "gpuckpt's --tcp-established"},
    {"--tcp-close", "gpuckpt's default (no --tcp-established)"},
    {"--timeout", "--criu-timeout (and --lock-timeout)"},
    {"--stream", "--staging-mode stream"},
    {"-D", "-o (dump) or the checkpoint argument (restore)"},
    {"--images-dir", "-o (dump) or the checkpoint argument (restore)"},
};

std::string allowed_list(Op op) {
  std::string s;
  const unsigned bit = op == Op::kDump ? kDumpOnly : kRestoreOnly;
  for (const auto& a : kAllowed)
    if (a.ops & bit) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

}  // namespace

void check_extra_args(Op op, const std::vector<std::string>& args) {
  const char* cmd = op == Op::kDump ? "criu dump" : "criu restore";
  const unsigned bit = op == Op::kDump ? kDumpOnly : kRestoreOnly;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const auto allowed = std::find_if(std::begin(kAllowed), std::end(kAllowed),
                                      [&](const PassThrough& a) { return a.name == name; });
    if (allowed == std::end(kAllowed) || !(allowed->ops & bit)) {
      std::string why = "--criu-opt " + arg + " is refused: ";
      const auto instead = std::find_if(std::begin(kInstead), std::end(kInstead),
                                        [&](const Instead& x) { return x.name == name; });
      if (instead != std::end(kInstead))
        why += "gpuckpt sets it itself (use " + std::string(instead->use) + ")";
      else if (allowed != std::end(kAllowed))
        why += "it is not an option of " + std::string(cmd);
      else
        why += "gpuckpt passes to " + std::string(cmd) +
               " only options that cannot change which processes are dumped, where their "
               "images go, or how they end";
      throw Error(Errc::kUsage, why + ". Allowed: " + allowed_list(op) + "; nothing was frozen");
    }
    if (allowed->value == Value::kNone && eq != std::string::npos)
      throw Error(Errc::kUsage, "--criu-opt " + arg + ": " + name + " takes no value");
    if (allowed->value == Value::kRequired && eq == std::string::npos) {
      // The value is the next argument (--criu-opt=--ghost-limit --criu-opt=64M).
      if (i + 1 >= args.size())
        throw Error(Errc::kUsage, "--criu-opt " + arg + " needs a value (" + name + "=VALUE)");
      ++i;
    }
  }
}

std::vector<std::string> tcp_args(bool established) {
  // nftables: CRIU locks each connection with libnftables (no iptables binary needed).
  if (established) return {"--tcp-established", "--network-lock", "nftables"};
  return {"--tcp-close"};
}

}  // namespace gpuckpt::criu
