// migrate --to ssh://[USER@]HOST[:PORT]: to another host, over one SSH connection
// (process/migrate_ssh.cpp, remote/ssh.h); and the steps both kinds of migration share
// (process/migrate.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "container/checkpoint.h"
#include "container/runtime.h"
#include "gpuckpt/process.h"
#include "process/dump_impl.h"
#include "process/guard.h"

namespace gpuckpt::process {

// What a container's migration adds to a tree's: the container as its runtime lists it, what
// its dump tells CRIU, and the ID its copy takes.
struct ContainerMove {
  container::Container box;
  container::DumpPlan plan;
  std::string copy_id;
  // Its tree holds the GPU's device files, so the checkpoint will carry CUDA state: the copy's
  // runtime must load gpuckpt's plugin, checked before the freeze.
  bool cuda = false;
};

// `c`: the container moved whole, or null for a bare tree.
MigrateResult migrate_over_ssh(const MigrateOptions& o, const ContainerMove* c);

// Before anything is frozen: every GPU in `used` (UUIDs the tree has open) must map (`map`, else
// the same UUID) to a GPU of the same chip among the target's (`devices`, its `gpuckpt --json
// devices`), with at least as much VRAM free there as the tree holds on it (`held`, per UUID in
// lower case; nullopt: unknown here, said in a warning). Error(kNoDevice) otherwise.
void check_target_gpus(const std::set<std::string>& used, const nlohmann::json& devices,
                       const GpuMap& map, const std::string& where,
                       const std::optional<std::map<std::string, std::uint64_t>>& held);

// Before anything is frozen: the target's NVIDIA kernel module (`devices`, as above) is this
// host's (`here`), if both are known. Error(kNoDevice) naming both otherwise.
void check_target_driver(const nlohmann::json& devices, const std::string& where,
                         const std::string& here);

// The file name of a migration's checkpoint of process `pid` named `comm`. A process sets its
// own name (prctl PR_SET_NAME): only letters, digits, '-', '_', '+' and inner dots are taken
// from it, so that the name cannot leave its directory, hide, or name another path.
std::string checkpoint_name(const std::string& comm, pid_t pid);

// The dump of a migration: to `output`, the tree kept stopped (dump_keep_stopped).
DumpOptions migration_dump(const MigrateOptions& o, const std::filesystem::path& output);
// A release handoff: the original tree ends now that `checkpoint` is durable, and from here on
// the guard's rollback restores it from there. Timed as "end_original".
// A container's runtime forgets it (runc delete) and a rollback restores it as that container.
void release_original(const MigrateOptions& o, const DumpOutcome& dumped,
                      const std::filesystem::path& checkpoint, Guard& guard, Timeline& tl,
                      const ContainerMove* c);
// After the handover (the guard told), a frozen original ends, and a container's runtime forgets
// it. Timed as "end_original"; what fails is said, for the copy serves either way.
void end_original(const DumpOutcome& dumped, const ContainerMove* c, Timeline& tl);

}  // namespace gpuckpt::process
