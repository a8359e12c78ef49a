// Whole-process checkpoint/restore: freeze, CUDA device checkpoint, CRIU dump, streaming to a
// checkpoint image; and the reverse. Every stage is timed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpuckpt/device.h"
#include "gpuckpt/image.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {

// How to tell that a (re)started service answers: connect to a unix or TCP socket, optionally
// send a request and wait for a reply line; ask an HTTP server until it answers 2xx; or wait
// for a line on the child's stdout.
struct ReadinessProbe {
  enum class Kind { kNone, kUnix, kTcp, kStdoutLine, kHttp };
  Kind kind = Kind::kNone;
  std::string target;  // socket path, "host:port" (tcp, http), or the text to wait for on stdout
  std::string path;    // http: the request path ("/health"), with any query
  // Sent after connecting (a '\n' is appended); empty = connect only. http: POSTed as the
  // body (application/json); empty = GET.
  std::string request;
  std::chrono::milliseconds timeout{60000};
};
// Parses "unix:PATH", "tcp:HOST:PORT", "http://HOST:PORT[/PATH]", "stdout:TEXT"; throws
// Error(kUsage).
ReadinessProbe parse_probe(const std::string& spec);
// Polls until the probe succeeds; returns the reply line, for http the first line of a 2xx
// answer's body or else its status line (may be empty). Throws kTimeout.
std::string wait_ready(const ReadinessProbe& probe);

// How gpuckpt runs CRIU (docs/CRIU.md, docs/PROCESS.md).
struct CriuSettings {
  std::filesystem::path binary;          // empty: $GPUCKPT_CRIU, else GPUCKPT_CRIU_PREFIX/bin/criu
  std::vector<std::string> extra_args;   // appended verbatim to criu dump/restore
  std::chrono::seconds timeout{1800};    // bound on each criu run (it is killed past it)
  bool check = true;                     // run `criu check` as part of the preflight
};

struct DumpOptions {
  pid_t pid = 0;
  std::filesystem::path output;
  // Snapshot: the process continues right after CRIU's dump (it runs while the image is
  // compressed and written). Otherwise it is kept stopped until the checkpoint is durable and
  // then killed; if writing the checkpoint fails it is resumed instead (nothing is lost).
  bool leave_running = false;
  std::filesystem::path staging_root = "/dev/shm";  // CRIU writes its images here first
  PackOptions pack;  // pack.force replaces an existing checkpoint; pack.progress is also used
                     // for the CRIU stages
  std::chrono::milliseconds lock_timeout{10000};  // cuCheckpointProcessLock timeout
  // Established TCP connections: false = not dumped (criu --tcp-close: on restore they are
  // gone, a client in mid-request sees its connection reset); true = dumped with their state
  // (criu --tcp-established, the network to them is locked meanwhile), so a client's
  // connection survives. Listening sockets come back either way.
  bool tcp_established = false;
  CriuSettings criu;
};

struct DumpResult {
  Timeline timeline;
  std::uint64_t image_bytes = 0;       // CRIU image bytes before compression
  std::uint64_t checkpoint_bytes = 0;  // bytes on storage
  bool gpu = false;                    // the process had CUDA state
  std::vector<std::string> gpu_uuids;  // GPUs the process had open
  std::string criu_version;
  std::string comm;                    // the process's name
  std::vector<pid_t> tree;             // every dumped process, root first
};

DumpResult dump(const DumpOptions& opts);

struct RestoreOptions {
  std::filesystem::path checkpoint;
  GpuMap gpu_map;
  std::filesystem::path staging_root = "/dev/shm";
  UnpackOptions unpack;  // unpack.progress is also used for the CRIU stages
  ReadinessProbe probe;  // if set, "first_answer" is timed as the last stage
  // Restore into a fresh pid namespace, so that the checkpointed pid may still be in use on
  // this host (the original runs, or is kept frozen by migrate). The restored process then has
  // its old pid inside the namespace and RestoreResult::pid on the host.
  bool new_pid_ns = false;
  // With new_pid_ns: a live process still serving a unix socket path of the checkpoint is
  // refused (the restored copy would silently take the path over); true hands it over.
  bool take_endpoints = false;
  CriuSettings criu;
  TrustOptions trust;  // who may have written the checkpoint (check_trust, gpuckpt/image.h)
};

struct RestoreResult {
  pid_t pid = 0;        // the restored process (the tree's root), from the caller's pid namespace
  std::vector<pid_t> tree;  // every restored process, root first, from the caller's namespace
  pid_t ns_pid = 0;     // its pid inside its own namespace (the checkpointed pid)
  pid_t pidns_init = 0; // host pid of the namespace's init (new_pid_ns only)
  Timeline timeline;
  std::string first_answer;
  bool gpu = false;     // the plugin restored CUDA state
};

RestoreResult restore(const RestoreOptions& opts);

enum class MigrateHandoff {
  kAuto,     // kRelease if the tree listens on TCP or an abstract unix socket, else kFrozen
  // The original stays frozen until the copy (in a new pid namespace) answers; a rollback only
  // resumes it. Impossible for endpoints the frozen original keeps bound (TCP ports,
  // abstract unix sockets).
  kFrozen,
  // The original ends once the checkpoint is durable, which releases its ports and pids; the
  // copy is restored in place. A rollback restores the original from the same checkpoint.
  kRelease,
};
const char* handoff_name(MigrateHandoff h);

struct MigrateOptions {
  pid_t pid = 0;
  std::filesystem::path to_dir;  // where the checkpoint is written and restored from
  GpuMap gpu_map;
  ReadinessProbe probe;
  bool keep_checkpoint = false;
  PackOptions pack;
  std::filesystem::path staging_root = "/dev/shm";
  std::chrono::milliseconds lock_timeout{10000};
  bool tcp_established = false;  // as in DumpOptions
  // How the endpoints pass from the original to the copy on this host (docs/PROCESS.md):
  MigrateHandoff handoff = MigrateHandoff::kAuto;
  CriuSettings criu;
  TrustOptions trust;  // applied to the checkpoint before it is restored
};

struct MigrateResult {
  pid_t old_pid = 0, new_pid = 0;
  MigrateHandoff handoff = MigrateHandoff::kAuto;  // the one used (never kAuto)
  Timeline timeline;  // dump stages, then restore stages, on one clock
  std::filesystem::path checkpoint;  // kept (keep_checkpoint) or already removed
  std::string first_answer;
};

// Same-host migration (docs/PROCESS.md): the old process is dumped and kept frozen, the
// checkpoint is written to `to_dir` and restored from there into a new pid namespace; the old
// process is killed only after the new one answers the probe (or, without a probe, after the
// restore succeeded). If anything fails the new process is killed and the old one is resumed
// (rollback), and the error says so.
MigrateResult migrate(const MigrateOptions& opts);

// For a program's handler of SIGINT, SIGTERM and SIGHUP (the CLI waits for them in a thread of
// its own): every dump, restore or migrate in flight is rolled back by its guard (the target
// resumed, copies killed, staging removed) before this returns. Returns what each guard did.
// The program then exits; an operation's own thread must not carry on.
std::vector<std::string> interrupt_operations(std::chrono::milliseconds timeout);

// Extra work for interrupt_operations() while this object lives (e.g. a benchmark's service to
// kill); it runs after the guards' rollbacks, in the signal-handling thread.
class OnInterrupt {
 public:
  explicit OnInterrupt(std::function<void()> fn);
  ~OnInterrupt();
  OnInterrupt(const OnInterrupt&) = delete;
  OnInterrupt& operator=(const OnInterrupt&) = delete;

 private:
  std::function<void()> fn_;
};

}  // namespace gpuckpt
