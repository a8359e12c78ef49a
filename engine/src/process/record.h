// The process record a dump stores in the checkpoint manifest (ImageInfo::extra, under
// "process"): who was dumped, with which CRIU and options, its GPUs and the dump timeline.
// restore() reads it back to know the pid, the CRIU options to repeat and whether CUDA state
// must be restored.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "container/checkpoint.h"
#include "device/cuda_driver.h"
#include "gpuckpt/device.h"
#include "gpuckpt/timing.h"

namespace gpuckpt::process {

struct ProcessRecord {
  int version = 1;
  pid_t pid = 0;
  std::string comm;
  std::vector<std::string> cmdline;
  std::string exe;
  std::string hostname;
  bool shell_job = false;
  bool leave_running = false;
  std::string criu_version;
  std::vector<std::string> criu_args;  // criu dump's arguments (without the binary)
  bool cuda = false;
  std::vector<std::string> gpu_uuids;
  // The same GPUs described (name, chip, memory, the tree's VRAM on each), for the restore's
  // checks. Records written before these existed have UUIDs only (the other fields empty).
  std::vector<RecordedGpu> gpus;
  // The driver build the CUDA state was dumped under (cuda only; unset in older records).
  std::optional<device::DriverIdentity> driver;
  // Every process of the dumped tree (root first) and those with CUDA state; a restore needs
  // all of these pids free.
  std::vector<pid_t> tree;
  std::vector<pid_t> cuda_pids;
  // TCP: whether the tree listened on TCP, and how established connections were dumped
  // ("closed": not dumped, clients see a reset; "established": dumped with criu
  // --tcp-established, restored with the same option).
  bool tcp_listener = false;
  std::vector<std::string> unix_listeners;  // listening unix socket paths ("@name": abstract)
  std::string tcp_established = "closed";
  Timeline timeline;  // the dump's stages up to (not including) the write
  // A whole container (dump --container): its runtime, bundle, spec and mounts.
  std::optional<container::ContainerRecord> container;
};

// {"process": {...}}, for PackOptions::extra.
nlohmann::json to_extra(const ProcessRecord& r);
// nullopt if `extra` has no process record; throws Error(kCorrupt) if it is malformed.
std::optional<ProcessRecord> from_extra(const nlohmann::json& extra);

}  // namespace gpuckpt::process
