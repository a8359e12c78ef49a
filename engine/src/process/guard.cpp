#include "process/guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "container/checkpoint.h"
#include "container/runtime.h"
#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "gpuckpt/process.h"
#include "process/proc_info.h"
#include "process/restore_impl.h"
#include "process/support.h"
#include "util/fault.h"
#include "util/fd_passing.h"
#include "util/fs.h"
#include "util/no_sigpipe.h"
#include "util/poll_timeout.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt {
namespace {
// CommitScope's: how many live, and the signal deferred meanwhile.
std::mutex g_commit_mu;
int g_commits = 0;
int g_deferred_signal = 0;
}  // namespace
}  // namespace gpuckpt

namespace gpuckpt::process {

// What the guard's recovery undoes, built from the operation's commands (apply).
struct GuardPlan {
  std::string operation;
  std::vector<pid_t> roots;
  std::set<pid_t> pids;
  std::set<pid_t> cuda;
  fs::path cuda_report;  // the dump's plugin report: its locked_pids are given back as well
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
    fs::path pidfile;
    std::uint64_t after = 0;
    bool kill = true;
    std::vector<pid_t> pids;  // the checkpoint's, which criu's tasks take
    fs::path log;             // criu's log, naming the ghost files it created
    bool criu_clean = false;  // criu exited by itself: it ended what it had restored
  };
  std::vector<NamedCopy> copy_pidfiles;
  // Containers that `runc restore` makes for this operation, to kill and delete from runc's
  // state on recovery (or leave): each known by its runc root and ID, the tick before runc
  // started, the runc in flight, and, once restored, its init's start tick.
  struct ContainerCopy {
    fs::path root;
    std::string id;
    std::uint64_t after = 0;
    bool kill = true;
    bool made = false;  // its runtime's record (containerd's, Docker's) was made for it too
    pid_t runc = 0;     // the leader of its own process group (criu runs in it)
    std::uint64_t runc_started = 0;
    std::uint64_t init_started = 0;
  };
  std::vector<ContainerCopy> containers;
  std::vector<std::pair<fs::path, fs::path>> renames;
  std::vector<fs::path> remove;
  fs::path restore_from, restore_staging, restore_criu;
  std::string restore_container;  // restore_from holds this runc container: restored as one
  // The spool that holds restore_from: kept from other runs' sweeps once gpuckpt (whose
  // TempDir held it) is gone and this guard may still restore from it.
  UniqueFd restore_hold;
  // Undone by a later run from the journal, maybe long after the kill: only what is still as
  // the kill left it (recover_abandoned_operations).
  bool replay = false;
};

namespace {

// The commands gpuckpt gives its guard, one JSON object a line ({"op": NAME, ...}), which the
// journal keeps too. The names are the protocol: never rename one.
enum class GuardOp {
  kProtect,        // the trees to resume (root, pids, their start ticks)
  kCuda,           // their processes whose CUDA state is locked and checkpointed
  kCudaReport,     // where the dump's CRIU plugin reports the tasks it locks
  kCriu,           // the criu in flight (pid 0: none any more)
  kCriuExit,       // how the restore's criu ended, and where its log is
  kDurable,        // the checkpoint is durable (and whether the trees end)
  kCopy,           // a restored copy (or its pid namespace's init)
  kCopyPidfile,    // a copy that criu's pidfile will name
  kContainer,      // a container that runc restores (root, ID), to kill or leave
  kContainerRunc,  // ... the runc restoring it
  kContainerInit,  // ... its init, restored
  kContainerId,    // ... the ID its runtime gave it (Docker's, for one made by name)
  kKeepCopy,       // commit: the copies stay
  kHandOver,       // commit: a migration's copy is the service
  kRemove,         // a path to remove in recovery
  kKeep,           // ... no longer
  kRename,         // an entry moved aside, to put back
  kRestoreFrom,    // a release migration's original, to restore from this checkpoint
  kLocks,          // process locks (file descriptors) come with this line; not journalled
  kAbort,          // recover now
  kDone,           // the operation is over: exit without touching anything
};

struct GuardOpName {
  GuardOp op;
  std::string_view name;
};
constexpr GuardOpName kGuardOps[] = {
    {GuardOp::kProtect, "protect"},
    {GuardOp::kCuda, "cuda"},
    {GuardOp::kCudaReport, "cuda_report"},
    {GuardOp::kCriu, "criu"},
    {GuardOp::kCriuExit, "criu_exit"},
    {GuardOp::kDurable, "durable"},
    {GuardOp::kCopy, "copy"},
    {GuardOp::kCopyPidfile, "copy_pidfile"},
    {GuardOp::kContainer, "container"},
    {GuardOp::kContainerRunc, "container_runc"},
    {GuardOp::kContainerInit, "container_init"},
    {GuardOp::kContainerId, "container_id"},
    {GuardOp::kKeepCopy, "keep_copy"},
    {GuardOp::kHandOver, "hand_over"},
    {GuardOp::kRemove, "remove"},
    {GuardOp::kKeep, "keep"},
    {GuardOp::kRename, "rename"},
    {GuardOp::kRestoreFrom, "restore_from"},
    {GuardOp::kLocks, "locks"},
    {GuardOp::kAbort, "abort"},
    {GuardOp::kDone, "done"},
};

std::string_view op_name(GuardOp op) {
  for (const auto& o : kGuardOps)
    if (o.op == op) return o.name;
  return "?";
}

// The command of a line; Error(kCorrupt) naming what is wrong if it is none.
GuardOp op_of(const json& m) {
  if (!m.is_object() || !m.contains("op") || !m["op"].is_string())
    throw Error(Errc::kCorrupt, "not a command: " + m.dump().substr(0, 200));
  const std::string name = m["op"].get<std::string>();
  for (const auto& o : kGuardOps)
    if (o.name == name) return o.op;
  throw Error(Errc::kCorrupt, "unknown command '" + name.substr(0, 64) + "'");
}

json command(GuardOp op, json fields = json::object()) {
  fields["op"] = op_name(op);
  return fields;
}

using Plan = GuardPlan;
void apply(Plan& p, const json& m, bool hold_dirs);
void apply_op(Plan& p, GuardOp op, const json& m, bool hold_dirs);
// What a recovery did, in order, and what of it failed (each failure is said in the summary too).
struct Recovery {
  std::string summary;
  std::vector<RecoveryFailure> failures;
};
Recovery recover(const Plan& p);

std::mutex g_guards_mu;
std::set<Guard*> g_guards;
std::set<std::function<std::string()>*> g_on_interrupt;  // guarded by g_guards_mu
// Set once an interrupt's rollback has begun: the operation's thread runs on until gpuckpt dies
// of the signal, and must not start a new guarded operation (a restore whose copy nobody would
// end) in the meantime.
bool g_interrupting = false;  // guarded by g_guards_mu
std::condition_variable g_interrupting_cv;

// Aborts in progress on any thread: an interrupt waits for them before gpuckpt dies of the
// signal, for one may be gpuckpt's own recovery (its guard had died), which nothing else would
// finish; what they undid while it waited is part of what the interrupt reports.
std::mutex g_recover_mu;
std::condition_variable g_recover_cv;
int g_aborting = 0;                 // guarded by g_recover_mu
bool g_interrupt_waits = false;     // guarded by g_recover_mu
std::vector<std::string> g_undone;  // guarded by g_recover_mu: summaries it waited for

// An abort (or a replay) counted in g_aborting is over; `summary` is what it undid.
void end_abort(const std::string& summary) {
  {
    std::lock_guard rk(g_recover_mu);
    --g_aborting;
    if (g_interrupt_waits) g_undone.push_back(summary);
  }
  g_recover_cv.notify_all();
}

fs::path guard_binary() {
  if (const char* e = std::getenv("GPUCKPT_GUARD"); e && *e) return e;
  const fs::path candidates[] = {
      self_exe_dir() / kGuardBinary,
      self_exe_dir() / ".." / "bin" / kGuardBinary,  // test executables in build/tests
      fs::path(GPUCKPT_INSTALL_LIB_DIR) / ".." / ".." / "bin" / kGuardBinary,
  };
  for (const auto& c : candidates)
    if (::access(c.c_str(), X_OK) == 0) return c;
  throw Error(Errc::kInternal, std::string("the guard binary ") + kGuardBinary +
                                   " was not found beside " + self_exe_dir().string() +
                                   " (set GPUCKPT_GUARD): nothing is frozen without it");
}

// Reads one line (the guard's summary) from `fd` within `timeout`; "" if none came.
std::string read_line(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  for (;;) {
    const int left_ms = poll_timeout_ms(deadline);
    if (left_ms == 0) return line;
    pollfd p{fd, POLLIN, 0};
    const int pr = ::poll(&p, 1, left_ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return line;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return line;
    line.append(buf, static_cast<std::size_t>(n));
    if (const auto nl = line.find('\n'); nl != std::string::npos) return line.substr(0, nl);
    if (line.size() > (1u << 20)) return line;
  }
}

}  // namespace

Guard::Guard(const std::string& operation) : mirror_(std::make_unique<GuardPlan>()) {
  mirror_->operation = operation;
  {
    std::lock_guard lk(g_guards_mu);
    if (g_interrupting)
      throw Error(Errc::kProcess, "gpuckpt was interrupted: no " + operation + " starts now");
  }
  // A signal deferred by an earlier operation's commit (CommitScope) applies before this one
  // starts: to the signal handler again, which now finds nothing committed.
  if (raise_deferred_interrupt())
    throw Error(Errc::kProcess, "gpuckpt was interrupted: no " + operation + " starts now");
  // Before anything of ours exists: what a run killed with its guard left (a stopped original,
  // an entry moved aside, its spool) is its to undo first, and ours not to touch.
  recover_abandoned_operations();
  journal_ = Journal::open_new(operation);
  int down[2], up[2];
  // Close-on-exec: criu and every other child of gpuckpt must not hold the write end, or the
  // guard would not see gpuckpt's death. A socket, not a pipe, to pass it the process locks.
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, down) != 0)
    throw_errno(Errc::kInternal, "socket for the guard");
  UniqueFd down_r(down[0]), down_w(down[1]);
  if (::pipe2(up, O_CLOEXEC) != 0) throw_errno(Errc::kInternal, "pipe for the guard");
  UniqueFd up_r(up[0]), up_w(up[1]);
  SpawnOptions so;
  so.new_session = true;  // no terminal signals; survives the end of gpuckpt's session
  so.stdin_fd = down_r.get();
  so.stdout_fd = up_w.get();  // the guard's summary; its diagnostics go to our stderr
  const fs::path bin = guard_binary();
  std::vector<std::string> argv{bin.string(), "--operation", operation};
  if (journal_.active()) argv.insert(argv.end(), {"--journal", journal_.path().string()});
  child_ = spawn(argv, so);
  to_guard_ = std::move(down_w);
  from_guard_ = std::move(up_r);
  // The guard says "ready" once it has set up its signal dispositions: from then on it is safe
  // to freeze anything.
  const std::string hello = read_line(from_guard_.get(), std::chrono::seconds(10));
  if (hello != "ready")
    throw Error(Errc::kInternal, "the guard (" + bin.string() + ") did not start: '" + hello + "'");
  std::lock_guard lk(g_guards_mu);
  g_guards.insert(this);
}

Guard::~Guard() {
  // Aborted while still listed: an interrupt meanwhile finds this abort in progress (and waits
  // for it) instead of finding nothing to wait for.
  if (armed()) {
    try {
      // Said only for a guard that had died: otherwise the operation's own error, or its
      // explicit abort, already told the operator.
      if (const std::string undone = abort(); gone_) spdlog::warn("rollback: {}", undone);
    } catch (...) {
    }
  }
  {
    std::lock_guard lk(g_guards_mu);
    g_guards.erase(this);
  }
  if (child_.running()) {
    to_guard_.reset();  // EOF: a guard still waiting for commands recovers and exits
    child_.wait_for(std::chrono::seconds(120));
  }
  std::lock_guard lk(mu_);
  release_locks_locked();
}

void Guard::refuse_after_abort_locked() const {
  // After an abort (an interrupt) the guard has recovered and is gone: what the operation
  // would do next (protect, start criu, move a path) must not happen unguarded.
  if (aborted_)
    throw Error(Errc::kProcess,
                "the operation was interrupted: its guard has recovered, so nothing more starts");
}

void Guard::send(const json& msg, bool must_reach) {
  std::lock_guard lk(mu_);
  refuse_after_abort_locked();
  if (must_reach) {
    send_locked(msg);
  } else if (!finished_) {
    // A commit (the checkpoint durable, the copy handed over): done whether or not the guard
    // hears of it, so a dead guard does not fail it. The mirror has it for a later abort.
    tell_locked(msg);
  }
}

void Guard::send_locked(const json& msg) {
  if (finished_) return;
  if (!tell_locked(msg)) throw_guard_died();
}

void Guard::throw_guard_died() const {
  throw Error(Errc::kInternal, "the guard (pid " + std::to_string(child_.pid()) +
                                   ") has died: the operation stops here");
}

void Guard::hold_locks(std::vector<HeldLockFile> locks) {
  std::lock_guard lk(mu_);
  refuse_after_abort_locked();
  // Not in the mirror or the journal: a lock means nothing once gpuckpt and its guard are gone.
  for (std::size_t i = 0; i < locks.size() && !finished_ && !gone_; i += kMaxFdsPerMessage) {
    std::vector<int> fds;
    for (std::size_t k = i; k < std::min(locks.size(), i + kMaxFdsPerMessage); ++k)
      fds.push_back(locks[k].fd());
    const std::string line = command(GuardOp::kLocks, {{"count", fds.size()}}).dump() + "\n";
    const int err = send_with_fds(to_guard_.get(), line, fds);
    if (err == EPIPE || err == ECONNRESET) {
      gone_ = true;
      spdlog::warn("the guard (pid {}) has died; gpuckpt recovers by itself", child_.pid());
    } else if (err != 0) {
      // ETOOMANYREFS, ENOBUFS: the guard lives, and nothing is frozen yet.
      throw_syserr(Errc::kIo, err, "pass the process locks to the guard");
    }
  }
  if (gone_) throw_guard_died();  // nothing is frozen yet
  for (auto& l : locks) locks_.push_back(std::move(l));
}

void Guard::release_locks_locked() {
  if (child_.running())
    for (auto& l : locks_) l.leave();
  locks_.clear();
}

bool Guard::tell_locked(const json& msg) {
  // Into the mirror first: a guard found gone now leaves gpuckpt to undo this step as well.
  // Without holds: gpuckpt's own temporary directories keep its spool from sweeps.
  apply(*mirror_, msg, /*hold_dirs=*/false);
  journal_.append(msg);
  return write_locked(msg);
}

bool Guard::write_locked(const json& msg) {
  if (gone_) return false;
  // The paths it names are UTF-8 (require_utf8_path, before anything is frozen); anything else
  // must not kill the operation here.
  const std::string line = msg.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  NoSigpipe nosig;  // a dead guard's socket: EPIPE, not gpuckpt's silent death
  if (write_fully(to_guard_.get(), line.data(), line.size()) != 0) {
    gone_ = true;
    spdlog::warn("the guard (pid {}) has died; gpuckpt recovers by itself", child_.pid());
  }
  return !gone_;
}

void Guard::protect(pid_t root, const std::vector<pid_t>& pids) {
  // With their start times, as the copies: a recovery after the trees ended (a migration's
  // original, ended once handed over) must not signal processes that took their pids since.
  json started = json::array();
  for (pid_t q : pids) started.push_back({q, start_ticks(q).value_or(0)});
  started.push_back({root, start_ticks(root).value_or(0)});
  send(command(GuardOp::kProtect, {{"root", root}, {"pids", pids}, {"started", started}}));
}
void Guard::cuda(const std::vector<pid_t>& pids) {
  send(command(GuardOp::kCuda, {{"pids", pids}}));
}
void Guard::cuda_report(const fs::path& report) {
  send(command(GuardOp::kCudaReport, {{"path", report.string()}}));
}
void Guard::criu_started(pid_t pid) {
  send(command(GuardOp::kCriu, {{"pid", pid}, {"started", start_ticks(pid).value_or(0)}}));
}
void Guard::criu_finished() {
  // Nothing starts here: after an abort there is nothing to tell, and an error path that calls
  // this must keep criu's own error.
  // A guard found dead here is not an error of this step either: the next step, or the abort,
  // meets it.
  std::lock_guard lk(mu_);
  if (!aborted_ && !finished_) tell_locked(command(GuardOp::kCriu, {{"pid", 0}, {"started", 0}}));
}
void Guard::criu_ended(bool clean, const fs::path& log) {
  // As criu_finished: called on criu's error path, whose error must stay the one reported.
  std::lock_guard lk(mu_);
  if (!aborted_ && !finished_)
    tell_locked(command(GuardOp::kCriuExit, {{"clean", clean}, {"log", log.string()}}));
}
void Guard::durable(bool end_targets) {
  send(command(GuardOp::kDurable, {{"end", end_targets}}), /*must_reach=*/false);
}
void Guard::copy_on_recovery(pid_t pid, pid_t pidns_init, Copy what) {
  // With their start times: the guard acts on these pids only while they are these processes.
  send(command(GuardOp::kCopy, {{"pid", pid},
                                {"pid_started", start_ticks(pid).value_or(0)},
                                {"pidns_init", pidns_init},
                                {"init_started", start_ticks(pidns_init).value_or(0)},
                                {"kill", what == Copy::kKill}}));
}
void Guard::copy_named_in(const fs::path& pidfile, Copy what, const std::vector<pid_t>& pids,
                          const fs::path& log) {
  // Taken here, before criu starts, not when the guard reads the line (maybe only after
  // gpuckpt died): the copy started after this tick, a process reusing its pid did not.
  send(command(GuardOp::kCopyPidfile, {{"path", pidfile.string()},
                                       {"after", boot_ticks_now()},
                                       {"kill", what == Copy::kKill},
                                       {"pids", pids},
                                       {"log", log.string()}}));
}
void Guard::container_on_recovery(const fs::path& runc_root, const std::string& id, Copy what,
                                  bool made_record) {
  // The tick before runc starts, as copy_named_in's: its container's init starts after it.
  send(command(GuardOp::kContainer, {{"root", runc_root.string()},
                                     {"id", id},
                                     {"after", boot_ticks_now()},
                                     {"kill", what == Copy::kKill},
                                     {"made", made_record}}));
}
void Guard::container_runc(pid_t runc) {
  send(command(GuardOp::kContainerRunc,
               {{"pid", runc}, {"started", start_ticks(runc).value_or(0)}}));
}
void Guard::container_known_as(const std::string& id) {
  send(command(GuardOp::kContainerId, {{"id", id}}));
}
void Guard::container_init(pid_t init) {
  send(command(GuardOp::kContainerInit, {{"started", start_ticks(init).value_or(0)}}));
}
void Guard::keep_copy() {
  commit(command(GuardOp::kKeepCopy));
}
void Guard::hand_over(bool end_original) {
  commit(command(GuardOp::kHandOver, {{"end", end_original}}));
}
void Guard::commit(const json& msg) {
  std::vector<fs::path> aside;
  {
    std::lock_guard lk(mu_);
    for (const auto& [from, to] : mirror_->renames) aside.push_back(from);
  }
  // Done whether or not the guard hears of it: the copy serves, and whoever asked for the
  // commit (a migration's controller) goes on as if it had.
  send(msg, /*must_reach=*/false);
  // What was moved aside for a rollback (a socket's entry, still bound to the replaced
  // process) would only mislead now; a rollback from here removes it as well.
  for (const auto& a : aside)
    if (::unlink(a.c_str()) != 0 && errno != ENOENT)
      spdlog::warn("cannot remove {}: {}", a.string(), std::strerror(errno));
}
void Guard::remove_on_recovery(const fs::path& path) {
  send(command(GuardOp::kRemove, {{"path", path.string()}}));
  hand_over_temp_dir(path);
}
void Guard::keep(const fs::path& path) {
  send(command(GuardOp::kKeep, {{"path", path.string()}}));
  take_back_temp_dir(path);
}
fs::path Guard::move_aside(const fs::path& path, const std::string& aside_name) {
  // Under the lock from the guard's plan to the rename: an abort from the interrupt thread comes
  // before both (and this throws) or after both (and puts the entry back), never between, when
  // it would find nothing to put back and the rename would then take the path away for good.
  std::lock_guard lk(mu_);
  refuse_after_abort_locked();
  // A name nothing has: one that a run killed with its guard left (its pid, ours now) is
  // neither replaced nor ever put over the path.
  fs::path aside;
  for (int n = 0; aside.empty(); ++n) {
    const fs::path name =
        path.parent_path() / (n == 0 ? aside_name : aside_name + "-" + std::to_string(n));
    struct stat st {};
    const int err = ::lstat(name.c_str(), &st) == 0 ? EEXIST : errno;
    if (err == ENOENT) {
      aside = name;
    } else if (err != EEXIST || n == 99) {
      throw Error(Errc::kIo, "cannot move " + path.string() + " aside for a rollback (" +
                                 name.string() + ": " + std::strerror(err) +
                                 "); nothing was restored");
    }
  }
  send_locked(command(GuardOp::kRename, {{"from", aside.string()}, {"to", path.string()}}));
  if (::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, aside.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    // Not moved, so the rollback cannot give the path back once criu has re-bound it: stop
    // before criu runs (a read-only directory would fail criu's bind anyway).
    throw Error(Errc::kIo, "cannot move " + path.string() + " aside for a rollback: " +
                               std::strerror(err) + "; nothing was restored");
  }
  return aside;
}
void Guard::restore_on_recovery(const fs::path& checkpoint, const fs::path& staging_root,
                                const fs::path& criu_binary, const std::string& container) {
  json m{{"checkpoint", checkpoint.string()},
         {"staging", staging_root.string()},
         {"criu", criu_binary.string()}};
  if (!container.empty()) m["container"] = container;
  send(command(GuardOp::kRestoreFrom, std::move(m)));
}

std::string Guard::abort(std::chrono::milliseconds timeout) {
  bool by_guard = false;
  {
    std::lock_guard lk(mu_);
    if (finished_ || !child_.running()) return {};
    aborted_ = true;
    by_guard = write_locked(command(GuardOp::kAbort));
    finished_ = true;
    std::lock_guard rk(g_recover_mu);
    ++g_aborting;
  }
  std::string summary;
  try {
    summary = recover_somewhere(by_guard, timeout);
  } catch (const std::exception& e) {
    summary = e.what();
  }
  {
    // Undone; or left to a guard that did not report in time and still runs: it holds the
    // journal until it has recovered, then removes it.
    std::lock_guard lk(mu_);
    if (child_.running())
      journal_.leave();
    else
      journal_.remove();
    release_locks_locked();
  }
  end_abort(summary);
  return summary;
}

std::string Guard::recover_somewhere(bool by_guard, std::chrono::milliseconds timeout) {
  guard_recovery_begun();
  const pid_t guard_pid = child_.pid();
  const std::string here = "gpuckpt undid the operation itself: ";
  if (!by_guard) {
    child_.wait_for(std::chrono::seconds(1));
    return "the guard (pid " + std::to_string(guard_pid) + ") had died, so " + here +
           recover(*mirror_).summary;
  }
  std::string summary = read_line(from_guard_.get(), timeout);
  const auto ended = child_.wait_for(std::chrono::seconds(10));
  if (summary.empty() && ended && !ended->ok())
    // It took the abort and died in its recovery (killed): what it had not done, and what it
    // had, is done again here (resuming, killing a copy and removing paths bear repeating).
    return "the guard (pid " + std::to_string(guard_pid) + ") died in its recovery (" +
           ended->describe() + "), so " + here + recover(*mirror_).summary;
  if (summary.empty())
    summary = "the guard did not report its recovery within " +
              std::to_string(timeout.count() / 1000) + " s";
  return summary;
}

void Guard::disarm() {
  {
    std::lock_guard lk(mu_);
    if (finished_ || !child_.running()) return;
    // The operation is complete: a guard that died meanwhile had nothing left to undo.
    write_locked(command(GuardOp::kDone));
    finished_ = true;
    journal_.remove();
    locks_.clear();  // the operation is complete: whatever the guard still holds is moot
  }
  // What the guard was to remove is gpuckpt's again (a snapshot's spool, still uploading): an
  // interrupt from here on removes it itself, as for any command without a guard.
  for (const auto& path : mirror_->remove) take_back_temp_dir(path);
  child_.wait_for(std::chrono::seconds(10));
}

std::vector<std::string> abort_all_guards(std::chrono::milliseconds timeout) {
  leave_handed_over_temp_dirs();
  {
    std::lock_guard rk(g_recover_mu);
    g_interrupt_waits = true;
  }
  std::vector<std::string> out;
  {
    // Held throughout: the operation's thread, which runs on and unwinds once its guard
    // refuses it, blocks in ~Guard (erase) until the abort that uses that guard is over.
    std::lock_guard lk(g_guards_mu);
    g_interrupting = true;
    g_interrupting_cv.notify_all();
    for (Guard* g : g_guards) {
      try {
        if (std::string s = g->abort(timeout); !s.empty()) out.push_back(std::move(s));
      } catch (const std::exception& e) {
        out.push_back(e.what());
      }
    }
  }
  // Then every abort still running on another thread, gpuckpt's own recovery included.
  std::unique_lock rk(g_recover_mu);
  g_recover_cv.wait(rk, [] { return g_aborting == 0; });
  for (auto& s : g_undone)
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  g_undone.clear();
  return out;
}

}  // namespace gpuckpt::process

namespace gpuckpt {

std::vector<std::string> interrupt_operations(std::chrono::milliseconds timeout) {
  auto out = process::abort_all_guards(timeout);
  std::vector<std::function<std::string()>> hooks;
  {
    std::lock_guard lk(process::g_guards_mu);
    for (auto* f : process::g_on_interrupt) hooks.push_back(*f);
  }
  for (auto& f : hooks)
    if (std::string said = f(); !said.empty()) out.push_back(std::move(said));
  // An output being built, a download, a benchmark's scratch: the guards removed theirs, and
  // the rest would stay hidden on disk (or in tmpfs) until a later run's sweep.
  for (const auto& r : remove_live_temp_dirs())
    out.push_back("removed the unfinished " + r.path.string() + " (" +
                  std::to_string(r.bytes >> 20) + " MiB)");
  return out;
}

bool process::raise_deferred_interrupt() {
  std::unique_lock ck(g_commit_mu);
  if (g_commits != 0 || g_deferred_signal == 0) return false;
  const int sig = std::exchange(g_deferred_signal, 0);
  ck.unlock();
  ::kill(::getpid(), sig);
  // Not returned before the signal's handler has begun (it ends the program): an error that
  // overtook it would end gpuckpt with that error's code instead of the signal's.
  std::unique_lock lk(g_guards_mu);
  g_interrupting_cv.wait_for(lk, std::chrono::seconds(5), [] { return g_interrupting; });
  return true;
}

CommitScope::CommitScope() {
  std::lock_guard lk(g_commit_mu);
  ++g_commits;
}

CommitScope::~CommitScope() {
  std::lock_guard lk(g_commit_mu);
  --g_commits;
}

bool defer_interrupt(int sig) {
  std::lock_guard lk(g_commit_mu);
  if (g_commits == 0) return false;
  g_deferred_signal = sig;
  return true;
}

int deferred_interrupt() {
  std::lock_guard lk(g_commit_mu);
  return g_deferred_signal;
}

OnInterrupt::OnInterrupt(std::function<std::string()> fn) : fn_(std::move(fn)) {
  std::lock_guard lk(process::g_guards_mu);
  process::g_on_interrupt.insert(&fn_);
}

OnInterrupt::~OnInterrupt() {
  std::lock_guard lk(process::g_guards_mu);
  process::g_on_interrupt.erase(&fn_);
}

}  // namespace gpuckpt

namespace gpuckpt::process {

// ------------------------------------------------------------------------- the guard itself

namespace {

// What a recovery has done so far, and what it could not do.
struct RecoveryLog {
  std::vector<std::string> said;
  std::vector<RecoveryFailure> failed;
};

void say(RecoveryLog& log, std::string s) {
  log.said.push_back(std::move(s));
}

// Said like the rest, and counted: `gpuckpt recover` exits with the first failure's code.
void fail(RecoveryLog& log, Errc code, std::string s) {
  log.failed.push_back({code, s});
  say(log, std::move(s));
}

// "12,13": pids as the summary names them.
std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const auto& i : items) (out += out.empty() ? "" : sep) += i;
  return out;
}

std::string pid_list(const std::vector<pid_t>& pids) {
  std::vector<std::string> ids;
  for (pid_t q : pids) ids.push_back(std::to_string(q));
  return join(ids, ",");
}

// The summary: what recovery did, in order.
std::string joined(const RecoveryLog& log) {
  return join(log.said, "; ");
}

// Every path of the plan goes (never a published checkpoint: remove() names temporaries).
void remove_staged(const Plan& p, RecoveryLog& log) {
  std::vector<std::string> removed;
  for (const auto& path : p.remove) {
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(path, ec))) continue;
    const std::uint64_t bytes = allocated_bytes(path);
    fs::remove_all(path, ec);
    if (ec)
      fail(log, Errc::kIo, "cannot remove " + path.string() + ": " + ec.message());
    else
      removed.push_back(path.string() + " (" + std::to_string(bytes >> 20) + " MiB)");
  }
  if (p.replay && !removed.empty()) say(log, "removed what it had staged: " + join(removed, ", "));
}

// Step 5, and the summary: every path of the plan goes, whichever way the targets went.
Recovery finish(const Plan& p, RecoveryLog log) {
  remove_staged(p, log);
  const std::string out = joined(log);
  return {out.empty() ? kNothingToUndo : out, std::move(log.failed)};
}

// For a replay: why undoing the plan now would do harm, or "" if everything is as the kill
// left it. A process of the protected trees that runs (not stopped) was resumed since, by
// criu's own rollback or by someone: nothing is frozen, and killing its copy or ending it would
// take a running service down. A release migration's copy that runs while the original has
// ended serves from the very checkpoint the original would be restored from.
std::string changed_since_the_kill(const Plan& p, const std::map<pid_t, Plan::Copy>& copies,
                                   const auto& is, const auto& protected_one) {
  bool original_lives = false;
  for (pid_t q : p.pids)
    if (protected_one(q)) original_lives = true;
  for (pid_t r : p.roots) {
    if (!protected_one(r)) continue;
    original_lives = true;
    for (pid_t q : process_tree(r)) {
      const auto info = read_proc(q);
      if (info && info->state != 'T' && info->state != 't' && info->state != 'Z')
        return "process " + std::to_string(q) + " runs again since gpuckpt was killed";
    }
  }
  if (!p.restore_from.empty() && !original_lives)
    for (const auto& [key, c] : copies)
      if (is(c.pid, c.pid_started))
        return "the copy " + std::to_string(c.pid) + ", restored from " + p.restore_from.string() +
               ", serves in place of the original, which has ended";
  if (!p.restore_from.empty() && !original_lives)
    for (const auto& c : p.containers) {
      const auto state = container::state_json({container::Runtime::kRunc, c.root, ""}, c.id);
      const pid_t init = state ? state->value("init_process_pid", 0) : 0;
      if (c.init_started > 0 && is(init, c.init_started))
        return "the container " + c.id + ", restored from " + p.restore_from.string() +
               ", serves in place of the original, which has ended";
    }
  return {};
}

// The driver's give-back of `q`'s CUDA state, on a thread of its own, waited for at most
// `limit`: a task that cannot run its restore thread blocks the call, and recovery must go on
// to the rest. nullopt past the limit (the call is left to the driver).
std::optional<device::Returned> return_to_running_within(pid_t q, std::chrono::seconds limit) {
  auto result = std::make_shared<std::promise<device::Returned>>();
  auto done = result->get_future();
  std::thread([q, result] {
    try {
      result->set_value(device::return_to_running(q));
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  }).detach();
  if (done.wait_for(limit) != std::future_status::ready) return std::nullopt;
  return done.get();
}

// Gives back the CUDA state of the live protected processes this dump locked (the plugin's
// report, read now: gpuckpt may have died before it learnt them) or checkpointed (p.cuda), from
// whatever state the driver reports: until then every CUDA call of theirs blocks. criu has
// ended (recover's step 1), so no tracer holds the restore threads the driver works in.
// A replay (`p.replay`) resumes nothing: it acts only on a task that runs, under that task's
// lock (another gpuckpt that locked it since is dumping it, and its CUDA state is that one's).
void give_back_cuda(const Plan& p, const std::vector<pid_t>& live, RecoveryLog& log) {
  std::set<pid_t> cuda = p.cuda;
  if (!p.cuda_report.empty()) {
    try {
      // None: criu stopped before the plugin started (nothing locked), or no plugin at all.
      if (const auto rep = criu::read_plugin_report(p.cuda_report))
        cuda.insert(rep->locked_pids.begin(), rep->locked_pids.end());
    } catch (const Error& e) {
      fail(log, e.code(),
           "the CRIU plugin's report cannot be read (" + std::string(e.what()) +
               "): a process it locked may stay frozen on the GPU");
    }
  }
  for (pid_t q : live) {
    if (!cuda.count(q)) continue;
    std::vector<HeldLockFile> held;
    if (p.replay) {
      const auto info = read_proc(q);
      if (info && (info->state == 'T' || info->state == 't')) {
        say(log, "process " + std::to_string(q) +
                     " is stopped, so its CUDA state was left as it is (once it runs: gpuckpt "
                     "cuda-checkpoint --pid " +
                     std::to_string(q) + " --action resume)");
        continue;
      }
      try {
        held = lock_processes({q});
      } catch (const Error& e) {
        say(log, "the CUDA state of process " + std::to_string(q) +
                     " was left to the gpuckpt that holds it now (" + e.what() + ")");
        continue;
      }
    }
    try {
      const auto back = return_to_running_within(q, std::chrono::seconds(60));
      if (!back) {
        fail(log, Errc::kTimeout,
             "the CUDA state of process " + std::to_string(q) +
                 " was not given back within 60 s (the driver's call blocks): it may stay "
                 "frozen on the GPU");
        continue;
      }
      switch (*back) {
        case device::Returned::kRestoredAndUnlocked:
          say(log, "the CUDA state of process " + std::to_string(q) + " was restored");
          break;
        case device::Returned::kUnlocked:
          say(log, "the CUDA state of process " + std::to_string(q) + " was unlocked");
          break;
        case device::Returned::kNothing:
          break;
      }
    } catch (const Error& e) {
      // One that ended meanwhile (a stop's SIGTERM was pending) has no state left to give back.
      if (!alive(q))
        say(log, "process " + std::to_string(q) + " ended before its CUDA state was given back");
      else
        fail(log, e.code(),
             "process " + std::to_string(q) +
                 " runs but its CUDA state could not be given back: " + e.what());
    }
  }
}

// The ghost files criu created, from its log's "Opening ghost file 0xID for PATH" lines (PATH
// relative to the root of a restore into "/").
std::vector<fs::path> ghost_files_in_log(const fs::path& log) {
  std::vector<fs::path> out;
  std::ifstream in(log);
  static constexpr std::string_view kSays = "Opening ghost file 0x";
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(kSays);
    if (at == std::string::npos) continue;
    const auto id_end = line.find(" for ", at);
    if (id_end == std::string::npos) continue;
    const std::string id = line.substr(at + kSays.size(), id_end - at - kSays.size());
    if (id.empty() || !std::all_of(id.begin(), id.end(), ::isxdigit)) continue;
    fs::path path = line.substr(id_end + 5);
    if (path.is_relative()) path = "/" / path;
    out.push_back(path.string() + ".cr." + id + ".ghost");
  }
  return out;
}

// A running criu's log: its -o (or --log-file), relative to its -W, else its -D; empty if it
// names none.
fs::path criu_log_of(const ProcInfo& criu) {
  fs::path log, work, images;
  const auto& a = criu.cmdline;
  for (std::size_t i = 1; i + 1 < a.size(); ++i) {
    if (a[i] == "-o" || a[i] == "--log-file") log = a[i + 1];
    if (a[i] == "-W" || a[i] == "--work-dir") work = a[i + 1];
    if (a[i] == "-D" || a[i] == "--images-dir") images = a[i + 1];
  }
  if (log.empty() || log.is_absolute()) return log;
  const fs::path base = work.empty() ? images : work;
  return base.empty() ? fs::path() : base / log;
}

// criu ended without naming its copy: what it had restored of the tree so far (tasks at the
// checkpoint's pids that started since it began) holds the service's name, its sockets and its
// pids, blocked for good. It is ended, and the ghost files criu made for it go too.
void end_half_restored(const Plan::NamedCopy& n, RecoveryLog& log) {
  std::vector<pid_t> half;
  for (pid_t q : n.pids) {
    const auto started = q > 0 ? start_ticks(q) : std::nullopt;
    if (started && *started >= n.after) half.push_back(q);
  }
  if (!half.empty()) {
    if (const auto left = end_tree(half, 10000); !left.empty())
      fail(log, Errc::kProcess,
           "criu restore ended before it had restored the tree, and its half-restored processes " +
               pid_list(left) + " do not end");
    else
      say(log,
          "criu restore ended before it had restored the tree, so its half-restored "
          "processes " +
              pid_list(half) + " were killed");
  }
  if (n.log.empty()) return;
  // criu logs a ghost file's name before it creates it: a file of that name may be another
  // restore's of the same file (beside this one, in a pid namespace of its own), which its criu
  // removes when it is done. Such a restore's log names it too; one whose log cannot be read
  // might.
  std::vector<fs::path> ghosts;
  for (auto& g : ghost_files_in_log(n.log)) {
    struct stat st {};
    if (::lstat(g.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) ghosts.push_back(std::move(g));
  }
  if (ghosts.empty()) return;
  std::vector<pid_t> owners;
  for (pid_t q : live_pids_where([](const ProcInfo& i) {
         return !i.cmdline.empty() && fs::path(i.cmdline[0]).filename() == "criu" &&
                std::find(i.cmdline.begin(), i.cmdline.end(), "restore") != i.cmdline.end();
       })) {
    const auto other = read_proc(q);
    const fs::path other_log = other ? criu_log_of(*other) : fs::path();
    std::error_code ec;
    if (other_log.empty() || !fs::exists(other_log, ec)) {
      owners.push_back(q);
      continue;
    }
    for (const auto& g : ghost_files_in_log(other_log))
      if (std::find(ghosts.begin(), ghosts.end(), g) != ghosts.end()) owners.push_back(q);
  }
  if (!owners.empty()) {
    say(log, "left the ghost files criu had made (" + ghosts.front().string() +
                 (ghosts.size() > 1 ? ", ..." : "") + "): criu " + pid_list(owners) +
                 " restores meanwhile, and they may be its. A restore that then fails with "
                 "\"File exists\" needs them removed once no criu runs");
    return;
  }
  std::vector<std::string> removed;
  for (const auto& g : ghosts)
    if (::unlink(g.c_str()) == 0) removed.push_back(g.string());
  if (!removed.empty()) say(log, "removed the ghost files criu had made: " + join(removed, ", "));
}

// A criu (or a runc running one) that recovery must let finish before it acts: its tasks are in
// a clean state only then. Waited for a minute, then killed (`group`: its process group too).
void let_finish(pid_t pid, const std::string& what, bool group, RecoveryLog& log) {
  if (wait_ended(pid, std::chrono::seconds(60))) return;
  ::kill(group ? -pid : pid, SIGKILL);
  if (wait_ended(pid, std::chrono::seconds(10)))
    say(log, what + " (pid " + std::to_string(pid) + ") was killed");
  else
    fail(log, Errc::kCriu,
         what + " (pid " + std::to_string(pid) +
             ") does not end, even killed: the processes it holds stay as they are");
}

// The record that a restore made for its container in containerd or Docker (a replica's), which
// would hold the name against the next restore.
void forget_made_record(const container::Container& box, RecoveryLog& log) {
  if (const std::string why = container::remove_record(box); !why.empty())
    fail(log, Errc::kProcess, "the record of the restored container " + box.id + " stays: " + why);
  else if (box.root.runtime != container::Runtime::kRunc)
    say(log, "the container record made for " + box.id + " was removed");
}

// The runc that containerd's shim runs to restore container `id` under `root`: not gpuckpt's
// child, so never named to the guard, and found by its command line.
std::vector<pid_t> shim_runc_restoring(const fs::path& root, const std::string& id) {
  return live_pids_where([&](const ProcInfo& i) {
    const auto& a = i.cmdline;
    if (a.size() < 3 || fs::path(a.front()).filename() != "runc" || a.back() != id ||
        std::find(a.begin(), a.end(), "restore") == a.end())
      return false;
    const auto r = std::find(a.begin(), a.end(), "--root");
    std::error_code ec;
    return r != a.end() && r + 1 != a.end() && fs::equivalent(*(r + 1), root, ec);
  });
}

// Step 2b: the containers runc restores for this operation. Its runc first (it writes runc's
// state once criu is done), then what runc lists under the ID, if this restore made it: killed
// and deleted from runc's state, so that the ID is free again (or left, if it was to stay). A
// replay knows the container by its init alone: an ID taken since is someone else's.
void end_restored_containers(const Plan& p, RecoveryLog& log, const auto& is) {
  for (const auto& c : p.containers) {
    if (!p.replay)
      for (const pid_t q : shim_runc_restoring(c.root, c.id))
        if (q != c.runc)  // gpuckpt's own runc is waited for below, with its process group
          let_finish(q, "the runtime's runc restore", /*group=*/false, log);
    // runc and its criu: runc leads their process group.
    if (is(c.runc, c.runc_started) && alive(c.runc))
      let_finish(c.runc, "runc restore", /*group=*/true, log);
    const container::Container box{container::root_at(c.root), c.id};
    const auto state = container::state_json(box.root, c.id);
    const auto start = state ? state->value("init_process_start", std::uint64_t{0}) : 0;
    const bool ours =
        state && (c.init_started > 0 ? start == c.init_started : !p.replay && start >= c.after);
    if (state && !ours) {
      say(log, "container " + c.id + " (runc root " + c.root.string() +
                   ") is not the one this restore made, and was left as it is");
      continue;
    }
    if (!state) {
      // runc made nothing it still lists: only the bundle gpuckpt wrote for it, a task its
      // runtime created from the images but never started, and the runtime's record made for
      // it, may be left.
      if (!p.replay) {
        container::remove_restore_bundle(box.root.path, c.id);
        if (c.kill) {
          if (const std::string why = container::remove_unstarted(box); !why.empty())
            fail(log, Errc::kProcess, "the task created for container " + c.id + " stays: " + why);
          if (c.made) forget_made_record(box, log);
        }
      }
      continue;
    }
    const pid_t init = state->value("init_process_pid", 0);
    const bool runs = init > 0 && is(init, start) && alive(init);
    if (!c.kill) {
      if (runs) say(log, "the restored container " + c.id + " is left running");
      continue;
    }
    // end_tree locks restored CUDA processes before it kills them (cuda-checkpoint#53).
    if (runs)
      if (const auto left = end_tree(process_tree(init), 10000); !left.empty()) {
        fail(log, Errc::kProcess,
             "the restored container " + c.id + " did not end (still alive: " + pid_list(left) +
                 "), so two copies may serve");
        continue;
      }
    if (const std::string why = container::remove_ended(box); !why.empty()) {
      fail(log, Errc::kProcess,
           "the restored container " + c.id + " ended, but runc still lists it: " + why);
      continue;
    }
    say(log, "the restored container " + c.id + " was killed and deleted from runc");
    if (c.made) forget_made_record(box, log);
  }
}

// Step 2a: the copies to end or leave, each once, by what is known best. gpuckpt named some; a
// criu that finished names the copy it restored in its pidfile (started after gpuckpt's tick,
// taken before criu started); one that wrote none left, at the checkpoint's pids, a
// half-restored tree that is ended here.
std::map<pid_t, Plan::Copy> copies_to_recover(const Plan& p, RecoveryLog& log) {
  auto copies = p.copies;
  for (const auto& n : p.copy_pidfiles) {
    pid_t q = 0;
    try {
      q = read_pidfile(n.pidfile);
    } catch (const Error&) {
      // No pidfile (criu restored nothing whole, or the staging that held it is gone): a tree
      // gpuckpt named as restored is a copy as any other; anything else at the checkpoint's pids
      // that criu started is half-restored.
      const bool named = std::any_of(p.copies.begin(), p.copies.end(), [&](const Plan::Copy& c) {
        return c.pid > 0 && std::find(n.pids.begin(), n.pids.end(), c.pid) != n.pids.end();
      });
      if (!named && !n.criu_clean) end_half_restored(n, log);
      continue;
    }
    const auto started = start_ticks(q);
    if (started && *started >= n.after) copies.push_back({q, 0, *started, 0, n.kill});
  }
  // A copy may be named twice, first by its pidfile or its namespace's init, then by its pid.
  std::map<pid_t, Plan::Copy> unique;
  for (const auto& c : copies) {
    auto& u = unique[c.pidns_init > 0 ? c.pidns_init : c.pid];
    if (u.pid == 0 && u.pidns_init == 0) u = c;
    if (c.pid > 0) {
      u.pid = c.pid;
      u.pid_started = c.pid_started;
    }
    u.kill = u.kill || c.kill;
  }
  return unique;
}

// Step 2a, continued: an unconfirmed copy (or a namespace whose restore was cut short) is
// killed, its CUDA processes locked first; a copy that is to stay is left as it is.
void end_copies(const std::map<pid_t, Plan::Copy>& unique, RecoveryLog& log, const auto& is) {
  for (const auto& [key, c] : unique) {
    const bool root = is(c.pid, c.pid_started), init = is(c.pidns_init, c.init_started);
    if (!root && !init) continue;  // gone already
    if (!c.kill && c.pid > 0) {
      // Stopped, it is not ours to call running: another gpuckpt may be dumping it.
      const auto info = root ? read_proc(c.pid) : std::nullopt;
      if (info && (info->state == 'T' || info->state == 't'))
        say(log, "the restored process " + std::to_string(c.pid) +
                     " is left as it is, stopped (another operation, such as a dump, holds it)");
      else if (info && info->state != 'Z')
        say(log, "the restored process " + std::to_string(c.pid) + " is left running");
      continue;
    }
    // To kill: an unconfirmed copy, or a namespace whose restore was cut short before gpuckpt
    // saw it restored (no root pid yet: criu may still be running in it, or have failed).
    std::vector<pid_t> tree;
    if (init) tree = process_tree(c.pidns_init);
    if (root)
      for (pid_t q : process_tree(c.pid))
        if (std::find(tree.begin(), tree.end(), q) == tree.end()) tree.push_back(q);
    // end_tree locks restored CUDA processes before it kills them (cuda-checkpoint#53).
    if (const auto left = end_tree(tree, 10000); !left.empty()) {
      fail(log, Errc::kProcess,
           "the restored copy " + std::to_string(root ? c.pid : c.pidns_init) +
               " did not end (still alive: " + pid_list(left) + "), so two copies may serve");
      continue;
    }
    say(log,
        c.kill ? "the restored copy " + std::to_string(root ? c.pid : c.pidns_init) + " was killed"
               : "the restore was interrupted before criu finished in its pid namespace, "
                 "so that namespace (init " +
                     std::to_string(c.pidns_init) + ") was killed");
  }
}

// Step 3: the paths a rollback must put back (socket paths a copy took).
void put_back_paths(const Plan& p, RecoveryLog& log) {
  for (const auto& [from, to] : p.renames) {
    if (::rename(from.c_str(), to.c_str()) == 0) {
      say(log, "the socket path " + to.string() + " was given back to the process serving it");
    } else if (errno != ENOENT) {
      const int err = errno;
      fail(log, Errc::kIo,
           detail::with_strerror("cannot give the socket path " + to.string() +
                                     " back to the process serving it (its entry is at " +
                                     from.string() + ")",
                                 err));
    }
  }
}

// Step 4a: an original that already ended for a migration comes back from its checkpoint.
void restore_original(const Plan& p, RecoveryLog& log) {
  RestoreOptions ro;
  ro.checkpoint = p.restore_from;
  ro.staging_root = p.restore_staging;
  ro.criu.binary = p.restore_criu;
  ro.criu.check = false;
  if (!p.restore_container.empty()) ro.container = p.restore_container;
  RestoreResult rr;
  try {
    restore_into(ro, rr, nullptr);
    say(log, "the original was restored from " + p.restore_from.string() +
                 (rr.container.empty() ? "" : " as container " + rr.container + ",") + " as pid " +
                 std::to_string(rr.pid));
  } catch (const std::exception& e) {
    const auto* err = dynamic_cast<const Error*>(&e);
    fail(log, err ? err->code() : Errc::kInternal,
         "restoring the original from " + p.restore_from.string() +
             " failed (restore it by hand: gpuckpt restore " + p.restore_from.string() +
             "): " + e.what());
  }
}

// Step 4b: the targets still alive, resumed where they are frozen (their CUDA state given
// back), or ended once the checkpoint is durable if they were to end.
void resume_or_end(const Plan& p, const std::vector<pid_t>& live, RecoveryLog& log) {
  if (p.durable && p.end_targets) {
    for (pid_t q : live) ::kill(q, SIGKILL);
    std::vector<pid_t> stuck;
    for (pid_t q : live)
      if (!wait_ended(q, std::chrono::seconds(10))) stuck.push_back(q);
    if (!stuck.empty())
      fail(log, Errc::kProcess,
           "the checkpoint is durable, but the dumped processes " + pid_list(stuck) +
               " did not end");
    else if (!live.empty())
      say(log, "the checkpoint is durable, so the dumped processes ended as planned");
    return;
  }
  for (pid_t q : live) ::kill(q, SIGCONT);
  give_back_cuda(p, live, log);
  if (!live.empty())
    say(log, (live.size() == 1 ? "process " : "processes ") + pid_list(live) +
                 (live.size() == 1 ? " was" : " were") + " resumed");
}

Recovery recover(const Plan& p) {
  RecoveryLog log;
  // A pid counts only while it is the process gpuckpt named (same start tick): one reused
  // since is someone else's.
  auto is = [](pid_t q, std::uint64_t started) {
    const auto t = q > 0 && started > 0 ? start_ticks(q) : std::nullopt;
    return t && *t == started;
  };
  auto protected_one = [&](pid_t q) {
    const auto it = p.started.find(q);
    return it != p.started.end() && is(q, it->second) && alive(q);
  };
  // The protected processes still alive as the ones named (start ticks), their trees included.
  auto live_targets = [&] {
    std::set<pid_t> live;
    for (pid_t q : p.pids)
      if (protected_one(q)) live.insert(q);
    for (pid_t r : p.roots)
      if (protected_one(r))
        for (pid_t q : process_tree(r))
          if (alive(q)) live.insert(q);
    return std::vector<pid_t>(live.begin(), live.end());
  };
  // 1. criu first: its tasks are in a clean state only once it has finished.
  if (is(p.criu, p.criu_started) && alive(p.criu)) let_finish(p.criu, "criu", false, log);
  // 2. the copies, which may own the service's endpoints.
  const auto copies = copies_to_recover(p, log);
  if (p.replay) {
    if (const std::string why = changed_since_the_kill(p, copies, is, protected_one);
        !why.empty()) {
      // Someone acted since (an operator resumed the original, or a copy has been serving
      // alone): undoing now would end a running service.
      // Except the CUDA state the dump locked: a tree that runs again because criu died with
      // gpuckpt (the kernel resumes a tracer's tasks) would otherwise serve frozen on the GPU.
      // Giving it back acts only on a state the driver still reports locked or checkpointed.
      // And what it staged (tmpfs images, a spool, an unpublished output): the journal names it
      // as the operation's own, nobody else holds it, and no later run would find it.
      const std::size_t said = log.said.size();
      if (!p.durable || !p.end_targets) give_back_cuda(p, live_targets(), log);
      say(log, why + (log.said.size() > said ? ", so nothing else was undone"
                                             : ", so nothing was undone"));
      remove_staged(p, log);
      return {joined(log), std::move(log.failed)};
    }
  }
  end_copies(copies, log, is);
  end_restored_containers(p, log, is);
  // 3. paths a rollback must put back.
  put_back_paths(p, log);
  // 4. the targets, each only while it is the process that was protected: restored from the
  // checkpoint if they already ended for a migration, else resumed (or ended, if durable).
  if (!p.restore_from.empty() &&
      std::none_of(p.roots.begin(), p.roots.end(), [&](pid_t r) { return protected_one(r); })) {
    restore_original(p, log);
    return finish(p, std::move(log));
  }
  resume_or_end(p, live_targets(), log);
  return finish(p, std::move(log));
}

// At a commit: the entries moved aside (the replaced process's socket paths) are not put back,
// only removed.
void forget_renames(Plan& p) {
  for (const auto& [from, to] : p.renames) p.remove.push_back(from);
  p.renames.clear();
}

// Adds command `m` to the plan. Error(kCorrupt) for a line that is no command, or one whose
// fields are missing or of the wrong type (what of it came before the bad field stays applied:
// each field is something to undo).
void apply(Plan& p, const json& m, bool hold_dirs) {
  const GuardOp op = op_of(m);
  try {
    apply_op(p, op, m, hold_dirs);
  } catch (const json::exception& e) {
    throw Error(Errc::kCorrupt,
                "command '" + std::string(op_name(op)) + "' is malformed (" + e.what() + ")");
  }
}

void apply_op(Plan& p, GuardOp op, const json& m, bool hold_dirs) {
  switch (op) {
    case GuardOp::kProtect: {
      p.roots.push_back(m.at("root").get<pid_t>());
      for (pid_t q : m.at("pids").get<std::vector<pid_t>>()) p.pids.insert(q);
      for (const auto& e : m.at("started"))
        p.started[e.at(0).get<pid_t>()] = e.at(1).get<std::uint64_t>();
      break;
    }
    case GuardOp::kCuda: {
      for (pid_t q : m.at("pids").get<std::vector<pid_t>>()) p.cuda.insert(q);
      break;
    }
    case GuardOp::kCudaReport: {
      p.cuda_report = m.at("path").get<std::string>();
      if (hold_dirs) {
        try {
          // The report lies in images/ of the dump's staging directory (make_images_dir).
          p.cuda_report_hold = hold_dir(p.cuda_report.parent_path().parent_path());
        } catch (const Error&) {
          // Gone already (the dump ended it, or a sweep took it): recovery then has p.cuda
          // alone.
        }
      }
      break;
    }
    case GuardOp::kCriu: {
      p.criu = m.at("pid").get<pid_t>();
      p.criu_started = m.at("started").get<std::uint64_t>();
      break;
    }
    case GuardOp::kDurable: {
      p.durable = true;
      p.end_targets = m.at("end").get<bool>();
      break;
    }
    case GuardOp::kCopy: {
      p.copies.push_back({m.at("pid").get<pid_t>(), m.at("pidns_init").get<pid_t>(),
                          m.at("pid_started").get<std::uint64_t>(),
                          m.at("init_started").get<std::uint64_t>(), m.at("kill").get<bool>()});
      break;
    }
    case GuardOp::kCopyPidfile: {
      p.copy_pidfiles.push_back({m.at("path").get<std::string>(),
                                 m.at("after").get<std::uint64_t>(), m.at("kill").get<bool>(),
                                 m.value("pids", std::vector<pid_t>{}),
                                 m.value("log", std::string())});
      break;
    }
    case GuardOp::kContainer: {
      p.containers.push_back({m.at("root").get<std::string>(), m.at("id").get<std::string>(),
                              m.at("after").get<std::uint64_t>(), m.at("kill").get<bool>(),
                              m.value("made", false)});
      break;
    }
    case GuardOp::kContainerRunc: {
      if (p.containers.empty()) throw Error(Errc::kCorrupt, "container_runc before container");
      p.containers.back().runc = m.at("pid").get<pid_t>();
      p.containers.back().runc_started = m.at("started").get<std::uint64_t>();
      break;
    }
    case GuardOp::kContainerInit: {
      if (p.containers.empty()) throw Error(Errc::kCorrupt, "container_init before container");
      p.containers.back().init_started = m.at("started").get<std::uint64_t>();
      break;
    }
    case GuardOp::kContainerId: {
      if (p.containers.empty()) throw Error(Errc::kCorrupt, "container_id before container");
      p.containers.back().id = m.at("id").get<std::string>();
      break;
    }
    case GuardOp::kCriuExit: {
      if (!p.copy_pidfiles.empty()) {
        auto& n = p.copy_pidfiles.back();
        n.criu_clean = m.at("clean").get<bool>();
        if (auto log = m.value("log", std::string()); !log.empty()) n.log = std::move(log);
      }
      break;
    }
    case GuardOp::kKeepCopy: {
      p.copies.clear();
      p.copy_pidfiles.clear();
      p.containers.clear();
      forget_renames(p);
      break;
    }
    case GuardOp::kRemove: {
      p.remove.emplace_back(m.at("path").get<std::string>());
      break;
    }
    case GuardOp::kKeep: {
      std::erase(p.remove, fs::path(m.at("path").get<std::string>()));
      break;
    }
    case GuardOp::kRename: {
      p.renames.emplace_back(m.at("from").get<std::string>(), m.at("to").get<std::string>());
      break;
    }
    case GuardOp::kRestoreFrom: {
      p.restore_from = m.at("checkpoint").get<std::string>();
      if (hold_dirs) {
        try {
          const fs::path dir = p.restore_from.parent_path();
          p.restore_hold = hold_dir(dir.empty() ? fs::path(".") : dir);
        } catch (const Error&) {
          // Not ours to hold (gone, or not a directory we may open): nobody sweeps it either.
        }
      }
      p.restore_staging = m.at("staging").get<std::string>();
      p.restore_criu = m.at("criu").get<std::string>();
      p.restore_container = m.value("container", std::string());
      break;
    }
    case GuardOp::kHandOver: {
      p.copies.clear();
      p.copy_pidfiles.clear();
      p.containers.clear();
      forget_renames(p);
      p.restore_from.clear();
      p.restore_hold.reset();
      if (m.at("end").get<bool>()) {
        p.durable = p.end_targets = true;
      } else {
        // A release: the original ended already, and its pids now name the copy.
        p.roots.clear();
        p.pids.clear();
        p.cuda.clear();
        p.cuda_report.clear();
        p.cuda_report_hold.reset();
        p.started.clear();
      }
      break;
    }
    case GuardOp::kLocks:
    case GuardOp::kAbort:
    case GuardOp::kDone:
      // Control, not plan: the guard's loop acts on them (and a journal never holds them).
      break;
  }
}

bool write_all(int fd, const std::string& s) {
  return write_fully(fd, s.data(), s.size()) == 0;
}

}  // namespace

namespace {

// How long gpuckpt may stay stopped (SIGSTOP, a Ctrl-Z) while its service waits on it:
// $GPUCKPT_STOPPED_LIMIT seconds, 30 unless set, at most a day; 0: no bound.
std::chrono::seconds stopped_limit() {
  constexpr long kDay = 24 * 3600;
  if (const char* e = std::getenv("GPUCKPT_STOPPED_LIMIT"); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end && *end == '\0' && v >= 0) return std::chrono::seconds(std::min(v, kDay));
  }
  return std::chrono::seconds(30);
}

// What of the service waits for gpuckpt now ("" if nothing): its processes stopped (criu's
// freeze, which is also when their CUDA state is locked, or kept stopped for a handoff), its
// socket paths moved aside, or, in a release migration, the service down between the
// original's end and the copy. Not the plan's CUDA pids alone: a dump that left its tree
// running has given their state back, and recovering it again is not for a stopped gpuckpt.
std::string what_waits(const Plan& p) {
  std::vector<pid_t> frozen;
  for (pid_t q : p.pids) {
    const auto info = read_proc(q);
    if (info && (info->state == 'T' || info->state == 't')) frozen.push_back(q);
  }
  if (!frozen.empty()) return "process " + pid_list(frozen) + " stayed frozen";
  if (!p.restore_from.empty())
    return "the service stayed down (its original ended, its copy not yet serving)";
  if (!p.renames.empty())
    return "the socket path " + p.renames.front().first.string() + " stayed moved aside";
  return {};
}

// A stopped gpuckpt neither finishes nor fails, so its service would wait for as long as
// nobody continues it. Called about once a second: past the bound, gpuckpt is killed, and the
// guard recovers as from any death of gpuckpt.
class StoppedWatch {
 public:
  StoppedWatch(pid_t gpuckpt, std::chrono::seconds limit) : gpuckpt_(gpuckpt), limit_(limit) {}
  void check(const Plan& p) {
    const auto info = limit_.count() > 0 && !killed_ ? read_proc(gpuckpt_) : std::nullopt;
    const std::string waits = info && info->state == 'T' ? what_waits(p) : std::string();
    if (waits.empty()) {
      since_.reset();
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!since_) since_ = now;
    if (now - *since_ < limit_) return;
    killed_ = true;
    ::kill(gpuckpt_, SIGKILL);
    write_all(2, "gpuckpt-guard: gpuckpt (pid " + std::to_string(gpuckpt_) + ") was stopped for " +
                     std::to_string(limit_.count()) + " s while " + waits +
                     ": it was killed, and its guard recovers ($GPUCKPT_STOPPED_LIMIT sets the "
                     "bound)\n");
  }

 private:
  pid_t gpuckpt_;
  std::chrono::seconds limit_;
  std::optional<std::chrono::steady_clock::time_point> since_;
  bool killed_ = false;
};

}  // namespace

int guard_main(int in_fd, int out_fd, const fs::path& journal) {
  // spdlog's default logger writes to stdout, which is the summary pipe in gpuckpt-guard: a log
  // line of its recovery (a restore's) would then be read as the summary, and the operator of
  // an interrupted gpuckpt would never learn what the guard did. Its diagnostics go to stderr.
  // Read once: a guard re-parented after gpuckpt's death must never take its new parent (a
  // subreaper) for gpuckpt.
  const pid_t gpuckpt = ::getppid();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "gpuckpt-guard", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  spdlog::set_pattern("%^[%l]%$ gpuckpt-guard: %v");
  spdlog::set_level(spdlog::level::warn);  // its summary says what it did; --quiet holds
  // The fault hooks stop gpuckpt under test. The guard inherits its environment, and its own
  // recovery (a restore) passes the same points: it must run through, not pause for good.
  for (const char* var : {"GPUCKPT_FAULT_PAUSE", "GPUCKPT_FAULT_MARK", "GPUCKPT_FAULT_RESUME"})
    ::unsetenv(var);
  // Terminal and termination signals are gpuckpt's business; the guard must outlive them. A
  // SIGPIPE (gpuckpt gone before reading the summary) must not kill it mid-recovery either.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) ::signal(sig, SIG_IGN);
  // Held from before "ready" (gpuckpt holds it until then): no run recovers what this guard
  // may still recover.
  const UniqueFd held = journal.empty() ? UniqueFd() : hold_journal(journal);
  if (!journal.empty() && !held) {
    // Not "ready": gpuckpt freezes nothing. A journal this guard did not hold would be
    // recovered by another run while this one recovers too.
    const std::string msg = "gpuckpt-guard: cannot hold the journal " + journal.string() + "\n";
    write_all(2, msg);
    return 1;
  }
  // The operation is over once this returns (done, or undone): nothing is left to recover.
  auto over = [&] {
    if (!journal.empty()) ::unlink(journal.c_str());
  };
  // A lock for each process of the tree arrives here: room for as many as the hard limit allows.
  if (rlimit r{}; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &r);
  }
  if (!write_all(out_fd, "ready\n")) return 1;
  Plan plan;
  std::string buf;
  bool aborted = false;
  // gpuckpt's process locks (Guard::hold_locks), held until the operation is over: a gpuckpt
  // killed meanwhile leaves them to this guard, so no other takes the processes it resumes.
  std::vector<UniqueFd> locks;
  bool locks_lost = false;
  StoppedWatch watch(gpuckpt, stopped_limit());
  for (;;) {
    pollfd pfd{in_fd, POLLIN, 0};
    // An error (EINTR, ENOMEM) is no sign that gpuckpt is gone: recv says that.
    if (::poll(&pfd, 1, 1000) <= 0) {
      watch.check(plan);
      continue;
    }
    char chunk[4096];
    bool truncated = false;
    const ssize_t n = recv_with_fds(in_fd, chunk, sizeof chunk, locks, &truncated);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // gpuckpt is gone
    if (truncated && !locks_lost) {
      locks_lost = true;  // said once: the recovery goes on, only without those locks
      write_all(2,
                "gpuckpt-guard: the kernel dropped some of the process locks passed to it (out "
                "of descriptors): another gpuckpt may take those processes up meanwhile\n");
    }
    buf.append(chunk, static_cast<std::size_t>(n));
    for (std::size_t nl; (nl = buf.find('\n')) != std::string::npos;) {
      const json m = json::parse(buf.substr(0, nl), nullptr, false);
      buf.erase(0, nl + 1);
      try {
        const GuardOp op = op_of(m);
        if (op == GuardOp::kDone) {
          over();
          return 0;
        }
        if (op == GuardOp::kAbort) {
          aborted = true;
          break;
        }
        apply(plan, m, /*hold_dirs=*/true);
      } catch (const Error& e) {
        // gpuckpt and its guard are built together: a line it cannot read is a bug, said where
        // the operator sees it; the recovery goes on with what it could read.
        write_all(2, "gpuckpt-guard: ignored a line from gpuckpt: " + std::string(e.what()) + "\n");
      }
    }
    if (aborted) break;
  }
  const std::string summary = recover(plan).summary;
  over();
  if (!aborted) {
    // gpuckpt died: nobody reads the pipe, so tell the operator on the inherited stderr.
    const std::string msg =
        "gpuckpt-guard: gpuckpt ended in the middle of an operation; " + summary + "\n";
    write_all(2, msg);
  }
  write_all(out_fd, summary + "\n");
  return 0;
}

}  // namespace gpuckpt::process

namespace gpuckpt {

std::vector<RecoveredOperation> recover_abandoned_operations() {
  std::vector<RecoveredOperation> out;
  process::for_each_abandoned_journal([&](const process::AbandonedJournal& j) {
    process::Plan p;
    p.replay = true;
    p.operation = j.header.value("operation", "");
    std::vector<std::string> unread;
    for (const auto& c : j.commands) {
      try {
        // Holding the spool a release migration's original is restored from, as its guard
        // did: a sweep by another run must not take it meanwhile.
        process::apply(p, c, /*hold_dirs=*/true);
      } catch (const Error& e) {
        unread.push_back(e.what());
      }
    }
    RecoveredOperation r;
    r.operation = p.operation;
    r.gpuckpt_pid = j.header.value("pid", 0);
    r.started = j.header.value("started", "");
    r.journal = j.path.string();
    {
      // Counted as an abort in progress: an interrupt meanwhile waits for it and reports it,
      // rather than leave it half done.
      std::lock_guard rk(process::g_recover_mu);
      ++process::g_aborting;
    }
    try {
      auto undone = process::recover(p);
      r.summary = std::move(undone.summary);
      r.failures = std::move(undone.failures);
      // A line it could not read may have named something to undo: the recovery is not known
      // to be complete.
      for (const auto& u : unread) {
        const std::string what = "a line of the journal " + r.journal + " was not read: " + u;
        r.summary += "; " + what;
        r.failures.push_back({Errc::kCorrupt, what});
      }
    } catch (...) {
      process::end_abort(r.summary);
      throw;
    }
    process::end_abort(r.summary);
    spdlog::log(r.failures.empty() ? spdlog::level::warn : spdlog::level::err,
                "a {} by gpuckpt (pid {}, started {}) was killed together with its guard; "
                "undone now{}: {}",
                r.operation, r.gpuckpt_pid, r.started, r.failures.empty() ? "" : ", not all of it",
                r.summary);
    out.push_back(std::move(r));
  });
  process::remove_abandoned_locks();  // never throws: the list above is what a caller needs
  return out;
}

}  // namespace gpuckpt
