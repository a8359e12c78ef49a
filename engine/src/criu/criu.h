// Running the CRIU binary: locating it (and gpuckpt's CRIU plugin), the preflight check, and
// `criu dump` / `criu restore` with a bounded run time, the log kept, and a failure turned into
// Error(kCriu) that quotes the log's error lines. Which options are passed, and why: docs/CRIU.md
// and docs/PROCESS.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "util/subprocess.h"

namespace gpuckpt::criu {

// File name of gpuckpt's CRIU plugin inside its plugin directory (criu --libdir).
inline constexpr const char* kPluginFile = "gpuckpt_criu_plugin.so";
// "1" in criu restore's environment turns on the huge-page fill of gpuckpt's CRIU build
// (scripts/criu-patches, docs/CRIU.md); any other CRIU ignores it.
inline constexpr const char* kEnvThpFill = "GPUCKPT_CRIU_THP_FILL";
// Streams per restored task's pages image (scripts/criu-patches/0004); unset: CRIU's default.
inline constexpr const char* kEnvCopyStreams = "GPUCKPT_CRIU_COPY_STREAMS";

// The patch of gpuckpt's CRIU build that lets `criu swrk` (a container runtime's CRIU) stream
// its images: with `stream` in its configuration file, runc's CRIU reads them from a
// RestoreStreamer as `criu restore --stream` does (scripts/criu-patches, docs/CRIU.md).
inline constexpr const char* kRpcStreamPatch = "0003-rpc-stream.patch";

struct Installation {
  std::filesystem::path binary;      // criu (the prefix's wrapper script)
  std::filesystem::path plugin_dir;  // directory holding kPluginFile; empty if none was found
  // The patches of gpuckpt's CRIU build (file names), from the build record that
  // scripts/install-criu.sh keeps beside the binary; none for any other CRIU.
  std::vector<std::string> patches;
  bool has_patch(std::string_view name) const;
};

// Resolves the CRIU binary: `override_binary` if given, else $GPUCKPT_CRIU, else
// GPUCKPT_CRIU_PREFIX/bin/criu. The plugin directory: $GPUCKPT_CRIU_PLUGIN_DIR, else
// <exe dir>/../lib/gpuckpt/criu (build and install trees), else the install prefix's. Does not
// run anything but reads the build record (PREFIX/share/gpuckpt-criu/build.txt for
// PREFIX/bin/criu); throws Error(kCriu) "CRIU not found at ...; run scripts/install-criu.sh" when
// the binary is missing.
Installation locate(const std::filesystem::path& override_binary = {});

// `criu --version` -> "4.1.1". Throws Error(kCriu) if it does not run.
std::string version(const Installation& inst);

// `criu check`: throws Error(kCriu) with CRIU's own explanation when the kernel or the
// installation cannot checkpoint.
void check(const Installation& inst, std::chrono::seconds timeout = std::chrono::seconds(60));

// What happens to the dumped tree after `criu dump`.
enum class FinalState { kKilled, kRunning, kStopped };

// How criu runs, whichever operation: what a dump and a restore share.
struct Launch {
  std::vector<std::string> env;  // "KEY=VALUE" for criu and the plugin inside it
  std::chrono::seconds timeout{1800};
  // Namespaces (nsfs fds, the caller's) CRIU runs in: one that the tree shares with CRIU is
  // not taken into a dump's images, and a restore leaves it as it is (its caller joins it
  // again).
  std::vector<int> namespace_fds;
  // Called with criu's pid before it runs (criu runs only once this returns, never if it
  // throws): the guard must know criu before criu can freeze anything.
  std::function<void(pid_t)> before_start;
  std::function<void(pid_t)> on_start;  // called with criu's pid once it runs
  // Called once criu has ended (before dump() or restore() returns or throws): how it ended
  // (killed past the timeout: a signal), and where its log is (once it failed, a copy outside
  // the directory that the caller may remove).
  std::function<void(const ExitStatus&, const std::filesystem::path& log)> on_end;
};

struct DumpArgs : Launch {
  pid_t pid = 0;
  std::filesystem::path images_dir;  // must exist; CRIU writes its images here
  FinalState final_state = FinalState::kStopped;
  bool shell_job = false;                   // the task's session/tty are outside the dumped tree
  std::vector<std::string> extra_args;      // passed through verbatim (e.g. --tcp-established)
  std::chrono::seconds freeze_timeout{10};  // criu --timeout: bounds the freezing stage
  // criu --stream: the images go to gpuckpt's DumpStreamer (criu/streamer.h) listening in
  // images_dir, not into files there.
  bool stream = false;
};

struct RestoreArgs : Launch {
  std::filesystem::path images_dir;
  std::filesystem::path pidfile;  // criu writes the restored root task's pid here
  bool shell_job = false;
  bool stream = false;  // criu --stream: images come from a RestoreStreamer in images_dir
  std::vector<std::string> extra_args;
};

// Argument vectors, exposed so that a restore can be launched from inside another pid
// namespace (process/pidns.h) with exactly the same options.
std::vector<std::string> dump_argv(const Installation& inst, const DumpArgs& a,
                                   const std::filesystem::path& log);
std::vector<std::string> restore_argv(const Installation& inst, const RestoreArgs& a,
                                      const std::filesystem::path& log);

struct Run {
  std::vector<std::string> argv;
  std::filesystem::path log;  // CRIU's -v4 log
  std::chrono::steady_clock::time_point start, end;
  double seconds() const { return std::chrono::duration<double>(end - start).count(); }
};

// restore()'s log, beside the pidfile.
inline constexpr const char* kRestoreLogName = "restore.log";

// Run criu; on a non-zero exit or a timeout, throws Error(kCriu / kTimeout) whose message has
// the log's last error lines. The log is written to images_dir/{dump,restore}.log; on failure
// it is first copied to $TMPDIR (the images dir is usually a temporary staging directory) and
// the message names that copy.
Run dump(const Installation& inst, const DumpArgs& a);
Run restore(const Installation& inst, const RestoreArgs& a);

// Turns a finished criu run into success or the Error described above. `what` = "criu dump".
void check_exit(const std::string& what, const ExitStatus& st, const std::filesystem::path& log);

// The last `max_lines` lines of a file, each indented by two spaces ("" if it cannot be read).
std::string log_tail(const std::filesystem::path& file, std::size_t max_lines);

// The log's error lines (at most `max_lines`, the last ones), or its last lines if it has none.
std::string log_excerpt(const std::filesystem::path& log, std::size_t max_lines = 8);

// Copies a log out of a directory that is about to be removed, into a private directory
// ($TMPDIR/gpuckpt-logs-<uid>, mode 0700, refused if it is not ours or is a link) under a fresh
// name opened with O_EXCL|O_NOFOLLOW, so that nobody can plant a link there; returns the copy's
// path (or the original path if copying failed).
std::filesystem::path preserve_log(const std::filesystem::path& log, const std::string& tag);

// Which criu command a --criu-opt is for.
enum class Op { kDump, kRestore };

// Refuses (Error kUsage, naming the option and what to use instead) any extra criu argument
// that is not on gpuckpt's allow-list for `op`: an option that gpuckpt sets itself (-t, -D,
// --leave-running, --stream, --pidfile, the log, TCP handling...), or that changes which tasks
// are dumped or how they end, would contradict the record and the guard. Called before
// anything is frozen or restored. A value is given as --opt=VALUE or as the next argument.
void check_extra_args(Op op, const std::vector<std::string>& args);

// criu options for established TCP connections, the same on dump and restore: dumped with
// their state (--tcp-established) or not at all (--tcp-close). docs/PROCESS.md ("TCP").
std::vector<std::string> tcp_args(bool established);

}  // namespace gpuckpt::criu
