// The guard: a small process that outlives gpuckpt and undoes a half-done operation, so that a
// signal, a crash or a SIGKILL of gpuckpt never leaves a service frozen (docs/PROCESS.md,
// "Faults").
//
// gpuckpt starts it (gpuckpt-guard, in its own session so a Ctrl-C to the terminal does not
// reach it) before anything is frozen, and tells it over a unix socket, as JSON lines, what it
// would have to undo: the trees to resume, the CRIU run in flight, the restored copies to kill,
// the paths to remove or put back (and passes it the processes' locks, which it holds until it
// exits). If the socket closes without a "done" (gpuckpt died), or on an
// "abort" (gpuckpt failed or was interrupted and asks for the rollback), the guard recovers:
//   1. waits for criu to finish (criu leaves its tasks in a clean state; killing it while its
//      parasite code runs inside a task could kill that task), SIGKILL past a bound;
//   2. kills the restored copies (they may own the service's endpoints), and deletes the
//      containers that runc restored for them from runc's state, once their runc has ended;
//   3. puts renamed paths back (a unix socket path that a rollback must restore);
//   4. resumes every process of the target trees (SIGCONT, then the CUDA restore and unlock of
//      those that were checkpointed), or ends them once the checkpoint is durable and they were
//      meant to end; or, if the original already ended for a migration, restores it from the
//      checkpoint in place;
//   5. removes staging and temporary outputs.
// A pid is acted on only while it names the process gpuckpt told of (same start tick).
// One recovery path serves errors, signals and crashes alike. What the guard is told also goes
// into the operation's journal (process/journal.h), from which a later run undoes the
// operation if gpuckpt and the guard are both killed (recover_abandoned_operations).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "process/journal.h"
#include "process/support.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"

namespace gpuckpt::process {

// A recovery's summary when it had nothing to undo.
inline constexpr const char* kNothingToUndo = "nothing to undo";

// File name of the guard binary (beside gpuckpt, or in the lib/gpuckpt directory).
inline constexpr const char* kGuardBinary = "gpuckpt-guard";

// What a recovery would undo (guard.cpp).
struct GuardPlan;

class Guard {
 public:
  // Starts the guard for `operation` ("dump", "migrate"). Throws Error(kInternal) when it cannot
  // be started: without a guard nothing is frozen.
  explicit Guard(const std::string& operation);
  // Not disarmed: the guard recovers (as abort()) and this waits for it.
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

  // The tree rooted at `root` is to be resumed on recovery (its descendants are found again
  // then); `pids` adds processes known to belong to it. Each with its start tick now: recovery
  // leaves alone a process that took one of these pids since.
  void protect(pid_t root, const std::vector<pid_t>& pids = {});
  // The processes' locks (lock_processes) are the guard's too from now on: a SIGKILL of gpuckpt
  // drops its own hold, and the guard's keeps every other gpuckpt off the processes until it
  // has resumed them. Released, their files removed, once the operation is over (done or
  // undone); left to the guard if it still recovers then.
  void hold_locks(std::vector<HeldLockFile> locks);
  // Locks the restore of container `id` under the runtime root `root`
  // (container::lock_restore_target) and holds it as the processes' locks: until its recovery
  // has removed what a failed restore left. Nothing if this operation holds it already (a
  // migration takes its copy's, and a release's rollback's, before the freeze).
  void lock_container_restore(const std::string& root, const std::string& id);
  // This dump locked these processes' CUDA state (and checkpointed it): recovery gives it back.
  void cuda(const std::vector<pid_t>& pids);
  // Where the CRIU plugin of the dump about to start reports the tasks it locks: a recovery
  // gives those back too, for gpuckpt may die before it learns them (cuda() above).
  void cuda_report(const std::filesystem::path& report);
  // criu runs as `pid` / has exited.
  void criu_started(pid_t pid);
  void criu_finished();
  // The restore's criu (of copy_named_in) ended: `clean` if it failed by itself (an exit code
  // other than 0), having undone what it restored; else (killed) what it left half-restored is
  // the recovery's to end. `log`: where its log is now.
  void criu_ended(bool clean, const std::filesystem::path& log);
  // The checkpoint is durable. `end_targets`: recovery now ends the protected trees instead of
  // resuming them (a dump that is to end the process).
  void durable(bool end_targets);
  // What recovery does with a restored copy: one that is not the service yet (a migration's,
  // or a restore awaiting its commit) is killed; any other restore's copy is left running, and
  // the summary says so, for an interrupted restore still restored what it could.
  enum class Copy { kKill, kLeave };
  // A restored copy: its root, and its pid namespace's init if any (either may be 0 while it is
  // not known yet). keep_copy() forgets them all once the copy is the service.
  void copy_on_recovery(pid_t pid, pid_t pidns_init, Copy what);
  // A copy that criu is about to restore in this pid namespace, whose root's pid it will write
  // to `pidfile`: recovery finds it there if criu got that far, though gpuckpt may die before
  // it reads the pid and calls copy_on_recovery.
  // `pids`: the checkpoint's, which criu gives the tasks it creates; `log`: criu's log. Should
  // criu end without writing its pidfile (killed, failed), the tasks it left at those pids,
  // started since, are a half-restored tree that nobody would end: recovery kills them, and
  // removes the ghost files (PATH.cr.ID.ghost) the log says criu created, which a later restore
  // of the same checkpoint would find in its way.
  void copy_named_in(const std::filesystem::path& pidfile, Copy what,
                     const std::vector<pid_t>& pids = {}, const std::filesystem::path& log = {});
  // A container that `runc restore` is about to make as `id` under the runc root `runc_root`:
  // recovery waits for that runc (container_runc), then, if runc lists a container of that ID
  // that it made (its init started since this call, or is the one container_init named), kills
  // it and deletes it from runc's state (kKill), or leaves it running (kLeave); with nothing
  // listed, the bundle gpuckpt wrote for it goes. `made_record`: the runtime's record of it
  // (containerd's, Docker's) was made for this restore, and goes with it. keep_copy() and
  // hand_over() forget it.
  void container_on_recovery(const std::filesystem::path& runc_root, const std::string& id,
                             Copy what, bool made_record = false);
  // ... the `runc restore` making it runs as `runc` (which leads its own process group, criu in
  // it); and, restored, its init is `init` (what a later run's replay knows it by).
  void container_runc(pid_t runc);
  void container_init(pid_t init);
  // ... its runtime knows it as `id` now: Docker gives a container it creates an ID, and the
  // guard was told its name before (nothing is left unnamed if gpuckpt dies in between).
  void container_known_as(const std::string& id);
  // ... its runtime unpacks copies of the images marked with `token` (containerd does for a
  // Docker start, into its temporary directory, and keeps them): recovery removes them once
  // the runtime's start has settled, whatever became of the container.
  void container_unpacks(const std::string& token);
  // A directory made for the copy (a container's rootfs unpacked for it), which has or is about
  // to have this identity at `path`: recovery removes it once the copies are ended, if it is
  // still that directory and no running container uses it; keep_copy() and hand_over() keep it.
  void copy_path(const std::filesystem::path& path, std::uint64_t dev, std::uint64_t ino,
                 std::int64_t btime_ns);
  // The copy is the service now (a restore's commit): it is left on recovery, and the paths
  // renamed aside for a rollback are removed (as hand_over). Done even with the guard dead.
  void keep_copy();
  // A migration's commit, in one step so that no recovery between two steps undoes both sides:
  // the copy is the service now (as keep_copy; renamed paths are no longer put back, only
  // removed; no restore from the checkpoint), and, with `end_original`, the original trees end
  // on recovery instead of being resumed (the checkpoint is durable).
  void hand_over(bool end_original);
  // Paths to remove on recovery (staging, temporary outputs); keep() forgets one.
  void remove_on_recovery(const std::filesystem::path& path);
  void keep(const std::filesystem::path& path);
  // The original tree has ended and lives only in `checkpoint`: recovery restores it from
  // there, in place, if no copy is kept (a release-handoff migration).
  // `container`: the checkpoint is of this runc container, restored as one.
  void restore_on_recovery(const std::filesystem::path& checkpoint,
                           const std::filesystem::path& staging_root,
                           const std::filesystem::path& criu_binary,
                           const std::string& container = {});
  // Renames `path` beside itself, to `aside_name` (or, if that is taken, `aside_name`-N), now,
  // and back on recovery: a rollback puts back the very entry (the same dentry). A commit
  // (keep_copy, hand_over) removes it instead. Returns the name it took; throws Error(kIo) when
  // it cannot be moved (nothing may then take the path).
  std::filesystem::path move_aside(const std::filesystem::path& path,
                                   const std::string& aside_name);

  // Recover now and wait for it; returns the guard's summary of what it did ("process 12 was
  // resumed; ..."). The guard has exited when this returns.
  std::string abort(std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // The operation finished as planned: the guard exits without touching anything.
  void disarm();
  bool armed() const {
    std::lock_guard lk(mu_);
    return child_.running() && !finished_;
  }

  pid_t pid() const { return child_.pid(); }

 private:
  // Throws once aborted (under mu_).
  void refuse_after_abort_locked() const;
  [[noreturn]] void throw_guard_died() const;
  // Under mu_, once the operation is over: the locks go, their files with them unless the
  // guard, still running, holds them yet.
  void release_locks_locked();
  // Under mu_: an abort from the interrupt thread and a command from the operation are ordered,
  // so that nothing is frozen (or started) after the guard has recovered.
  void send_locked(const nlohmann::json& msg);
  // `must_reach`: a guard found dead stops the operation (Error); else the step goes on.
  void send(const nlohmann::json& msg, bool must_reach = true);
  // keep_copy() and hand_over(): `msg`, then the entries renamed aside are removed.
  void commit(const nlohmann::json& msg);
  // abort()'s recovery: the guard's, or gpuckpt's own from the mirror if the guard is dead.
  std::string recover_somewhere(bool by_guard, std::chrono::milliseconds timeout);
  // The mirror, then the guard; false once the guard is found gone (its socket broken).
  bool tell_locked(const nlohmann::json& msg);
  bool write_locked(const nlohmann::json& msg);
  mutable std::mutex mu_;
  Child child_;
  UniqueFd to_guard_, from_guard_;
  // Everything the guard is told, on disk too: for a recovery by the next run should gpuckpt
  // and the guard both be killed (process/journal.h).
  Journal journal_;
  // Everything the guard was told: should it die (killed, out of memory), gpuckpt, still alive,
  // recovers from this itself rather than leave a service frozen.
  std::unique_ptr<GuardPlan> mirror_;
  std::vector<HeldLockFile> locks_;           // shared with the guard (hold_locks)
  std::vector<std::string> container_locks_;  // among them, by container::restore_dir
  bool finished_ = false;
  bool aborted_ = false;
  bool gone_ = false;
};

// Asks every live Guard of this process to recover and waits for them (for the CLI's handler of
// SIGINT, SIGTERM and SIGHUP, which then exits). Returns the summaries.
std::vector<std::string> abort_all_guards(std::chrono::milliseconds timeout);

// A signal that a commit deferred (CommitScope), once no commit holds it any more: raised again,
// and returns true once the program's handler has begun to act on it (the operation's thread
// then stops, as at any interrupt); false if none was deferred.
bool raise_deferred_interrupt();

// The guard process's main loop: commands on `in_fd`, summary (after an abort) on `out_fd`.
// `journal`: the operation's journal, which it holds while it lives and removes once the
// operation is over (done, or recovered); empty if there is none. Returns the exit code.
int guard_main(int in_fd, int out_fd, const std::filesystem::path& journal);

}  // namespace gpuckpt::process
