// `gpuckpt dump | restore | migrate`: whole-process checkpoint/restore (docs/PROCESS.md).
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "commands.h"
#include "flags.h"
#include "gpuckpt/migrate_wire.h"

namespace gpuckpt::cli {

namespace {

// The target side of a migration: the controller closing its end (its ssh dropped, it was
// interrupted or killed) before the commit means the copy is not wanted, and it must not serve
// on until its probe times out. A hang-up of stdin becomes SIGHUP to ourselves, whose handler
// rolls back as for any interrupt (the guard kills an uncommitted copy). Nothing is read: the
// controller sends nothing between the checkpoint and its commit, which comes only after our
// result line (confirm stops the watch before it reads).
class HangupWatch {
 public:
  HangupWatch() : stop_(::eventfd(0, EFD_CLOEXEC)) {
    if (stop_ >= 0) thread_ = std::thread([this] { run(); });
  }
  ~HangupWatch() {
    stop();
    if (stop_ >= 0) ::close(stop_);
  }
  HangupWatch(const HangupWatch&) = delete;
  HangupWatch& operator=(const HangupWatch&) = delete;
  void stop() {
    if (!thread_.joinable()) return;
    const std::uint64_t one = 1;
    (void)!::write(stop_, &one, sizeof one);
    thread_.join();
  }

 private:
  void run() {
    // POLLRDHUP only: the end of a pipe or socket, not data (a regular file never reports it).
    pollfd p[2] = {{STDIN_FILENO, POLLRDHUP, 0}, {stop_, POLLIN, 0}};
    for (;;) {
      const int n = ::poll(p, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || p[1].revents != 0 || (p[0].revents & POLLNVAL)) return;
      if (p[0].revents & (POLLHUP | POLLRDHUP | POLLERR)) {
        // A writer that sent its commit ahead and closed (a pipe says POLLHUP with the data
        // still unread): the answer is there, and confirm reads it.
        int unread = 0;
        if (::ioctl(STDIN_FILENO, FIONREAD, &unread) == 0 && unread > 0) return;
        spdlog::warn(
            "the migration's controller closed the connection before its commit: the "
            "copy is not kept");
        ::kill(::getpid(), SIGHUP);
        return;
      }
    }
  }
  const int stop_;  // an eventfd: stop() wakes the watch
  std::thread thread_;
};

void print_header(const char* fmt, auto... args) {
  std::printf(fmt, args...);
  std::printf("\n");
}

// --staging DIR and --staging-mode (docs/PROCESS.md, "Streaming"): by default CRIU's images
// stream through gpuckpt and DIR holds only CRIU's socket, log and stats; naming a staging
// directory asks for the images to be staged there, unless --staging-mode stream says otherwise.
struct StagingFlags {
  std::string dir = "/dev/shm";
  StagingMode mode = StagingMode::kAuto;
  CLI::Option *dir_opt = nullptr, *mode_opt = nullptr;
  void add(CLI::App* c, const std::string& what) {
    dir_opt = c->add_option("--staging", dir, what + " (implies --staging-mode staged)");
    mode_opt = c->add_option("--staging-mode", mode,
                             "stream: CRIU's images flow through gpuckpt's streamer, no copy of "
                             "the process's memory in tmpfs; staged: through a directory under "
                             "--staging; auto (default): staged for a snapshot (--leave-running) "
                             "when --staging has room, which shortens the time the process is "
                             "frozen, else stream")
                   ->transform(
                       enum_option({StagingMode::kStream, StagingMode::kStaged, StagingMode::kAuto},
                                   staging_mode_name));
  }
  StagingMode resolve() const {
    if (mode_opt && mode_opt->count() > 0) return mode;
    return dir_opt && dir_opt->count() > 0 ? StagingMode::kStaged : StagingMode::kAuto;
  }
};

// --threads, for dump, restore and migrate.
constexpr const char* kThreadsHelp =
    "Compression and decompression workers (default 0: one per CPU gpuckpt may run on, at most "
    "32). Fewer leave the node's other services their CPUs (the servers on its other GPUs; a "
    "staged --leave-running snapshot compresses while the process runs again), at the cost of "
    "a longer dump or restore where compression is the bound";

// What dump and migrate both take for the dump they make: one group, so that the two stay alike.
struct DumpFlags {
  StagingFlags staging;
  bool force = false, tcp_established = false, with_rootfs = false;
  int level = 1;
  CompressFlag compress;
  unsigned threads = 0;
  int lock_timeout_ms = 10000;
  CriuFlags criu;
  SignFlags sign;

  struct Help {
    std::string tcp, force, staging, threads;
  };
  void add(CLI::App* c, const Help& h) {
    c->add_flag("--tcp-established", tcp_established, h.tcp);
    c->add_flag("--with-rootfs", with_rootfs,
                "With --container, one that runc runs from a bundle: its whole rootfs directory "
                "goes into the checkpoint (rootfs.tar), and a restore on a host without it "
                "unpacks it there (containerd's and Docker's containers carry their writable "
                "layer anyway)");
    c->add_flag("--force", force, h.force);
    staging.add(c, h.staging);
    c->add_option("--level", level, "zstd level")->check(CLI::Range(-7, 22));
    compress.add(c, kCompressAutoForDumps);
    c->add_option("--threads", threads, h.threads)->check(CLI::Range(0u, 1024u));
    c->add_option("--lock-timeout", lock_timeout_ms, "CUDA lock timeout (ms)")
        ->check(CLI::PositiveNumber);
    criu.add(c);
    sign.add(c);
  }
  // Into DumpOptions or MigrateOptions, which name these the same.
  template <typename Options>
  void apply(Options& o, const Context& ctx) const {
    o.staging_root = staging.dir;
    o.staging_mode = staging.resolve();
    o.pack.zstd_level = level;
    o.pack.compression = compress.value();
    o.pack.threads = threads;
    o.pack.force = force;
    o.pack.progress = ctx.progress();
    o.pack.sign_key = sign.path();
    o.lock_timeout = std::chrono::milliseconds(lock_timeout_ms);
    o.tcp_established = tcp_established;
    o.carry_rootfs = with_rootfs;
    o.criu = criu.settings();
  }
};

struct DumpArgs {
  TargetFlags target;
  std::string output, spool;
  bool leave_running = false;
  DumpFlags flags;
};

void run_dump(const DumpArgs& o, Context& ctx) {
  o.target.require("dump");
  DumpOptions d;
  d.pid = o.target.pid;
  d.container = o.target.container;
  d.output = o.output;
  d.spool_root = o.spool;
  d.leave_running = o.leave_running;
  o.flags.apply(d, ctx);
  const DumpResult r = dump(d);
  ctx.progress_done();
  if (ctx.json) {
    ctx.emit({{"ok", true},
              {"pid", r.tree.empty() ? d.pid : r.tree.front()},
              {"container", r.container},
              {"comm", r.comm},
              {"checkpoint", d.output},
              {"leave_running", d.leave_running},
              {"image_bytes", r.image_bytes},
              {"checkpoint_bytes", r.checkpoint_bytes},
              {"skipped_compression_bytes", r.skipped_compression_bytes},
              {"gpu", r.gpu},
              {"gpu_uuids", r.gpu_uuids},
              {"criu_version", r.criu_version},
              {"tree", r.tree},
              {"tcp_established", d.tcp_established},
              {"staging_mode", staging_mode_name(r.staging_mode)},
              {"staging_note", r.staging_note},
              {"frozen_seconds", r.frozen_seconds},
              {"process_end_seconds", r.process_end_seconds},
              {"timeline", timeline_json(r.timeline)}});
    return;
  }
  print_header(
      "dumped %s%d (%s%s) to %s: %s of CRIU images, %s on storage%s%s",
      r.container.empty() ? "pid " : ("container " + r.container + ", init pid ").c_str(),
      r.tree.empty() ? d.pid : r.tree.front(), r.comm.c_str(),
      r.tree.size() > 1 ? (", a tree of " + std::to_string(r.tree.size()) + " processes").c_str()
                        : "",
      d.output.c_str(), human_bytes(r.image_bytes).c_str(), human_bytes(r.checkpoint_bytes).c_str(),
      r.gpu ? ", with CUDA state" : "",
      d.leave_running ? "; the process continues"
                      : ("; the process has ended (" + format_seconds(r.process_end_seconds) +
                         " after the checkpoint was durable)")
                            .c_str());
  if (r.skipped_compression_bytes > 0)
    print_header(
        "%s of the images stored uncompressed, so that the writes kept up with "
        "them (--compress always: a smaller checkpoint, a longer dump on this node)",
        human_bytes(r.skipped_compression_bytes).c_str());
  if (d.leave_running)
    print_header("frozen for %s (%s images%s)", format_seconds(r.frozen_seconds).c_str(),
                 staging_mode_name(r.staging_mode),
                 r.staging_note.empty() ? "" : ("; " + r.staging_note).c_str());
  print_stages(r.timeline);
}

void add_dump(CLI::App& app, Context& ctx) {
  auto* c = app.add_subcommand("dump", "Checkpoint a live process (CUDA state included) to CKPT");
  auto o = std::make_shared<DumpArgs>();
  o->target.add(c, "Root of the process tree to checkpoint",
                "A whole runc container, by ID (runc's root, or one in $GPUCKPT_RUNC_ROOTS): it "
                "ends, and runc forgets it, once the checkpoint is durable; `restore "
                "--container` brings it back");
  c->add_option("-o,--output", o->output,
                "Checkpoint to write: a directory, or s3://BUCKET/PREFIX in object storage "
                "(credentials, region and endpoint as for the AWS CLI: AWS_ACCESS_KEY_ID, "
                "AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, ~/.aws/credentials and "
                "~/.aws/config; docs/OPERATORS.md). An s3:// dump is written to --spool, "
                "uploaded in parallel multipart parts with the manifest last, and the process "
                "ends only once the upload is complete")
      ->required();
  c->add_option("--spool", o->spool,
                "With an s3:// output: local directory the checkpoint is written to before "
                "the upload (default $TMPDIR or /var/tmp; needs the checkpoint's size)");
  c->add_flag("--leave-running", o->leave_running,
              "Snapshot: the process continues after the dump (default: it ends once the "
              "checkpoint is written)");
  o->flags.add(c, {"Dump established TCP connections with their state, so clients stay "
                   "connected (default: they are not dumped and a client in mid-request sees a "
                   "reset; listening sockets come back either way)",
                   "Replace an existing checkpoint", "Where CRIU writes its images first (tmpfs)",
                   kThreadsHelp});
  c->callback([o, &ctx] { run_dump(*o, ctx); });
}

// --no-huge-pages, for restore and migrate.
constexpr const char* kNoHugePagesHelp =
    "Fill the restored memory as upstream CRIU does: 4 KiB pages, faulted in by its one thread "
    "(default: dense private anonymous memory is read into transparent huge pages, and helper "
    "threads populate the memory ahead of the read; docs/CRIU.md \"Huge-page fill\", "
    "\"Parallel fill\")";

struct RestoreArgs {
  unsigned copy_streams = 0;
  std::string checkpoint, gpu_map, spool, container_log;
  PodNamespaceFlags pod;
  std::string expected_container;
  std::optional<std::string> container;
  StagingFlags staging;
  bool new_pidns = false, take_endpoints = false, await_commit = false, no_huge_pages = false;
  unsigned threads = 0;
  ProbeFlags probe;
  CriuFlags criu;
  TrustFlags trust;
};

void run_restore(const RestoreArgs& o, Context& ctx) {
  RestoreOptions r;
  r.checkpoint = o.checkpoint;
  r.spool_root = o.spool;
  if (!o.gpu_map.empty()) r.gpu_map = parse_gpu_map(o.gpu_map);
  r.staging_root = o.staging.dir;
  r.staging_mode = o.staging.resolve();
  r.unpack.progress = ctx.progress();
  r.unpack.threads = o.threads;
  r.probe = o.probe.probe();
  r.new_pid_ns = o.new_pidns;
  r.container = o.container;
  r.container_log = o.container_log;
  r.pod_namespaces = o.pod.resolve();
  if (!o.expected_container.empty()) {
    r.expected_container = nlohmann::json::parse(o.expected_container, nullptr, false);
    if (!r.expected_container.is_object())
      throw Error(Errc::kUsage, "--expect-container takes a container record as JSON");
  }
  r.take_endpoints = o.take_endpoints;
  r.huge_pages = !o.no_huge_pages;
  r.copy_streams = o.copy_streams;
  r.criu = o.criu.settings();
  r.trust = o.trust.options();
  auto result_json = [&r](const RestoreResult& res) {
    nlohmann::json j{{"ok", true},
                     {"pid", res.pid},
                     {"ns_pid", res.ns_pid},
                     {"gpu", res.gpu},
                     {"tree", res.tree},
                     {"timeline", timeline_json(res.timeline)},
                     {"staging_mode", staging_mode_name(res.staging_mode)},
                     {"huge_page_bytes", res.huge_page_bytes}};
    if (res.pidns_init > 0) j["pidns_init"] = res.pidns_init;
    if (!res.container.empty()) j["container"] = res.container;
    if (!res.damaged_unread.empty()) j["damaged_unread"] = res.damaged_unread;
    if (r.probe.kind != ReadinessProbe::Kind::kNone) j["first_answer"] = res.first_answer;
    return j;
  };
  std::optional<HangupWatch> hangup;  // lives through restore(), which calls confirm
  if (o.await_commit) {
    hangup.emplace();
    // The target side of a migration (docs/PROCESS.md): first a line saying it is receiving,
    // with this host's GPUs (the controller checks them before it freezes anything); then the
    // result as one line, and the copy stays only if "commit" comes back on stdin.
    r.on_receiving = [] {
      std::fflush(stdout);
      migrate_wire::send_line(STDOUT_FILENO, migrate_wire::receiving(devices_json(list_devices())));
    };
    r.confirm = [&](const RestoreResult& res) {
      hangup->stop();
      std::fflush(stdout);
      migrate_wire::send_line(STDOUT_FILENO, result_json(res));
      return migrate_wire::read_commit(STDIN_FILENO);
    };
  }
  const RestoreResult res = restore(r);
  ctx.progress_done();
  if (o.await_commit) return;  // the result is out already
  if (ctx.json) {
    ctx.emit(result_json(res));
    return;
  }
  print_header("restored %s as %spid %d%s%s", r.checkpoint.c_str(),
               res.container.empty() ? "" : ("container " + res.container + ", init ").c_str(),
               res.pid,
               res.pidns_init > 0
                   ? (" (pid " + std::to_string(res.ns_pid) + " in its own pid namespace)").c_str()
                   : "",
               res.gpu ? ", with CUDA state" : "");
  if (r.probe.kind != ReadinessProbe::Kind::kNone)
    print_header("first answer: %s", res.first_answer.c_str());
  print_stages(res.timeline);
}

void add_restore(CLI::App& app, Context& ctx) {
  auto* c =
      app.add_subcommand("restore", "Restore a process from CKPT (optionally onto other GPUs)");
  auto o = std::make_shared<RestoreArgs>();
  c->add_option("checkpoint", o->checkpoint,
                "Checkpoint made by gpuckpt dump: a directory, or s3://BUCKET/PREFIX (downloaded "
                "with parallel ranged reads into --spool, then restored with every chunk "
                "verified; configured as for dump -o s3://), or - for a checkpoint stream on "
                "stdin (what migrate --to ssh:// sends)")
      ->required();
  c->add_option("--spool", o->spool,
                "With an s3:// checkpoint or -: local directory it is downloaded to (default "
                "$TMPDIR or /var/tmp)");
  c->add_flag("--await-commit", o->await_commit,
              "The target side of migrate --to ssh:// (checkpoint -): print the result as one "
              "JSON line once the copy answers, then keep the copy only if \"commit\" arrives "
              "on stdin; anything else, or EOF, kills it");
  c->add_option("--expect-container", o->expected_container,
                "With --container: the container record (JSON, as inspect --json shows it) the "
                "checkpoint brings, checked before anything is read or started (migrate "
                "--container sends it, so that a target that cannot take it refuses before the "
                "freeze)");
  c->add_flag("--take-endpoints", o->take_endpoints,
              "With --new-pidns: hand the checkpoint's unix socket paths to the restored copy "
              "even if a live process serves them (refused by default)");
  c->add_option("--gpu-map", o->gpu_map, "GPU remapping OLD=NEW[,...] (UUIDs or indices)");
  o->staging.add(c, "Where the images are unpacked for CRIU (tmpfs)");
  c->add_flag("--new-pidns", o->new_pidns,
              "Restore into a new pid namespace (the checkpointed pid may be in use here)");
  c->add_option("--container", o->container,
                "A container checkpoint (dump --container), restored as a runc container "
                "under its ID, or NEW_ID (a second one beside it: a replica)")
      ->expected(0, 1)
      ->default_str("");
  c->add_option("--container-log", o->container_log,
                "With --container: file the restored container's stdout and stderr are "
                "appended to (default /var/log/gpuckpt/containers/ID.log)");
  o->pod.add(c, "namespace it");
  c->add_flag("--no-huge-pages", o->no_huge_pages, kNoHugePagesHelp);
  add_copy_streams(c, o->copy_streams);
  c->add_option("--threads", o->threads, kThreadsHelp)->check(CLI::Range(0u, 1024u));
  o->probe.add(c);
  o->criu.add(c);
  o->trust.add(c);
  c->callback([o, &ctx] { run_restore(*o, ctx); });
}

struct MigrateArgs {
  TargetFlags target;
  std::string new_id;
  PodNamespaceFlags pod;
  std::string to, gpu_map, ssh_config, remote_gpuckpt = "gpuckpt", spool, remote_spool;
  MigrateHandoff handoff = MigrateHandoff::kAuto;
  bool keep = false, no_huge_pages = false;
  int stall_timeout_s = 60;
  DumpFlags flags;
  ProbeFlags probe;
  TrustFlags trust;
};

void run_migrate(const MigrateArgs& o, Context& ctx) {
  o.target.require("migrate");
  MigrateOptions m;
  m.pid = o.target.pid;
  m.container = o.target.container;
  m.new_container_id = o.new_id;
  m.pod_namespaces = o.pod.resolve();
  m.to_dir = o.to;
  m.ssh_config = o.ssh_config;
  m.remote_gpuckpt = o.remote_gpuckpt;
  m.spool_root = o.spool;
  m.remote_spool_root = o.remote_spool;
  m.stall_timeout = std::chrono::seconds(o.stall_timeout_s);
  if (!o.gpu_map.empty()) m.gpu_map = parse_gpu_map(o.gpu_map);
  m.probe = o.probe.probe();
  m.keep_checkpoint = o.keep;
  o.flags.apply(m, ctx);
  m.huge_pages = !o.no_huge_pages;
  m.handoff = o.handoff;
  m.trust = o.trust.options();
  const MigrateResult res = migrate(m);  // holds the commit until this has reported it
  ctx.progress_done();
  if (ctx.json) {
    nlohmann::json j{{"ok", true},
                     {"pid", res.new_pid},
                     {"old_pid", res.old_pid},
                     {"handoff", handoff_name(res.handoff)},
                     {"target", res.target},
                     {"skipped_compression_bytes", res.skipped_compression_bytes},
                     {"container", res.container},
                     {"timeline", timeline_json(res.timeline)}};
    if (!res.target_result.is_null()) j["target_result"] = res.target_result;
    if (o.keep) j["checkpoint"] = res.checkpoint;
    if (m.probe.kind != ReadinessProbe::Kind::kNone) j["first_answer"] = res.first_answer;
    ctx.emit(j);
    return;
  }
  print_header(
      "migrated %spid %d -> pid %d on %s (%s handoff)%s",
      res.container.empty()
          ? ""
          : ("container " + o.target.container + " as " + res.container + ", init ").c_str(),
      res.old_pid, res.new_pid, res.target.c_str(), handoff_name(res.handoff),
      o.keep ? (" (checkpoint kept at " + res.checkpoint.string() + ")").c_str() : "");
  if (m.probe.kind != ReadinessProbe::Kind::kNone)
    print_header("first answer: %s", res.first_answer.c_str());
  if (res.skipped_compression_bytes > 0)
    print_header("%s of the images stored uncompressed, so that the writes kept up with them",
                 human_bytes(res.skipped_compression_bytes).c_str());
  print_stages(res.timeline);
}

void add_migrate(CLI::App& app, Context& ctx) {
  auto* c = app.add_subcommand(
      "migrate",
      "Move a process through a checkpoint in DIR; the old one ends only after the "
      "new one answers, and is resumed if anything fails");
  auto o = std::make_shared<MigrateArgs>();
  auto* box = o->target.add(c, "Root of the process tree to migrate",
                            "A whole runc container, by ID (as dump --container), which comes "
                            "back on the target as a container runc lists; the original ends "
                            "and runc forgets it once the copy answers");
  c->add_option("--new-id", o->new_id,
                "With --container: the copy's container ID (default: the original's). On this "
                "host a frozen handoff needs one, for the frozen original keeps its ID until "
                "the copy answers")
      ->needs(box);
  o->pod.add(c, "namespace its copy on the target");
  c->add_option("--handoff", o->handoff,
                "auto|frozen|release: frozen keeps the original frozen until the copy (in a new "
                "pid namespace) answers; release ends the original once the checkpoint is "
                "durable and restores the copy in place (needed for TCP listeners; a "
                "rollback restores the original). auto: release for TCP or abstract-socket "
                "listeners, else frozen; a container: release for a copy under its own ID, or "
                "for host-network listeners, else frozen")
      ->transform(
          enum_option({MigrateHandoff::kAuto, MigrateHandoff::kFrozen, MigrateHandoff::kRelease},
                      handoff_name));
  c->add_option("--to", o->to,
                "Where to: a directory on this host that the checkpoint is written to and "
                "restored from, or ssh://[USER@]HOST[:PORT], another host with gpuckpt (OpenSSH, "
                "BatchMode: keys or an agent, no prompts). Over ssh:// the checkpoint streams "
                "over one connection into `gpuckpt restore -` on HOST while it is written, and "
                "HOST restores as soon as the manifest is in and probes the copy; the original, "
                "kept frozen meanwhile, ends only after that, and any failure resumes it here "
                "and kills the copy there. The target's GPUs (chip, free VRAM) are checked "
                "before anything is frozen")
      ->required();
  c->add_option("--ssh-config", o->ssh_config, "ssh:// only: ssh configuration file (ssh -F)");
  c->add_option("--remote-gpuckpt", o->remote_gpuckpt,
                "ssh:// only: the gpuckpt command on the target (default: gpuckpt on its PATH)");
  c->add_option("--spool", o->spool,
                "ssh:// only: local directory for the checkpoint, written while it is sent "
                "(default $TMPDIR or /var/tmp)");
  c->add_option("--remote-spool", o->remote_spool,
                "ssh:// only: the target's directory for the checkpoint it receives");
  c->add_option("--stall-timeout", o->stall_timeout_s,
                "ssh:// only: seconds the target may take none of the checkpoint before the "
                "migration fails and the original resumes")
      ->check(CLI::PositiveNumber);
  c->add_option("--gpu-map", o->gpu_map, "GPU remapping OLD=NEW[,...] (UUIDs or indices)");
  c->add_flag("--keep-checkpoint", o->keep,
              "Keep the checkpoint after a successful migration (ssh://: in --spool, as "
              "COMM-PID.ckpt)");
  o->flags.add(c, {"Carry established TCP connections over (see dump --tcp-established)",
                   "Replace a checkpoint of this process already in --to (one that a failed "
                   "migration kept, so that it can be retried)",
                   "tmpfs staging directory for CRIU's images",
                   std::string(kThreadsHelp) + " (ssh://: this host's; the target uses its own)"});
  c->add_flag("--no-huge-pages", o->no_huge_pages, kNoHugePagesHelp);
  o->probe.add(c);
  o->trust.add(c);
  c->callback([o, &ctx] { run_migrate(*o, ctx); });
}

void run_recover(Context& ctx) {
  const std::vector<RecoveredOperation> done = recover_abandoned_operations();
  // A failover script reads the exit status: an operation not wholly undone (the original not
  // restored, a socket path not put back) exits with the code of its first failure.
  const RecoveryFailure* first = nullptr;
  for (const auto& r : done)
    if (!first && !r.failures.empty()) first = &r.failures.front();
  if (first) ctx.exit_code = static_cast<int>(first->code);
  if (ctx.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& r : done) {
      nlohmann::json failures = nlohmann::json::array();
      for (const auto& f : r.failures)
        failures.push_back({{"code", std::string(errc_name(f.code))}, {"message", f.what}});
      list.push_back({{"operation", r.operation},
                      {"gpuckpt_pid", r.gpuckpt_pid},
                      {"started", r.started},
                      {"journal", r.journal},
                      {"summary", r.summary},
                      {"complete", r.failures.empty()},
                      {"failures", failures}});
    }
    nlohmann::json out = {{"ok", first == nullptr}, {"recovered", list}};
    if (first)
      out["error"] = {{"code", std::string(errc_name(first->code))},
                      {"message", "not everything could be undone: " + first->what}};
    ctx.emit(out);
    return;
  }
  if (done.empty()) print_header("nothing to recover: no gpuckpt was killed with its guard");
  for (const auto& r : done)
    print_header("undid the %s of gpuckpt pid %d (started %s)%s: %s", r.operation.c_str(),
                 static_cast<int>(r.gpuckpt_pid), r.started.c_str(),
                 r.failures.empty() ? "" : ", not all of it", r.summary.c_str());
  if (first)
    std::fprintf(stderr, "gpuckpt: error: not everything could be undone: %s\n",
                 first->what.c_str());
}

void add_recover(CLI::App& app, Context& ctx) {
  auto* c = app.add_subcommand(
      "recover",
      "Undo what a dump, restore or migrate killed together with its guard left (a stopped "
      "process, a socket path moved aside, an unconfirmed copy), from its journal in "
      "/run/gpuckpt; every dump, restore and migrate does this first");
  c->callback([&ctx] { run_recover(ctx); });
}

}  // namespace

void add_process_commands(CLI::App& app, Context& ctx) {
  add_dump(app, ctx);
  add_restore(app, ctx);
  add_migrate(app, ctx);
  add_recover(app, ctx);
}

}  // namespace gpuckpt::cli
