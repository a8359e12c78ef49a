#include "process/guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "container/checkpoint.h"
#include "container/runtime.h"
#include "gpuckpt/error.h"
#include "gpuckpt/process.h"
#include "process/guard_plan.h"
#include "process/proc_info.h"
#include "process/support.h"
#include "util/fault.h"
#include "util/fd_passing.h"
#include "util/fs.h"
#include "util/no_sigpipe.h"
#include "util/pipe.h"
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

namespace {

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
  int down[2];
  // Close-on-exec: criu and every other child of gpuckpt must not hold the write end, or the
  // guard would not see gpuckpt's death. A socket, not a pipe, to pass it the process locks.
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, down) != 0)
    throw_errno(Errc::kInternal, "socket for the guard");
  UniqueFd down_r(down[0]), down_w(down[1]);
  auto [up_r, up_w] = make_pipe("pipe for the guard");
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

void Guard::lock_container_restore(const std::string& root, const std::string& id) {
  // The same lock however `root` is spelled: a second take of it here would be refused.
  const std::string key = container::restore_dir(root, id).string();
  {
    std::lock_guard lk(mu_);
    if (std::find(container_locks_.begin(), container_locks_.end(), key) != container_locks_.end())
      return;
  }
  std::vector<HeldLockFile> lock;
  lock.push_back(container::lock_restore_target(root, id));
  hold_locks(std::move(lock));
  std::lock_guard lk(mu_);
  container_locks_.push_back(key);
}

void Guard::release_locks_locked() {
  if (child_.running())
    for (auto& l : locks_) l.leave();
  locks_.clear();
  container_locks_.clear();
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
void Guard::container_unpacks(const std::string& token) {
  send(command(GuardOp::kContainerToken, {{"token", token}}));
}
void Guard::copy_path(const fs::path& path, std::uint64_t dev, std::uint64_t ino,
                      std::int64_t btime_ns) {
  send(command(GuardOp::kCopyPath,
               {{"path", path.string()}, {"dev", dev}, {"ino", ino}, {"btime_ns", btime_ns}}));
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
    // What a restore unpacked and still holds is this recovery's to remove now.
    container::release_rootfs_holds();
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
    container_locks_.clear();
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
