// The restore half of container/checkpoint.h: what a target host must have first
// (check_restore_target) and the restore through each runtime (restore_container).
// checkpoint.cpp has the dump and the runtimes' lifecycle calls.
#include "container/checkpoint.h"

#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <xxhash.h>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "container/containerd.h"
#include "container/docker.h"
#include "container/internal.h"
#include "container/pod.h"
#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/support.h"
#include "process/proc_info.h"
#include "process/support.h"
#include "util/fs.h"
#include "util/no_sigpipe.h"
#include "util/pipe.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt::container {

namespace {

// Where a restore keeps the bundle it made of the recorded spec: runc reads it once, but names
// it as the container's bundle for as long as the container lives.
constexpr const char* kBundlesDir = "/run/gpuckpt/containers";
// Where a restored container's stdout and stderr go by default: beside the host's logs, not in
// a tmpfs, and kept after the container ends.
constexpr const char* kLogsDir = "/var/log/gpuckpt/containers";

// Whether an overlay with upper directory `upper` is mounted here: its container runs, or its
// runtime has not let go of its rootfs yet.
bool upper_mounted(const fs::path& upper) {
  const std::string opt = "upperdir=" + upper.string();
  for (const auto& m : mounts_of(::getpid()))
    if (m.fstype == "overlay" && ("," + m.options + ",").find("," + opt + ",") != std::string::npos)
      return true;
  return false;
}

// tar (`argv`, reading its archive from stdin) fed by `write`, which is given a pipe. A tar that
// stops reading early makes `write` see EPIPE, and tar's own exit says why.
ExitStatus extract_streamed(const std::vector<std::string>& argv,
                            const std::function<void(int fd)>& write) {
  auto [out, in] = make_pipe("pipe2");
  SpawnOptions so;
  so.stdin_fd = out.get();
  so.new_process_group = true;
  so.die_with_parent = true;  // a directory it fills may be the guard's to remove
  Child tar = spawn(argv, so);
  out.reset();
  try {
    NoSigpipe nosig;  // a tar gone: EPIPE, not gpuckpt's death
    write(in.get());
  } catch (...) {
    in.reset();
    tar.kill(SIGKILL);
    tar.wait();
    throw;
  }
  in.reset();
  return tar.wait();
}

std::string carried_what(const ContainerRecord& r) {
  return r.layer == WritableLayer::kRootfs ? "rootfs" : "writable layer";
}

// The archive of what the checkpoint carries of the container's files (layer_file()): "-" for
// a streamed restore's, which q.write_layer writes. Throws Error(kCorrupt) if it is missing.
std::string layer_archive(const RestoreRequest& q) {
  if (q.write_layer) return "-";
  const std::string name = layer_file(q.record->layer);
  const fs::path file = q.images / name;
  std::error_code ec;
  if (!fs::exists(file, ec))
    throw Error(Errc::kCorrupt, "the checkpoint's record says it carries the container's " +
                                    carried_what(*q.record) + ", but its images have no " + name);
  return file.string();
}

// `archive` (layer_archive's) extracted into `dir`; its bytes into `scope`.
void extract_layer(const RestoreRequest& q, const std::string& archive, const fs::path& dir,
                   std::optional<Timeline::Scope>& scope) {
  std::error_code ec;
  if (scope) scope->set_bytes(q.write_layer ? q.layer_bytes : fs::file_size(archive, ec));
  // From a streamed checkpoint, the archive comes on tar's stdin.
  const std::vector<std::string> argv{"tar",
                                      "--extract",
                                      "--file",
                                      archive,
                                      "--numeric-owner",
                                      "--xattrs",
                                      "--xattrs-include=*",
                                      "--same-permissions",
                                      "-C",
                                      dir.string()};
  SpawnOptions so;
  so.die_with_parent = true;
  const ExitStatus st = q.write_layer ? extract_streamed(argv, q.write_layer)
                                      : run_capture(argv, std::chrono::minutes(30), so).status;
  if (!st.ok())
    throw Error(Errc::kIo, "extracting the container's " + carried_what(*q.record) + " into " +
                               dir.string() + " failed (" + st.describe() + ")");
}

// The container's writable layer as the checkpoint holds it, into `upper`: the upper directory
// of the container that the restore starts. One made for it (`fresh`) has an empty one; the one
// dumped has whatever it holds now, which is the checkpoint's only if nothing ran in it since,
// so it is emptied first. A layer the checkpoint does not carry leaves the one dumped as it is
// (check_restore_target refuses to make a new one without it).
void set_writable_layer(const RestoreRequest& q, const fs::path& upper, bool fresh) {
  const ContainerRecord& r = *q.record;
  if (r.layer != WritableLayer::kEmpty && r.layer != WritableLayer::kCarried) return;
  if (fresh && r.layer == WritableLayer::kEmpty) return;
  // Before the dumped one's layer is emptied.
  const std::string archive = r.layer == WritableLayer::kCarried ? layer_archive(q) : "";
  std::optional<Timeline::Scope> scope;
  if (q.timeline) scope.emplace(*q.timeline, stage::kRootfsApply);
  if (upper.empty())
    throw Error(
        Errc::kInvalidInput,
        "the checkpoint holds the container's writable layer, but the snapshot of container " +
            q.id + " has no overlay upper directory to put it in");
  if (!fresh) {
    if (upper_mounted(upper))
      throw Error(Errc::kExists, "the rootfs of container " + q.id + " is still mounted (" +
                                     upper.string() +
                                     "): its runtime has not let go of it. Nothing was restored");
    for (const auto& e : fs::directory_iterator(upper)) fs::remove_all(e.path());
  }
  if (!archive.empty()) extract_layer(q, archive, upper, scope);
}

// Whether the rootfs that `r` carries is here already, to be run on as it is: the directory that
// was dumped (this boot's, by its device, inode and birth time), or one that a restore unpacked
// from this checkpoint (its token). False if nothing is at its path. Anything else there (a copy of
// the bundle, one unpacked from another checkpoint) may hold other files than the checkpoint's
// processes had: Error(kExists).
bool carried_rootfs_here(const ContainerRecord& r) {
  if (!r.rootfs_origin) throw Error(Errc::kCorrupt, "the container record's rootfs has no origin");
  struct stat st {};
  if (::lstat(r.rootfs.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    throw_errno(Errc::kIo, "stat ", r.rootfs);
  }
  const RootfsOrigin& o = *r.rootfs_origin;
  if (S_ISDIR(st.st_mode)) {
    if (!o.boot_id.empty() && o.boot_id == boot_id() && dir_identity(r.rootfs) == o.dir)
      return true;
    char v[128];
    const ssize_t n = ::lgetxattr(r.rootfs.c_str(), kRootfsTokenXattr, v, sizeof v);
    if (n > 0 && std::string_view(v, static_cast<std::size_t>(n)) == o.token) return true;
  }
  throw Error(Errc::kExists,
              r.rootfs +
                  " is here, but is neither the container's rootfs that was dumped nor one "
                  "unpacked from this checkpoint, and may hold other files than its processes "
                  "had: move it away, and the restore unpacks the checkpoint's own. Nothing was "
                  "restored");
}

// The carried rootfs a restore runs on, and its hold of it (hold_rootfs) until its container
// runs. `placed`: the restore unpacked it ("" if it was there).
struct CarriedRootfs {
  fs::path placed;
  RootfsHold held;
};

// The rootfs at `r`'s path, held, where one is there and is the checkpoint's; nullopt where
// nothing is. Anything else there is refused (carried_rootfs_here).
std::optional<RootfsHold> hold_carried(const ContainerRecord& r) {
  for (;;) {
    RootfsHold held = hold_rootfs(r.rootfs);
    // Nothing there (any more: a restore that failed removed it after it was held).
    if (!carried_rootfs_here(r)) return std::nullopt;
    if (held) return held;
    // A directory came after hold_rootfs found none: that one is held next.
  }
}

// A runc bundle's rootfs that the checkpoint carries, where the recorded one is missing (a host
// without the bundle): unpacked beside it, marked with the checkpoint's token and renamed into
// place, so that a restore that dies half-way leaves no partial rootfs for the next one to take
// as whole. One that is the checkpoint's already is run on as it is (carried_rootfs_here).
CarriedRootfs place_carried_rootfs(const RestoreRequest& q) {
  const ContainerRecord& r = *q.record;
  if (r.layer != WritableLayer::kRootfs) return {};
  const fs::path dest = r.rootfs;
  if (auto theirs = hold_carried(r)) return {{}, std::move(*theirs)};
  const std::string archive = layer_archive(q);
  std::optional<Timeline::Scope> scope;
  if (q.timeline) scope.emplace(*q.timeline, stage::kRootfsApply);
  fs::create_directories(dest.parent_path());
  TempDir tmp = TempDir::beside(dest, q.on_path_made);
  extract_layer(q, archive, tmp.path(), scope);
  const std::string& token = r.rootfs_origin->token;
  if (::lsetxattr(tmp.path().c_str(), kRootfsTokenXattr, token.data(), token.size(), 0) != 0)
    spdlog::warn(
        "cannot mark {} as this checkpoint's ({}): a replica restored beside it will "
        "refuse it",
        dest.string(), std::strerror(errno));
  fault_point(fault::kRootfsUnpacked);
  tmp.unmark();
  // Held from before it is in place: no other restore's failure removes it under this one.
  RootfsHold held = hold_rootfs(tmp.path());
  // The guard learns of it before it is there, by the identity it keeps through the rename: a
  // path that later holds another directory is not removed. After an abort this throws, and
  // nothing is renamed.
  const auto id = dir_identity(tmp.path());
  if (!held || !id)
    throw Error(Errc::kIo, "the unpacked rootfs " + tmp.path().string() + " is gone");
  if (q.on_rootfs_placed) q.on_rootfs_placed(dest, *id);
  while (::renameat2(AT_FDCWD, tmp.path().c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    if (err != EEXIST) throw_syserr(Errc::kIo, err, "rename the unpacked rootfs to ", dest);
    // Another restore of this checkpoint placed it first: run on that one (tmp goes). One that
    // failed since and removed it has left the path free again.
    if (auto theirs = hold_carried(r)) return {{}, std::move(*theirs)};
  }
  tmp.release();
  fsync_dir(dest.parent_path());
  spdlog::info("unpacked the container's rootfs from the checkpoint into {}", dest.string());
  return {dest, std::move(held)};
}

}  // namespace

fs::path restore_dir(const fs::path& root, const std::string& id) {
  if (!valid_id(id)) throw Error(Errc::kUsage, "'" + id + "' is no container ID runc accepts");
  // One directory per runc root: the same ID under two (two containerd namespaces, runc's and
  // Docker's) names two containers. And one root however it is spelled (/var/run/runc and
  // /run/runc/ are /run/runc), for this directory's lock is what keeps two restores apart.
  std::error_code ec;
  std::string r = fs::weakly_canonical(root, ec).native();
  if (ec) r = root.lexically_normal().native();
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  char key[17];
  std::snprintf(key, sizeof key, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(r.data(), r.size())));
  return fs::path(kBundlesDir) / key / id;
}

namespace {

fs::path make_restore_dir(const fs::path& root, const std::string& id) {
  const fs::path dir = restore_dir(root, id);
  fs::create_directories(dir);
  ::chmod(kBundlesDir, 0700);
  return dir;
}

}  // namespace

namespace {

// crun's directory of container `id` under `root` that has no status (half-made, or being made).
bool crun_without_status(const fs::path& root, const std::string& id) {
  std::error_code ec;
  return valid_id(id) && fs::is_directory(root / id, ec) && !fs::exists(root / id / "status", ec) &&
         !fs::exists(root / id / "state.json", ec);
}

// Where crun's CRIU writes the restored init's pid (its `pidfile`), in the restore's bundle.
fs::path crun_pidfile(const fs::path& root, const std::string& id) {
  return restore_dir(root, id) / "restored.pid";
}

// Ends the tree whose init a crun restore's CRIU restored (crun_pidfile) where crun failed or was
// killed before it wrote the container's status: nothing else knows it, and in a migration it
// would serve beside the original. A pid whose process started after the file was written is
// another's.
void end_unlisted_init(const fs::path& pidfile) {
  std::error_code ec;
  const auto written = fs::last_write_time(pidfile, ec);
  if (ec) return;
  pid_t pid = 0;
  try {
    pid = std::stoi(read_file(pidfile));
  } catch (const std::exception&) {
    return;
  }
  const auto started = process::start_ticks(pid);
  double uptime = 0;
  if (pid <= 0 || !started || !(std::ifstream("/proc/uptime") >> uptime)) return;
  const double age_s =
      std::chrono::duration<double>(fs::file_time_type::clock::now() - written).count();
  const double written_ticks = (uptime - age_s) * static_cast<double>(::sysconf(_SC_CLK_TCK));
  if (static_cast<double>(*started) > written_ticks + 1) return;
  spdlog::warn("crun restored container init {} but never listed it: ending it", pid);
  if (const auto left = process::end_tree(process::process_tree(pid), 10000); !left.empty())
    spdlog::warn("the restored tree of init {} did not end", pid);
}

}  // namespace

std::string remove_half_made(const Container& c) {
  if (c.root.runtime != Runtime::kCrun || !crun_without_status(c.root.path, c.id)) return {};
  const fs::path dir = c.root.path / c.id;
  json spec;
  try {
    spec = json::parse(read_file(dir / "config.json"));
  } catch (const std::exception&) {
    return {};  // not crun's copy of a spec gpuckpt wrote: not ours to remove
  }
  const json notes = spec.is_object() ? spec.value("annotations", json::object()) : json();
  if (!notes.is_object() || notes.value("org.criu.config", json()) !=
                                (restore_dir(c.root.path, c.id) / "criu.conf").string())
    return {};
  end_unlisted_init(crun_pidfile(c.root.path, c.id));
  auto argv = runtime_argv(Runtime::kCrun, c.root.path.string());
  argv.insert(argv.end(), {"delete", "--force", c.id});
  const RunResult res = run_capture(argv, std::chrono::seconds(60));
  std::error_code ec;
  if (!res.status.ok() || fs::exists(dir, ec))
    return "crun delete --force " + c.id + " left " + dir.string() + ": " + res.output;
  return {};
}

process::HeldLockFile lock_restore_target(const std::string& root, const std::string& id) {
  const fs::path dir = restore_dir(root, id);
  fs::create_directories(dir.parent_path());
  ::chmod(kBundlesDir, 0700);
  if (auto lock = process::try_lock_file(dir.string() + ".lock")) return std::move(*lock);
  throw Error(Errc::kExists, "another gpuckpt is restoring a container " + id + " (root " + root +
                                 ") now: one restore under an ID at a time. Wait for it, or "
                                 "restore under another ID (--container NEW_ID). Nothing was "
                                 "restored");
}

bool made_by_restore(const Container& c, const json& state) {
  if (!runs_bundles(c.root.runtime)) return true;
  const std::string bundle = bundle_of(state.is_object() ? state.value("config", json()) : json());
  if (!valid_id(c.id) || bundle.empty()) return false;
  const fs::path ours = restore_dir(c.root.path, c.id);
  // Lexically first: a replay's bundle directory may be gone. Then as the runtime may have
  // resolved it (its working directory).
  std::error_code ec;
  return fs::path(bundle).lexically_normal() == ours.lexically_normal() ||
         fs::equivalent(bundle, ours, ec);
}

void remove_restore_bundle(const fs::path& root, const std::string& id) {
  if (!valid_id(id)) return;
  std::error_code ec;
  fs::remove_all(restore_dir(root, id), ec);
}

namespace {

// A bare runtime's (runc's, crun's) target.
void check_runc_target(const ContainerRecord& r, const std::string& id) {
  const std::string name = container_runtime_name(r.runtime);
  try {
    (void)(r.runtime == Runtime::kCrun ? crun_binary() : runc_binary());
  } catch (const Error& e) {
    throw e.with_context("", ". Nothing was restored");
  }
  const StateRoot root{r.runtime, r.root, ""};
  if (r.runtime == Runtime::kCrun && crun_without_status(root.path, id))
    throw Error(Errc::kExists,
                "crun (root " + r.root + ") holds a container " + id +
                    " without its status: one being made, or left by a restore or `crun run` "
                    "that failed. If none runs, delete it (crun --root " +
                    r.root + " delete --force " + id +
                    "), or restore under another ID (--container NEW_ID). Nothing was restored");
  const auto roots = state_roots();
  if (std::none_of(roots.begin(), roots.end(),
                   [&](const StateRoot& k) { return k.path == root.path; }))
    throw Error(Errc::kInvalidInput, "the checkpoint's " + name + " root " + r.root +
                                         " is none that gpuckpt knows here: name it in "
                                         "$GPUCKPT_RUNC_ROOTS. Nothing was restored");
  if (state_json(root, id)) {
    const auto all = running();
    if (std::any_of(all.begin(), all.end(),
                    [&](const Container& c) { return c.id == id && c.root.path == root.path; }))
      throw Error(Errc::kExists, name + " (root " + r.root + ") already has a container " + id +
                                     " running: restore under another ID (--container NEW_ID)");
    // Stopped: a dump that ended it but was itself ended before its runtime forgot it. Nothing
    // of it runs, so nothing is lost by forgetting it now.
    spdlog::info("{} (root {}) still lists the ended container {}: deleting it", name, r.root, id);
    if (const std::string why = remove_ended({root, id}); !why.empty())
      throw Error(Errc::kExists, name + " (root " + r.root + ") has a stopped container " + id +
                                     " that could not be deleted: " + why);
  }
}

// The criu that containerd's shims run for Docker, which passes them no CRIU binary: the first
// on the PATH that the shim gets, which containerd's "opt" directory starts
// (docs/research/docker-containerd.md, "How the runc shim picks the CRIU binary").
std::optional<fs::path> shim_criu() {
  std::vector<std::string> dirs{"/var/lib/containerd/opt/bin"};
  for (const pid_t d : process::live_pids_where(
           [](const process::ProcInfo& i) { return i.comm == "containerd"; })) {
    std::ifstream in("/proc/" + std::to_string(d) + "/environ");
    for (std::string e; std::getline(in, e, '\0');)
      if (e.rfind("PATH=", 0) == 0) {
        std::istringstream p(e.substr(5));
        for (std::string dir; std::getline(p, dir, ':');) dirs.push_back(dir);
      }
  }
  for (const auto& d : dirs) {
    const fs::path c = fs::path(d) / "criu";
    if (::access(c.c_str(), X_OK) == 0) return c;
  }
  return std::nullopt;
}

// The name a container made for a restore of `r` as `id` gets: the dumped one's, for a restore
// under its own ID (on a spare that has no such container).
std::string docker_create_name(const ContainerRecord& r, const std::string& id) {
  return id == r.id ? r.docker->name : id;
}

// A container made for the restore starts from its image: without the dumped one's writable
// layer, the files it wrote would be gone from under its processes.
void require_layer_carried(const ContainerRecord& r, const std::string& id) {
  if (r.layer == WritableLayer::kNotCarried)
    throw Error(Errc::kInvalidInput,
                "the checkpoint does not carry the writable layer of container " + r.id + " (" +
                    r.layer_why + "): it can be restored only into that container, on the host " +
                    "it was dumped on, not as a new container " + id + ". Nothing was restored");
}

void check_containerd_target(const ContainerRecord& r, const std::string& id,
                             const PodNamespaces& joins) {
  const ContainerdRecord& d = *r.containerd;
  containerd::Client api(containerd::address(), d.ns);
  std::optional<containerd::ContainerInfo> have;
  try {
    have = api.container(id);
  } catch (const Error& e) {
    throw e.with_context(
        "the checkpoint's container is containerd's, and containerd does not "
        "answer here (CONTAINERD_ADDRESS names its socket): ",
        ". Nothing was restored");
  }
  if (have) {
    const auto t = api.task(id);
    if (t && t->status != containerd::TaskStatus::kStopped)
      throw Error(Errc::kExists, "containerd (namespace " + d.ns + ") already runs container " +
                                     id + ": restore under another ID (--container NEW_ID)");
    if (id != r.id)
      throw Error(Errc::kExists, "containerd (namespace " + d.ns + ") already has a container " +
                                     id + " that is not the one dumped (" + r.id +
                                     "): remove it (ctr container rm) or choose another ID");
    require_new_record_for_joins(r, id, joins);
    return;  // the container dumped, its task ended: restored in place
  }
  // A new container record, over the image's own top layer.
  require_layer_carried(r, id);
  if (api.snapshot_parent(d.snapshotter, id))
    throw Error(Errc::kExists, "containerd's snapshotter " + d.snapshotter +
                                   " already has a snapshot " + id + ", which a new container " +
                                   id + " would take as its rootfs: remove it (ctr snapshots rm " +
                                   id + ") or choose another ID. Nothing was restored");
  if (!d.snapshot_parent.empty() && !api.snapshot_parent(d.snapshotter, d.snapshot_parent))
    throw Error(Errc::kInvalidInput,
                "the image " + d.image + " of the checkpoint's container is not unpacked here (" +
                    d.snapshotter + " has no snapshot " + d.snapshot_parent +
                    "): import it and unpack it (ctr image import; ctr image unpack). Nothing "
                    "was restored");
}

void check_docker_target(const ContainerRecord& r, const std::string& id) {
  docker::Client api;
  std::optional<json> have;
  try {
    have = api.inspect(id);
    require_docker_restores(api);
  } catch (const Error& e) {
    throw e.with_context("the checkpoint's container is Docker's: ", ". Nothing was restored");
  }
  if (have && docker::flag_at(*have, {"State", "Running"}))
    throw Error(Errc::kExists, "Docker already runs container " + id +
                                   ": restore under another name (--container NAME)");
  const std::string full = have ? docker::string_at(*have, {"Id"}) : "";
  const DockerRecord& d = *r.docker;
  if (!have) {
    // What it will be created as: the dumped one's name, under its own ID.
    const std::string name = docker_create_name(r, id);
    if (const auto other = name == id ? std::nullopt : api.inspect(name))
      throw Error(Errc::kExists, "Docker already has a container named " + name + " (" +
                                     docker::string_at(*other, {"Id"}).substr(0, 12) +
                                     "), which is not the one dumped: remove it (docker rm " +
                                     name +
                                     ") or restore under another name. Nothing was "
                                     "restored");
    require_layer_carried(r, id);
  }
  if (!have && !d.image_id.empty() && !api.image(d.image_id))
    throw Error(Errc::kInvalidInput, "the image " + docker::string_at(d.config, {"Image"}) + " (" +
                                         d.image_id +
                                         ") of the checkpoint's container is not here: load it "
                                         "(docker load or import). Nothing was restored");
  if (have && full != r.id)
    throw Error(Errc::kExists, "Docker already has a container " + id +
                                   " that is not the one dumped: remove it (docker rm) or choose "
                                   "another name");
  if (!shim_criu())
    throw Error(Errc::kCriu,
                "containerd's shim finds no criu to run for Docker's restore: link gpuckpt's CRIU "
                "into containerd's opt directory (ln -s " +
                    std::string(GPUCKPT_CRIU_PREFIX) +
                    "/bin/criu /var/lib/containerd/opt/bin/criu). Nothing was restored");
}

// The host paths beside its rootfs that a restore of `r` needs to find: the sources of the
// runtime's bind mounts (volumes, model directories, the driver's files) but Docker's own
// per-container files (resolv.conf, hosts, hostname).
std::vector<std::string> mount_sources_needed(const ContainerRecord& r) {
  std::vector<std::string> out;
  for (const auto& m : r.mounts)
    if (r.runtime != Runtime::kDocker ||
        m.source.find("/containers/" + r.id + "/") == std::string::npos)
      out.push_back(m.source);
  return out;
}

}  // namespace

void check_restore_target(const ContainerRecord& r, const std::string& id,
                          const PodNamespaces& joins) {
  // First: the checks below may act (delete a stopped container of the ID).
  if (r.layer == WritableLayer::kRootfs) (void)carried_rootfs_here(r);
  check_joined_namespaces(r, joins);
  if (r.runtime == Runtime::kDocker) {
    check_docker_target(r, id);
  } else {
    if (!valid_id(id))
      throw Error(Errc::kUsage, "'" + id +
                                    "' is no container ID runc accepts (letters, digits, _ + - "
                                    "and .): nothing was restored");
    if (r.runtime == Runtime::kContainerd) {
      check_containerd_target(r, id, joins);
    } else {
      check_runc_target(r, id);
    }
  }
  std::error_code ec;
  if (runs_bundles(r.runtime) && r.layer != WritableLayer::kRootfs &&
      !fs::exists(fs::symlink_status(r.rootfs, ec)))
    throw Error(Errc::kInvalidInput,
                r.rootfs +
                    ", the container's root filesystem, is not here: copy its bundle here, or "
                    "dump it with --with-rootfs, whose checkpoint carries it. Nothing was "
                    "restored");
  for (const auto& p : mount_sources_needed(r))
    if (!fs::exists(fs::symlink_status(p, ec)))
      throw Error(Errc::kInvalidInput, p + ", the source of one of the container's mounts, is not "
                                           "here: nothing was restored");
}

namespace {

std::string criu_config_text(const RestoreRequest& q) {
  std::string conf;
  for (const auto& l : q.criu_config) conf += l + "\n";
  return conf;
}

fs::path stdio_log(const RestoreRequest& q) {
  if (!q.stdio_log.empty()) return q.stdio_log;
  fs::create_directories(kLogsDir);
  return fs::path(kLogsDir) / (q.id + ".log");
}

Container running_as(Runtime runtime, const std::string& root, const std::string& id) {
  for (auto& found : running())
    if (found.id == id && found.root.path == root) return std::move(found);
  throw Error(Errc::kProcess, "container " + id + " was restored, but " +
                                  container_runtime_name(runtime) + " (root " + root +
                                  ") does not list it running");
}

fs::path criu_wrapper(const RestoreRequest& q, const fs::path& dir,
                      const std::vector<std::string>& more = {});

// CRIU's failure, with the lines of its log that say why.
[[noreturn]] void restore_failed(const RestoreRequest& q, const std::string& how,
                                 const std::string& more = {}) {
  const fs::path kept = criu::preserve_log(q.work / criu::kRestoreLogName, "runc-criu-restore");
  throw Error(Errc::kCriu,
              how + ":\n" + more + criu::log_excerpt(kept) + "CRIU's log: " + kept.string());
}

Container runc_restore_from(const RestoreRequest& q) {
  const ContainerRecord& r = *q.record;
  const fs::path bundle = make_restore_dir(r.root, q.id);
  json spec = r.spec;
  join_namespaces(spec, q.joins);
  spec["root"]["path"] = r.rootfs;  // absolute: this bundle is not where the rootfs is
  // runc takes a relative bind source from the bundle, which was another directory.
  if (spec.contains("mounts"))
    for (auto& m : spec["mounts"]) {
      const std::string src = m.value("source", "");
      if (!src.empty() && src[0] != '/' && m.value("type", "") == "bind")
        m["source"] = (fs::path(r.bundle) / src).lexically_normal().string();
    }
  // A replica beside the original gets a cgroup of its own (runc's default, named by its ID).
  if (q.id != r.id && spec.contains("linux")) spec["linux"].erase("cgroupsPath");
  spec["annotations"]["org.criu.config"] = (bundle / "criu.conf").string();
  write_file_atomic(bundle / "config.json", spec.dump(1));

  const std::string name = container_runtime_name(r.runtime);
  const fs::path runc_log = q.work / (name + ".log");
  auto argv = runtime_argv(r.runtime, r.root);
  SpawnOptions so;
  so.env = q.env;
  if (r.runtime == Runtime::kCrun) {
    // crun takes no CRIU binary and reads no configuration file of gpuckpt's (1.8 reads none):
    // its libcriu runs the `criu` first on its PATH, which here is a wrapper that runs gpuckpt's
    // CRIU with this restore's configuration.
    // And its restored init's pid, for the restore that fails before crun lists it.
    const fs::path pidfile = crun_pidfile(r.root, q.id);
    std::error_code ec;
    fs::remove(pidfile, ec);
    const fs::path wrapper = criu_wrapper(q, bundle, {"pidfile " + pidfile.string()});
    const char* path = std::getenv("PATH");
    so.env.push_back("PATH=" + wrapper.parent_path().string() + ":" +
                     (path && *path ? path : "/usr/sbin:/usr/bin:/sbin:/bin"));
    argv.insert(argv.end(),
                {"--cgroup-manager=" + r.cgroup_manager, "--log", runc_log.string(), "restore"});
    // CRIU reads that configuration before crun's request, which sets these four from crun's
    // own options whatever the file says: crun must be given them.
    for (const auto& l : q.criu_config)
      if (l == "tcp-established" || l == "file-locks" || l == "ext-unix-sk" || l == "shell-job")
        argv.push_back("--" + l);
  } else {
    write_file_atomic(bundle / "criu.conf", criu_config_text(q));
    argv.insert(argv.end(), {"--log", runc_log.string(), "--criu", q.criu.string(), "restore"});
  }
  argv.insert(argv.end(), {"--detach", "--image-path", q.images.string(), "--work-path",
                           q.work.string(), "--bundle", bundle.string(), q.id});
  // runc hands its stdio to the container (CRIU's inherit-fd for the recorded stdio pipes).
  // A pipe, drained into the log by a process of its own that outlives gpuckpt, as a
  // runtime's shim does: a file there would make the container impossible to dump again.
  const fs::path stdio = stdio_log(q);
  auto [drain, feed] = make_pipe("pipe2");
  {
    SpawnOptions lo;
    lo.stdin_fd = drain.get();
    lo.stdout_file = stdio;
    lo.stderr_file = stdio;
    lo.new_session = true;
    // Started by a shell that exits at once: the drain is nobody's child here to reap. (An
    // asynchronous command's stdin is /dev/null before its own redirections: hence fd 3.)
    const ExitStatus st = spawn({"/bin/sh", "-c", "exec 3<&0; cat <&3 3<&- &"}, lo).wait();
    if (!st.ok()) throw Error(Errc::kInternal, "the container's log drain did not start");
  }
  drain.reset();
  so.stdout_fd = feed.get();
  so.stderr_fd = feed.get();
  so.new_process_group = true;
  so.cwd = bundle;
  if (q.on_container_id) q.on_container_id(r.root, q.id, false);
  fault_point(fault::kRuntimeStarting);
  Child c = spawn(argv, so);
  feed.reset();
  const Container made{StateRoot{r.runtime, r.root, ""}, q.id};
  auto undo = [&] {
    if (const auto state = state_json(made.root, made.id); state && made_by_restore(made, *state))
      destroy(made);
    else if (state)
      spdlog::warn("{} lists a container {} that another made meanwhile: it was left as it is",
                   name, q.id);
    if (const std::string why = remove_half_made(made); !why.empty()) spdlog::warn("{}", why);
    remove_restore_bundle(r.root, q.id);
  };
  if (q.on_runc_started) {
    try {
      q.on_runc_started(c.pid());
    } catch (...) {
      ::kill(-c.pid(), SIGKILL);
      c.wait();
      undo();
      throw;
    }
  }
  auto st = c.wait_for(q.timeout);
  if (!st) {
    ::kill(-c.pid(), SIGKILL);  // runc and the criu it runs: its own process group
    c.wait();
    undo();
    throw Error(Errc::kTimeout, name + " restore did not finish within " +
                                    std::to_string(q.timeout.count()) + " s and was killed");
  }
  if (!st->ok()) {
    undo();
    restore_failed(q, name + " restore of container " + q.id + " failed (" + st->describe() + ")",
                   criu::log_tail(runc_log, 4));
  }
  try {
    return running_as(r.runtime, r.root, q.id);
  } catch (...) {
    undo();
    throw;
  }
}

Container runc_restore(const RestoreRequest& q) {
  CarriedRootfs rootfs = place_carried_rootfs(q);
  try {
    return runc_restore_from(q);
  } catch (...) {
    // Unpacked for this restore, unless a replica restored meanwhile took it too.
    if (!rootfs.placed.empty()) {
      try {
        if (const std::string keeper =
                remove_unused_rootfs(rootfs.placed, {}, std::move(rootfs.held));
            !keeper.empty())
          spdlog::info("left the rootfs {} that this restore unpacked: {}", rootfs.placed.string(),
                       keeper);
      } catch (const Error& e) {
        spdlog::warn("{}", e.what());
      }
    }
    throw;
  }
}

// For a runtime's shim, which passes CRIU neither gpuckpt's arguments nor its environment: a
// CRIU that runs with this restore's settings (its configuration file through CRIU_CONFIG_FILE,
// which `criu swrk` reads before runc's requests) and the plugin's environment.
fs::path criu_wrapper(const RestoreRequest& q, const fs::path& dir,
                      const std::vector<std::string>& more) {
  std::string conf = criu_config_text(q);
  for (const auto& l : more) conf += l + "\n";
  write_file_atomic(dir / "criu.conf", conf);
  std::string sh =
      "#!/bin/sh\nexport CRIU_CONFIG_FILE=" + shell_quote((dir / "criu.conf").string()) + "\n";
  for (const auto& e : q.env)
    if (const auto kv = split_env_entry(e))
      sh += "export " + kv->first + "=" + shell_quote(kv->second) + "\n";
  sh += "exec " + shell_quote(q.criu.string()) + " \"$@\"\n";
  const fs::path wrapper = dir / "criu";
  write_file_atomic(wrapper, sh);
  ::chmod(wrapper.c_str(), 0700);
  return wrapper;
}

Container containerd_restore(const RestoreRequest& q) {
  const ContainerRecord& r = *q.record;
  const ContainerdRecord& d = *r.containerd;
  containerd::Client api(containerd::address(), d.ns);
  // The container record: the one dumped, its task gone, or a new one made from the
  // checkpoint's over a fresh snapshot of the image.
  auto info = api.container(q.id);
  const bool made = !info;
  if (made) {
    containerd::ContainerInfo n;
    n.id = q.id;
    n.labels = d.labels;
    n.image = d.image;
    n.runtime = d.runtime;
    n.runtime_options_type = d.options_type;
    n.runtime_options = d.options;
    json spec = r.spec;
    join_namespaces(spec, q.joins);
    // Its cgroup is named after it ("/NS/ID" as ctr makes it): a replica's is its own.
    if (spec.contains("linux") && spec["linux"].contains("cgroupsPath")) {
      std::string cg = spec["linux"]["cgroupsPath"].get<std::string>();
      if (cg.size() >= r.id.size() && cg.compare(cg.size() - r.id.size(), r.id.size(), r.id) == 0)
        spec["linux"]["cgroupsPath"] = cg.substr(0, cg.size() - r.id.size()) + q.id;
      else
        spec["linux"].erase("cgroupsPath");
    }
    n.spec = spec.dump();
    n.snapshotter = d.snapshotter;
    n.snapshot_key = q.id;
    n.sandbox = d.sandbox;
    info = n;
  }
  std::string root = containerd::options_root(info->runtime_options);
  if (root.empty()) root = "/run/containerd/runc";
  root = (fs::path(root) / d.ns).string();
  const fs::path dir = make_restore_dir(root, q.id);
  auto undo = [&] {
    try {
      api.kill_task(q.id, SIGKILL);
      (void)task_stopped_within(api, q.id, std::chrono::seconds(30));
      api.delete_task(q.id);
      if (made) {
        api.delete_container(q.id);
        api.remove_snapshot(d.snapshotter, q.id);
      }
    } catch (const Error& e) {
      spdlog::warn("removing the half-restored container {}: {}", q.id, e.what());
    }
    remove_restore_bundle(root, q.id);
  };
  containerd::CreateTask t;
  try {
    // The guard knows of the record before it exists: gpuckpt killed from here on leaves none.
    if (q.on_container_id) q.on_container_id(root, q.id, made);
    if (made) {
      // The record first, naming its snapshot: containerd's garbage collector keeps a snapshot
      // that a container names, and may take one that nothing names yet.
      api.create_container(*info);
      set_writable_layer(q, upper_of(api.prepare_snapshot(d.snapshotter, q.id, d.snapshot_parent)),
                         /*fresh=*/true);
    } else {
      if (api.task(q.id)) api.delete_task(q.id);  // stopped: check_restore_target saw to it
      set_writable_layer(q, upper_of(api.snapshot_mounts(info->snapshotter, info->snapshot_key)),
                         /*fresh=*/false);
    }
    t.container_id = q.id;
    t.stdout_uri = t.stderr_uri = "file://" + stdio_log(q).string();
    // A stdin that was a pipe (ctr's) gets one again, from the shim. Without it the shim's runc
    // hands the task its own /dev/null, a file on a mount outside the container, and CRIU could
    // not dump the restored container again.
    if (!r.stdio.empty() && r.stdio[0].rfind("pipe:", 0) == 0) {
      t.stdin_fifo = (dir / "stdin").string();
      if (::mkfifo(t.stdin_fifo.c_str(), 0600) != 0 && errno != EEXIST)
        throw_errno(Errc::kIo, "mkfifo ", t.stdin_fifo);
    }
    t.options_type = info->runtime_options_type;
    t.options =
        containerd::restore_options(info->runtime_options, criu_wrapper(q, dir), q.images, q.work);
    t.timeout = q.timeout;
    t.rootfs = api.snapshot_mounts(info->snapshotter, info->snapshot_key);
  } catch (...) {
    undo();
    throw;
  }
  try {
    (void)api.create_task(t);
    fault_point(fault::kRuntimeCreated);
    api.start_task(q.id, q.timeout);
  } catch (const Error& e) {
    undo();
    restore_failed(q, "containerd's restore of container " + q.id + " failed: " + e.what());
  }
  // Its CRIU has run: nothing names the directory from here on (the shim keeps its own bundle).
  remove_restore_bundle(root, q.id);
  try {
    return running_as(Runtime::kRunc, root, q.id);
  } catch (...) {
    undo();
    throw;
  }
}

// CRIU's images as symbolic links to the staged ones. dockerd's start tars the checkpoint
// directory into containerd's content store, and containerd untars it into a directory of its
// own for runc's CRIU: both keep a link as a link, so what goes through them is a few bytes per
// image instead of every page twice. The staged images stay until the restore has ended. The
// other files (descriptors.json for runc, the settings for gpuckpt's plugin, which it opens only
// as a regular file) are hard links, else copies; so is every file where containerd would not
// find the staged images by their path (a private /var/tmp, another mount namespace).
//
// Relative links that climb to the host's root first: CRIU's restored tasks open their images
// after they moved into the container's root, where an absolute path names the container's
// files; a relative one resolves from the images directory (a host directory outside that
// root), and ".." above the host's root stays there, so any number of them reaches it from
// wherever containerd untars the directory.
void place_images(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::remove_all(to, ec);  // left by a killed gpuckpt that had this one's pid
  fs::create_directories(to);
  const fs::path staged = fs::canonical(from);
  const bool link = containerd::containerd_sees_as_here(staged);
  if (!link)
    spdlog::warn(
        "no containerd here is seen to reach {} by that path (a private /var/tmp, another mount "
        "namespace, or none visible): dockerd copies every image through containerd (--staging "
        "DIR on a path both share avoids it)",
        staged.string());
  std::string up;
  for (int i = 0; i < 40; ++i) up += "../";
  for (const auto& e : fs::directory_iterator(from)) {
    const fs::path name = e.path().filename();
    if (!e.is_regular_file() || name == kRootfsDiffFile) continue;
    if (link && name.extension() == ".img") {
      fs::create_symlink(up + (staged / name).relative_path().string(), to / name);
      continue;
    }
    fs::create_hard_link(e.path(), to / name, ec);
    if (ec) fs::copy_file(e.path(), to / name, fs::copy_options::overwrite_existing);
  }
}

Container docker_restore(const RestoreRequest& q) {
  const ContainerRecord& r = *q.record;
  const DockerRecord& d = *r.docker;
  docker::Client api;
  // The container dumped (stopped since), or a new one made as `docker run` made it.
  std::string id;
  const auto have = api.inspect(q.id);
  const bool made = !have;
  const std::string name = "gpuckpt-" + std::to_string(::getpid());
  const std::string token = containerd::new_restore_token();
  fs::path dir;
  auto undo = [&] {
    try {
      if (!id.empty()) api.kill(id);
      if (made) api.remove(id.empty() ? docker_create_name(r, q.id) : id);
    } catch (const Error& e) {
      spdlog::warn("removing the half-restored container {}: {}", id, e.what());
    }
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  };
  try {
    if (made) {
      // The guard knows it by the name it will have before dockerd makes it, then by its ID.
      const std::string create_name = docker_create_name(r, q.id);
      if (q.on_container_id) q.on_container_id(r.root, create_name, true);
      json config = d.config;
      // The image it ran, not whatever its tag names here now: CRIU restores files by their
      // paths in that rootfs.
      if (!d.image_id.empty()) config["Image"] = d.image_id;
      id = api.create(create_name, config, d.host_config);
      if (q.on_container_named) q.on_container_named(id);
    } else {
      id = docker::string_at(*have, {"Id"});
      if (q.on_container_id) q.on_container_id(r.root, id, false);
    }
    if (q.on_unpacked_token) q.on_unpacked_token(token);
    set_writable_layer(
        q, docker::string_at(api.inspect(id).value_or(json()), {"GraphDriver", "Data", "UpperDir"}),
        made);
    std::string data_root = docker::string_at(api.info(), {"DockerRootDir"});
    if (data_root.empty()) data_root = "/var/lib/docker";
    dir = fs::path(data_root) / "containers" / id / "checkpoints" / name;
    if (q.on_path_made) q.on_path_made(dir);
    std::optional<Timeline::Scope> scope;
    if (q.timeline) scope.emplace(*q.timeline, stage::kCheckpointDir);
    place_images(q.images, dir);
    write_file_atomic(dir / containerd::kRestoreTokenFile, token);
    fault_point(fault::kRuntimeCreated);  // made, its checkpoint in place, not started
  } catch (...) {
    undo();
    throw;
  }
  // The hook runs libcurl verbose (into a callback): only where a test holds gpuckpt there.
  std::function<void()> starting;
  if (fault_point_armed(fault::kRuntimeStarting))
    starting = [] { fault_point(fault::kRuntimeStarting); };
  try {
    api.start_from_checkpoint(id, name, q.timeout, starting);
  } catch (const Error& e) {
    containerd::take_from_unpacked_copy(token, criu::kRestoreReportName,
                                        q.images / criu::kRestoreReportName);
    containerd::remove_unpacked_copies(token);
    undo();
    throw Error(Errc::kCriu, "Docker's restore of container " + id + " failed: " + e.what() +
                                 " (its CRIU log is in containerd's task directory of " + id + ")");
  }
  // The plugin's report, which dockerd's CRIU wrote beside the images it read: in containerd's
  // copy of them (criu/plugin_report.h).
  containerd::take_from_unpacked_copy(token, criu::kRestoreReportName,
                                      q.images / criu::kRestoreReportName);
  containerd::remove_unpacked_copies(token);
  std::error_code ec;
  fs::remove_all(dir, ec);
  try {
    return running_as(Runtime::kRunc, r.root, id);
  } catch (...) {
    undo();
    throw;
  }
}

}  // namespace

Container restore_container(const RestoreRequest& q) {
  switch (q.record->runtime) {
    case Runtime::kContainerd:
      return containerd_restore(q);
    case Runtime::kDocker:
      return docker_restore(q);
    case Runtime::kRunc:
    case Runtime::kCrun:
      break;
  }
  return runc_restore(q);
}

std::string in_container_network(const ContainerRecord& r, pid_t init,
                                 const std::function<std::string()>& fn) {
  // Its own namespace, or one it joined (a pod's): not the host's, where gpuckpt runs.
  return r.own_network || !joined_network(r).empty() ? in_network_of(init, fn) : fn();
}

void restore_loopback(const ContainerRecord& r, pid_t init) {
  if (!r.own_network || !r.loopback_up) return;
  in_network_of(init, [] {
    const UniqueFd s = control_socket();
    ifreq req{};
    std::snprintf(req.ifr_name, sizeof req.ifr_name, "lo");
    req.ifr_flags = static_cast<short>(loopback_flags(s.get()) | IFF_UP);
    if (::ioctl(s.get(), SIOCSIFFLAGS, &req) != 0) throw_errno(Errc::kProcess, "SIOCSIFFLAGS lo");
    return true;
  });
}

}  // namespace gpuckpt::container
