// The contract between gpuckpt and its CRIU plugin (criu_plugin/): the environment variables
// gpuckpt sets for criu (the plugin runs inside criu and inherits them), and the small JSON
// report the plugin writes, which gpuckpt reads into the dump/restore timeline. Compiled into
// both the engine and the plugin.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace gpuckpt::criu {

// Where the plugin writes its report. Unset: "<images dir>/gpuckpt-plugin-<stage>.json".
inline constexpr const char* kEnvReport = "GPUCKPT_PLUGIN_REPORT";
// "running" (criu --leave-running), "stopped" (--leave-stopped) or "killed": after a dump the
// plugin resumes the device only when the task keeps running.
inline constexpr const char* kEnvFinalState = "GPUCKPT_DUMP_FINAL_STATE";
// cuCheckpointProcessLock timeout, milliseconds.
inline constexpr const char* kEnvLockTimeoutMs = "GPUCKPT_LOCK_TIMEOUT_MS";
// Restore-time GPU remapping, "OLD_UUID=NEW_UUID[,...]" (indices already resolved).
inline constexpr const char* kEnvGpuMap = "GPUCKPT_GPU_MAP";
// The absolute path of the libcuda gpuckpt found (dlinfo): the plugin dlopens it first, so it
// loads the same driver whatever criu's library search path is (GPU hosts often keep the
// driver under /usr/local/nvidia, found only through gpuckpt's environment).
inline constexpr const char* kEnvLibcuda = "GPUCKPT_LIBCUDA_PATH";
// Restore: the pids the checkpoint recorded with CUDA state, "PID[,PID...]". A restored task
// no longer holds /dev/nvidia* (its GPU state is in host memory), so this is how the plugin
// knows that a task it cannot restore for lack of a driver must fail, not be skipped.
inline constexpr const char* kEnvCudaPids = "GPUCKPT_CUDA_PIDS";
// Tests only: the device-file prefix that marks a task as holding a GPU (default
// "/dev/nvidia"), so that the plugin's refusal to skip such a task can be tested without one.
inline constexpr const char* kEnvTestDevicePrefix = "GPUCKPT_PLUGIN_TEST_DEVICE_PREFIX";
// "1": the device checkpoint and restore of a tree's CUDA tasks one after the other, as CRIU
// calls the hooks, instead of together (one thread per task). For a driver that misbehaves
// with concurrent calls, and for measuring what the concurrency gains.
inline constexpr const char* kEnvDeviceSerial = "GPUCKPT_DEVICE_SERIAL";

// A restore whose runtime hands CRIU none of gpuckpt's environment (dockerd's shim runs runc,
// which runs CRIU with /etc/criu/runc.conf alone) puts the variables above in this file of the
// images directory, as one JSON object; a plugin started without $GPUCKPT_PLUGIN_REPORT sets
// the restore's settings among them that choose nothing outside the restore (lock timeout, GPU
// map, CUDA pids, device serial, huge-page fill) where criu's environment lacks them, and
// writes its report into the images directory.
inline constexpr const char* kEnvFileName = "gpuckpt-plugin-env.json";
inline constexpr const char* kDumpReportName = "gpuckpt-plugin-dump.json";
inline constexpr const char* kRestoreReportName = "gpuckpt-plugin-restore.json";

struct PluginHook {
  // device_lock, device_checkpoint, device_resume, device_restore, unlock, and cuda_init (the
  // plugin's one driver load, cuInit included, timed where it happened)
  std::string name;
  pid_t pid = 0;
  std::int64_t start_ns = 0;  // CLOCK_MONOTONIC, comparable with std::chrono::steady_clock
  std::int64_t end_ns = 0;
  bool ok = true;
  bool skipped = false;  // nothing to do (no CUDA state / no checkpoint API): timed only
  std::string error;
  double seconds() const { return static_cast<double>(end_ns - start_ns) / 1e9; }
};

struct PluginReport {
  int version = 1;
  std::string stage;           // "dump" or "restore"
  bool api_available = false;  // CUDA driver with the checkpoint API loaded
  std::string api_error;       // why not
  bool cuda = false;           // some dumped/restored task had CUDA state
  std::vector<pid_t> cuda_pids;
  // Dump: the tasks this run locked (they were running before it). A recovery that resumes
  // the tree gives their CUDA state back: until then their next CUDA call blocks, so a task
  // resumed with its VRAM still in host memory would be a service left frozen on the GPU.
  std::vector<pid_t> locked_pids;
  std::string gpu_map;             // restore: the map the plugin applied
  std::string driver_library;      // the libcuda the plugin loaded ("" if none)
  double driver_load_seconds = 0;  // dlopen + entry points + cuInit, once per criu run
  double cuinit_seconds = 0;       // cuInit alone
  bool interrupt_only = false;     // set_compel_interrupt_only_mode() was called
  // The most CUDA tasks whose device checkpoint (dump) or restore and unlock (restore) ran at
  // once, one thread each; 0 when they ran one after the other (or there were fewer than two).
  int together = 0;
  std::vector<PluginHook> hooks;
  int criu_result = 0;    // ret passed to the plugin's exit hook (0 = success)
  bool finished = false;  // the exit hook ran

  const PluginHook* find(const std::string& name) const;
  // Of the hooks called `name` (one per task), the one that ended last.
  const PluginHook* last_to_end(const std::string& name) const;
  bool all_ok() const;
  std::string first_error() const;
};

std::string to_json_text(const PluginReport& r);
// Throws Error(kCriu) on malformed JSON.
PluginReport parse_plugin_report(const std::string& text);
// nullopt if the file does not exist.
std::optional<PluginReport> read_plugin_report(const std::filesystem::path& path);

}  // namespace gpuckpt::criu
