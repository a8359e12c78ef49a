#include "container/pod.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "process/proc_info.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt::container {

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

}  // namespace

std::vector<std::pair<std::string, std::string>> joined_namespaces(const json& spec) {
  auto out = spec_namespaces(spec);
  std::erase_if(out, [](const auto& ns) { return ns.second.empty(); });
  return out;
}

std::string proc_ns_name(const std::string& type) {
  return type == "network" ? "net" : type == "mount" ? "mnt" : type;
}

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

void join_namespaces(json& spec, const PodNamespaces& joins) {
  if (joins.empty() || !spec.contains("linux") || !spec["linux"].contains("namespaces")) return;
  for (auto& ns : spec["linux"]["namespaces"])
    if (ns.is_object() && !ns.value("path", "").empty())
      if (const auto t = pod_namespace_from(ns.value("type", "")))
        if (const auto it = joins.find(*t); it != joins.end()) ns["path"] = it->second.string();
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
