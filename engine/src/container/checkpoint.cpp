#include "container/checkpoint.h"

#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "container/containerd.h"
#include "container/docker.h"
#include "container/internal.h"
#include "criu/criu.h"
#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "process/proc_info.h"
#include "util/fs.h"
#include "util/pipe.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt::container {

std::string bundle_of(const json& config) {
  // runc's own label comes after one per annotation of the spec, which may be named `bundle`.
  std::string bundle;
  if (config.is_object())
    for (const auto& l : config.value("labels", json::array()))
      if (l.is_string() && l.get<std::string>().rfind("bundle=", 0) == 0)
        bundle = l.get<std::string>().substr(7);
  return bundle;
}

namespace {

bool has_namespace(const json& config, const char* type, std::string* path = nullptr) {
  for (const auto& n : config.value("namespaces", json::array()))
    if (n.value("type", "") == type) {
      if (path) *path = n.value("path", "");
      return true;
    }
  return false;
}

// Whether CRIU binds mount `m` from another mount of the container (its validate_mounts): a
// whole file system, or the container's root or an external mount showing a path of the same
// file system at or above m's.
bool reached_through(const MountInfo& m, const std::vector<MountInfo>& mounts,
                     const std::set<std::string>& external) {
  return std::any_of(mounts.begin(), mounts.end(), [&](const MountInfo& n) {
    return n.id != m.id && n.dev == m.dev &&
           (n.root == "/" || ((n.mount_point == "/" || external.count(n.mount_point)) &&
                              at_or_under(m.root, n.root)));
  });
}

// The path of this host (gpuckpt's mount namespace) that shows what mount `m` of a container
// shows, checked to be on m's device; "" if none does.
std::string host_path_of(const MountInfo& m) {
  const auto dev = device_number(m.dev);
  if (!dev) return {};
  auto here = mounts_of(::getpid());
  // The deepest first (the fewest mounts on the way); a path that another mount hides here is on
  // another device, and the next is tried.
  std::stable_sort(here.begin(), here.end(), [](const MountInfo& a, const MountInfo& b) {
    return a.root.size() > b.root.size();
  });
  for (const auto& n : here) {
    if (n.dev != m.dev) continue;
    const auto path = shown_at(n.mount_point, n.root, m.root);
    struct stat st {};
    if (path && ::stat(path->c_str(), &st) == 0 && st.st_dev == *dev) return path->string();
  }
  return {};
}

// A host file that CRIU would reach through no mount of the container, and so cannot dump.
std::string outside_file(pid_t pid, int fd, const std::vector<MountInfo>& mounts) {
  const std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  struct stat st {};
  if (::stat(link.c_str(), &st) != 0) return {};
  std::error_code ec;
  const std::string target = fs::read_symlink(link, ec).string();
  // The memory devices (/dev/null, /dev/zero...) CRIU opens again by path; a host terminal it
  // cannot give back to a detached container.
  if (S_ISCHR(st.st_mode)) return major(st.st_rdev) == 1 ? std::string() : target;
  if (!S_ISREG(st.st_mode)) return {};
  // CRIU looks a file up by the mount it was opened through (fdinfo's mnt_id) among the
  // container's mounts: a host file opened through a host mount fails the dump, once frozen,
  // even where a bind mount shows the same file inside.
  std::ifstream info("/proc/" + std::to_string(pid) + "/fdinfo/" + std::to_string(fd));
  int mnt_id = -1;
  for (std::string line; std::getline(info, line);)
    if (line.rfind("mnt_id:", 0) == 0) mnt_id = std::atoi(line.c_str() + 7);
  if (std::any_of(mounts.begin(), mounts.end(), [&](const MountInfo& m) { return m.id == mnt_id; }))
    return {};
  return target;
}

}  // namespace

short loopback_flags(int sock) {
  ifreq req{};
  std::snprintf(req.ifr_name, sizeof req.ifr_name, "lo");
  if (::ioctl(sock, SIOCGIFFLAGS, &req) != 0) throw_errno(Errc::kProcess, "SIOCGIFFLAGS lo");
  return req.ifr_flags;
}

UniqueFd control_socket() {
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) throw_errno(Errc::kProcess, "socket");
  return s;
}

std::vector<MountInfo> mounts_of(pid_t pid) {
  return read_mountinfo("/proc/" + std::to_string(pid) + "/mountinfo");
}

std::vector<std::string> runtime_argv(Runtime runtime, const std::string& root) {
  if (runtime != Runtime::kCrun) return {runc_binary().string(), "--root", root};
  fs::path crun;
  try {
    crun = crun_binary();
  } catch (const Error&) {
    // Killing and deleting need no CRIU: a crun without it does.
    if (auto p = find_executable("crun"))
      crun = *p;
    else
      throw;
  }
  return {crun.string(), "--root", root};
}

namespace {

// Docker's name or short ID of a container, as `docker ps` shows it: its runc ID is the full
// one. "" where no dockerd answers or it has no such container.
std::string docker_full_id(const std::string& name) {
  try {
    if (const auto j = docker::Client().inspect(name)) return docker::string_at(*j, {"Id"});
  } catch (const Error& e) {
    spdlog::debug("asking dockerd for {}: {}", name, e.what());
  }
  return {};
}

}  // namespace

Container find(const std::string& name) {
  std::string id = name;
  auto all = running();
  if (std::none_of(all.begin(), all.end(), [&](const Container& c) { return c.id == id; }))
    if (std::string full = docker_full_id(name); !full.empty()) id = std::move(full);
  // Under one ID in two roots, a container that gpuckpt can take before a daemon's crun one.
  std::stable_partition(all.begin(), all.end(), [](const Container& c) { return !c.under_crun; });
  for (auto& c : all)
    if (c.id == id) {
      // Its restore would go through the daemon's shim, which runs crun's own restore: crun
      // takes no CRIU binary, and its libcriu would run whatever `criu` the shim finds first on
      // its PATH, with none of gpuckpt's configuration.
      if (c.under_crun)
        throw Error(Errc::kUsage,
                    "the " + c.describe() +
                        " runs under crun (its runtime's binary): gpuckpt dumps containerd's "
                        "and Docker's containers only where their shim runs runc, whose restore "
                        "takes gpuckpt's CRIU. Run it with runc, or run it with crun itself "
                        "(gpuckpt takes crun's own containers). Nothing was frozen");
      // runc's "paused": its cgroup frozen. CRIU would wait on it, and a dump that ends it
      // would end a container its operator stopped on purpose.
      const auto state = state_json(c.root, id);
      const json paths = state ? state->value("cgroup_paths", json::object()) : json::object();
      const std::string v1 = paths.value("freezer", "");
      const std::string v2 = paths.value("", "");
      std::string frozen;
      try {
        if (!v1.empty())
          frozen = read_file(fs::path(v1) / "freezer.state");
        else if (!v2.empty())
          frozen = read_file(fs::path(v2) / "cgroup.freeze");
        else if (c.root.runtime == Runtime::kCrun && !process::frozen_cgroup(c.init_pid).empty())
          frozen = "FROZEN";  // crun's state names no freezer: its init's cgroup says
      } catch (const Error&) {
      }
      if (frozen.rfind("FROZEN", 0) == 0 || frozen.rfind("1", 0) == 0) {
        const std::string resume =
            c.root.runtime == Runtime::kDocker ? "docker unpause"
            : c.root.runtime == Runtime::kContainerd
                ? "ctr task resume"
                : container_runtime_name(c.root.runtime) + std::string(" resume");
        throw Error(Errc::kProcess, "the " + c.describe() + " is paused: resume it first (" +
                                        resume + "); nothing was frozen");
      }
      return std::move(c);
    }
  std::vector<std::string> known;
  for (const auto& root : state_roots()) {
    if (state_json(root, id))
      throw Error(Errc::kInvalidInput,
                  "container " + id + " under " + root.path.string() +
                      " is not running (its init has ended; already checkpointed, or stopped): "
                      "nothing to dump");
  }
  for (const auto& c : running()) known.push_back(c.id);
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  throw Error(Errc::kInvalidInput,
              "no running container " + id + " is known to runc, crun, Docker or containerd here" +
                  (list.empty() ? std::string(" (none runs)") : " (running: " + list + ")") +
                  "; a runc started with --root DIR is found through $GPUCKPT_RUNC_ROOTS");
}

fs::path upper_of(const std::vector<containerd::Mount>& mounts) {
  for (const auto& m : mounts)
    for (const auto& o : m.options)
      if (o.rfind("upperdir=", 0) == 0) return o.substr(9);
  return {};
}

namespace {

// containerd's record of the container: to make it again where containerd has none.
ContainerdRecord containerd_part(const Container& c, fs::path& upper) {
  containerd::Client api(containerd::address(), c.root.ns);
  std::optional<containerd::ContainerInfo> info;
  try {
    info = api.container(c.id);
  } catch (const Error& e) {
    throw e.with_context("", ". The " + c.describe() +
                                 " is containerd's, and its restore needs containerd "
                                 "(CONTAINERD_ADDRESS names its socket). Nothing was frozen");
  }
  if (!info)
    throw Error(Errc::kInvalidInput, "containerd (namespace " + c.root.ns +
                                         ") has no record of container " + c.id +
                                         ", which runc runs under containerd's root: nothing "
                                         "was frozen");
  ContainerdRecord d;
  d.ns = c.root.ns;
  d.image = info->image;
  if (!d.image.empty()) d.image_digest = api.image_digest(d.image).value_or("");
  d.labels = info->labels;
  d.runtime = info->runtime;
  d.options_type = info->runtime_options_type;
  d.options = info->runtime_options;
  d.snapshotter = info->snapshotter;
  d.sandbox = info->sandbox;
  if (!info->snapshot_key.empty()) {
    d.snapshot_parent = api.snapshot_parent(info->snapshotter, info->snapshot_key).value_or("");
    upper = upper_of(api.snapshot_mounts(info->snapshotter, info->snapshot_key));
  }
  return d;
}

// dockerd's restore passes CRIU no option of gpuckpt's, and runc has CRIU read this file for a
// container whose spec names no configuration of its own (Docker's name none). A container's
// TCP connections are closed at the dump (--tcp-close), and CRIU restores such images only with
// the same option.
constexpr const char* kRuncCriuConf = "/etc/criu/runc.conf";

// The lines of runc's CRIU configuration, trimmed, without a leading "--".
std::vector<std::string> runc_conf_lines() {
  std::vector<std::string> out;
  std::ifstream in(kRuncCriuConf);
  for (std::string l; std::getline(in, l);) {
    l.erase(0, l.find_first_not_of(" \t"));
    l.erase(l.find_last_not_of(" \t\r") + 1);
    if (l.starts_with("--")) l.erase(0, 2);
    out.push_back(std::move(l));
  }
  return out;
}

void require_runc_conf_closes_tcp() {
  for (const auto& l : runc_conf_lines())
    if (l == "tcp-close") return;
  throw Error(Errc::kUsage, std::string("dockerd restores through runc, which gives CRIU only the "
                                        "options of ") +
                                kRuncCriuConf +
                                ", and gpuckpt closes a container's TCP connections at the dump: "
                                "add the line `tcp-close` to that file (echo tcp-close >> " +
                                kRuncCriuConf + ")");
}

}  // namespace

fs::path runc_criu_libdir() {
  fs::path libdir = "/usr/lib/criu";  // CRIU's own default, where the file names none
  for (auto l : runc_conf_lines()) {
    // "libdir DIR" or "libdir=DIR", as CRIU's configuration parser reads an option and its
    // value; a comment after it goes.
    if (!l.starts_with("libdir") || l.size() == 6 ||
        std::string(" \t=").find(l[6]) == std::string::npos)
      continue;
    if (const auto hash = l.find(" #"); hash != std::string::npos) l.erase(hash);
    const auto from = l.find_first_not_of(" \t=", 6);
    if (from == std::string::npos) continue;
    std::string v = l.substr(from);
    v.erase(v.find_last_not_of(" \t") + 1);
    if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front())
      v = v.substr(1, v.size() - 2);
    if (!v.empty()) libdir = v;
  }
  return libdir;
}

void require_runc_criu_loads_plugin(const fs::path& plugin_dir, const std::string& why) {
  const fs::path libdir = runc_criu_libdir();
  std::error_code ec;
  if (fs::exists(libdir / criu::kPluginFile, ec)) return;
  throw Error(Errc::kUsage,
              "the checkpoint holds CUDA state, and " + why +
                  ": that CRIU loads gpuckpt's plugin only from " + libdir.string() +
                  " (`libdir` in " + kRuncCriuConf + ", else CRIU's default), which lacks " +
                  criu::kPluginFile + ", so the container would come back without its GPU state. " +
                  (plugin_dir.empty()
                       ? std::string("Build gpuckpt's CRIU plugin and link it there")
                       : "Link it there: ln -s " + (plugin_dir / criu::kPluginFile).string() + " " +
                             libdir.string() + "/") +
                  ". Nothing was restored");
}

void require_docker_restores(docker::Client& api) {
  require_runc_conf_closes_tcp();
  if (!docker::flag_at(api.version(), {"Experimental"}))
    throw Error(Errc::kUsage,
                "dockerd restores checkpoints only in experimental mode: set "
                "\"experimental\": true in /etc/docker/daemon.json and restart it");
}

namespace {

// dockerd's record of it: to create it again, and to start it from the images.
DockerRecord docker_part(const Container& c, fs::path& upper) {
  docker::Client api;
  std::optional<json> j;
  try {
    j = api.inspect(c.id);
    require_docker_restores(api);
  } catch (const Error& e) {
    throw e.with_context("", ". The " + c.describe() +
                                 " is Docker's, and its restore needs dockerd (DOCKER_HOST names "
                                 "its socket). Nothing was frozen");
  }
  if (!j)
    throw Error(Errc::kInvalidInput, "dockerd has no container " + c.id +
                                         ", which runc runs under Docker's root: nothing was "
                                         "frozen");
  std::string name = docker::string_at(*j, {"Name"});
  if (!name.empty() && name[0] == '/') name.erase(0, 1);
  // dockerd would start a fresh container of it once the dump ends it: two would serve after
  // a migration, and a rolled-back one would be replaced by a cold start.
  const std::string policy = docker::string_at(*j, {"HostConfig", "RestartPolicy", "Name"});
  if (!policy.empty() && policy != "no")
    throw Error(Errc::kUsage, "the " + c.describe() + " (" + name + ") has the restart policy '" +
                                  policy +
                                  "': dockerd would start it afresh once the dump ends it. Set "
                                  "`docker update --restart no " +
                                  name + "` first. Nothing was frozen");
  upper = docker::string_at(*j, {"GraphDriver", "Data", "UpperDir"});
  return {name, docker::object_at(*j, {"Config"}), docker::object_at(*j, {"HostConfig"}),
          docker::string_at(*j, {"Image"})};
}

// Whether runc's mount `m` of the Docker container `c` is the tmpfs dockerd made for that
// container's own /dev/shm (an IPC mode of "shareable", the default of older daemons): dockerd
// unmounts it once the container ends, and its restore binds a fresh one, so what the container
// kept there would be lost as an external mount. CRIU dumps it as the tmpfs it is, contents
// and all, and mounts it again at the restore.
bool own_docker_shm(const Container& c, const json& m) {
  if (c.root.runtime != Runtime::kDocker || m.value("destination", "") != "/dev/shm") return false;
  const fs::path src = fs::path(m.value("source", "")).lexically_normal();
  return src.filename() == "shm" && src.parent_path().filename() == "mounts" &&
         src.parent_path().parent_path().filename() == c.id;
}

}  // namespace

DumpPlan plan_dump(const Container& c, bool tcp_established, bool carry_rootfs) {
  const auto state = state_json(c.root, c.id);
  if (!state || !state->contains("config"))
    throw Error(Errc::kInvalidInput, "the runtime's state of the " + c.describe() + " is gone");
  const json& config = state->at("config");
  DumpPlan p;
  ContainerRecord& r = p.record;
  r.runtime = c.root.runtime;
  r.root = c.root.path.string();
  r.id = c.id;
  r.rootfs = config.value("rootfs", "");
  if (r.runtime == Runtime::kCrun) {
    // Its restore is crun's, whose CRIU support is built in or not at all: a dump that ends
    // the container must know that this host could bring it back.
    try {
      (void)crun_binary();
    } catch (const Error& e) {
      throw e.with_context("", ". Nothing was frozen");
    }
    const json& cr = state->at("crun");
    r.cgroup_manager = cr.value("systemd_cgroup", false)     ? "systemd"
                       : cr.value("cgroup_path", "").empty() ? "disabled"
                                                             : "cgroupfs";
  }
  if (carry_rootfs) {
    if (!runs_bundles(r.runtime))
      throw Error(Errc::kUsage,
                  "--with-rootfs carries the rootfs of a container that runc or crun runs from "
                  "a bundle; the " +
                      c.describe() +
                      " runs from an image, whose checkpoint carries its writable layer "
                      "anyway, and a restore finds the image by its digest. Nothing was frozen");
    const auto dir = r.rootfs.empty() || r.rootfs[0] != '/' ? std::nullopt : dir_identity(r.rootfs);
    if (!dir)
      throw Error(Errc::kInvalidInput, "the rootfs of the " + c.describe() + " (" + r.rootfs +
                                           ") is no directory here to carry. Nothing was frozen");
    r.layer = WritableLayer::kRootfs;
    r.rootfs_origin = RootfsOrigin{containerd::new_restore_token(), boot_id(), *dir};
  }
  r.bundle = bundle_of(config);
  r.stdio = state->value("external_descriptors", std::vector<std::string>{});
  try {
    r.spec = json::parse(read_file(fs::path(r.bundle) / "config.json"));
  } catch (const std::exception& e) {
    throw Error(Errc::kInvalidInput, "the bundle of the " + c.describe() + " (" + r.bundle +
                                         ") has no readable config.json, which its restore "
                                         "needs: " +
                                         e.what() + ". Nothing was frozen");
  }
  if (c.root.runtime == Runtime::kContainerd) {
    r.containerd = containerd_part(c, p.upper_dir);
    if (p.upper_dir.empty())
      p.layer_why = "containerd's snapshotter " + r.containerd->snapshotter +
                    " gives its snapshot no overlay upper directory";
  }
  if (c.root.runtime == Runtime::kDocker) {
    r.docker = docker_part(c, p.upper_dir);
    if (p.upper_dir.empty())
      p.layer_why = "Docker's storage driver gives it no overlay upper directory";
  }
  if (!p.layer_why.empty())
    spdlog::warn(
        "the writable layer of the {} does not travel with its checkpoint ({}): it can be "
        "restored only into the container it was dumped from, on this host",
        c.describe(), p.layer_why);
  if (r.spec.contains("process") && r.spec["process"].value("terminal", false))
    throw Error(Errc::kUsage, "the " + c.describe() +
                                  " runs on a terminal (process.terminal in its spec), which "
                                  "runc cannot restore detached: nothing was frozen");
  const pid_t init = c.init_pid;
  const auto mounts = mounts_of(init);
  // CRIU dumps a pid namespace from its init's tree: a process of the namespace outside that
  // tree (what a `runc exec` still attached runs, its parent being runc on the host) would fail
  // the dump once frozen, or be left running in a namespace the dump ends.
  const auto tree = process::process_tree(init);
  for (const pid_t q : process::live_pids_where([&](const process::ProcInfo& i) {
         return i.pid != init && process::pid_namespace_inode(i.pid) == c.pid_namespace;
       }))
    if (std::find(tree.begin(), tree.end(), q) == tree.end())
      throw Error(Errc::kProcess, "process " + std::to_string(q) + " runs in the " + c.describe() +
                                      " but not under its init (a `runc exec` still attached?): "
                                      "CRIU could not dump it with the container. Nothing was "
                                      "frozen");
  for (int fd = 0; fd <= 2; ++fd)
    if (const std::string f = outside_file(init, fd, mounts); !f.empty())
      throw Error(Errc::kProcess,
                  "the init of the " + c.describe() + " has its fd " + std::to_string(fd) + " on " +
                      f +
                      ", a host file opened outside the container's mounts, which CRIU cannot "
                      "dump. "
                      "Start it with pipes for its output (as containerd and Docker do) or a "
                      "file inside the container. Nothing was frozen");

  auto& a = p.criu_args;
  a = {"--root", r.rootfs, "--manage-cgroups"};
  std::set<std::string> named;
  auto external = [&](const std::string& dest, const std::string& key, const std::string& src,
                      bool outside_spec = false) {
    a.push_back("--ext-mount-map");
    a.push_back(dest + ":" + key);
    named.insert(dest);
    if (!src.empty()) r.mounts.push_back({dest, src, outside_spec});
  };
  for (const auto& m : config.value("mounts", json::array())) {
    if (m.value("device", "") != "bind") continue;
    if (own_docker_shm(c, m)) {
      spdlog::info(
          "{}: its /dev/shm (dockerd's tmpfs, IPC mode shareable) is dumped with its files; the "
          "restored container has a /dev/shm of its own, which a container that joins its IPC "
          "namespace afterwards does not share",
          c.describe());
      continue;
    }
    external(m.value("destination", ""), m.value("destination", ""), m.value("source", ""));
  }
  // cgroup v1 without a cgroup namespace: runc bind-mounts the host's hierarchies.
  if (!has_namespace(config, "NEWCGROUP"))
    for (const auto& m : mounts)
      if (m.fstype == "cgroup" && m.mount_point.rfind("/sys/fs/cgroup/", 0) == 0)
        external(m.mount_point, m.mount_point, "");
  // Masked files are /dev/null bound over them. runc's restore maps the key /dev/null to
  // /dev/null, crun's maps each path to /dev/null (its criu.c).
  for (const auto& path : config.value("mask_paths", std::vector<std::string>{})) {
    struct stat st {};
    const std::string inside = "/proc/" + std::to_string(init) + "/root" + path;
    if (::stat(inside.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
      external(path, r.runtime == Runtime::kCrun ? path : "/dev/null", "");
  }
  for (const auto& d : config.value("devices", json::array())) {
    const std::string path = d.value("path", "");
    if (!path.empty()) external(path, path, path);
  }
  // What a hook bound in, which the spec does not name (the NVIDIA container toolkit's hook binds
  // the driver's files and device nodes into the rootfs): CRIU finds no mount of the container
  // that holds what such a bind shows, and would fail once everything is frozen. Each is
  // external, from the host path it shows.
  for (const auto& m : mounts) {
    // A cgroup file system's root reads relative to the reader's cgroup namespace: the
    // container's own (its cgroup namespace's) reads here as its cgroup's path, which CRIU
    // mounts again itself, as it does a namespace file.
    if (m.mount_point == "/" || m.root == "/" || m.fstype == "cgroup" || m.fstype == "cgroup2" ||
        m.fstype == "nsfs" || named.count(m.mount_point) || reached_through(m, mounts, named))
      continue;
    const std::string src = host_path_of(m);
    if (src.empty())
      throw Error(Errc::kUsage, "the " + c.describe() + " has a mount at " + m.mount_point + " (" +
                                    m.fstype + ", " + m.root + " of device " + m.dev +
                                    ") that its spec does not name and that shows no path of "
                                    "this host's mounts, so CRIU could not dump it. Nothing "
                                    "was frozen");
    // dockerd's restore reads no CRIU configuration of gpuckpt's, which would map it back.
    if (c.root.runtime == Runtime::kDocker)
      throw Error(Errc::kUsage, "the " + c.describe() + " has " + src + " bound at " +
                                    m.mount_point +
                                    " by something other than its spec (a hook), which "
                                    "dockerd's restore could not bind again. Nothing was frozen");
    // A line of CRIU's configuration maps it back: "ext-mount-map DEST:SOURCE".
    if ((m.mount_point + src).find_first_of(": \t\n\\") != std::string::npos)
      throw Error(Errc::kUsage, "the " + c.describe() + " has " + src + " bound at " +
                                    m.mount_point +
                                    " by something other than its spec (a hook), a path CRIU's "
                                    "configuration cannot name. Nothing was frozen");
    spdlog::info("{}: {} is bound at {} outside its spec: dumped as an external mount",
                 c.describe(), src, m.mount_point);
    external(m.mount_point, m.mount_point, src, /*outside_spec=*/true);
  }
  std::string netns, pidns;
  r.own_network = has_namespace(config, "NEWNET", &netns) && netns.empty();
  // runc cannot restore it (its criu_linux.go: "Do not know how to handle namespace").
  if (std::string cgroupns; has_namespace(config, "NEWCGROUP", &cgroupns) && !cgroupns.empty())
    throw Error(Errc::kUsage, "the " + c.describe() + " joined the cgroup namespace " + cgroupns +
                                  " by path, which runc cannot restore. Nothing was frozen");
  for (const auto& [type, path] : joined_namespaces(r.spec)) {
    const std::string own = "/proc/" + std::to_string(init) + "/ns/" + proc_ns_name(type);
    // CRIU takes a namespace its tree does not share with it into the images, and its restore
    // would set the pod's hostname and make the pod's SysV objects again inside the namespace
    // that the restore joins (the same pod's, where they still are, or another pod's).
    if (type == "ipc" || type == "uts") p.criu_namespaces.push_back(own);
    // And inside the pod's, CRIU cannot take a segment attached there (cr-dump.c
    // check_sysvipc_map_dump): it would fail once everything is frozen.
    if (type == "ipc")
      for (const pid_t q : tree)
        if (process::maps_sysv_shm(q))
          throw Error(Errc::kUsage,
                      "process " + std::to_string(q) + " of the " + c.describe() +
                          " has a SysV shared memory segment attached, of the ipc namespace " +
                          path +
                          " that the container joined (its pod's): CRIU cannot dump the segment "
                          "without the namespace, which is the pod's. Nothing was frozen");
    struct stat st {};
    if (::stat(own.c_str(), &st) != 0) continue;
    JoinedNamespace& n = r.joined[type];
    n.inode = st.st_ino;
    if (const pid_t holder = ns_holder(ns_file(path)); holder > 0) {
      n.boot_id = boot_id();
      n.holder_started = process::start_ticks(holder).value_or(0);
    }
  }
  if (has_namespace(config, "NEWPID", &pidns) && !pidns.empty())
    throw Error(Errc::kUsage, "the " + c.describe() + " joined the pid namespace " + pidns +
                                  " of another container: dump that one. Nothing was frozen");
  if (!netns.empty()) {
    // A namespace the container joined (a pod's): CRIU leaves it out, and the restore joins it.
    struct stat st {};
    if (::stat(netns.c_str(), &st) != 0)
      throw_errno(Errc::kInvalidInput, "the network namespace ", netns, " of the ", c.describe());
    a.push_back("--external");
    a.push_back("net[" + std::to_string(st.st_ino) + "]:extRootNetNS");
  }
  if (r.own_network) {
    // CRIU locks a namespace it dumps until the dumped tasks end, and a guard that resumes
    // them instead could not unlock it (the lock is CRIU's table, named by its run). Without
    // established connections to keep there is nothing to lock for.
    if (tcp_established)
      throw Error(Errc::kUsage, "the " + c.describe() +
                                    " has a network namespace of its own, and gpuckpt cannot "
                                    "yet keep its established connections (--tcp-established) "
                                    "without leaving it locked on a failed dump. Nothing was "
                                    "frozen");
    // runc restores it empty (the network is its caller's): CRIU need not read it, nor need
    // `ip` and iptables for that.
    a.insert(a.end(), {"--network-lock", "skip", "--empty-ns", "net"});
    r.loopback_up = in_network_of(init, [] {
      const UniqueFd s = control_socket();
      return (loopback_flags(s.get()) & IFF_UP) != 0;
    });
  }
  return p;
}

namespace {

// Bytes tar `pid` has read and written so far (/proc/PID/io); 0 if unknown.
std::uint64_t io_bytes(pid_t pid) {
  std::ifstream io("/proc/" + std::to_string(pid) + "/io");
  std::string key;
  std::uint64_t value = 0, sum = 0;
  while (io >> key >> value)
    if (key == "rchar:" || key == "wchar:") sum += value;
  return sum;
}

// `tar --create` of `argv` (its archive on stdout) into `sink`. A tar that moves no byte for
// `stall` (a rootfs on a dead NFS server; the sink not taking any) is killed, and that is
// Error(kTimeout) naming `what`: it must not keep the container stopped for good.
std::uint64_t archive_into(const std::vector<std::string>& argv, const std::string& name,
                           const ArchiveSink& sink, const std::string& what,
                           std::chrono::minutes stall, ExitStatus& st) {
  auto [archive, tar_out] = make_pipe("pipe2");
  SpawnOptions so;
  so.stdout_fd = tar_out.get();
  so.new_process_group = true;
  so.die_with_parent = true;
  Child tar = spawn(argv, so);
  tar_out.reset();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::atomic<bool> stalled{false};
  std::thread watchdog([&, pid = tar.pid()] {
    auto last = std::chrono::steady_clock::now();
    std::uint64_t seen = io_bytes(pid);
    std::unique_lock lk(mu);
    while (!cv.wait_for(lk, std::chrono::seconds(5), [&] { return done; })) {
      const auto now = std::chrono::steady_clock::now();
      if (const std::uint64_t n = io_bytes(pid); n != seen) {
        seen = n;
        last = now;
      } else if (now - last > stall) {
        stalled = true;
        ::kill(-pid, SIGKILL);  // its process group: reaped only after this thread is joined
        return;
      }
    }
  });
  auto stop_watchdog = [&] {
    {
      std::lock_guard lk(mu);
      done = true;
    }
    cv.notify_all();
    watchdog.join();
  };
  std::uint64_t bytes = 0;
  try {
    bytes = sink(name, archive.get());
  } catch (...) {
    stop_watchdog();
    tar.kill(SIGKILL);
    tar.wait();
    throw;
  }
  stop_watchdog();
  st = tar.wait();
  if (stalled)
    throw Error(Errc::kTimeout, "tar of " + what + " moved no byte for " +
                                    std::to_string(stall.count()) + " minutes and was killed");
  return bytes;
}

}  // namespace

const char* layer_file(WritableLayer layer) {
  if (layer == WritableLayer::kCarried) return kRootfsDiffFile;
  if (layer == WritableLayer::kRootfs) return kRootfsFile;
  return nullptr;
}

std::uint64_t write_layer_archive(const DumpPlan& p, const fs::path& images_dir,
                                  ContainerRecord& out, const ArchiveSink& sink) {
  std::error_code ec;
  out.layer_why = p.layer_why;
  fs::path from = p.upper_dir;
  std::string what = "the writable layer of container " + p.record.id;
  if (p.record.layer == WritableLayer::kRootfs) {
    out.layer = WritableLayer::kRootfs;
    from = p.record.rootfs;
    what = "the rootfs of container " + p.record.id;
  } else if (runs_bundles(p.record.runtime)) {
    out.layer = WritableLayer::kNone;
    return 0;
  } else if (p.upper_dir.empty()) {
    out.layer = WritableLayer::kNotCarried;
    return 0;
  } else {
    out.layer = WritableLayer::kEmpty;
  }
  if (!fs::is_directory(from, ec))
    throw Error(Errc::kIo, what + " (" + from.string() + ") is no directory any more");
  if (out.layer == WritableLayer::kEmpty) {
    if (fs::is_empty(from, ec)) return 0;
    out.layer = WritableLayer::kCarried;
  }
  const std::string name = layer_file(out.layer);
  const fs::path file = images_dir / name;
  // GNU tar keeps what overlay needs of an upper directory: whiteouts are character devices
  // 0:0, and an opaque directory is its trusted.overlay.opaque attribute. A rootfs stays on its
  // own file system: a host mount under it is not the container's.
  std::vector<std::string> argv{
      "tar",      "--create",           "--file",  sink ? "-" : file.string(), "--numeric-owner",
      "--xattrs", "--xattrs-include=*", "--sparse"};
  // A rootfs unpacked by a restore carries that checkpoint's token, which is not this one's.
  if (out.layer == WritableLayer::kRootfs)
    argv.insert(argv.end(),
                {"--one-file-system", std::string("--xattrs-exclude=") + kRootfsTokenXattr});
  argv.insert(argv.end(), {"-C", from.string(), "."});
  ExitStatus st;
  std::uint64_t bytes = 0;
  if (sink) {
    bytes = archive_into(argv, name, sink, what, std::chrono::minutes(10), st);
  } else {
    SpawnOptions so;
    so.die_with_parent = true;  // into the staging, which the guard removes once gpuckpt dies
    st = run_capture(argv, std::chrono::minutes(30), so).status;
  }
  // GNU tar's 1: a file changed while it was read (a snapshot's container runs again by now);
  // what it wrote is whole, each file as it was when read.
  if (st.exited && st.code == 1)
    spdlog::warn(
        "files of {} changed while it was saved: a snapshot keeps each as it was when "
        "read",
        what);
  else if (!st.ok())
    throw Error(Errc::kIo,
                "tar of " + what + " " + from.string() + " failed (" + st.describe() + ")");
  return sink ? bytes : fs::file_size(file);
}

void write_descriptors(const ContainerRecord& r, const fs::path& images_dir) {
  write_file_atomic(images_dir / kDescriptorsFile, json(r.stdio).dump());
}

fs::path runc_binary() {
  if (const char* e = std::getenv("GPUCKPT_RUNC"); e && *e) return e;
  if (auto p = find_executable("runc")) return *p;
  throw Error(Errc::kInvalidInput,
              "runc was not found on PATH (set GPUCKPT_RUNC): containers need it");
}

namespace {

// Whether `crun --version` lists +CRIU: crun has checkpoint and restore only when built with
// libcriu (Debian 12's is not).
bool crun_has_criu(const fs::path& crun) {
  static std::mutex mu;
  static std::map<fs::path, bool> known;
  std::lock_guard lk(mu);
  if (const auto it = known.find(crun); it != known.end()) return it->second;
  const RunResult r = run_capture({crun.string(), "--version"}, std::chrono::seconds(30));
  const bool has = r.status.ok() && r.output.find("+CRIU") != std::string::npos;
  known.emplace(crun, has);
  return has;
}

}  // namespace

fs::path crun_binary() {
  std::vector<fs::path> tried;
  if (const char* e = std::getenv("GPUCKPT_CRUN"); e && *e) {
    tried.emplace_back(e);
  } else {
    if (auto p = find_executable("crun")) tried.push_back(*p);
    try {
      tried.push_back(criu::locate().binary.parent_path() / "crun");
    } catch (const Error&) {
      // No CRIU of gpuckpt's: its prefix holds no crun either.
    }
  }
  std::string why;
  for (const auto& c : tried) {
    std::error_code ec;
    if (!fs::exists(c, ec)) continue;
    if (crun_has_criu(c)) return c;
    why += (why.empty() ? "" : "; ") + c.string() +
           " was built without CRIU (`crun --version` lacks +CRIU)";
  }
  throw Error(Errc::kUsage,
              "no crun that can checkpoint and restore was found" +
                  (why.empty() ? std::string(" (none on PATH)") : " (" + why + ")") +
                  ": set GPUCKPT_CRUN to a crun built with libcriu, as podman's and CRI-O's "
                  "are; scripts/install-crun.sh builds one into gpuckpt's CRIU prefix");
}

namespace {

// Whether `done` holds within `bound`, asked every 20 ms: a daemon's view of a container follows
// its init's end by a moment, and it tells nobody when.
bool within(std::chrono::milliseconds bound, const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + bound;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

bool task_stopped_within(containerd::Client& api, const std::string& id,
                         std::chrono::milliseconds bound) {
  return within(bound, [&] {
    const auto t = api.task(id);
    return !t || t->status == containerd::TaskStatus::kStopped;
  });
}

namespace {

std::string forget_run(const Container& c) {
  switch (c.root.runtime) {
    case Runtime::kDocker: {
      // dockerd deletes the task itself once the shim tells it the init ended: its container
      // is free to start again once dockerd no longer shows it running.
      docker::Client api;
      if (within(std::chrono::seconds(30), [&] {
            const auto j = api.inspect(c.id);
            return !j || !docker::flag_at(*j, {"State", "Running"});
          }))
        return {};
      return "dockerd still shows container " + c.id + " running 30 s after its init ended";
    }
    case Runtime::kContainerd: {
      containerd::Client api(containerd::address(), c.root.ns);
      if (!task_stopped_within(api, c.id, std::chrono::seconds(30)))
        return "containerd's task " + c.id + " still runs 30 s after its init ended";
      api.delete_task(c.id);
      return {};
    }
    case Runtime::kRunc:
    case Runtime::kCrun:
      break;
  }
  auto argv = runtime_argv(c.root.runtime, c.root.path.string());
  argv.insert(argv.end(), {"delete", "--force", c.id});
  const RunResult res = run_capture(argv, std::chrono::seconds(60));
  if (!res.status.ok())
    return std::string(container_runtime_name(c.root.runtime)) + " delete " + c.id + ": " +
           res.output;
  return {};
}

}  // namespace

std::string stream_refusal(const ContainerRecord& r) {
  if (r.runtime == Runtime::kDocker)
    return "dockerd restores from a checkpoint directory of its own";
  if (r.runtime != Runtime::kContainerd || !r.containerd) return {};
  std::string v;
  try {
    v = containerd::Client(containerd::address(), r.containerd->ns).version();
  } catch (const Error&) {
    return {};  // the restore's own call to it says what is wrong
  }
  const std::string bare = v.substr(v.rfind('v', 0) == 0 ? 1 : 0);
  if (std::atoi(bare.c_str()) >= 2)
    return "containerd " + v + " runs the criu on its shims' PATH, without gpuckpt's configuration";
  return {};
}

std::string remove_ended(const Container& c) {
  try {
    if (std::string why = forget_run(c); !why.empty()) return why;
  } catch (const Error& e) {
    return e.what();
  }
  // The bundle a restore made for it, if it was one (its log stays under kLogsDir).
  remove_restore_bundle(c.root.path, c.id);
  return {};
}

bool await_runtime_start(const Container& c, std::chrono::seconds limit) noexcept {
  if (c.root.runtime != Runtime::kDocker) return true;
  // dockerd holds a container's lock for the whole of its start, and its inspect takes that
  // lock: the answer comes once no start is in flight (a container gone answers at once).
  try {
    (void)docker::Client().inspect(c.id, limit);
    return true;
  } catch (const std::exception& e) {
    spdlog::warn("waiting for dockerd's start of container {} to end: {}", c.id, e.what());
    return false;
  }
}

std::string remove_unstarted(const Container& c) {
  if (c.root.runtime != Runtime::kContainerd) return {};
  try {
    containerd::Client api(containerd::address(), c.root.ns);
    const auto t = api.task(c.id);
    if (t && t->status == containerd::TaskStatus::kCreated) api.delete_task(c.id);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

std::string remove_record(const Container& c) {
  try {
    if (c.root.runtime == Runtime::kContainerd) {
      containerd::Client api(containerd::address(), c.root.ns);
      const auto info = api.container(c.id);
      if (!info) return {};
      api.delete_container(c.id);
      if (!info->snapshot_key.empty()) api.remove_snapshot(info->snapshotter, info->snapshot_key);
    } else if (c.root.runtime == Runtime::kDocker) {
      docker::Client().remove(c.id);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

void destroy(const Container& c) {
  if (!state_json(c.root, c.id)) return;  // runc removed it itself
  try {
    switch (c.root.runtime) {
      case Runtime::kContainerd:
        containerd::Client(containerd::address(), c.root.ns).kill_task(c.id, SIGKILL);
        break;
      case Runtime::kDocker:
        docker::Client().kill(c.id);
        break;
      case Runtime::kRunc:
      case Runtime::kCrun: {
        auto kill = runtime_argv(c.root.runtime, c.root.path.string());
        kill.insert(kill.end(), {"kill", c.id, "KILL"});
        (void)run_capture(kill, std::chrono::seconds(30));
        break;
      }
    }
  } catch (const Error& e) {
    spdlog::warn("{}", e.what());
  }
  if (c.init_pid > 0 && !process::wait_ended(c.init_pid, std::chrono::seconds(30)))
    spdlog::warn("the init {} of container {} has not ended 30 s after SIGKILL", c.init_pid, c.id);
  if (const std::string why = remove_ended(c); !why.empty()) spdlog::warn("{}", why);
}

}  // namespace gpuckpt::container
