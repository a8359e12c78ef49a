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

struct DumpOptions {
  pid_t pid = 0;
  std::filesystem::path output;
  bool leave_running = false;  // snapshot: the process continues after the dump
  std::filesystem::path staging_root = "/dev/shm";  // CRIU writes its images here first
  PackOptions pack;
  std::chrono::milliseconds lock_timeout{10000};  // cuCheckpointProcessLock timeout
};

struct DumpResult {
  Timeline timeline;
  std::uint64_t image_bytes = 0;       // CRIU image bytes before compression
  std::uint64_t checkpoint_bytes = 0;  // bytes on storage
  bool gpu = false;                    // the process had CUDA state
};

DumpResult dump(const DumpOptions& opts);

struct RestoreOptions {
  std::filesystem::path checkpoint;
  GpuMap gpu_map;
  std::filesystem::path staging_root = "/dev/shm";
  UnpackOptions unpack;
  ReadinessProbe probe;  // if set, "first_answer" is timed as the last stage
};

struct RestoreResult {
  pid_t pid = 0;
  Timeline timeline;
  std::string first_answer;
};

RestoreResult restore(const RestoreOptions& opts);

struct MigrateOptions {
  pid_t pid = 0;
  std::filesystem::path to_dir;  // where the checkpoint is written and restored from
  GpuMap gpu_map;
  ReadinessProbe probe;
  bool keep_checkpoint = false;
  PackOptions pack;
};

struct MigrateResult {
  pid_t old_pid = 0, new_pid = 0;
  Timeline timeline;  // dump stages, then restore stages, on one clock
};

// The old process ends only after the new one answers (probe), or after restore succeeded
// when no probe is given.
MigrateResult migrate(const MigrateOptions& opts);

}  // namespace gpuckpt
