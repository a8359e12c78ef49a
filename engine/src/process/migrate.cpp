// gpuckpt::migrate() on one host: dump the tree with the original kept stopped, write the
// checkpoint to the target directory, restore it, and end the original only once it can no
// longer be needed. Two handoffs (docs/PROCESS.md, "Migration"):
//   frozen:  the copy is restored into a new pid namespace while the original stays frozen; the
//            original ends after the copy answers. Rollback = kill the copy, resume the original.
//   release: the original's TCP ports and abstract sockets cannot be shared with a copy, so the
//            original ends as soon as the checkpoint is durable, and the copy is restored in
//            place. Rollback = kill the copy, restore the original from the same checkpoint.
// Every rollback is the guard's recovery (process/guard.h), so a signal or a crash of gpuckpt
// rolls back exactly like an error.
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <cctype>
#include <cstdlib>

#include "container/checkpoint.h"
#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/process.h"
#include "image/publish.h"
#include "probe/probe.h"
#include "process/dump_impl.h"
#include "process/guard.h"
#include "process/migrate_ssh.h"
#include "process/proc_info.h"
#include "process/restore_impl.h"
#include "process/support.h"
#include "remote/ssh.h"
#include "util/fault.h"
#include "util/utf8.h"

namespace fs = std::filesystem;

namespace gpuckpt {

const char* handoff_name(MigrateHandoff h) {
  switch (h) {
    case MigrateHandoff::kAuto:
      return "auto";
    case MigrateHandoff::kFrozen:
      return "frozen";
    case MigrateHandoff::kRelease:
      return "release";
  }
  return "?";
}

namespace {

MigrateHandoff choose_handoff(const MigrateOptions& o, const process::ProcInfo& info,
                              const process::ContainerMove* c) {
  bool release_needed = false;
  std::string why;
  // A container's copy gets a network namespace of its own if the original has one, or joins
  // another pod's (--join-ns naming another network namespace than the original's): its ports
  // and abstract names cannot clash there. But it shares the original's root filesystem, and
  // its runtime lists the frozen original under its ID until the copy answers.
  std::error_code ec;
  const auto net = o.pod_namespaces.find(PodNamespace::kNetwork);
  const bool other_pod =
      net != o.pod_namespaces.end() &&
      !fs::equivalent(net->second, "/proc/" + std::to_string(o.pid) + "/ns/net", ec);
  const bool own_network = c && (c->plan.record.own_network || other_pod);
  if (c && c->copy_id == c->box.id) {
    release_needed = true;
    why = "the copy takes the container's own ID, " + c->box.id;
  }
  for (pid_t q : process::process_tree(o.pid)) {
    if (!own_network && process::has_tcp_listener(q)) {
      release_needed = true;
      why = "process " + std::to_string(q) + " listens on a TCP port";
    }
    for (const auto& l : process::unix_listeners(q)) {
      // Moved aside for a rollback (a path, not an abstract name), which the guard must be able
      // to name.
      if (!l.abstract && !is_utf8(l.path))
        throw Error(Errc::kProcess,
                    "process " + std::to_string(q) +
                        " listens on a unix socket whose path is not "
                        "UTF-8, which a rollback could not put back (the guard names paths in "
                        "JSON); nothing was frozen. Dump and restore it instead");
      if (c && !l.abstract) {
        release_needed = true;
        why = "process " + std::to_string(q) + " listens on the unix socket " + l.path +
              " in the container's root filesystem, which its copy shares";
      }
      if (!l.abstract || own_network) continue;
      release_needed = true;
      why = "process " + std::to_string(q) + " listens on the abstract unix socket " + l.path;
    }
  }
  if (o.handoff == MigrateHandoff::kFrozen && release_needed)
    throw Error(Errc::kUsage, "--handoff frozen is impossible for the tree of " +
                                  std::to_string(o.pid) + " (" + info.comm + "): " + why +
                                  ", which a copy beside the frozen original could not take. "
                                  "Use --handoff release (the default for it)" +
                                  (c ? std::string(", or a new ID for the copy (--new-id)") : ""));
  if (o.handoff != MigrateHandoff::kAuto) return o.handoff;
  if (release_needed) spdlog::info("handoff: release ({})", why);
  return release_needed ? MigrateHandoff::kRelease : MigrateHandoff::kFrozen;
}

}  // namespace

namespace process {

std::string checkpoint_name(const std::string& comm, pid_t pid) {
  std::string name;
  for (const char c : comm)
    name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '+' ||
                    (c == '.' && !name.empty())
                ? c
                : '_';
  if (name.empty()) name = "process";
  return name + "-" + std::to_string(pid) + ".ckpt";
}

DumpOptions migration_dump(const MigrateOptions& o, const fs::path& output) {
  DumpOptions d;
  d.pid = o.pid;  // a container's init (migrate() resolved it)
  d.output = output;
  d.leave_running = false;  // kept stopped: dump_keep_stopped does not end it
  d.staging_root = o.staging_root;
  d.staging_mode = o.staging_mode;
  d.pack = o.pack;
  d.lock_timeout = o.lock_timeout;
  d.tcp_established = o.tcp_established;
  d.carry_rootfs = o.carry_rootfs;
  d.criu = o.criu;
  return d;
}

namespace {

// The original container has ended: its runtime forgets it (runc delete). Said, not thrown: the
// copy serves, or the checkpoint is durable, either way.
void forget_original(const ContainerMove* c) {
  if (!c) return;
  if (const std::string why = container::remove_ended(c->box); !why.empty())
    spdlog::warn("the original container ended, but runc still lists it: {}", why);
}

}  // namespace

void release_original(const MigrateOptions& o, const DumpOutcome& dumped,
                      const fs::path& checkpoint, Guard& guard, Timeline& tl,
                      const ContainerMove* c) {
  guard.restore_on_recovery(checkpoint, o.staging_root, o.criu.binary, c ? c->box.id : "");
  auto scope = tl.scope(stage::kEndOriginal);
  if (const auto left = end_tree(dumped.record.tree); !left.empty()) {
    const std::string undone = guard.abort();
    throw Error(Errc::kProcess, "migration failed: process " + std::to_string(left.front()) +
                                    " of the original tree did not end after SIGKILL; " + undone);
  }
  // Its ID is free for the copy, or for the rollback's restore of the original (which would
  // delete a stopped entry itself).
  forget_original(c);
}

void end_original(const DumpOutcome& dumped, const ContainerMove* c, Timeline& tl) {
  auto scope = tl.scope(stage::kEndOriginal);
  if (const auto left = end_tree(dumped.record.tree); !left.empty()) {
    spdlog::warn("process {} of the original tree did not end after SIGKILL", left.front());
    return;
  }
  forget_original(c);
}

}  // namespace process

namespace {

bool holds_gpu(const container::Container& box);
MigrateResult migrate_tree(const MigrateOptions& o, const process::ContainerMove* c);

}  // namespace

MigrateResult migrate(const MigrateOptions& opts) {
  using namespace process;
  if (opts.to_dir.empty()) throw Error(Errc::kUsage, "no target directory given");
  if (opts.container.empty()) {
    if (opts.pid <= 0) throw Error(Errc::kUsage, "no pid given");
    if (!opts.new_container_id.empty())
      throw Error(Errc::kUsage, "a new container ID is for a container (--container)");
    if (!opts.pod_namespaces.empty())
      throw Error(Errc::kUsage,
                  "--join-ns and --netns name the namespaces a container joins: they are "
                  "for --container only");
    if (opts.carry_rootfs)
      throw Error(Errc::kUsage,
                  "--with-rootfs carries a container's rootfs: it is for "
                  "--container only");
    return migrate_tree(opts, nullptr);
  }
  if (opts.pid > 0) throw Error(Errc::kUsage, "give --pid or --container, not both");
  // The container's init is the tree's root from here on.
  ContainerMove c;
  c.box = container::find(opts.container);
  // On this host the copy runs on the rootfs that is here: nothing to carry.
  const bool carry = opts.carry_rootfs && remote::is_ssh_url(opts.to_dir.string());
  if (opts.carry_rootfs && !carry)
    spdlog::info("--with-rootfs: the copy runs on this host, on the rootfs here; not carried");
  c.plan = container::plan_dump(c.box, opts.tcp_established, carry);
  c.copy_id = opts.new_container_id.empty() ? c.box.id : opts.new_container_id;
  c.cuda = holds_gpu(c.box);
  MigrateOptions o = opts;
  o.pid = c.box.init_pid;
  MigrateResult res = migrate_tree(o, &c);
  res.container = c.copy_id;
  return res;
}

namespace {

// Whether the container's tree holds the GPU's device files (so its dump carries CUDA state).
bool holds_gpu(const container::Container& box) {
  // Tests name what stands for /dev/nvidia* there, as they do for the plugin.
  const char* test = std::getenv(criu::kEnvTestDevicePrefix);
  const std::string prefix = test && *test ? test : "/dev/nvidia";
  for (pid_t p : process::process_tree(box.init_pid))
    if (device::holds_device_files(p, prefix)) return true;
  return false;
}

// A copy that its runtime's CRIU restores without gpuckpt's settings (Docker, containerd 2.0)
// needs gpuckpt's plugin where that CRIU loads plugins, if the container holds a GPU: checked
// before the freeze, not once the original is dumped (a rollback). Over ssh the target checks
// its own, told by the expected container's "cuda".
void require_copy_gets_plugin(const process::ContainerMove& c) {
  if (!c.cuda) return;
  if (const std::string why = container::stream_refusal(c.plan.record); !why.empty())
    container::require_runc_criu_loads_plugin(criu::locate().plugin_dir, why);
}

MigrateResult migrate_tree(const MigrateOptions& o, const process::ContainerMove* c) {
  using namespace process;
  require_socket_probe(o.probe);
  const auto info = read_proc(o.pid);
  require_live(o.pid, info);
  // Both halves' options, before the freeze: a restore's refusal after it (after the original
  // ended, in a release) would cost the rollback instead of the command line.
  const bool over_ssh = remote::is_ssh_url(o.to_dir.string());
  criu::check_extra_args(criu::Op::kDump, o.criu.extra_args);
  if (!over_ssh) criu::check_extra_args(criu::Op::kRestore, o.criu.extra_args);
  if (over_ssh) return migrate_over_ssh(o, c);
  MigrateResult res;
  res.old_pid = o.pid;
  res.target = "this host";
  res.handoff = choose_handoff(o, *info, c);
  Guard guard("migrate");
  // The copy's ID, and the original's that a release's rollback restores it under, are held
  // against another restore from before their checks to the end of the migration.
  if (c) {
    guard.lock_container_restore(c->plan.record.root, c->copy_id);
    if (res.handoff == MigrateHandoff::kRelease)
      guard.lock_container_restore(c->plan.record.root, c->box.id);
  }
  // A new ID for the copy must be free before the freeze (the original's own is freed by the
  // release; its rootfs and mounts are here, as the original runs).
  if (c && c->copy_id != c->box.id) {
    container::check_restore_target(c->plan.record, c->copy_id, o.pod_namespaces);
  } else if (c && !o.pod_namespaces.empty()) {
    // Its own ID, freed by the release: only where the copy joins.
    container::check_joined_namespaces(c->plan.record, o.pod_namespaces);
    container::require_new_record_for_joins(c->plan.record, c->box.id, o.pod_namespaces);
  }
  if (c) require_copy_gets_plugin(*c);
  require_utf8_path(fs::absolute(o.to_dir), "--to directory");
  std::error_code ec;
  fs::create_directories(o.to_dir, ec);
  if (ec) throw Error(Errc::kIo, "cannot create " + o.to_dir.string() + ": " + ec.message());
  res.checkpoint = o.to_dir / checkpoint_name(info->comm, o.pid);

  // On failure the original already runs again.
  DumpOutcome dumped =
      dump_keep_stopped(migration_dump(o, res.checkpoint), guard, {}, c ? &c->plan : nullptr);
  res.timeline = dumped.result.timeline;
  res.image_bytes = dumped.result.image_bytes;
  res.checkpoint_bytes = dumped.result.checkpoint_bytes;
  res.adaptive_compression = compression_adapts(o.pack.compression, false);
  res.skipped_compression_bytes = dumped.result.skipped_compression_bytes;
  const bool release = res.handoff == MigrateHandoff::kRelease;
  // The ports and pids pass to the copy. Frozen, the original's socket paths are moved aside
  // for the copy (restore_into), and put back by a rollback.
  if (release) release_original(o, dumped, res.checkpoint, guard, res.timeline, c);

  RestoreOptions r;
  r.checkpoint = res.checkpoint;
  r.gpu_map = o.gpu_map;
  r.staging_root = o.staging_root;
  r.staging_mode = o.staging_mode;
  r.unpack.progress = o.pack.progress;
  r.unpack.threads = o.pack.threads;
  r.probe = o.probe;
  if (c) {
    r.container = c->copy_id;  // namespaces of its own, made by runc
    r.pod_namespaces = o.pod_namespaces;
  } else {
    r.new_pid_ns = !release;
    r.take_endpoints = true;  // the copy is meant to take the original's socket paths
  }
  r.huge_pages = o.huge_pages;
  r.criu = o.criu;
  r.criu.check = false;  // checked by the dump a moment ago
  r.trust = o.trust;
  RestoreResult restored;
  try {
    restore_into(r, restored, &guard, /*provisional=*/true);
  } catch (...) {
    const std::string undone = guard.abort();
    rethrow_with_context(
        "migration failed: ",
        "\nrollback: " + undone + "; the checkpoint is kept at " + res.checkpoint.string());
  }
  res.timeline.append(restored.timeline);
  res.new_pid = restored.pid;
  res.first_answer = restored.first_answer;
  res.huge_page_bytes = restored.huge_page_bytes;

  // The copy answers (or, without a probe, was restored): it is the service from here on, and
  // the original may end. Told to the guard before the original ends, in one step: gpuckpt
  // stopped at any point after this leaves the copy serving and the original ended, never
  // neither (a copy killed after its original) nor both.
  // Committed: an interrupt from here on lets the migration finish and report the copy.
  res.committed = std::make_shared<const CommitScope>();
  guard.hand_over(/*end_original=*/!release);
  if (!release) {
    fault_point(fault::kEndOriginal);
    end_original(dumped, c, res.timeline);
  }
  guard.disarm();
  if (!o.keep_checkpoint) {
    try {
      fault_point(fault::kRemoveCheckpoint);
      image::unpublish(res.checkpoint);
    } catch (const Error& e) {
      spdlog::warn("{}", e.what());
    }
  }
  return res;
}

}  // namespace

}  // namespace gpuckpt
