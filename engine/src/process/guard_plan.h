// The guard's plan: what a recovery undoes, built from the commands gpuckpt sends its guard
// (and journals). Shared by the guard process (guard_main), gpuckpt's own mirror of it
// (Guard), and the replay of an abandoned journal (recover_abandoned_operations).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpuckpt/process.h"
#include "util/unique_fd.h"

namespace gpuckpt::process {

// What the guard's recovery undoes, built from the operation's commands (apply).
struct GuardPlan {
  std::string operation;
  std::vector<pid_t> roots;
  std::set<pid_t> pids;
  std::set<pid_t> cuda;
  std::filesystem::path
      cuda_report;  // the dump's plugin report: its locked_pids are given back as well
  // The dump's staging directory, which holds that report: kept from other runs' sweeps while
  // a recovery may still need to read it (gpuckpt's TempDir held it until it was killed).
  UniqueFd cuda_report_hold;
  // Start ticks of the protected processes when they were named (0: it had ended already).
  std::map<pid_t, std::uint64_t> started;
  pid_t criu = 0;
  std::uint64_t criu_started = 0;
  bool durable = false, end_targets = false;
  struct Copy {
    pid_t pid = 0, pidns_init = 0;
    std::uint64_t pid_started = 0, init_started = 0;  // start ticks; 0: the pid is not known
    bool kill = true;
  };
  std::vector<Copy> copies;
  // Copies known only by criu's pidfile, each with the tick before criu started.
  struct NamedCopy {
    std::filesystem::path pidfile;
    std::uint64_t after = 0;
    bool kill = true;
    std::vector<pid_t> pids;    // the checkpoint's, which criu's tasks take
    std::filesystem::path log;  // criu's log, naming the ghost files it created
    bool criu_clean = false;    // criu exited by itself: it ended what it had restored
  };
  std::vector<NamedCopy> copy_pidfiles;
  // Containers that `runc restore` makes for this operation, to kill and delete from runc's
  // state on recovery (or leave): each known by its runc root and ID, the tick before runc
  // started, the runc in flight, and, once restored, its init's start tick.
  struct ContainerCopy {
    std::filesystem::path root;
    std::string id;
    std::uint64_t after = 0;
    bool kill = true;
    bool made = false;  // its runtime's record (containerd's, Docker's) was made for it too
    pid_t runc = 0;     // the leader of its own process group (criu runs in it)
    std::uint64_t runc_started = 0;
    std::uint64_t init_started = 0;
    // Its runtime unpacks copies of the images that carry this token (containerd, for a Docker
    // start) and never removes them: recovery does.
    std::string unpacked_token;
  };
  std::vector<ContainerCopy> containers;
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> renames;
  std::vector<std::filesystem::path> remove;
  // Made for the copies: removed once they are ended, if still the directory made (its device,
  // inode and birth time) and no running container uses it; kept with them by the commit.
  struct CopyPath {
    std::filesystem::path path;
    std::uint64_t dev = 0, ino = 0;
    std::int64_t btime_ns = 0;
  };
  std::vector<CopyPath> copy_paths;
  std::filesystem::path restore_from, restore_staging, restore_criu;
  std::string restore_container;  // restore_from holds this runc container: restored as one
  // The spool that holds restore_from: kept from other runs' sweeps once gpuckpt (whose
  // TempDir held it) is gone and this guard may still restore from it.
  UniqueFd restore_hold;
  // Undone by a later run from the journal, maybe long after the kill: only what is still as
  // the kill left it (recover_abandoned_operations).
  bool replay = false;
};
using Plan = GuardPlan;

// The commands gpuckpt gives its guard, one JSON object a line ({"op": NAME, ...}), which the
// journal keeps too. The names are the protocol: never rename one.
enum class GuardOp {
  kProtect,         // the trees to resume (root, pids, their start ticks)
  kCuda,            // their processes whose CUDA state is locked and checkpointed
  kCudaReport,      // where the dump's CRIU plugin reports the tasks it locks
  kCriu,            // the criu in flight (pid 0: none any more)
  kCriuExit,        // how the restore's criu ended, and where its log is
  kDurable,         // the checkpoint is durable (and whether the trees end)
  kCopy,            // a restored copy (or its pid namespace's init)
  kCopyPidfile,     // a copy that criu's pidfile will name
  kContainer,       // a container that runc restores (root, ID), to kill or leave
  kContainerRunc,   // ... the runc restoring it
  kContainerInit,   // ... its init, restored
  kContainerId,     // ... the ID its runtime gave it (Docker's, for one made by name)
  kContainerToken,  // ... the token of the copies of the images its runtime unpacks
  kCopyPath,     // a path made for the copies (a rootfs unpacked for a container): goes with them
  kKeepCopy,     // commit: the copies stay
  kHandOver,     // commit: a migration's copy is the service
  kRemove,       // a path to remove in recovery
  kKeep,         // ... no longer
  kRename,       // an entry moved aside, to put back
  kRestoreFrom,  // a release migration's original, to restore from this checkpoint
  kLocks,        // process locks (file descriptors) come with this line; not journalled
  kAbort,        // recover now
  kDone,         // the operation is over: exit without touching anything
};

std::string_view op_name(GuardOp op);
// The command of a line; Error(kCorrupt) naming what is wrong if it is none.
nlohmann::json command(GuardOp op, nlohmann::json fields = nlohmann::json::object());
GuardOp op_of(const nlohmann::json& m);

// Adds command `m` to the plan. Error(kCorrupt) for a line that is no command, or one whose
// fields are missing or of the wrong type (what of it came before the bad field stays applied:
// each field is something to undo). `hold_dirs`: hold the directories it names open, so that
// no other run's sweep takes them while a recovery may still need them.
void apply(Plan& p, const nlohmann::json& m, bool hold_dirs);

// What a recovery did, in order, and what of it failed (each failure is said in the summary too).
struct Recovery {
  std::string summary;
  std::vector<RecoveryFailure> failures;
};
// Undoes what the plan names: ends copies, restores or resumes the originals, gives their CUDA
// state back, puts paths back. Never throws for what it cannot undo: it says so.
Recovery recover(const Plan& p);

// What of the service waits for gpuckpt now ("" if nothing).
std::string what_waits(const Plan& p);

}  // namespace gpuckpt::process
