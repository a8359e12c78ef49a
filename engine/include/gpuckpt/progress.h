// Progress reporting: long operations call a sink; the CLI draws it on a TTY (bytes, GB/s).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace gpuckpt {

struct Progress {
  std::string phase;  // e.g. "pack", "unpack", "criu_dump"
  std::uint64_t done_bytes = 0;
  std::uint64_t total_bytes = 0;  // 0 when unknown
  double elapsed_seconds = 0;
};

// Called from worker threads, at most a few times per second; must be cheap and thread-safe.
using ProgressFn = std::function<void(const Progress&)>;

}  // namespace gpuckpt
