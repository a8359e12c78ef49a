// Whole-process checkpoint/restore: freeze, CUDA device checkpoint, CRIU dump, streaming to a
// checkpoint image; and the reverse. Every stage is timed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gpuckpt/device.h"
#include "gpuckpt/image.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {

// How to tell that a (re)started service answers: connect to a unix or TCP socket, optionally
// send a request and wait for a reply line; or wait for a line on the child's stdout.
struct ReadinessProbe {
  enum class Kind { kNone, kUnix, kTcp, kStdoutLine };
  Kind kind = Kind::kNone;
  std::string target;   // socket path, "host:port", or the substring to wait for on stdout
  std::string request;  // sent after connecting (a '\n' is appended); empty = connect only
  std::chrono::milliseconds timeout{60000};
};
// Parses "unix:PATH", "tcp:HOST:PORT", "stdout:TEXT"; throws Error(kUsage).
ReadinessProbe parse_probe(const std::string& spec);
// Polls until the probe succeeds; returns the reply line (may be empty). Throws kTimeout.
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
  CriuSettings criu;
};

struct RestoreResult {
  pid_t pid = 0;        // the restored process, as seen from the caller's pid namespace
  pid_t ns_pid = 0;     // its pid inside its own namespace (the checkpointed pid)
  pid_t pidns_init = 0; // host pid of the namespace's init (new_pid_ns only)
  Timeline timeline;
  std::string first_answer;
  bool gpu = false;     // the plugin restored CUDA state
};

RestoreResult restore(const RestoreOptions& opts);

struct MigrateOptions {
  pid_t pid = 0;
  std::filesystem::path to_dir;  // where the checkpoint is written and restored from
  GpuMap gpu_map;
  ReadinessProbe probe;
  bool keep_checkpoint = false;
  PackOptions pack;
  std::filesystem::path staging_root = "/dev/shm";
  std::chrono::milliseconds lock_timeout{10000};
  CriuSettings criu;
};

struct MigrateResult {
  pid_t old_pid = 0, new_pid = 0;
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

}  // namespace gpuckpt
