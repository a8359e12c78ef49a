// Small pieces shared by dump, restore and migrate.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>

#include "gpuckpt/device.h"
#include "gpuckpt/progress.h"

namespace gpuckpt::process {

// While alive, reports the bytes under `dir` to `fn` (phase `phase`) a few times a second:
// CRIU gives no progress of its own, but its images grow as it dumps.
class DirProgress {
 public:
  // `total`: expected bytes (an estimate; 0 = unknown).
  DirProgress(ProgressFn fn, std::string phase, std::filesystem::path dir, std::uint64_t total = 0);
  ~DirProgress();
  DirProgress(const DirProgress&) = delete;
  DirProgress& operator=(const DirProgress&) = delete;

 private:
  ProgressFn fn_;
  std::string phase_;
  std::filesystem::path dir_;
  std::uint64_t total_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Resumes a process that CRIU left stopped (--leave-stopped): SIGCONT, then, if it had CUDA
// state (checkpointed by the plugin), restores it onto its GPUs and unlocks it. Throws on
// failure; the message says what state the process is left in.
void resume_stopped(pid_t pid, bool cuda);

// SIGKILLs a process that is not our child and waits until it has ended (or is a zombie).
// Returns false if it is still there after `timeout_ms`.
bool kill_and_wait(pid_t pid, int timeout_ms = 30000);

// Environment handed to criu for the plugin.
std::string gpu_map_env(const GpuMap& map);

std::string hostname();

}  // namespace gpuckpt::process
