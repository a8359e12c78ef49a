#include "container/checkpoint.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/nsfs.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <xxhash.h>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "container/containerd.h"
#include "container/docker.h"
#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/support.h"
#include "process/proc_info.h"
#include "trust/keys.h"
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

// runc's own rule for IDs; anything else could name a path outside the bundles' directory.
bool valid_id(const std::string& id) {
  if (id.empty() || id == "." || id == ".." || id.size() > 1024) return false;
  return std::all_of(id.begin(), id.end(), [](unsigned char ch) {
    return std::isalnum(ch) || ch == '_' || ch == '+' || ch == '-' || ch == '.';
  });
}

WritableLayer layer_from(const std::string& s) {
  for (const auto l : {WritableLayer::kNone, WritableLayer::kEmpty, WritableLayer::kCarried,
                       WritableLayer::kNotCarried})
    if (s == layer_name(l)) return l;
  throw Error(Errc::kCorrupt, "unknown writable layer '" + s + "' in the container record");
}

Runtime runtime_from(const std::string& s) {
  if (s == "runc") return Runtime::kRunc;
  if (s == "docker") return Runtime::kDocker;
  if (s == "containerd") return Runtime::kContainerd;
  throw Error(Errc::kCorrupt, "unknown container runtime '" + s + "' in the container record");
}

// Runs `fn` on a thread of its own that has entered the network namespace of `pid`: setns
// changes only the calling thread's namespace, so gpuckpt's other threads stay where they are.
template <typename Fn>
auto in_network_of(pid_t pid, Fn fn) -> decltype(fn()) {
  const std::string ns = "/proc/" + std::to_string(pid) + "/ns/net";
  UniqueFd fd(::open(ns.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw_errno(Errc::kProcess, "open ", ns);
  decltype(fn()) result{};
  std::exception_ptr failure;
  std::thread t([&] {
    try {
      if (::setns(fd.get(), CLONE_NEWNET) != 0)
        throw_errno(Errc::kProcess, "entering the network namespace of pid ", pid);
      result = fn();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  t.join();
  if (failure) std::rethrow_exception(failure);
  return result;
}

// The flags of the loopback device in the calling thread's network namespace.
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

struct MountInfo {
  int id = 0;  // the mount's ID, which /proc/PID/fdinfo names as mnt_id
  std::string mount_point, fstype, options;  // options: the file system's own (super options)
};

// /proc/PID/mountinfo as its process sees it (mount points relative to its root).
std::vector<MountInfo> mounts_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/mountinfo");
  std::vector<MountInfo> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype, source, options;
    tail >> fstype >> source >> options;
    out.push_back({std::atoi(id.c_str()), point, fstype, options});
  }
  return out;
}

std::string bundle_of(const json& config) {
  for (const auto& l : config.value("labels", json::array()))
    if (l.is_string() && l.get<std::string>().rfind("bundle=", 0) == 0)
      return l.get<std::string>().substr(7);
  return {};
}

bool has_namespace(const json& config, const char* type, std::string* path = nullptr) {
  for (const auto& n : config.value("namespaces", json::array()))
    if (n.value("type", "") == type) {
      if (path) *path = n.value("path", "");
      return true;
    }
  return false;
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

std::vector<std::string> runc_argv(const std::string& root) {
  return {runc_binary().string(), "--root", root};
}

}  // namespace

const char* layer_name(WritableLayer l) {
  switch (l) {
    case WritableLayer::kEmpty:
      return "empty";
    case WritableLayer::kCarried:
      return "carried";
    case WritableLayer::kNotCarried:
      return "not_carried";
    case WritableLayer::kNone:
      break;
  }
  return "none";
}

const char* runtime_name(Runtime r) {
  switch (r) {
    case Runtime::kDocker:
      return "docker";
    case Runtime::kContainerd:
      return "containerd";
    case Runtime::kRunc:
      break;
  }
  return "runc";
}

json to_json(const ContainerRecord& r) {
  json mounts = json::array();
  for (const auto& m : r.mounts)
    mounts.push_back({{"destination", m.destination}, {"source", m.source}});
  json j = {{"runtime", runtime_name(r.runtime)},
            {"root", r.root},
            {"id", r.id},
            {"bundle", r.bundle},
            {"rootfs", r.rootfs},
            {"spec", r.spec},
            {"stdio", r.stdio},
            {"mounts", mounts},
            {"network", {{"own", r.own_network}, {"loopback_up", r.loopback_up}}},
            {"writable_layer", layer_name(r.layer)}};
  if (!r.layer_why.empty()) j["writable_layer_why"] = r.layer_why;
  for (const auto& [type, n] : r.joined) {
    j["joined_namespaces"][type] = {{"inode", n.inode}};
    if (!n.boot_id.empty())
      j["joined_namespaces"][type].update(
          {{"boot_id", n.boot_id}, {"holder_started", n.holder_started}});
  }
  if (const auto& c = r.containerd)
    j["containerd"] = {
        {"namespace", c->ns},
        {"image", c->image},
        {"image_digest", c->image_digest},
        {"labels", c->labels},
        {"runtime", c->runtime},
        {"options_type", c->options_type},
        {"options", trust::to_base64(reinterpret_cast<const unsigned char*>(c->options.data()),
                                     c->options.size())},
        {"snapshotter", c->snapshotter},
        {"snapshot_parent", c->snapshot_parent},
        {"sandbox", c->sandbox}};
  if (const auto& d = r.docker)
    j["docker"] = {{"name", d->name},
                   {"config", d->config},
                   {"host_config", d->host_config},
                   {"image_id", d->image_id}};
  return j;
}

namespace {

// The namespaces that `spec` names (OCI type, path: "" for one of its own), in its order.
std::vector<std::pair<std::string, std::string>> spec_namespaces(const json& spec) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!spec.contains("linux") || !spec["linux"].contains("namespaces")) return out;
  for (const auto& ns : spec["linux"]["namespaces"])
    if (ns.is_object()) out.emplace_back(ns.value("type", ""), ns.value("path", ""));
  return out;
}

// Whether `spec` gives the container a namespace of `type` of its own (one without a path).
bool has_own_namespace(const json& spec, const std::string& type) {
  const auto all = spec_namespaces(spec);
  return std::any_of(all.begin(), all.end(),
                     [&type](const auto& ns) { return ns.first == type && ns.second.empty(); });
}

// The namespaces that `spec` joins by path (OCI type, path), in its order.
std::vector<std::pair<std::string, std::string>> joined_namespaces(const json& spec) {
  auto out = spec_namespaces(spec);
  std::erase_if(out, [](const auto& ns) { return ns.second.empty(); });
  return out;
}

// An OCI namespace type's name under /proc/PID/ns.
std::string proc_ns_name(const std::string& type) {
  return type == "network" ? "net" : type == "mount" ? "mnt" : type;
}

// The process or thread whose namespace a /proc/PID/ns/ or /proc/PID/task/TID/ns/ path names;
// 0 for another path (a bind mount, /proc/self).
pid_t ns_holder(const std::string& path) {
  std::size_t at = 0;
  // The number that `path` has at `at`, followed by '/'; 0 if none.
  auto number = [&path, &at]() -> pid_t {
    pid_t n = 0;
    const std::size_t from = at;
    for (; at < path.size() && std::isdigit(static_cast<unsigned char>(path[at])); ++at) {
      if (n > 4194304) return 0;  // above any pid_max
      n = n * 10 + (path[at] - '0');
    }
    return at > from && at < path.size() && path[at++] == '/' ? n : 0;
  };
  auto skip = [&path, &at](std::string_view word) {
    if (path.compare(at, word.size(), word) != 0) return false;
    at += word.size();
    return true;
  };
  if (!skip("/proc/")) return 0;
  pid_t holder = number();
  if (holder > 0 && skip("task/")) holder = number();
  return holder > 0 && skip("ns/") ? holder : 0;
}

// The path that `path` names through the links an operator made (a directory linked to /proc/PID,
// a link to /proc/PID/ns/ipc), up to the namespace file itself, whose own link is the kernel's.
std::string ns_file(const std::string& path) {
  fs::path p = path;
  std::error_code ec;
  for (int hops = 0; hops < 40; ++hops) {
    const fs::path dir = fs::canonical(p.parent_path(), ec);
    if (ec) return path;
    p = dir / p.filename();
    if (ns_holder(p.string()) > 0 || !fs::is_symlink(p, ec)) return p.string();
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) return p.string();
    p = target.is_absolute() ? target : dir / target;
  }
  return p.string();
}

}  // namespace

json target_check_json(const ContainerRecord& r) {
  json j = to_json(r);
  // Of the spec, only the namespaces the container joined by path, which must be there too.
  j["spec"] = json::object();
  for (const auto& [type, path] : joined_namespaces(r.spec))
    j["spec"]["linux"]["namespaces"].push_back({{"type", type}, {"path", path}});
  if (j.contains("containerd")) {
    j["containerd"]["labels"] = json::object();
    j["containerd"]["options"] = "";
  }
  if (j.contains("docker")) {
    j["docker"]["config"] = {{"Image", docker::string_at(r.docker->config, {"Image"})}};
    j["docker"]["host_config"] = json::object();
  }
  return j;
}

ContainerRecord container_record_from_json(const json& j) {
  try {
    ContainerRecord r;
    r.runtime = runtime_from(j.at("runtime").get<std::string>());
    r.root = j.at("root").get<std::string>();
    r.id = j.at("id").get<std::string>();
    if (!valid_id(r.id)) throw Error(Errc::kCorrupt, "the container record's ID is no runc ID");
    r.bundle = j.value("bundle", "");
    r.rootfs = j.at("rootfs").get<std::string>();
    r.spec = j.at("spec");
    if (!r.spec.is_object()) throw Error(Errc::kCorrupt, "the container record has no OCI spec");
    r.stdio = j.value("stdio", std::vector<std::string>{});
    for (const auto& m : j.value("mounts", json::array()))
      r.mounts.push_back(
          {m.at("destination").get<std::string>(), m.at("source").get<std::string>()});
    if (j.contains("network")) {
      r.own_network = j["network"].value("own", false);
      r.loopback_up = j["network"].value("loopback_up", false);
    }
    const json joined = j.value("joined_namespaces", json::object());
    for (const auto& [type, n] : joined.items())
      r.joined[type] = {n.at("inode").get<std::uint64_t>(), n.value("boot_id", ""),
                        n.value("holder_started", std::uint64_t{0})};
    if (j.contains("writable_layer")) {
      r.layer = layer_from(j["writable_layer"].get<std::string>());
      r.layer_why = j.value("writable_layer_why", "");
    } else if (j.value("rootfs_diff", false)) {  // recorded by gpuckpt before 2026-12-06
      r.layer = WritableLayer::kCarried;
    } else if (r.runtime != Runtime::kRunc) {
      r.layer = WritableLayer::kEmpty;
    }
    if (j.contains("containerd")) {
      const json& c = j["containerd"];
      ContainerdRecord d;
      d.ns = c.at("namespace").get<std::string>();
      d.image = c.value("image", "");
      d.image_digest = c.value("image_digest", "");
      d.labels = c.value("labels", std::map<std::string, std::string>{});
      d.runtime = c.at("runtime").get<std::string>();
      d.options_type = c.value("options_type", "");
      const std::string b64 = c.value("options", "");
      const std::size_t pad = std::count(b64.begin(), b64.end(), '=');
      if (b64.size() % 4 != 0 || pad > 2)
        throw Error(Errc::kCorrupt, "the containerd runtime options are not base64");
      const auto raw = trust::from_base64(b64, b64.size() / 4 * 3 - pad);
      if (!raw) throw Error(Errc::kCorrupt, "the containerd runtime options are not base64");
      d.options.assign(raw->begin(), raw->end());
      d.snapshotter = c.at("snapshotter").get<std::string>();
      d.snapshot_parent = c.value("snapshot_parent", "");
      d.sandbox = c.value("sandbox", "");
      r.containerd = std::move(d);
    }
    if (j.contains("docker"))
      r.docker = DockerRecord{j["docker"].at("name").get<std::string>(), j["docker"].at("config"),
                              j["docker"].at("host_config"), j["docker"].value("image_id", "")};
    if ((r.runtime == Runtime::kContainerd && !r.containerd) ||
        (r.runtime == Runtime::kDocker && !r.docker))
      throw Error(Errc::kCorrupt, std::string("the container record lacks its ") +
                                      runtime_name(r.runtime) + " part");
    return r;
  } catch (const json::exception& e) {
    throw Error(Errc::kCorrupt, std::string("malformed container record: ") + e.what());
  }
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
  if (const auto all = running();
      std::none_of(all.begin(), all.end(), [&](const Container& c) { return c.id == id; })) {
    if (std::string full = docker_full_id(name); !full.empty()) id = std::move(full);
  }
  for (auto& c : running())
    if (c.id == id) {
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
      } catch (const Error&) {
      }
      if (frozen.rfind("FROZEN", 0) == 0 || frozen.rfind("1", 0) == 0)
        throw Error(Errc::kProcess, "the " + c.describe() +
                                        " is paused: resume it first (runc resume); nothing was "
                                        "frozen");
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
              "no running container " + id + " is known to runc, Docker or containerd here" +
                  (list.empty() ? std::string(" (none runs)") : " (running: " + list + ")") +
                  "; a runc started with --root DIR is found through $GPUCKPT_RUNC_ROOTS");
}

namespace {

// The overlay upper directory among a snapshot's mount options.
fs::path upper_of(const std::vector<containerd::Mount>& mounts) {
  for (const auto& m : mounts)
    for (const auto& o : m.options)
      if (o.rfind("upperdir=", 0) == 0) return o.substr(9);
  return {};
}

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

namespace {

// What a dockerd must be to restore a checkpoint: what its runc gives CRIU closes TCP as the
// dump did, and it runs in experimental mode. Throws Error(kUsage) naming the fix.
void require_docker_restores(docker::Client& api) {
  require_runc_conf_closes_tcp();
  if (!docker::flag_at(api.version(), {"Experimental"}))
    throw Error(Errc::kUsage,
                "dockerd restores checkpoints only in experimental mode: set "
                "\"experimental\": true in /etc/docker/daemon.json and restart it");
}

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

}  // namespace

DumpPlan plan_dump(const Container& c, bool tcp_established) {
  const auto state = state_json(c.root, c.id);
  if (!state || !state->contains("config"))
    throw Error(Errc::kInvalidInput, "runc's state of the " + c.describe() + " is gone");
  const json& config = state->at("config");
  DumpPlan p;
  ContainerRecord& r = p.record;
  r.runtime = c.root.runtime;
  r.root = c.root.path.string();
  r.id = c.id;
  r.rootfs = config.value("rootfs", "");
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
  auto external = [&](const std::string& dest, const std::string& key, const std::string& src) {
    a.push_back("--ext-mount-map");
    a.push_back(dest + ":" + key);
    if (!src.empty()) r.mounts.push_back({dest, src});
  };
  for (const auto& m : config.value("mounts", json::array()))
    if (m.value("device", "") == "bind")
      external(m.value("destination", ""), m.value("destination", ""), m.value("source", ""));
  // cgroup v1 without a cgroup namespace: runc bind-mounts the host's hierarchies.
  if (!has_namespace(config, "NEWCGROUP"))
    for (const auto& m : mounts)
      if (m.fstype == "cgroup" && m.mount_point.rfind("/sys/fs/cgroup/", 0) == 0)
        external(m.mount_point, m.mount_point, "");
  // Masked files are /dev/null bound over them.
  for (const auto& path : config.value("mask_paths", std::vector<std::string>{})) {
    struct stat st {};
    const std::string inside = "/proc/" + std::to_string(init) + "/root" + path;
    if (::stat(inside.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) external(path, "/dev/null", "");
  }
  for (const auto& d : config.value("devices", json::array())) {
    const std::string path = d.value("path", "");
    if (!path.empty()) external(path, path, path);
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

std::uint64_t write_rootfs_diff(const DumpPlan& p, const fs::path& images_dir,
                                ContainerRecord& out) {
  std::error_code ec;
  out.layer_why = p.layer_why;
  if (p.record.runtime == Runtime::kRunc) {
    out.layer = WritableLayer::kNone;
    return 0;
  }
  if (p.upper_dir.empty()) {
    out.layer = WritableLayer::kNotCarried;
    return 0;
  }
  if (!fs::is_directory(p.upper_dir, ec))
    throw Error(Errc::kIo, "the writable layer of container " + p.record.id + " (" +
                               p.upper_dir.string() + ") is no directory any more");
  out.layer = WritableLayer::kEmpty;
  if (fs::is_empty(p.upper_dir, ec)) return 0;
  out.layer = WritableLayer::kCarried;
  const fs::path tar = images_dir / kRootfsDiffFile;
  // GNU tar keeps what overlay needs of an upper directory: whiteouts are character devices
  // 0:0, and an opaque directory is its trusted.overlay.opaque attribute.
  const RunResult r =
      run_capture({"tar", "--create", "--file", tar.string(), "--numeric-owner", "--xattrs",
                   "--xattrs-include=*", "--sparse", "-C", p.upper_dir.string(), "."},
                  std::chrono::minutes(30));
  // GNU tar's 1: a file changed while it was read (a snapshot's container runs again by now);
  // what it wrote is whole, each file as it was when read.
  if (r.status.exited && r.status.code == 1)
    spdlog::warn(
        "files of the container's writable layer changed while it was saved: a "
        "snapshot keeps each as it was when read");
  else if (!r.status.ok())
    throw Error(Errc::kIo, "tar of the container's writable layer " + p.upper_dir.string() +
                               " failed (" + r.status.describe() + ")");
  return fs::file_size(tar);
}

namespace {

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

// The container's writable layer as the checkpoint holds it, into `upper`: the upper directory
// of the container that the restore starts. One made for it (`fresh`) has an empty one; the one
// dumped has whatever it holds now, which is the checkpoint's only if nothing ran in it since,
// so it is emptied first. A layer the checkpoint does not carry leaves the one dumped as it is
// (check_restore_target refuses to make a new one without it).
void set_writable_layer(const RestoreRequest& q, const fs::path& upper, bool fresh) {
  const ContainerRecord& r = *q.record;
  if (r.layer == WritableLayer::kNone || r.layer == WritableLayer::kNotCarried) return;
  if (fresh && r.layer == WritableLayer::kEmpty) return;
  const fs::path diff = q.images / kRootfsDiffFile;
  std::error_code ec;
  if (r.layer == WritableLayer::kCarried && !q.write_layer && !fs::exists(diff, ec))
    throw Error(Errc::kCorrupt,
                "the checkpoint's record says it carries the container's "
                "writable layer, but its images have no " +
                    std::string(kRootfsDiffFile));
  std::optional<Timeline::Scope> scope;
  if (q.timeline) scope.emplace(*q.timeline, stage::kRootfsApply);
  if (scope && r.layer == WritableLayer::kCarried)
    scope->set_bytes(q.write_layer ? q.layer_bytes : fs::file_size(diff, ec));
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
  if (r.layer != WritableLayer::kCarried) return;
  // From a streamed checkpoint, the archive comes on tar's stdin.
  const std::string archive = q.write_layer ? "-" : diff.string();
  const std::vector<std::string> argv{"tar",
                                      "--extract",
                                      "--file",
                                      archive,
                                      "--numeric-owner",
                                      "--xattrs",
                                      "--xattrs-include=*",
                                      "--same-permissions",
                                      "-C",
                                      upper.string()};
  const ExitStatus st = q.write_layer ? extract_streamed(argv, q.write_layer)
                                      : run_capture(argv, std::chrono::minutes(30)).status;
  if (!st.ok())
    throw Error(Errc::kIo, "extracting the container's writable layer into " + upper.string() +
                               " failed (" + st.describe() + ")");
}

}  // namespace

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

// containerd's shim reaps an init that has ended, then its task shows stopped; a task can be
// deleted only then.
bool task_stopped_within(containerd::Client& api, const std::string& id,
                         std::chrono::milliseconds bound) {
  return within(bound, [&] {
    const auto t = api.task(id);
    return !t || t->status == containerd::TaskStatus::kStopped;
  });
}

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
      break;
  }
  auto argv = runc_argv(c.root.path.string());
  argv.insert(argv.end(), {"delete", "--force", c.id});
  const RunResult res = run_capture(argv, std::chrono::seconds(60));
  if (!res.status.ok()) return "runc delete " + c.id + ": " + res.output;
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

namespace {

fs::path restore_dir(const fs::path& root, const std::string& id) {
  if (!valid_id(id)) throw Error(Errc::kUsage, "'" + id + "' is no container ID runc accepts");
  // One directory per runc root: the same ID under two (two containerd namespaces, runc's and
  // Docker's) names two containers.
  const std::string& r = root.native();
  char key[17];
  std::snprintf(key, sizeof key, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(r.data(), r.size())));
  return fs::path(kBundlesDir) / key / id;
}

fs::path make_restore_dir(const fs::path& root, const std::string& id) {
  const fs::path dir = restore_dir(root, id);
  fs::create_directories(dir);
  ::chmod(kBundlesDir, 0700);
  return dir;
}

}  // namespace

void remove_restore_bundle(const fs::path& root, const std::string& id) {
  if (!valid_id(id)) return;
  std::error_code ec;
  fs::remove_all(restore_dir(root, id), ec);
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
      case Runtime::kRunc: {
        auto kill = runc_argv(c.root.path.string());
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

namespace {

void check_runc_target(const ContainerRecord& r, const std::string& id) {
  (void)runc_binary();
  const StateRoot root{Runtime::kRunc, r.root, ""};
  const auto roots = state_roots();
  if (std::none_of(roots.begin(), roots.end(),
                   [&](const StateRoot& k) { return k.path == root.path; }))
    throw Error(Errc::kInvalidInput, "the checkpoint's runc root " + r.root +
                                         " is none that gpuckpt knows here: name it in "
                                         "$GPUCKPT_RUNC_ROOTS. Nothing was restored");
  if (state_json(root, id)) {
    const auto all = running();
    if (std::any_of(all.begin(), all.end(),
                    [&](const Container& c) { return c.id == id && c.root.path == root.path; }))
      throw Error(Errc::kExists, "runc (root " + r.root + ") already has a container " + id +
                                     " running: restore under another ID (--container NEW_ID)");
    // Stopped: a dump that ended it but was itself ended before runc forgot it. Nothing of it
    // runs, so nothing is lost by forgetting it now.
    spdlog::info("runc (root {}) still lists the ended container {}: deleting it", r.root, id);
    if (const std::string why = remove_ended({root, id}); !why.empty())
      throw Error(Errc::kExists, "runc (root " + r.root + ") has a stopped container " + id +
                                     " that could not be deleted: " + why);
  }
}

}  // namespace

namespace {

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

}  // namespace

namespace {

// The host paths that a restore of `r` needs to find: runc's rootfs (containerd and Docker make
// theirs), and the sources of the runtime's bind mounts (volumes, model directories, the
// driver's files) but Docker's own per-container files (resolv.conf, hosts, hostname).
std::vector<std::string> host_paths_needed(const ContainerRecord& r) {
  std::vector<std::string> out;
  if (r.runtime == Runtime::kRunc) out.push_back(r.rootfs);
  for (const auto& m : r.mounts)
    if (r.runtime != Runtime::kDocker ||
        m.source.find("/containers/" + r.id + "/") == std::string::npos)
      out.push_back(m.source);
  return out;
}

}  // namespace

namespace {

// CLONE_NEWTIME, which older headers lack.
constexpr int kCloneNewTime = 0x00000080;

// The clone flag of an OCI namespace type; 0 for one gpuckpt does not know.
int clone_flag(const std::string& type) {
  static const std::pair<const char*, int> kTypes[] = {
      {"network", CLONE_NEWNET}, {"ipc", CLONE_NEWIPC},       {"uts", CLONE_NEWUTS},
      {"mount", CLONE_NEWNS},    {"cgroup", CLONE_NEWCGROUP}, {"user", CLONE_NEWUSER},
      {"pid", CLONE_NEWPID},     {"time", kCloneNewTime}};
  for (const auto& [name, flag] : kTypes)
    if (type == name) return flag;
  return 0;
}

// Refused (Error(kInvalidInput), naming it) unless `path` is a namespace of OCI type `type` here.
void require_namespace(const std::string& type, const std::string& path, const std::string& how) {
  // A FIFO or a device at the path must neither block nor become a terminal.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    throw Error(Errc::kInvalidInput, "the " + type + " namespace " + path + " that the container " +
                                         how + " is not here (" + std::strerror(err) +
                                         "). Nothing was restored");
  }
  const int want = clone_flag(type);
  struct statfs fs {};
  const int got = ::fstatfs(fd.get(), &fs) == 0 && fs.f_type == NSFS_MAGIC
                      ? ::ioctl(fd.get(), NS_GET_NSTYPE)
                      : -1;
  if (got < 0 || (want != 0 && got != want))
    throw Error(Errc::kInvalidInput, path + ", the " + type + " namespace that the container " +
                                         how + ", is no " + type +
                                         " namespace (a bind mount of one, as /run/netns/NAME, "
                                         "or /proc/PID/ns/" +
                                         (type == "network" ? "net" : type) +
                                         "). Nothing was restored");
}

// A /proc/PID/ns/ path names the namespace of whatever process has the pid now: the pod's
// sandbox, or once the pod was recreated (or on another host), any other process. A bind mount
// (/run/netns/NAME) is named by whoever made it, and may be made again under its name.
void require_dumped_namespace(const ContainerRecord& r, const std::string& type,
                              const std::string& path) {
  const auto it = r.joined.find(type);
  const std::string file = ns_file(path);
  if (it == r.joined.end() || file.rfind("/proc/", 0) != 0) return;
  const JoinedNamespace& n = it->second;
  struct stat st {};
  const pid_t holder = ns_holder(file);
  // The same boot and the same process's start name one process; the inode, one namespace.
  const bool same =
      ::stat(path.c_str(), &st) == 0 && st.st_ino == n.inode &&
      (n.boot_id.empty() || (n.boot_id == boot_id() && holder > 0 &&
                             process::start_ticks(holder).value_or(0) == n.holder_started));
  if (same) return;
  throw Error(Errc::kInvalidInput,
              path + " is no longer the " + type + " namespace that container " + r.id +
                  " joined at the dump: its pod was made again (another process has that pid "
                  "now), or this is another host. Restore it into the pod's namespaces as they "
                  "are now, naming each (--join-ns network=PATH, ipc=PATH, uts=PATH; containerd: "
                  "under a new ID, --container NEW_ID). Nothing was restored");
}

}  // namespace

std::string joined_network(const ContainerRecord& r) {
  for (const auto& [type, path] : joined_namespaces(r.spec))
    if (type == "network") return path;
  return {};
}

void check_joined_namespaces(const ContainerRecord& r, const PodNamespaces& joins) {
  if (r.runtime == Runtime::kDocker) {
    if (!joins.empty())
      throw Error(Errc::kUsage,
                  "dockerd makes a Docker container's namespaces itself: --join-ns and --netns "
                  "are for runc and containerd containers");
    return;
  }
  const auto joined = joined_namespaces(r.spec);
  auto joined_path = [&joined](const std::string& type) {
    const auto it = std::find_if(joined.begin(), joined.end(),
                                 [&type](const auto& j) { return j.first == type; });
    return it == joined.end() ? std::string() : it->second;
  };
  for (const auto& [ns, path] : joins) {
    const std::string type = pod_namespace_name(ns);
    if (joined_path(type).empty())
      throw Error(Errc::kUsage,
                  "container " + r.id + " had " +
                      (has_own_namespace(r.spec, type) ? "its own " + type + " namespace"
                                                       : "the host's " + type + " namespace") +
                      ", and --join-ns " + type +
                      "=PATH is for one that it joined by path (a pod's). Nothing "
                      "was restored");
    // The runtime's shim opens it from a directory of its own, and a migration's on the target.
    if (!path.is_absolute())
      throw Error(Errc::kUsage, "--join-ns " + type + "= takes an absolute path, not " +
                                    path.string() + ". Nothing was restored");
  }
  // Dumped by a gpuckpt that let CRIU take the pod's ipc and uts namespaces into the images,
  // whose restore would set them inside the pod it joins (its hostname, SysV objects).
  for (const auto& [ns, path] : joins)
    if (ns != PodNamespace::kNetwork && !r.joined.count(pod_namespace_name(ns)))
      throw Error(Errc::kUsage,
                  "the checkpoint of container " + r.id +
                      " was made by a gpuckpt before "
                      "2026-12-07, which dumped its pod's " +
                      pod_namespace_name(ns) +
                      " namespace with it: restored into another pod it would set that pod's "
                      "state to the first pod's. Restore it where it was, and dump it again "
                      "with this gpuckpt. Nothing was restored");
  // Moved into another pod by its network alone, it would keep the first pod's ipc and uts.
  if (!joins.empty())
    for (const auto& [type, path] : joined) {
      const auto ns = pod_namespace_from(type);
      if (!ns)
        throw Error(Errc::kUsage, "container " + r.id + " joined the " + type + " namespace " +
                                      path +
                                      " by path, which gpuckpt cannot move it out of: restore "
                                      "it where that namespace is, without --join-ns. Nothing "
                                      "was restored");
      if (!joins.count(*ns))
        throw Error(Errc::kUsage, "container " + r.id + " also joined the " + type + " namespace " +
                                      path +
                                      " by path (its pod's): name the new pod's too, with "
                                      "--join-ns " +
                                      type +
                                      "=PATH, or restore it where that pod is. Nothing was "
                                      "restored");
    }
  for (const auto& [ns, path] : joins) {
    const std::string type = pod_namespace_name(ns);
    require_namespace(type, path.string(), "is to join");
    // /proc/self names whoever opens it (gpuckpt, runc, the shim): the host's, never a pod's.
    struct stat want {
    }, own{};
    if (::stat(path.c_str(), &want) == 0 &&
        ::stat(("/proc/self/ns/" + proc_ns_name(type)).c_str(), &own) == 0 &&
        want.st_ino == own.st_ino && want.st_dev == own.st_dev)
      throw Error(Errc::kInvalidInput,
                  path.string() + " is the " + type +
                      " namespace that gpuckpt itself runs in (the host's), not a pod's: name "
                      "the new pod's sandbox's, /proc/PAUSE_PID/ns/" +
                      proc_ns_name(type) + ". Nothing was restored");
  }
  if (joins.empty())
    for (const auto& [type, path] : joined) {
      require_namespace(type, path, "joined at the dump (its pod's; --join-ns names another)");
      require_dumped_namespace(r, type, path);
    }
}

void require_new_record_for_joins(const ContainerRecord& r, const std::string& id,
                                  const PodNamespaces& joins) {
  // containerd makes the task from its record's spec, which names the namespaces it joined.
  if (r.runtime == Runtime::kContainerd && !joins.empty())
    throw Error(Errc::kUsage, "containerd's container " + id +
                                  " keeps the namespaces its record names: give the copy a new "
                                  "ID (restore --container NEW_ID, migrate --new-id) to join "
                                  "another pod's. Nothing was frozen or restored");
}

std::vector<std::string> join_ns_args(const PodNamespaces& joins) {
  std::vector<std::string> out;
  for (const auto& [ns, path] : joins) {
    out.push_back("--join-ns");
    out.push_back(std::string(pod_namespace_name(ns)) + "=" + path.string());
  }
  return out;
}

void check_restore_target(const ContainerRecord& r, const std::string& id,
                          const PodNamespaces& joins) {
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
  for (const auto& p : host_paths_needed(r))
    if (!fs::exists(fs::symlink_status(p, ec)))
      throw Error(Errc::kInvalidInput, p + ", the container's root filesystem or the source of "
                                           "one of its mounts, is not here: nothing was restored");
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

Container running_as(const std::string& root, const std::string& id) {
  for (auto& found : running())
    if (found.id == id && found.root.path == root) return std::move(found);
  throw Error(Errc::kProcess, "container " + id + " was restored, but runc (root " + root +
                                  ") does not list it running");
}

// CRIU's failure, with the lines of its log that say why.
[[noreturn]] void restore_failed(const RestoreRequest& q, const std::string& how,
                                 const std::string& more = {}) {
  const fs::path kept = criu::preserve_log(q.work / criu::kRestoreLogName, "runc-criu-restore");
  throw Error(Errc::kCriu,
              how + ":\n" + more + criu::log_excerpt(kept) + "CRIU's log: " + kept.string());
}

// Each namespace that `spec` joins by path becomes the one `joins` names for its type (runc
// then has CRIU join it: an external network namespace, --join-ns for ipc and uts).
void join_namespaces(json& spec, const PodNamespaces& joins) {
  if (joins.empty() || !spec.contains("linux") || !spec["linux"].contains("namespaces")) return;
  for (auto& ns : spec["linux"]["namespaces"])
    if (ns.is_object() && !ns.value("path", "").empty())
      if (const auto t = pod_namespace_from(ns.value("type", "")))
        if (const auto it = joins.find(*t); it != joins.end()) ns["path"] = it->second.string();
}

Container runc_restore(const RestoreRequest& q) {
  const ContainerRecord& r = *q.record;
  const fs::path bundle = make_restore_dir(r.root, q.id);
  write_file_atomic(bundle / "criu.conf", criu_config_text(q));
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

  const fs::path runc_log = q.work / "runc.log";
  auto argv = runc_argv(r.root);
  argv.insert(argv.end(), {"--log", runc_log.string(), "--criu", q.criu.string(), "restore",
                           "--detach", "--image-path", q.images.string(), "--work-path",
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
  SpawnOptions so;
  so.env = q.env;
  so.stdout_fd = feed.get();
  so.stderr_fd = feed.get();
  so.new_process_group = true;
  so.cwd = bundle;
  if (q.on_container_id) q.on_container_id(r.root, q.id, false);
  Child c = spawn(argv, so);
  feed.reset();
  const Container made{StateRoot{Runtime::kRunc, r.root, ""}, q.id};
  auto undo = [&] {
    destroy(made);
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
    throw Error(Errc::kTimeout, "runc restore did not finish within " +
                                    std::to_string(q.timeout.count()) + " s and was killed");
  }
  if (!st->ok()) {
    undo();
    restore_failed(q, "runc restore of container " + q.id + " failed (" + st->describe() + ")",
                   criu::log_tail(runc_log, 4));
  }
  try {
    return running_as(r.root, q.id);
  } catch (...) {
    undo();
    throw;
  }
}

// For a runtime's shim, which passes CRIU neither gpuckpt's arguments nor its environment: a
// CRIU that runs with this restore's settings (its configuration file through CRIU_CONFIG_FILE,
// which `criu swrk` reads before runc's requests) and the plugin's environment.
fs::path criu_wrapper(const RestoreRequest& q, const fs::path& dir) {
  write_file_atomic(dir / "criu.conf", criu_config_text(q));
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
    return running_as(root, q.id);
  } catch (...) {
    undo();
    throw;
  }
}

// Hard links where the images are on dockerd's file system, else copies: dockerd reads the
// directory once, into its content store, during the start.
void place_images(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    if (!e.is_regular_file() || e.path().filename() == kRootfsDiffFile) continue;
    std::error_code ec;
    fs::create_hard_link(e.path(), to / e.path().filename(), ec);
    if (ec) fs::copy_file(e.path(), to / e.path().filename(), fs::copy_options::overwrite_existing);
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
    containerd::remove_unpacked_copies(token);
    undo();
    throw Error(Errc::kCriu, "Docker's restore of container " + id + " failed: " + e.what() +
                                 " (its CRIU log is in containerd's task directory of " + id + ")");
  }
  containerd::remove_unpacked_copies(token);
  std::error_code ec;
  // The plugin's report, which dockerd's CRIU wrote beside the images (criu/plugin_report.h).
  fs::copy_file(dir / criu::kRestoreReportName, q.images / criu::kRestoreReportName,
                fs::copy_options::overwrite_existing, ec);
  fs::remove_all(dir, ec);
  try {
    return running_as(r.root, id);
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

namespace gpuckpt {

const char* pod_namespace_name(PodNamespace n) {
  switch (n) {
    case PodNamespace::kIpc:
      return "ipc";
    case PodNamespace::kUts:
      return "uts";
    case PodNamespace::kNetwork:
      break;
  }
  return "network";
}

std::optional<PodNamespace> pod_namespace_from(std::string_view name) {
  if (name == "network" || name == "net") return PodNamespace::kNetwork;
  if (name == "ipc") return PodNamespace::kIpc;
  if (name == "uts") return PodNamespace::kUts;
  return std::nullopt;
}

}  // namespace gpuckpt
