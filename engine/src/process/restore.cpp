// gpuckpt::restore(): verify-and-unpack the checkpoint to tmpfs (a corrupt checkpoint fails here,
// before any process exists), criu restore (the plugin restores and unlocks CUDA inside it),
// then optionally wait for the first answer.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "criu/stats.h"
#include "criu/streamer.h"
#include "device/cuda_checkpoint.h"
#include "device/cuda_driver.h"
#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/process.h"
#include "gpuckpt/support.h"
#include "image/stream_pack.h"
#include "probe/probe.h"
#include "process/guard.h"
#include "process/pidns.h"
#include "process/proc_info.h"
#include "process/record.h"
#include "process/remote_spool.h"
#include "process/restore_impl.h"
#include "process/stages.h"
#include "process/support.h"
#include "remote/ssh.h"
#include "util/fault.h"
#include "util/fs.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"
#include "util/utf8.h"

namespace fs = std::filesystem;

namespace gpuckpt {

namespace process {

pid_t read_pidfile(const fs::path& p) {
  std::ifstream in(p);
  long pid = 0;
  if (!(in >> pid) || pid <= 0 || pid > std::numeric_limits<pid_t>::max())
    throw Error(Errc::kCriu, "criu restore succeeded but wrote no pid to " + p.string());
  return static_cast<pid_t>(pid);
}

namespace {

// Returns true if it had to wait for a zombie to be reaped.
bool check_pid_free(const ProcessRecord& rec, pid_t pid) {
  auto p = read_proc(pid);
  // A zombie keeps its pid until its parent reaps it; an init reaping orphans late (the
  // dumped process's parent may have exited) usually gets to it within moments.
  const auto start = std::chrono::steady_clock::now();
  bool waited = false;
  for (int i = 0; p && p->state == 'Z' && i < 200; ++i) {
    waited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    p = read_proc(pid);
  }
  if (waited && !p)
    spdlog::info("waited {:.1f} s for pid {} (a zombie) to be reaped",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 pid);
  if (!p) return waited;
  const std::string id = "pid " + std::to_string(pid) + " (" + p->comm + ")";
  if (p->state == 'Z')
    throw Error(Errc::kProcess, id + " is a zombie its parent (pid " + std::to_string(p->ppid) +
                                    ") has not reaped yet; CRIU restores the checkpointed pid, "
                                    "so it must be free");
  throw Error(
      Errc::kProcess,
      id + " is in use" + (p->comm == rec.comm ? " (the checkpointed process still runs?)" : "") +
          (pid != rec.pid
               ? " (it belongs to the checkpointed tree of pid " + std::to_string(rec.pid) + ")"
               : "") +
          "; CRIU restores a process with its checkpointed pid: stop that process, or "
          "restore into a new pid namespace (--new-pidns)");
}

}  // namespace

std::vector<pid_t> kill_restored(const RestoreResult& r, std::chrono::milliseconds grace) {
  std::vector<pid_t> tree = r.tree;
  if (r.pid > 0)
    for (pid_t q : process_tree(r.pid))
      if (std::find(tree.begin(), tree.end(), q) == tree.end()) tree.push_back(q);
  // The namespace's init, if any: without a grace it goes first, and its SIGKILL takes the
  // whole namespace with it. After a shutdown of their own it goes last: it ends by itself once
  // its namespace is empty (a SIGTERM from outside does not reach it), else it takes whatever
  // the tree started meanwhile with it.
  if (r.pidns_init > 0) tree.insert(grace.count() > 0 ? tree.end() : tree.begin(), r.pidns_init);
  // end_tree locks live CUDA processes before any signal (cuda-checkpoint#53), within a third
  // of its timeout: 10 s, as lock_before_kill's own default.
  return end_tree(tree, 30000, grace);
}

namespace {

// A listening unix socket of the checkpoint whose path a live process serves now: restoring
// beside it (new pid namespace) would silently take that path over from it (CRIU re-binds it).
std::string endpoint_in_use(const ProcessRecord& rec) {
  for (const auto& path : rec.unix_listeners) {
    if (path.empty() || path[0] == '@') continue;
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    if (!fd || path.size() >= sizeof sa.sun_path) continue;
    std::memcpy(sa.sun_path, path.c_str(), path.size());
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 || errno == EAGAIN)
      return path;
  }
  return {};
}

// What the steps of one restore share. Members are destroyed in reverse order: the streamer
// before the checkpoint it reads, both before the staging directory.
struct RestoreState {
  const RestoreOptions& o;
  RestoreResult& out;
  Guard* guard;
  bool provisional;
  const image::BlobArrival* arrival;
  ImageInfo info;
  ProcessRecord rec;
  criu::Installation inst;
  bool stream = false;
  fs::path staging_root;  // where this restore stages (RestoreOptions::staging_root, mostly)
  TempDir staging;
  fs::path images;
  std::optional<image::CheckpointSource> source;
  std::optional<criu::RestoreStreamer> streamer;
  criu::RestoreArgs args;
  fs::path report_path;
  criu::Run run;
};

// A container restore's staging by default (choose_staging).
constexpr const char* kDiskStaging = "/var/tmp";

Guard::Copy fate(const RestoreState& r) {
  return r.provisional ? Guard::Copy::kKill : Guard::Copy::kLeave;
}

void read_record(RestoreState& r) {
  const RestoreOptions& o = r.o;
  r.info = inspect(o.checkpoint);
  check_trust(o.checkpoint, o.trust);  // before anything in the checkpoint is acted on
  const auto rec = from_extra(r.info.extra);
  if (!rec)
    throw Error(Errc::kInvalidInput, o.checkpoint.string() +
                                         " is not a process checkpoint (its manifest has no "
                                         "process record; was it made by gpuckpt pack?)");
  r.rec = *rec;
}

// Returns true if it had to wait for a zombie to be reaped. The pids are locked first, until
// the restore is over: another restore of them is refused now, not by criu ("Can't fork").
bool check_pids_free(RestoreState& r) {
  bool waited = false;
  if (r.o.new_pid_ns) return waited;
  // A guard's own rollback (no guard of its own) restores while the interrupted operation may
  // still hold these: it goes on without them.
  // Held by the guard: until its recovery has ended what a failed restore left at those pids.
  if (r.guard) r.guard->hold_locks(lock_restored_pids(r.rec.tree));
  for (pid_t q : r.rec.tree) waited |= check_pid_free(r.rec, q);
  return waited;
}

void check_endpoints(const RestoreState& r) {
  if (r.o.new_pid_ns && !r.o.take_endpoints) {
    if (const std::string busy = endpoint_in_use(r.rec); !busy.empty())
      throw Error(Errc::kProcess,
                  "a live process serves " + busy +
                      ", which the checkpointed process listened on: a restore beside it would "
                      "take that socket path over from it. End that process first, or pass "
                      "--take-endpoints to hand the path to the restored copy");
  }
}

void check_gpu_targets(const RestoreState& r) {
  const RestoreOptions& o = r.o;
  if (!o.gpu_map.empty() && !r.rec.cuda)
    spdlog::warn("{} holds no CUDA state: the GPU map has nothing to remap", o.checkpoint.string());
  if (r.rec.cuda) {
    std::string why;
    // Judged without cuInit here: the CUDA work, and its one cuInit, happen in criu's plugin.
    if (!device::probe_checkpoint_api(&why))
      throw Error(Errc::kNoDevice,
                  "the checkpoint holds CUDA state but it cannot be restored here: " + why);
    // The driver build first: its checkpoint is its own, and a restore under another fails
    // late, inside criu's plugin or the driver.
    if (r.rec.driver)
      if (const std::string why = device::driver_mismatch(*r.rec.driver, device::driver_identity());
          !why.empty())
        throw Error(Errc::kNoDevice, why + "; nothing was restored");
    // Before any process exists: every checkpointed GPU mapped, same chip types, free VRAM.
    check_restore_targets(r.rec.gpus, o.gpu_map);
  }
}

void prepare_criu(RestoreState& r) {
  r.inst = criu::locate(r.o.criu.binary);
  if (r.o.criu.check) criu::check(r.inst);
  if (r.inst.plugin_dir.empty() && r.rec.cuda)
    throw Error(Errc::kCriu,
                "the checkpoint holds CUDA state but gpuckpt's CRIU plugin was not found (set "
                "GPUCKPT_CRIU_PLUGIN_DIR)");
}

void choose_staging(RestoreState& r) {
  const RestoreOptions& o = r.o;
  r.stream = o.staging_mode != StagingMode::kStaged;
  if (r.stream && o.container) {
    // runc runs CRIU itself, as `criu swrk`: it streams only with gpuckpt's patch, and only
    // where the runtime hands runc the images directory and gpuckpt's configuration.
    std::string why = container::stream_refusal(*r.rec.container);
    if (why.empty() && !r.inst.has_patch(criu::kRpcStreamPatch))
      why = "the CRIU at " + r.inst.binary.string() + " lacks gpuckpt's patch " +
            criu::kRpcStreamPatch + " (scripts/install-criu.sh builds it)";
    if (!why.empty()) {
      if (o.staging_mode == StagingMode::kStream)
        spdlog::warn(
            "cannot stream the checkpoint into the container runtime's CRIU ({}): "
            "unpacking it first",
            why);
      r.stream = false;
    }
  }
  // A container's images unpacked whole for its runtime would take as much memory again as
  // the container in a tmpfs, so they go to disk unless a directory was asked for.
  r.staging_root = o.container && !r.stream && o.staging_mode == StagingMode::kAuto
                       ? fs::path(kDiskStaging)
                       : o.staging_root;
  if (r.stream) {
    const std::string why = criu::stream_unsupported_reason(
        r.staging_root / "gpuckpt-restore-4194304-XXXXXX" / "images", o.criu.extra_args);
    if (!why.empty()) {
      spdlog::warn("cannot stream the checkpoint into CRIU ({}): unpacking it to {} first", why,
                   r.staging_root.string());
      r.stream = false;
    }
  }
  r.out.staging_mode = r.stream ? StagingMode::kStream : StagingMode::kStaged;
  std::error_code ec;
  const auto space = fs::space(r.staging_root, ec);
  if (ec || !fs::is_directory(r.staging_root, ec))
    throw Error(Errc::kInvalidInput,
                "staging directory " + r.staging_root.string() + " does not exist");
  // Streaming stages nothing but CRIU's log and stats.
  if (!r.stream && r.info.raw_bytes > space.available)
    throw Error(Errc::kIo, "the staging directory " + r.staging_root.string() + " has " +
                               std::to_string(space.available >> 20) +
                               " MiB free, but the checkpoint unpacks to " +
                               std::to_string(r.info.raw_bytes >> 20) +
                               " MiB: use --staging DIR on a larger filesystem");
}

void stage_images(RestoreState& r) {
  const RestoreOptions& o = r.o;
  r.staging = make_staging(r.staging_root, "gpuckpt-restore");
  if (r.guard) r.guard->remove_on_recovery(r.staging.path());
  r.images = r.staging.path() / "images";
  // Streaming: CRIU asks for each image as it needs it, and gets it from the checkpoint
  // (verified chunk by chunk) through a pipe; a damaged checkpoint is still found from the seal
  // and the blobs' sizes before criu starts.
  if (r.stream) {
    fs::create_directory(r.images);
    r.source.emplace(o.checkpoint, r.arrival, image::SourceLimits{o.unpack.threads});
    r.streamer.emplace(r.images, *r.source);
  } else {
    if (r.arrival) r.arrival->wait_complete();  // unpack reads the blobs as they are
    auto scope = r.out.timeline.scope(stage::kReadDecompress);
    const TransferResult tr = unpack(o.checkpoint, r.images, o.unpack);
    scope.set_bytes(tr.raw_bytes);
  }
}

// A copy that is not the service yet takes the checkpoint's socket paths from whoever serves
// them now (a migration's frozen original, or the instance a migration between hosts replaces).
// CRIU unlinks and re-binds each path: had it unlinked the live owner's entry, a rollback could
// only put a different link there, and the owner's socket would stay bound to a deleted name,
// unreachable (and carried as deleted by every later dump). So the entries are renamed aside
// first (the same dentry, only moved); the guard's rollback renames them back over the copy's,
// and the commit removes them.
void move_endpoints_aside(const RestoreState& r) {
  if (!r.guard || !r.provisional || !r.o.new_pid_ns || !r.o.take_endpoints) return;
  for (const auto& l : r.rec.unix_listeners) {
    if (l.empty() || l[0] == '@') continue;
    const fs::path path = l;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (!is_utf8(l)) {
      // The guard names paths in JSON, which could not name this one back.
      spdlog::warn(
          "{} is not UTF-8: a rollback could not put its entry back, so it is left to "
          "criu",
          path.string());
      continue;
    }
    r.guard->move_aside(
        path, "." + path.filename().string() + ".gpuckpt-rollback-" + std::to_string(::getpid()));
  }
}

// The streams each task's pages image is copied by (docs/CRIU.md, "Parallel copy"): as asked, or
// half the CPUs (as CRIU's own default), no more than the buffer budget feeds at once when every
// large pages image is read at the same time (a tree's tasks restore side by side), so that the
// restore keeps its memory bound. 0: nothing to pass (an operator's GPUCKPT_CRIU_COPY_STREAMS
// reaches CRIU as it is; a restore with no large pages image leaves CRIU's default).
unsigned copy_streams(RestoreState& r) {
  if (!r.source) return r.o.copy_streams;         // staged: CRIU reads files, gpuckpt feeds nothing
  constexpr std::uint64_t kLarge = 128ull << 20;  // two of the patch's 64 MiB ranges
  unsigned large = 0;
  for (const auto& e : r.source->manifest().entries)
    if (e.path.starts_with("pages-") && e.size >= kLarge) ++large;
  unsigned n = r.o.copy_streams;
  // The operator's setting, in gpuckpt's environment, reaches CRIU as it is.
  const char* env = std::getenv(criu::kEnvCopyStreams);
  if (!n && env) n = static_cast<unsigned>(std::strtoul(env, nullptr, 10));
  if (!n && large)
    n = std::min(std::clamp(usable_cpus() / 2, 1u, 9u),
                 std::max(1u, r.source->feeds_within_budget() / large));
  // Every stream of every large image fed at once, each within its share.
  if (n > 1 && large) r.source->share_feeds(n * large);
  return r.o.copy_streams || !env ? n : 0;
}

// What gpuckpt gives the restoring CRIU and its plugin, as KEY=VALUE: its own criu's environment,
// or a runtime's (restore_container).
std::vector<std::string> criu_env(RestoreState& r) {
  std::vector<std::string> env = {
      std::string(criu::kEnvReport) + "=" + r.report_path.string(),
      std::string(criu::kEnvGpuMap) + "=" + r.o.gpu_map.to_string(),
      std::string(criu::kEnvThpFill) + "=" + (r.o.huge_pages ? "1" : "0")};
  if (const unsigned n = copy_streams(r))
    env.push_back(std::string(criu::kEnvCopyStreams) + "=" + std::to_string(n));
  for (auto& e : plugin_device_env(r.rec.cuda_pids)) env.push_back(std::move(e));
  return env;
}

void build_criu_args(RestoreState& r) {
  const RestoreOptions& o = r.o;
  criu::RestoreArgs& a = r.args;
  a.images_dir = r.images;
  a.pidfile = r.staging.path() / "restore.pid";
  a.shell_job = r.rec.shell_job;
  a.stream = r.stream;
  a.extra_args = criu::tcp_args(r.rec.tcp_established == "established");
  a.extra_args.insert(a.extra_args.end(), o.criu.extra_args.begin(), o.criu.extra_args.end());
  a.timeout = o.criu.timeout;
  a.before_start = [guard = r.guard](pid_t criu_pid) {
    if (guard) guard->criu_started(criu_pid);
  };
  a.on_start = [](pid_t) { fault_point(fault::kCriuRestore); };
  a.on_end = [guard = r.guard](const ExitStatus& st, const fs::path& log) {
    // Clean: it failed by itself and ended what it had restored. An exit 0 without a pidfile
    // is no clean failure: what it left is the recovery's to end.
    if (guard) guard->criu_ended(st.exited && st.code != 0, log);
  };
  r.report_path = r.staging.path() / criu::kRestoreReportName;
  a.env = criu_env(r);
}

void criu_restore_in_new_pidns(RestoreState& r) {
  const criu::RestoreArgs& a = r.args;
  criu::Run& run = r.run;
  const fs::path log = r.staging.path() / "restore.log";
  run.argv = criu::restore_argv(r.inst, a, log);
  run.log = log;
  run.start = std::chrono::steady_clock::now();
  // The whole namespace goes with its init: the guard knows it before criu may start, so the
  // copy cannot outlive a rollback, even one that starts while criu still restores it.
  const auto on_init = [&r](pid_t init) {
    if (r.guard) r.guard->copy_on_recovery(0, init, fate(r));
  };
  const PidnsRun pr =
      run_in_new_pidns(run.argv, a.env, r.staging.path() / "criu-restore.out", a.timeout, on_init,
                       [] { fault_point(fault::kCriuRestore); });
  run.end = std::chrono::steady_clock::now();
  r.out.pidns_init = pr.init_pid;
  if (!pr.criu.ok()) {
    ::kill(pr.init_pid, SIGKILL);
    criu::check_exit("criu restore (in a new pid namespace)", pr.criu,
                     criu::preserve_log(log, "criu-restore"));
  }
  try {
    r.out.ns_pid = read_pidfile(a.pidfile);
    r.out.pid = host_pid_in_ns(pr.init_pid, r.out.ns_pid);
  } catch (...) {
    ::kill(pr.init_pid, SIGKILL);
    throw;
  }
}

// CRIU failed (`e`) while streaming. A damaged chunk was never written to CRIU: its pipe was
// closed, CRIU failed on a truncated image and removed what it had restored. The checkpoint is
// then the cause, thrown with `what_stopped` (what CRIU left, who ran it) and CRIU's error;
// otherwise this returns.
void blame_the_stream(RestoreState& r, const Error& e, const std::string& what_stopped) {
  if (!r.streamer) return;
  try {
    r.streamer->finish();
  } catch (const Error& se) {
    throw se.with_context("", "\n" + what_stopped + " stopped on it (" + e.what() + ")");
  }
}

void run_criu_restore(RestoreState& r) {
  if (r.o.unpack.progress) r.o.unpack.progress(Progress{"criu_restore", 0, 0, 0});
  try {
    if (r.o.new_pid_ns) {
      criu_restore_in_new_pidns(r);
    } else {
      // criu gives the copy the checkpoint's pids, and gpuckpt reads them only after criu
      // exits: a guard recovering before that finds the copy by criu's pidfile.
      if (r.guard)
        r.guard->copy_named_in(r.args.pidfile, fate(r), r.rec.tree,
                               r.args.pidfile.parent_path() / criu::kRestoreLogName);
      r.run = criu::restore(r.inst, r.args);
      r.out.pid = r.out.ns_pid = read_pidfile(r.args.pidfile);
    }
  } catch (const Error& e) {
    blame_the_stream(r, e, "no process was left running: criu restore");
    throw;
  }
}

// The streamer's end once CRIU has restored: its error (a damaged chunk CRIU did not notice,
// the last one of a file) is thrown, and the caller ends what was restored.
void finish_streaming(RestoreState& r) {
  if (!r.streamer) return;
  r.streamer->finish();
  // read_decompress overlaps criu_restore: CRIU reads its images while it restores.
  const auto fed = Timeline::Clock::now();
  r.out.timeline.add(stage::kReadDecompress, r.run.start, fed, r.source->raw_written());
  // Not an interval: the time gpuckpt's feed waited for CRIU to read, summed over the files.
  // Near read_decompress, CRIU's copy bounds the restore; far below it, the reads and the
  // decompression do. Files fed at once (a tree's tasks, a task's streams) wait at once: the
  // sum is capped at read_decompress, which it would otherwise pass, and the restore's total.
  r.out.timeline.add(stage::kFeedWait, r.run.start,
                     r.run.start + std::min<Timeline::Clock::duration>(
                                       r.source->waited_for_reader(), fed - r.run.start));
  r.streamer.reset();
}

// What CRIU restored, into the result and its timeline. Returns why its CUDA state did not come
// back, or "": the caller ends the restored tree its own way and says so.
std::string collect_restored(RestoreState& r) {
  RestoreResult& out = r.out;
  out.tree = process_tree(out.pid);
  for (pid_t p : out.tree) out.huge_page_bytes += huge_page_bytes(p);
  auto plugin = criu::read_plugin_report(r.report_path);
  // Where a runtime's CRIU had no gpuckpt environment, the plugin wrote it beside the images.
  if (!plugin && r.rec.container && !r.stream)
    plugin = criu::read_plugin_report(r.images / criu::kRestoreReportName);
  add_restore_stages(out.timeline, r.run, criu::read_restore_stats(r.images), plugin,
                     criu::read_restore_log_spans(r.run.log));
  out.gpu = plugin && plugin->cuda;
  // CRIU ignores errors of the late device hook (it only logs them), so a failed CUDA restore
  // would leave a process that hangs on its first CUDA call.
  if (plugin && !plugin->all_ok())
    return "restoring the CUDA state failed (" + plugin->first_error() + ")";
  if (r.rec.cuda && !out.gpu)
    return "the checkpoint holds CUDA state but the CRIU plugin restored none";
  return {};
}

void check_restored(RestoreState& r) {
  RestoreResult& out = r.out;
  if (r.guard) r.guard->criu_finished();
  if (r.guard) r.guard->copy_on_recovery(out.pid, out.pidns_init, fate(r));
  if (const std::string why = collect_restored(r); !why.empty()) {
    kill_restored(out);
    throw Error(Errc::kDevice, why + "; the restored process was killed");
  }
}

void wait_first_answer(RestoreState& r) {
  if (r.o.probe.kind == ReadinessProbe::Kind::kNone) return;
  fault_point(fault::kFirstAnswer);
  auto scope = r.out.timeline.scope(stage::kFirstAnswer);
  const pid_t pid = r.out.pid;
  r.out.first_answer = wait_ready(r.o.probe, [pid] {
    if (!alive(pid))
      throw Error(Errc::kProcess,
                  "the restored process " + std::to_string(pid) + " exited before answering");
  });
}

// CRIU asked only for the images it needed. A damaged file it did not need (the dump's log)
// leaves the restored process as good, so it is said, not thrown; checked after the first
// answer, so the restore's time does not include it. Of a checkpoint still arriving, only the
// files already in are checked: waiting for the rest would lengthen a migration's downtime
// (the dump's log comes last), and `gpuckpt verify` checks them. An s3:// download fetches
// every file but the pages first, so those are usually in.
void check_unread(RestoreState& r) {
  if (!r.source) return;
  try {
    std::vector<std::string> not_arrived;
    for (const Error& e : r.source->check_unread(&not_arrived)) {
      spdlog::warn("{} (the restore did not need that file; the restored process is unaffected)",
                   e.what());
      r.out.damaged_unread.push_back(e.what());
    }
    if (!not_arrived.empty())
      spdlog::info(
          "{} file(s) the restore did not need had not arrived yet and were not checked "
          "(first: {}); gpuckpt verify checks them",
          not_arrived.size(), not_arrived.front());
  } catch (const Error& e) {
    spdlog::warn("could not check the files of {} that the restore did not read: {}",
                 r.o.checkpoint.string(), e.what());
  }
}

// --criu-opt arguments as lines of a CRIU configuration file ("--ghost-limit=64M" and
// "--ghost-limit 64M" are "ghost-limit 64M"): runc passes CRIU no arguments of ours.
std::vector<std::string> criu_config_lines(const std::vector<std::string>& args) {
  std::vector<std::string> lines;
  for (const auto& a : args) {
    if (a.rfind("--", 0) == 0) {
      std::string l = a.substr(2);
      if (const auto eq = l.find('='); eq != std::string::npos) l[eq] = ' ';
      lines.push_back(l);
    } else if (!lines.empty()) {
      lines.back() += " " + a;  // the value of the option before
    }
  }
  return lines;
}

// The runtime's CRIU reads its images from this restore's streamer (stage_images), in the
// directory runc is given: the files that runc and gpuckpt read themselves are put beside it.
void stream_into_runtime(RestoreState& r, const container::ContainerRecord& rec,
                         container::RestoreRequest& q) {
  q.criu_config.push_back("stream");
  container::write_descriptors(rec, r.images);
  const char* file = container::layer_file(rec.layer);
  if (const image::ManifestEntry* layer = file ? r.source->find(file) : nullptr) {
    q.layer_bytes = layer->size;
    // A tar that stops reading early (EPIPE here) says why by its exit.
    q.write_layer = [&src = *r.source, layer](int fd) { src.write_to(*layer, fd); };
  }
}

// A container checkpoint, restored as a container its runtime lists: by runc, or by
// containerd's or dockerd's shim through runc.
void restore_container(RestoreState& r) {
  const RestoreOptions& o = r.o;
  const container::ContainerRecord& rec = *r.rec.container;
  const std::string id = o.container->empty() ? rec.id : *o.container;
  stage_images(r);
  r.report_path = r.staging.path() / criu::kRestoreReportName;
  container::RestoreRequest q;
  q.record = &rec;
  q.id = id;
  q.images = r.images;
  q.work = r.staging.path() / "work";
  fs::create_directory(q.work);
  q.criu = r.inst.binary;
  if (!r.inst.plugin_dir.empty()) q.criu_config.push_back("libdir " + r.inst.plugin_dir.string());
  // What a hook bound in: the runtime maps only its spec's mounts for its CRIU.
  for (const auto& m : rec.mounts)
    if (m.outside_spec) q.criu_config.push_back("ext-mount-map " + m.destination + ":" + m.source);
  auto args = criu::tcp_args(r.rec.tcp_established == "established");
  args.insert(args.end(), o.criu.extra_args.begin(), o.criu.extra_args.end());
  for (auto& l : criu_config_lines(args)) q.criu_config.push_back(std::move(l));
  if (r.stream) stream_into_runtime(r, rec, q);
  q.env = criu_env(r);
  if (!r.stream) {
    // A runtime whose CRIU gets none of this environment (dockerd's, containerd 2.0's shims)
    // has the plugin read it from beside the images, and write its report there
    // (criu/plugin_report.h). What a checkpoint brought under those names is not gpuckpt's.
    fs::remove(r.images / criu::kRestoreReportName);
    nlohmann::json env = nlohmann::json::object();
    for (const auto& e : q.env)
      if (const auto kv = split_env_entry(e)) env[kv->first] = kv->second;
    write_file_atomic(r.images / criu::kEnvFileName, env.dump(2) + "\n");
  }
  q.stdio_log = o.container_log;
  q.joins = o.pod_namespaces;
  q.timeout = o.criu.timeout;
  q.timeline = &r.out.timeline;
  if (o.unpack.progress) o.unpack.progress(Progress{"criu_restore", 0, 0, 0});
  // Until it answers, a container that gpuckpt stops restoring (an error, a signal, its death)
  // is killed and deleted from runc's state by the guard: a half-made one, its loopback still
  // down, would only hold the ID. The checkpoint is untouched, and the restore can run again.
  if (r.guard) {
    q.on_container_id = [g = r.guard](const std::string& root, const std::string& made,
                                      bool record) {
      g->container_on_recovery(root, made, Guard::Copy::kKill, record);
    };
    q.on_container_named = [g = r.guard](const std::string& id) { g->container_known_as(id); };
    q.on_unpacked_token = [g = r.guard](const std::string& t) { g->container_unpacks(t); };
    q.on_path_made = [g = r.guard](const fs::path& p) { g->remove_on_recovery(p); };
    q.on_rootfs_placed = [g = r.guard](const fs::path& p, const container::DirIdentity& d) {
      g->copy_path(p, d.dev, d.ino, d.btime_ns);
    };
    q.on_runc_started = [g = r.guard](pid_t runc) { g->container_runc(runc); };
  }
  fault_point(fault::kCriuRestore);
  r.run.log = q.work / criu::kRestoreLogName;
  r.run.start = std::chrono::steady_clock::now();
  const container::Container c = [&] {
    try {
      return container::restore_container(q);
    } catch (const Error& e) {
      blame_the_stream(r, e, "no container was left: its runtime's CRIU");
      throw;
    }
  }();
  r.run.end = std::chrono::steady_clock::now();
  RestoreResult& out = r.out;
  out.container = c.id;
  out.pid = c.init_pid;
  out.ns_pid = 1;
  try {
    if (r.guard) r.guard->container_init(c.init_pid);
    fault_point(fault::kCriuRestored);
    finish_streaming(r);
    {
      auto scope = out.timeline.scope(stage::kNetwork);
      container::restore_loopback(rec, c.init_pid);
    }
    if (const std::string why = collect_restored(r); !why.empty())
      throw Error(Errc::kDevice, why + "; the restored container was removed");
    // Probed from inside: its ports are in its own network namespace, if it has one.
    container::in_container_network(rec, c.init_pid, [&] {
      wait_first_answer(r);
      return std::string();
    });
  } catch (...) {
    container::destroy(c);
    throw;
  }
  // It serves: a restore's own container stays from here on, whatever happens to gpuckpt; one
  // awaiting a commit (a migration's copy) is kept only by the commit.
  if (r.guard && !r.provisional) r.guard->keep_copy();
  check_unread(r);
}

}  // namespace

void restore_into(const RestoreOptions& o, RestoreResult& out, Guard* guard, bool provisional,
                  const image::BlobArrival* arrival) {
  Timeline& tl = out.timeline;
  std::optional<Timeline::Scope> preflight;
  preflight.emplace(tl, "preflight");
  criu::check_extra_args(criu::Op::kRestore, o.criu.extra_args);
  RestoreState r{o, out, guard, provisional, arrival};
  read_record(r);
  if (o.container) {
    if (!r.rec.container)
      throw Error(Errc::kUsage, o.checkpoint.string() +
                                    " holds no container (it was dumped with --pid): restore "
                                    "it without --container");
    if (o.new_pid_ns || o.take_endpoints)
      throw Error(Errc::kUsage,
                  "a container comes back in pid namespaces of its own: --container takes no "
                  "--new-pidns or --take-endpoints");
    const std::string id = o.container->empty() ? r.rec.container->id : *o.container;
    // Before the target's checks, which then see what a restore under this ID that ends
    // meanwhile made. Held by the guard until its recovery has removed what a failed one left.
    if (r.guard) r.guard->lock_container_restore(r.rec.container->root, id);
    container::check_restore_target(*r.rec.container, id, o.pod_namespaces);
    check_gpu_targets(r);
    prepare_criu(r);
    if (r.rec.cuda)
      if (const std::string why = container::stream_refusal(*r.rec.container); !why.empty())
        container::require_runc_criu_loads_plugin(r.inst.plugin_dir, why);
    choose_staging(r);
    preflight.reset();
    restore_container(r);
    return;
  }
  if (r.rec.container)
    throw Error(Errc::kUsage, o.checkpoint.string() + " holds the runc container " +
                                  r.rec.container->id +
                                  ": restore it with --container [NEW_ID], as a container its "
                                  "runtime knows");
  if (check_pids_free(r)) {
    // That wait was the previous process's teardown, not this restore: restart the clock.
    preflight.reset();
    tl = Timeline();
    preflight.emplace(tl, "preflight");
  }
  check_endpoints(r);
  check_gpu_targets(r);
  prepare_criu(r);
  choose_staging(r);
  preflight.reset();

  stage_images(r);
  build_criu_args(r);
  move_endpoints_aside(r);  // as late as can be: the path is unreachable until criu binds it
  run_criu_restore(r);
  fault_point(fault::kCriuRestored);  // the copy runs; gpuckpt has not looked at it yet
  try {
    finish_streaming(r);
  } catch (...) {
    kill_restored(r.out);
    throw;
  }
  check_restored(r);
  wait_first_answer(r);
  check_unread(r);
}

}  // namespace process

std::vector<pid_t> stop_restored(const RestoreResult& r, std::chrono::milliseconds grace) {
  return process::kill_restored(r, std::max(grace, std::chrono::milliseconds(1)));
}

RestoreResult restore(const RestoreOptions& opts) {
  require_socket_probe(opts.probe);
  if (!opts.pod_namespaces.empty() && !opts.container)
    throw Error(Errc::kUsage,
                "--join-ns and --netns name the namespaces a container joins: they are for "
                "--container only");
  // Only the staging to sweep if gpuckpt dies: a restored tree is left running (restored).
  process::Guard guard("restore");
  if (!opts.expected_container.is_null()) {
    if (!opts.container)
      throw Error(Errc::kUsage, "an expected container is checked for --container only");
    const auto rec = container::container_record_from_json(opts.expected_container);
    const std::string id = opts.container->empty() ? rec.id : *opts.container;
    // A migration's target: its ID is held from before it says it receives, while the source
    // is still unfrozen, to the end of the restore (restore_into holds it already then).
    guard.lock_container_restore(rec.root, id);
    container::check_restore_target(rec, id, opts.pod_namespaces);
    // The checkpoint to come carries CUDA state: a runtime that restores it with a CRIU of its
    // own must load gpuckpt's plugin, as restore_into checks once the record is read.
    if (opts.expected_container.value("cuda", false))
      if (const std::string why = container::stream_refusal(rec); !why.empty())
        container::require_runc_criu_loads_plugin(criu::locate(opts.criu.binary).plugin_dir, why);
  }
  RestoreResult r;
  if (opts.take_endpoints && !opts.new_pid_ns)
    throw Error(Errc::kUsage,
                "--take-endpoints hands a live process's socket paths to a copy restored beside "
                "it, so it needs --new-pidns");
  // With a confirmation the copy is provisional: the guard kills it unless it is confirmed. A
  // copy that takes a live process's endpoints is too, until it is restored: any failure
  // before then gives the endpoints back to the process that served them.
  const bool provisional =
      static_cast<bool>(opts.confirm) || (opts.new_pid_ns && opts.take_endpoints);
  try {
    // An s3:// checkpoint, or a stream on stdin, goes into a spool first, and is restored
    // from there.
    const auto remote = process::RemoteSpool::for_restore(opts.checkpoint, opts.spool_root, guard);
    if (!remote) {
      process::restore_into(opts, r, &guard, provisional);
    } else {
      Timeline tl;
      RestoreOptions local = opts;
      local.checkpoint = remote->local();
      // The blobs arrive on threads of their own while the restore reads each chunk as soon
      // as its bytes are in. Whatever brings them is waited for either way: no thread outlives
      // the restore, and a failed restore stops the download.
      auto restore_as_it_arrives = [&](const image::BlobArrival& arrival, auto&& stop_and_wait) {
        try {
          process::restore_into(local, r, &guard, provisional, &arrival);
        } catch (...) {
          try {
            stop_and_wait();
          } catch (const Error& se) {
            spdlog::warn("{}", se.what());
          }
          if (opts.checkpoint == "-") throw;
          try {
            throw;
          } catch (const Error& e) {
            // The spool is private and gone with the restore: the operator knows the checkpoint
            // by its URL.
            std::string what = e.what();
            const std::string spool = local.checkpoint.string(), url = opts.checkpoint.string();
            for (auto at = what.find(spool); at != std::string::npos;
                 at = what.find(spool, at + url.size()))
              what.replace(at, spool.size(), url);
            throw Error(e.code(), what);
          }
        }
      };
      const auto t0 = Timeline::Clock::now();
      if (opts.checkpoint == "-") {
        // A stream: its blobs come while the dump runs on the other host, its manifest as
        // soon as that is written.
        if (opts.on_receiving) opts.on_receiving();
        remote::StreamReceiver rx(STDIN_FILENO, remote->local());
        rx.start();
        restore_as_it_arrives(rx.arrival(), [&] {
          rx.cancel();
          rx.join();
        });
        const std::uint64_t received = rx.join();  // to the end marker: a commit line may follow
        tl.add(stage::kReceive, t0, rx.ended(), received);
      } else {
        const auto dl = remote->start_download();
        restore_as_it_arrives(dl->arrival(), [&] {
          dl->cancel();
          dl->join();
        });
        // The restore read every chunk it needed, each verified: a range it never read
        // (CRIU's logs) that failed leaves the restored tree as good, so it is said, not
        // thrown.
        remote::TransferStats st;
        try {
          st = dl->join();
        } catch (const Error& e) {
          spdlog::warn("the restore is complete, but part of {} it did not read failed: {}",
                       opts.checkpoint.string(), e.what());
        }
        const auto ended = dl->ended();
        tl.add(stage::kDownload, t0,
               ended == Timeline::Clock::time_point{} ? Timeline::Clock::now() : ended, st.bytes);
        spdlog::info("downloaded {} in {} objects from {} in {} ({} connections)", st.bytes,
                     st.objects, opts.checkpoint.string(), format_seconds(st.seconds),
                     st.connections);
      }
      tl.append(r.timeline);
      r.timeline = std::move(tl);
    }
    if (provisional) {
      bool keep = !opts.confirm;
      try {
        if (opts.confirm) keep = opts.confirm(r);
      } catch (const std::exception& e) {
        spdlog::warn("no confirmation: {}", e.what());
      }
      if (!keep) {
        const std::string undone = guard.abort();
        throw Error(Errc::kProcess, "the restore was not confirmed: " + undone);
      }
      guard.keep_copy();
    }
    guard.disarm();
  } catch (const Error& e) {
    // The guard's recovery says what became of the copy: a provisional one that failed is
    // killed, so nothing half-restored stays; any other is the service already and stays, left
    // running and named, whatever failed (the guard's own death included, when gpuckpt
    // recovers from its plan). Staging goes either way.
    if (guard.armed()) {
      const std::string undone = guard.abort();
      if (!undone.empty() && undone != process::kNothingToUndo)
        throw e.with_context("", "\n" + undone);
    }
    throw;
  }
  return r;
}

}  // namespace gpuckpt
