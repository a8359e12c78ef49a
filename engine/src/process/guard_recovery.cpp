// The guard's recovery: what undoes an operation that did not finish, from its plan.
#include "process/guard_plan.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "container/checkpoint.h"
#include "container/containerd.h"
#include "container/runtime.h"
#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "process/guard.h"
#include "process/proc_info.h"
#include "process/restore_impl.h"
#include "process/support.h"

namespace fs = std::filesystem;

namespace gpuckpt::process {

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
      const auto state = container::state_json(container::root_at(c.root, c.id), c.id);
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
  // removes when it is done. Such a restore's log names it too; one whose log is not known
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
    if (other_log.empty()) {
      owners.push_back(q);
      continue;
    }
    // One whose log is not there has named no ghost file yet, so made none: it has only just
    // started (a restore beside this one), or it ends with its staging swept.
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
  else if (!container::runs_bundles(box.root.runtime))
    say(log, "the container record made for " + box.id + " was removed");
}

// The runc that containerd's shim runs to restore container `id` under `root`: not gpuckpt's
// child, so never named to the guard, and found by its command line. Also gpuckpt's own runc or
// crun when gpuckpt died before it named that to the guard.
std::vector<pid_t> shim_runc_restoring(const fs::path& root, const std::string& id) {
  return live_pids_where([&](const ProcInfo& i) {
    const auto& a = i.cmdline;
    if (a.size() < 3 || a.back() != id ||
        (fs::path(a.front()).filename() != "runc" && fs::path(a.front()).filename() != "crun") ||
        std::find(a.begin(), a.end(), "restore") == a.end())
      return false;
    const std::string r = cmdline_option(a, "root");
    std::error_code ec;
    return !r.empty() && fs::equivalent(r, root, ec);
  });
}

// Step 2b: the containers runc restores for this operation. Its runc first (it writes runc's
// state once criu is done), then what runc lists under the ID, if this restore made it: killed
// and deleted from runc's state, so that the ID is free again (or left, if it was to stay). A
// replay knows the container by its init alone: an ID taken since is someone else's.
void end_restored_container(const Plan& p, const Plan::ContainerCopy& c, RecoveryLog& log,
                            const auto& is) {
  if (!p.replay)
    for (const pid_t q : shim_runc_restoring(c.root, c.id))
      if (q != c.runc)  // gpuckpt's own runc is waited for below, with its process group
        let_finish(q, "the runtime's runc restore", /*group=*/false, log);
  // runc and its criu: runc leads their process group.
  if (is(c.runc, c.runc_started) && alive(c.runc))
    let_finish(c.runc, "runc restore", /*group=*/true, log);
  // Once they are done: what they left says whose the container is (crun's copy of its spec,
  // in a root that both runtimes may use).
  const container::Container box{container::root_at(c.root, c.id), c.id};
  const auto state = container::state_json(box.root, c.id);
  const auto start = state ? state->value("init_process_start", std::uint64_t{0}) : 0;
  const bool made = state && container::made_by_restore(box, *state);
  const bool ours =
      made && (c.init_started > 0 ? start == c.init_started : !p.replay && start >= c.after);
  if (state && !ours) {
    say(log, "container " + c.id + " (runc root " + c.root.string() +
                 ") is not the one this restore made, and was left as it is");
    // Another's, made under the ID meanwhile: the bundle this restore wrote is no container's.
    if (!p.replay && !made) container::remove_restore_bundle(box.root.path, c.id);
    return;
  }
  if (!state) {
    // runc made nothing it still lists: only the bundle gpuckpt wrote for it, a task its
    // runtime created from the images but never started, and the runtime's record made for
    // it, may be left.
    if (!p.replay) {
      // crun's directory for it, if its restore failed half-way: before the bundle, which
      // tells it as this restore's.
      if (const std::string why = container::remove_half_made(box); !why.empty())
        fail(log, Errc::kProcess, "the half-made crun container " + c.id + " stays: " + why);
      container::remove_restore_bundle(box.root.path, c.id);
      if (c.kill) {
        if (const std::string why = container::remove_unstarted(box); !why.empty())
          fail(log, Errc::kProcess, "the task created for container " + c.id + " stays: " + why);
        if (c.made) forget_made_record(box, log);
      }
    }
    return;
  }
  const pid_t init = state->value("init_process_pid", 0);
  const bool runs = init > 0 && is(init, start) && alive(init);
  if (!c.kill) {
    if (runs) say(log, "the restored container " + c.id + " is left running");
    return;
  }
  // end_tree locks restored CUDA processes before it kills them (cuda-checkpoint#53).
  if (runs)
    if (const auto left = end_tree(process_tree(init), 10000); !left.empty()) {
      fail(log, Errc::kProcess,
           "the restored container " + c.id + " did not end (still alive: " + pid_list(left) +
               "), so two copies may serve");
      return;
    }
  if (const std::string why = container::remove_ended(box); !why.empty()) {
    fail(log, Errc::kProcess,
         "the restored container " + c.id + " ended, but runc still lists it: " + why);
    return;
  }
  say(log, "the restored container " + c.id + " was killed and deleted from runc");
  if (c.made) forget_made_record(box, log);
}

// The copies of the images that containerd unpacked for container `c`'s start (a Docker
// restore's), once that start has ended (`settled`), else said to be left.
void remove_runtime_copies(const Plan::ContainerCopy& c, bool settled, RecoveryLog& log) {
  if (c.unpacked_token.empty()) return;
  if (!settled) {
    say(log, "containerd's copies of the images of " + c.id +
                 ", if any, were left: dockerd's start had not ended after 60 s (remove the "
                 "ctrd-checkpoint* directories holding the token " +
                 c.unpacked_token + " once it has)");
  } else if (const std::uint64_t n =
                 container::containerd::remove_unpacked_copies(c.unpacked_token)) {
    say(log, "containerd's copy of the images of " + c.id + " was removed (" +
                 std::to_string(n >> 20) + " MiB)");
  }
}

void end_restored_containers(const Plan& p, RecoveryLog& log, const auto& is) {
  for (const auto& c : p.containers) {
    // A start that gpuckpt asked dockerd for goes on without it: its outcome first, and the
    // copies of the images that containerd unpacked for it go only once it has ended.
    const bool settled = c.unpacked_token.empty() || p.replay ||
                         container::await_runtime_start({container::root_at(c.root, c.id), c.id},
                                                        std::chrono::seconds(60));
    end_restored_container(p, c, log, is);
    remove_runtime_copies(c, settled, log);
  }
}

// Step 2c: what was made for the copies (a rootfs unpacked for a container), now that they are
// ended; one that a running container uses (a copy left running, a replica that took it) or
// that another restore holds (container::hold_rootfs) stays.
void remove_copy_paths(const Plan& p, RecoveryLog& log) {
  // The roots of the copies too: a recover run without the $GPUCKPT_RUNC_ROOTS they were under.
  std::vector<fs::path> roots;
  for (const auto& c : p.containers) roots.push_back(c.root);
  for (const auto& [path, dev, ino, btime_ns] : p.copy_paths) {
    if (container::dir_identity(path.string()) != container::DirIdentity{dev, ino, btime_ns})
      continue;  // gone, or another directory now
    try {
      if (const std::string keeper = container::remove_unused_rootfs(path, roots); !keeper.empty())
        say(log, path.string() + ", made for the copy, was left: " + keeper);
      else
        say(log, "removed " + path.string() + ", made for the copy");
    } catch (const Error& e) {
      fail(log, e.code(), e.what());
    }
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

}  // namespace

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
      // Long after the kill, no start it asked for is still in flight.
      for (const auto& c : p.containers) remove_runtime_copies(c, /*settled=*/true, log);
      remove_staged(p, log);
      return {joined(log), std::move(log.failed)};
    }
  }
  end_copies(copies, log, is);
  end_restored_containers(p, log, is);
  remove_copy_paths(p, log);
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

}  // namespace gpuckpt::process
