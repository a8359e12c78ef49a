// gpuckpt::dump(): preflight of the whole tree, criu dump (the plugin locks and checkpoints CUDA
// inside it), pack of CRIU's images into the checkpoint, then the end of every process of the
// tree. A guard process (process/guard.h) undoes the dump if gpuckpt fails or dies before that.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>

#include "container/checkpoint.h"
#include "container/runtime.h"
#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "criu/stats.h"
#include "criu/streamer.h"
#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/process.h"
#include "gpuckpt/support.h"
#include "image/stream_pack.h"
#include "process/dump_impl.h"
#include "process/guard.h"
#include "process/pidns.h"
#include "process/proc_info.h"
#include "process/remote_spool.h"
#include "process/stages.h"
#include "process/support.h"
#include "trust/keys.h"
#include "util/fault.h"
#include "util/fs.h"

namespace fs = std::filesystem;

namespace gpuckpt {

namespace process {

namespace {

void preflight_output(const DumpOptions& o) {
  if (o.output.empty()) throw Error(Errc::kUsage, "no output checkpoint path given");
  require_utf8_path(fs::absolute(o.output), "output");
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(o.output, ec)))
    throw Error(Errc::kExists, "output " + o.output.string() +
                                   " is a symbolic link; refusing to replace it (name the "
                                   "checkpoint itself); nothing was frozen");
  if (fs::exists(o.output, ec) && !o.pack.force)
    throw Error(Errc::kExists, o.output.string() + " exists (use --force to replace it)");
  if (fs::exists(fs::symlink_status(o.output, ec)) && o.pack.force) {
    // --force replaces a checkpoint, nothing else, and says so before anything is frozen.
    try {
      inspect(o.output);
    } catch (const Error& e) {
      throw Error(Errc::kExists, o.output.string() +
                                     " exists and is not a gpuckpt checkpoint, so --force does "
                                     "not replace it (" +
                                     e.what() + "); nothing was frozen");
    }
  }
  const fs::path parent = o.output.parent_path().empty() ? "." : o.output.parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error(Errc::kInvalidInput, "output directory " + parent.string() + " does not exist");
  // A read-only or forbidden directory would fail only after the freeze.
  if (::access(parent.c_str(), W_OK) != 0)
    throw_errno(Errc::kIo, "the output directory ", parent,
                " cannot be written (nothing was frozen)");
  if (!fs::is_directory(o.staging_root, ec))
    throw Error(Errc::kInvalidInput,
                "staging directory " + o.staging_root.string() + " does not exist");
  // The writer loads it again where it signs; a key it would refuse is refused here, before
  // anything is frozen, not once the tree is stopped.
  if (!o.pack.sign_key.empty()) {
    try {
      (void)trust::SigningKey::load(o.pack.sign_key);
    } catch (const Error& e) {
      throw e.with_context("", "; nothing was frozen");
    }
  }
}

// Everything that can be known before anything is frozen: each refusal here costs the service
// nothing.
struct Target {
  ProcInfo root;
  std::vector<pid_t> tree;
  std::uint64_t memory_bytes = 0;
  bool tcp_listener = false;
  std::vector<std::string> unix_listeners;  // absolute paths, "@name" for abstract ones
  std::uint64_t largest_ghost = 0;          // largest deleted file held (CRIU's ghost files)
};

// CRIU records the size of a regular file open for writing without O_APPEND and refuses the
// restore if it differs then ("bad size"): a service's stdout or stderr redirected with `>`
// into a log that anything writes to after the dump cannot be restored.
void warn_unappended_output(pid_t q) {
  for (const int fd : {1, 2}) {
    const std::string base = "/proc/" + std::to_string(q);
    struct stat st {};
    if (::stat((base + "/fd/" + std::to_string(fd)).c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      continue;
    std::string info;
    try {
      info = read_file(base + "/fdinfo/" + std::to_string(fd));
    } catch (const Error&) {
      continue;
    }
    const auto at = info.find("flags:");
    if (at == std::string::npos) continue;
    const unsigned long flags = std::strtoul(info.c_str() + at + 6, nullptr, 8);
    if ((flags & O_ACCMODE) == O_RDONLY || (flags & O_APPEND)) continue;
    std::error_code ec;
    const fs::path file = fs::read_symlink(base + "/fd/" + std::to_string(fd), ec);
    spdlog::warn(
        "process {} writes its fd {} to {} without O_APPEND: CRIU restores it only while that "
        "file keeps the size it has now, so anything written to it after the dump makes the "
        "restore fail (\"bad size\"); start the service with `>>` (or its own log file)",
        q, fd, file.string());
  }
}

// Why a process in a pid namespace of its own cannot be dumped alone, named by who made that
// namespace: a container runtime (from its state), gpuckpt's own restore, or something else.
std::string pid_namespace_refusal(pid_t q, const ProcInfo& p) {
  const std::string who = "process " + std::to_string(q) + " (" + p.comm + ")";
  const std::string whole =
      "CRIU dumps a pid namespace only whole, from its init, with its mounts. Nothing was "
      "frozen";
  if (const auto c = container::holding(q)) {
    const std::string where =
        who + " runs in the " + c->describe() +
        (c->init_pid == q ? ", as its init"
                          : " (its init is pid " + std::to_string(c->init_pid) + ")") +
        ": " + whole;
    if (c->under_crun)
      return where +
             ". It runs under crun, whose containers gpuckpt takes only from crun "
             "itself, not through containerd or Docker";
    return where + ". Dump the container whole: `gpuckpt dump --container " + shell_quote(c->id) +
           "`";
  }
  std::optional<ProcInfo> init;
  try {
    init = read_proc(host_pid_in_ns(q, 1));
  } catch (const Error&) {
    // No init found (it is exiting): said without its name.
  }
  if (init && init->comm == "gpuckpt-pidns")
    return who +
           " lives in a pid namespace that gpuckpt made (a `restore --new-pidns` or a "
           "frozen-handoff migration put it there): " +
           whole +
           ". Restore without --new-pidns, or migrate with --handoff release, to keep a "
           "process re-checkpointable";
  return who + " lives in a pid namespace of its own" +
         (init ? ", whose init is pid " + std::to_string(init->pid) + " (" + init->comm + ")"
               : std::string()) +
         ", made by no container runtime gpuckpt knows (`unshare --pid`, or a runtime whose "
         "state is not under " +
         container::kRuncRoot + ", " + container::kCrunRoot +
         " or $GPUCKPT_RUNC_ROOTS), and gpuckpt does not dump pid namespaces yet: " + whole;
}

// `own_pid_ns`: the pid namespace of the container being dumped whole (0 for a bare tree).
Target preflight_target(pid_t pid, std::uint64_t own_pid_ns) {
  if (pid <= 0) throw Error(Errc::kUsage, "no pid given");
  if (pid == ::getpid()) throw Error(Errc::kUsage, "gpuckpt cannot dump itself");
  Target t;
  const auto info = read_proc(pid);
  require_live(pid, info);
  t.root = *info;
  t.tree = process_tree(pid);
  for (pid_t q : t.tree) {
    if (q == ::getpid())
      throw Error(Errc::kUsage, "gpuckpt cannot dump a tree it belongs to (pid " +
                                    std::to_string(pid) + " is an ancestor of gpuckpt)");
    const auto p = read_proc(q);
    if (!p) continue;               // exited since the scan: CRIU will not see it either
    if (p->state == 'Z') continue;  // CRIU dumps zombies as such
    if (const std::string why = undumpable_reason(*p); !why.empty())
      throw Error(
          Errc::kProcess,
          q == pid ? why : why + " (it belongs to the tree of pid " + std::to_string(pid) + ")");
    if (in_child_pid_namespace(q) &&
        (own_pid_ns == 0 || pid_namespace_inode(q).value_or(0) != own_pid_ns))
      throw Error(Errc::kProcess, pid_namespace_refusal(q, *p));
    warn_unappended_output(q);
    t.memory_bytes += dumpable_memory_bytes(q);
    t.tcp_listener |= has_tcp_listener(q);
    t.largest_ghost = std::max(t.largest_ghost, largest_deleted_file_bytes(q));
    std::error_code ec;
    const fs::path cwd = fs::read_symlink("/proc/" + std::to_string(q) + "/cwd", ec);
    for (const auto& l : unix_listeners(q)) {
      fs::path path = l.path;
      if (!l.abstract && path.is_relative() && !cwd.empty()) path = cwd / path;
      t.unix_listeners.push_back(path.string());
    }
  }
  return t;
}

// The processes with CUDA state, from the plugin's report (the root alone if it says none).
std::vector<pid_t> cuda_pids_of(const std::optional<criu::PluginReport>& plugin) {
  if (!plugin || !plugin->cuda) return {};
  return plugin->cuda_pids;
}

// What the steps of one dump share. Members are destroyed in reverse order: the streamer before
// the packer it feeds, both before the staging directory.
struct DumpState {
  const DumpOptions& o;
  Guard& guard;
  const Target& target;
  const container::DumpPlan* container;
  image::PackCopy copy;
  DumpOutcome out;
  criu::Installation inst;
  std::uint64_t need = 0;
  bool stream = false;
  TempDir staging;
  fs::path images;
  std::vector<UniqueFd> criu_namespaces;  // args.namespace_fds, open while CRIU starts
  criu::DumpArgs args;
  fs::path report_path;
  std::optional<image::StreamPacker> packer;
  std::optional<criu::DumpStreamer> streamer;
  criu::Run run;
};

void prepare_criu(DumpState& d) {
  d.inst = criu::locate(d.o.criu.binary);
  d.out.record.criu_version = criu::version(d.inst);
  if (d.o.criu.check) criu::check(d.inst);
  if (d.inst.plugin_dir.empty())
    spdlog::warn(
        "gpuckpt's CRIU plugin ({}) was not found: no device stages are recorded and "
        "CUDA processes cannot be dumped (set GPUCKPT_CRIU_PLUGIN_DIR)",
        criu::kPluginFile);
}

void choose_staging(DumpState& d) {
  const DumpOptions& o = d.o;
  // CRIU would find out after freezing the tree for as long as it took to fill the tmpfs.
  // The checkpoint moves the tree's VRAM into its host memory first: stage that too.
  const std::uint64_t vram = gpu_memory_of(d.target.tree);
  require_host_room_for_vram(vram, mem_available_bytes());
  d.need = d.target.memory_bytes + vram;
  const std::uint64_t free_bytes = fs::space(o.staging_root).available;
  d.stream = o.staging_mode == StagingMode::kStream;
  if (o.staging_mode == StagingMode::kAuto) {
    // What a snapshot loses is its frozen time, which staging shortens; a staging directory
    // without room for the tree streams instead.
    // A carried rootfs, of whatever size, is no file for the staging tmpfs.
    const bool rootfs = d.container && d.container->record.layer == WritableLayer::kRootfs;
    d.stream = !o.leave_running || rootfs || d.need + (64ull << 20) > free_bytes;
    if (o.leave_running)
      d.out.result.staging_note =
          rootfs     ? "a snapshot that carries its container's rootfs streams"
          : d.stream ? "a snapshot streams: the staging directory has too little room for the tree"
                     : "a snapshot stages its images: the process runs again sooner";
  }
  if (d.stream) {
    // Longer than any images path make_staging() creates (gpuckpt-dump-XXXXXX), to be safe.
    const std::string why = criu::stream_unsupported_reason(
        o.staging_root / "gpuckpt-dump-4194304-XXXXXX" / "images", o.criu.extra_args);
    if (!why.empty()) {
      d.out.result.staging_note = why;
      spdlog::warn("cannot stream CRIU's images ({}): staging them in {} instead", why,
                   o.staging_root.string());
      d.stream = false;
    }
  }
  d.out.result.staging_mode = d.stream ? StagingMode::kStream : StagingMode::kStaged;
  // Streaming stages nothing but CRIU's log and stats.
  if (!d.stream && d.need > free_bytes)
    throw Error(Errc::kIo, "the staging directory " + o.staging_root.string() + " has " +
                               std::to_string(free_bytes >> 20) + " MiB free, but the tree of " +
                               std::to_string(o.pid) + " has " + std::to_string(d.need >> 20) +
                               " MiB of memory to dump: use --staging DIR on a larger filesystem");
}

void fill_record(DumpState& d) {
  const DumpOptions& o = d.o;
  const Target& target = d.target;
  ProcessRecord& rec = d.out.record;
  rec.pid = o.pid;
  rec.comm = target.root.comm;
  rec.cmdline = target.root.cmdline;
  rec.exe = target.root.exe;
  rec.hostname = host_name();
  rec.shell_job = needs_shell_job(target.root);
  rec.leave_running = o.leave_running;
  for (pid_t q : target.tree)
    for (auto& u : nvidia_gpu_uuids(q))
      if (std::find(rec.gpu_uuids.begin(), rec.gpu_uuids.end(), u) == rec.gpu_uuids.end())
        rec.gpu_uuids.push_back(u);
  rec.gpus = describe_checkpointed_gpus(rec.gpu_uuids, target.tree);  // for restore's checks
  // Before the freeze (hashing libcuda takes a moment); kept only if CUDA state is dumped.
  if (!rec.gpu_uuids.empty()) rec.driver = device::driver_identity();
  rec.tcp_listener = target.tcp_listener;
  rec.unix_listeners = target.unix_listeners;
  rec.tcp_established = o.tcp_established ? "established" : "closed";
  if (d.container) rec.container = d.container->record;
}

void make_images_dir(DumpState& d) {
  d.staging = make_staging(d.o.staging_root, "gpuckpt-dump");
  d.guard.remove_on_recovery(d.staging.path());
  d.images = d.staging.path() / "images";
  fs::create_directory(d.images);
  if (d.container) container::write_descriptors(d.container->record, d.images);
}

void build_criu_args(DumpState& d) {
  const DumpOptions& o = d.o;
  criu::DumpArgs& a = d.args;
  a.pid = o.pid;
  a.images_dir = d.images;
  a.final_state = o.leave_running ? criu::FinalState::kRunning : criu::FinalState::kStopped;
  a.shell_job = d.out.record.shell_job;
  a.stream = d.stream;
  a.extra_args = criu::tcp_args(o.tcp_established);
  if (d.container) {
    a.extra_args.insert(a.extra_args.end(), d.container->criu_args.begin(),
                        d.container->criu_args.end());
    for (const auto& ns : d.container->criu_namespaces) {
      UniqueFd fd(::open(ns.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd) throw_errno(Errc::kProcess, "the container's namespace ", ns, " (its init ended?)");
      a.namespace_fds.push_back(fd.get());
      d.criu_namespaces.push_back(std::move(fd));
    }
  }
  // A /dev/shm segment unlinked once mapped (vLLM's and SGLang's shared rings) is a ghost file
  // to CRIU, refused above 1 MiB: raise the limit to what this tree holds.
  if (d.target.largest_ghost > (1u << 20))
    a.extra_args.push_back("--ghost-limit=" + std::to_string(d.target.largest_ghost + (1u << 20)));
  a.extra_args.insert(a.extra_args.end(), o.criu.extra_args.begin(), o.criu.extra_args.end());
  a.timeout = o.criu.timeout;
  // CRIU's --timeout bounds the freezing stage, which includes the plugin's CUDA lock.
  a.freeze_timeout =
      std::chrono::duration_cast<std::chrono::seconds>(o.lock_timeout) + std::chrono::seconds(10);
  d.report_path = d.images / criu::kDumpReportName;
  a.before_start = [&guard = d.guard, report = d.report_path](pid_t criu_pid) {
    guard.cuda_report(report);
    guard.criu_started(criu_pid);
  };
  a.on_start = [](pid_t) { fault_point(fault::kCriuDump); };
  a.env = {std::string(criu::kEnvReport) + "=" + d.report_path.string(),
           std::string(criu::kEnvFinalState) + "=" + (o.leave_running ? "running" : "stopped"),
           std::string(criu::kEnvLockTimeoutMs) + "=" + std::to_string(o.lock_timeout.count())};
  for (auto& e : plugin_device_env({})) a.env.push_back(std::move(e));
  const auto argv = criu::dump_argv(d.inst, a, d.images / "dump.log");
  d.out.record.criu_args.assign(argv.begin() + 1, argv.end());
}

// Streaming: the checkpoint is built while CRIU dumps. Its temporary directory is the guard's to
// remove, exactly as the staged pack's is.
void start_streaming(DumpState& d) {
  if (!d.stream) return;
  try {
    PackOptions po = d.o.pack;
    po.on_temp_path = [&guard = d.guard](const fs::path& p) {
      guard.remove_on_recovery(p);
      fault_point(fault::kCompressWrite);
    };
    d.packer.emplace(d.o.output, po, d.images, d.copy);
    d.streamer.emplace(d.images, *d.packer);
  } catch (...) {
    d.packer.reset();
    const std::string undone = d.guard.abort();
    rethrow_with_context("", "\nno checkpoint was written; " + undone);
  }
}

// criu resumes the tree itself after a failed dump; the guard makes sure of it (a timed-out criu
// was killed with the tree possibly stopped).
[[noreturn]] void fail_criu_dump(DumpState& d, const Error& e) {
  std::optional<criu::PluginReport> rep;
  try {
    rep = criu::read_plugin_report(d.report_path);
  } catch (const Error&) {
  }
  const bool device = rep && !rep->all_ok();
  // A streamer that could not store an image closed CRIU's pipes: that is the cause.
  std::string cause;
  Errc code = e.code();
  if (d.streamer) {
    try {
      d.streamer->finish();
    } catch (const Error& se) {
      cause = std::string("storing CRIU's images failed: ") + se.what() + "\n";
      code = se.code();
    } catch (const std::exception& se) {
      cause = std::string("storing CRIU's images failed: ") + se.what() + "\n";
    }
    d.streamer.reset();
    d.packer.reset();
  }
  d.guard.criu_finished();
  const std::string undone = d.guard.abort();
  throw Error(device ? Errc::kDevice : code,
              (device ? "CUDA checkpoint failed: " + rep->first_error() + "\n" : "") + cause +
                  e.what() + "\nno checkpoint was written; " + undone);
}

void run_criu_dump(DumpState& d) {
  std::optional<DirProgress> progress;
  if (!d.stream) progress.emplace(d.o.pack.progress, "criu_dump", d.images, d.need);
  try {
    d.run = criu::dump(d.inst, d.args);
    d.guard.criu_finished();
  } catch (const Error& e) {
    fail_criu_dump(d, e);
  }
}

// The frozen tree, its images and what CRIU and the plugin reported, into the record and result.
void collect_dump(DumpState& d) {
  const DumpOptions& o = d.o;
  ProcessRecord& rec = d.out.record;
  DumpResult& result = d.out.result;
  if (d.streamer) {
    d.streamer->finish();  // everything CRIU sent is in the packer now
    spdlog::debug("criu streamed {} image files", d.streamer->files().size());
    d.streamer.reset();
  }
  if (d.container) {
    // Its processes are stopped (running again for a snapshot, whose layer is then as it is
    // now): what they wrote into the image's rootfs goes with their memory. Into the packer as
    // tar writes it, when it streams: a whole rootfs is no file for the staging tmpfs.
    container::ArchiveSink sink;
    if (d.packer)
      sink = [&p = *d.packer](const std::string& name, int fd) { return p.add_fd(name, fd); };
    auto scope = result.timeline.scope(stage::kRootfsDiff);
    scope.set_bytes(container::write_layer_archive(*d.container, d.images, *rec.container, sink));
  }
  // Frozen now (or running again, for a snapshot): this is the tree CRIU dumped.
  rec.tree = o.leave_running ? d.target.tree : process_tree(o.pid);
  d.guard.protect(o.pid, rec.tree);
  if (d.packer) {
    // What CRIU (and the plugin) left as files: its log, stats-dump, the plugin's report.
    // They belong to the checkpoint as in a staged dump.
    for (const auto& f : fs::directory_iterator(d.images))
      if (f.is_regular_file() && !f.is_symlink())
        d.packer->add_file(f.path().filename().string(), f.path());
    result.image_bytes = d.packer->raw_bytes();
  } else {
    result.image_bytes = tree_bytes(d.images);
  }
  const auto stats = criu::read_dump_stats(d.images);
  const auto plugin = criu::read_plugin_report(d.report_path);
  if (!plugin && !d.inst.plugin_dir.empty())
    spdlog::warn("the CRIU plugin wrote no report ({}): device stages are missing",
                 d.report_path.string());
  rec.cuda_pids = cuda_pids_of(plugin);
  // Only what this dump locked: a task that was locked or checkpointed before it is left so.
  if (!o.leave_running && plugin) d.guard.cuda(plugin->locked_pids);
  add_dump_stages(result.timeline, d.run, result.image_bytes, stats, plugin);
  if (const Stage* f = result.timeline.find(stage::kFrozen)) result.frozen_seconds = f->seconds;
  rec.cuda = plugin && plugin->cuda;
  if (!rec.cuda) rec.driver.reset();
  result.gpu = rec.cuda;
  result.gpu_uuids = rec.gpu_uuids;
  result.criu_version = rec.criu_version;
  result.comm = rec.comm;
  result.tree = rec.tree;
}

void publish_checkpoint(DumpState& d) {
  Timeline& tl = d.out.result.timeline;
  ProcessRecord& rec = d.out.record;
  rec.timeline = tl;
  if (d.packer) {
    d.out.result.skipped_compression_bytes =
        d.packer->finish(to_extra(rec)).skipped_compression_bytes;
    // compress_write overlaps criu_dump: from CRIU's first image byte to the published
    // manifest.
    tl.add(stage::kCompressWrite, d.packer->first_byte, Timeline::Clock::now(),
           d.packer->raw_bytes());
    // Not an interval: the time CRIU's images waited for gpuckpt, summed. Near criu_memdump,
    // compression and the writes bound the dump; far below it, CRIU's own page chain did.
    tl.add(stage::kCaptureWait, d.packer->first_byte,
           d.packer->first_byte + d.packer->waited_for_room);
    d.packer.reset();
  } else {
    PackOptions po = d.o.pack;
    po.compression = compression_adapts(po.compression, d.copy.tap != nullptr)
                         ? Compression::kAdaptive
                         : Compression::kAlways;
    po.extra = to_extra(rec);
    po.on_temp_path = [&guard = d.guard](const fs::path& p) {
      guard.remove_on_recovery(p);
      fault_point(fault::kCompressWrite);
    };
    auto scope = tl.scope(stage::kCompressWrite);
    const TransferResult tr = pack(d.images, d.o.output, po);
    scope.set_bytes(tr.raw_bytes);
    d.out.result.skipped_compression_bytes = tr.skipped_compression_bytes;
  }
}

}  // namespace

DumpOutcome dump_keep_stopped(const DumpOptions& o, Guard& guard, image::PackCopy copy,
                              const container::DumpPlan* plan) {
  criu::check_extra_args(criu::Op::kDump, o.criu.extra_args);
  // Locked before the tree is looked at: another gpuckpt's dump in flight may have it stopped
  // already, and "being dumped by another gpuckpt" is the refusal that says why.
  guard.hold_locks(lock_processes(o.pid > 0 ? process_tree(o.pid) : std::vector<pid_t>{}));
  const Target target = preflight_target(o.pid, plan ? pid_namespace_inode(o.pid).value_or(0) : 0);
  preflight_output(o);

  DumpState d{o, guard, target, plan, copy};
  {
    Timeline::Scope preflight(d.out.result.timeline, stage::kPreflight);
    prepare_criu(d);
    choose_staging(d);
    fill_record(d);
    make_images_dir(d);
    build_criu_args(d);
    guard.protect(o.pid, target.tree);
  }

  start_streaming(d);
  run_criu_dump(d);
  // From here on a stopped tree must not be lost: if anything fails before the checkpoint is
  // durable, the guard resumes it, exactly as if the dump had not happened.
  try {
    collect_dump(d);
    publish_checkpoint(d);
  } catch (...) {
    d.streamer.reset();
    d.packer.reset();
    const std::string undone = guard.abort();
    rethrow_with_context("", "\nno checkpoint was written; " + undone);
  }
  std::error_code ec;
  d.out.result.checkpoint_bytes =
      fs::is_directory(o.output, ec) ? tree_bytes(o.output) : fs::file_size(o.output, ec);
  return std::move(d.out);
}

}  // namespace process

const char* staging_mode_name(StagingMode m) {
  return m == StagingMode::kStream ? "stream" : m == StagingMode::kStaged ? "staged" : "auto";
}

DumpResult dump(const DumpOptions& opts) {
  if (opts.carry_rootfs && opts.container.empty())
    throw Error(Errc::kUsage,
                "--with-rootfs carries a container's rootfs: it is for --container only");
  process::Guard guard("dump");
  // An s3:// output: the checkpoint is written into a spool, uploaded while it is written, and
  // durable only once its manifest is in the store. The spool need not survive the host.
  auto remote =
      process::RemoteSpool::for_dump(opts.output, opts.spool_root, opts.pack.force, guard);
  DumpOptions local = opts;
  std::optional<container::Container> box;
  std::optional<container::DumpPlan> plan;
  if (!opts.container.empty()) {
    if (opts.pid > 0) throw Error(Errc::kUsage, "give --pid or --container, not both");
    box = container::find(opts.container);
    plan = container::plan_dump(*box, opts.tcp_established, opts.carry_rootfs);
    local.pid = box->init_pid;
  }
  image::PackCopy copy;
  if (remote) {
    local.output = remote->local();
    local.pack.force = false;
    copy = {&remote->start_upload(opts.pack.progress), false};
  }
  process::DumpOutcome out =
      process::dump_keep_stopped(local, guard, copy, plan ? &*plan : nullptr);
  out.result.container = box ? box->id : std::string();
  if (remote && !opts.leave_running) {
    // The tree is still stopped: a failed upload resumes it, exactly like a failed write.
    try {
      fault_point(fault::kUpload);
      remote->finish_upload(out.result.timeline);
    } catch (...) {
      const std::string undone = guard.abort();
      rethrow_with_context("", "\nno checkpoint was published; " + undone);
    }
  }
  // An interrupt from here until the guard is told says that the checkpoint stays: it is
  // whole, and a retry to the same output would otherwise meet it unawares.
  std::optional<OnInterrupt> say_kept;
  if (!opts.leave_running)
    say_kept.emplace([where = opts.output.string()] {
      return "the checkpoint " + where +
             " was complete and stays (gpuckpt verify checks it): use it, remove it, or dump "
             "again with --force";
    });
  fault_point(fault::kPublished);  // the checkpoint is whole; the guard not yet told
  const auto durable = Timeline::Clock::now();
  guard.durable(!opts.leave_running);
  say_kept.reset();
  fault_point(fault::kDurable);
  if (!opts.leave_running) {
    const auto left = process::end_tree(out.record.tree);
    out.result.process_end_seconds =
        std::chrono::duration<double>(Timeline::Clock::now() - durable).count();
    if (!left.empty()) {
      // The guard would try again; the checkpoint is complete either way.
      guard.abort();
      throw Error(Errc::kProcess, "the checkpoint " + opts.output.string() +
                                      " is complete, but process " + std::to_string(left.front()) +
                                      " of the tree did not end after SIGKILL");
    }
  }
  guard.disarm();
  if (box && !opts.leave_running) {
    // Its runtime still lists it, stopped: the ID is freed for the restore.
    auto scope = out.result.timeline.scope(stage::kRuntimeDelete);
    if (const std::string why = container::remove_ended(*box); !why.empty())
      spdlog::warn("the checkpoint is complete, but the ended container stays listed: {}", why);
  }
  if (remote && opts.leave_running) {
    // A snapshot: the process already runs again; a failed upload fails the snapshot only.
    remote->finish_upload(out.result.timeline);
  }
  return std::move(out.result);
}

}  // namespace gpuckpt
