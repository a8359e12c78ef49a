// gpuckpt::migrate() on one host: dump with the original kept frozen, write the checkpoint to
// the target directory, restore from it into a new pid namespace, and end the original only
// once the new process answers. Any failure rolls back: the new process is killed and the
// original resumed. Design and limits: docs/PROCESS.md.
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstring>

#include "gpuckpt/error.h"
#include "gpuckpt/process.h"
#include "probe/probe.h"
#include "process/dump_impl.h"
#include "process/proc_info.h"
#include "process/restore_impl.h"
#include "process/support.h"

namespace fs = std::filesystem;

namespace gpuckpt {

namespace {

// CRIU's restore unlinks and re-binds the path of every listening unix socket, which would
// strand the frozen original's sockets if we had to roll back. A hard link to each socket
// inode, taken while the original is frozen, lets a rollback put the paths back (rename).
class SocketPathGuard {
 public:
  explicit SocketPathGuard(pid_t pid) {
    const fs::path cwd = fs::read_symlink("/proc/" + std::to_string(pid) + "/cwd", ec_);
    for (const auto& l : process::unix_listeners(pid)) {
      if (l.abstract) continue;
      fs::path path = l.path;
      if (path.is_relative() && !cwd.empty()) path = cwd / path;
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      fs::path backup = path.parent_path() / ("." + path.filename().string() +
                                              ".gpuckpt-rollback-" + std::to_string(pid));
      ::unlink(backup.c_str());
      if (::link(path.c_str(), backup.c_str()) == 0)
        links_.push_back({path, backup});
      else
        spdlog::warn("cannot keep {} for a rollback: {}", path.string(), std::strerror(errno));
    }
  }
  SocketPathGuard(const SocketPathGuard&) = delete;
  SocketPathGuard& operator=(const SocketPathGuard&) = delete;
  ~SocketPathGuard() {
    for (const auto& [path, backup] : links_) ::unlink(backup.c_str());
  }
  // Points the paths at the original's sockets again.
  void put_back() {
    for (const auto& [path, backup] : links_) {
      if (::rename(backup.c_str(), path.c_str()) != 0)
        spdlog::warn("cannot put {} back: {}", path.string(), std::strerror(errno));
    }
    links_.clear();
  }

 private:
  std::error_code ec_;
  std::vector<std::pair<fs::path, fs::path>> links_;
};

}  // namespace

MigrateResult migrate(const MigrateOptions& o) {
  using namespace process;
  if (o.pid <= 0) throw Error(Errc::kUsage, "no pid given");
  if (o.to_dir.empty()) throw Error(Errc::kUsage, "no target directory given");
  require_socket_probe(o.probe);
  const auto info = read_proc(o.pid);
  if (!info || info->state == 'Z')
    throw Error(Errc::kProcess, "no process with pid " + std::to_string(o.pid));
  // The frozen original keeps its listening sockets; a restored copy on the same host could
  // not bind the same TCP port while it exists.
  if (has_tcp_listener(o.pid))
    throw Error(Errc::kProcess,
                "process " + std::to_string(o.pid) + " (" + info->comm +
                    ") listens on a TCP port: a same-host migration keeps the original frozen "
                    "until the copy answers, and the copy could not bind that port. Use "
                    "`gpuckpt dump` then `gpuckpt restore` (see docs/PROCESS.md)");
  for (const auto& l : unix_listeners(o.pid)) {
    if (l.abstract)
      throw Error(Errc::kProcess, "process " + std::to_string(o.pid) + " (" + info->comm +
                                      ") listens on the abstract unix socket " + l.path +
                                      ": a copy on the same host could not bind it while the "
                                      "frozen original exists. Use dump then restore");
  }
  std::error_code ec;
  fs::create_directories(o.to_dir, ec);
  if (ec) throw Error(Errc::kIo, "cannot create " + o.to_dir.string() + ": " + ec.message());

  MigrateResult res;
  res.old_pid = o.pid;
  res.checkpoint = o.to_dir / (info->comm + "-" + std::to_string(o.pid) + ".ckpt");

  DumpOptions d;
  d.pid = o.pid;
  d.output = res.checkpoint;
  d.leave_running = false;  // kept stopped: dump_keep_stopped does not end it
  d.staging_root = o.staging_root;
  d.pack = o.pack;
  d.lock_timeout = o.lock_timeout;
  d.criu = o.criu;
  DumpOutcome dumped = dump_keep_stopped(d);  // on failure the original already runs again
  res.timeline = dumped.result.timeline;
  SocketPathGuard socket_paths(o.pid);

  RestoreOptions r;
  r.checkpoint = res.checkpoint;
  r.gpu_map = o.gpu_map;
  r.staging_root = o.staging_root;
  r.unpack.progress = o.pack.progress;
  r.probe = o.probe;
  r.new_pid_ns = true;
  r.criu = o.criu;
  r.criu.check = false;  // checked by the dump a moment ago
  RestoreResult restored;
  try {
    restore_into(r, restored);
  } catch (const std::exception& e) {
    const auto* ge = dynamic_cast<const Error*>(&e);
    std::string what = "migration failed: " + std::string(e.what()) + "\nrollback: ";
    if (restored.pid > 0 || restored.pidns_init > 0) {
      kill_restored(restored);
      if (restored.pid > 0)
        what += "the new process " + std::to_string(restored.pid) + " was killed; ";
    }
    socket_paths.put_back();
    try {
      resume_stopped(o.pid, dumped.record.cuda);
      what += "the original process " + std::to_string(o.pid) + " was resumed";
    } catch (const Error& re) {
      what += std::string("resuming the original failed: ") + re.what();
    }
    what += "; the checkpoint is kept at " + res.checkpoint.string();
    throw Error(ge ? ge->code() : Errc::kInternal, what);
  }
  res.timeline.append(restored.timeline);
  res.new_pid = restored.pid;
  res.first_answer = restored.first_answer;

  {
    // The new process answers (or, without a probe, was restored): the original may end.
    auto scope = res.timeline.scope("end_original");
    if (!kill_and_wait(o.pid))
      spdlog::warn("the original process {} did not end after SIGKILL", o.pid);
  }
  if (!o.keep_checkpoint) {
    fs::remove_all(res.checkpoint, ec);
    if (ec) spdlog::warn("cannot remove {}: {}", res.checkpoint.string(), ec.message());
  }
  return res;
}

}  // namespace gpuckpt
