#include "container/checkpoint.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "criu/criu.h"
#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "process/proc_info.h"
#include "util/fs.h"
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
  std::string mount_point, fstype;
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
    std::string fstype;
    tail >> fstype;
    out.push_back({point, fstype});
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
std::string outside_file(pid_t pid, int fd) {
  const std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  struct stat st {};
  if (::stat(link.c_str(), &st) != 0) return {};
  std::error_code ec;
  const std::string target = fs::read_symlink(link, ec).string();
  // The memory devices (/dev/null, /dev/zero...) CRIU opens again by path; a host terminal it
  // cannot give back to a detached container.
  if (S_ISCHR(st.st_mode)) return major(st.st_rdev) == 1 ? std::string() : target;
  if (!S_ISREG(st.st_mode)) return {};
  // The file as the container sees it: reachable if that path names the same inode.
  struct stat inside {};
  const std::string via_root = "/proc/" + std::to_string(pid) + "/root" + target;
  if (::stat(via_root.c_str(), &inside) == 0 && inside.st_ino == st.st_ino &&
      inside.st_dev == st.st_dev)
    return {};
  return target;
}

std::vector<std::string> runc_argv(const std::string& root) {
  return {runc_binary().string(), "--root", root};
}

}  // namespace

json to_json(const ContainerRecord& r) {
  json mounts = json::array();
  for (const auto& m : r.mounts)
    mounts.push_back({{"destination", m.destination}, {"source", m.source}});
  return {{"runtime", runtime_name(r.runtime)},
          {"root", r.root},
          {"id", r.id},
          {"bundle", r.bundle},
          {"rootfs", r.rootfs},
          {"spec", r.spec},
          {"stdio", r.stdio},
          {"mounts", mounts},
          {"network", {{"own", r.own_network}, {"loopback_up", r.loopback_up}}}};
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
    return r;
  } catch (const json::exception& e) {
    throw Error(Errc::kCorrupt, std::string("malformed container record: ") + e.what());
  }
}

Container find(const std::string& id) {
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

DumpPlan plan_dump(const Container& c, bool tcp_established) {
  if (c.root.runtime != Runtime::kRunc)
    throw Error(Errc::kUsage, "the " + c.describe() +
                                  " belongs to its runtime, which gpuckpt cannot restore into "
                                  "yet: checkpoint it with `" +
                                  c.checkpoint_command() + "`. Nothing was frozen");
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
    if (const std::string f = outside_file(init, fd); !f.empty())
      throw Error(Errc::kProcess,
                  "the init of the " + c.describe() + " has its fd " + std::to_string(fd) + " on " +
                      f +
                      ", a host file outside the container's mounts, which CRIU cannot dump. "
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

void write_descriptors(const ContainerRecord& r, const fs::path& images_dir) {
  write_file_atomic(images_dir / kDescriptorsFile, json(r.stdio).dump());
}

fs::path runc_binary() {
  if (const char* e = std::getenv("GPUCKPT_RUNC"); e && *e) return e;
  if (auto p = find_executable("runc")) return *p;
  throw Error(Errc::kInvalidInput,
              "runc was not found on PATH (set GPUCKPT_RUNC): containers need it");
}

std::string remove_ended(const Container& c) {
  try {
    auto argv = runc_argv(c.root.path.string());
    argv.insert(argv.end(), {"delete", "--force", c.id});
    const RunResult res = run_capture(argv, std::chrono::seconds(60));
    if (!res.status.ok()) return "runc delete " + c.id + ": " + res.output;
  } catch (const Error& e) {
    return e.what();
  }
  // The bundle a restore made for it, if it was one (its log stays under kLogsDir).
  remove_restore_bundle(c.id);
  return {};
}

void remove_restore_bundle(const std::string& id) {
  if (!valid_id(id)) return;
  std::error_code ec;
  fs::remove_all(fs::path(kBundlesDir) / id, ec);
}

void destroy(const Container& c) {
  if (!state_json(c.root, c.id)) return;  // runc removed it itself
  auto argv = runc_argv(c.root.path.string());
  auto kill = argv;
  kill.insert(kill.end(), {"kill", c.id, "KILL"});
  try {
    (void)run_capture(kill, std::chrono::seconds(30));
  } catch (const Error& e) {
    spdlog::warn("{}", e.what());
  }
  if (const std::string why = remove_ended(c); !why.empty()) spdlog::warn("{}", why);
}

void check_restore_target(const ContainerRecord& r, const std::string& id) {
  if (r.runtime != Runtime::kRunc)
    throw Error(Errc::kUsage, "gpuckpt restores only runc containers yet");
  if (!valid_id(id))
    throw Error(Errc::kUsage, "'" + id +
                                  "' is no container ID runc accepts (letters, digits, _ + - "
                                  "and .): nothing was restored");
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
  std::error_code ec;
  if (!fs::is_directory(r.rootfs, ec))
    throw Error(Errc::kInvalidInput, "the container's root filesystem " + r.rootfs +
                                         " is not here: nothing was restored");
  for (const auto& m : r.mounts)
    if (!fs::exists(fs::symlink_status(m.source, ec)))
      throw Error(Errc::kInvalidInput, "the source " + m.source + " of the container's mount " +
                                           m.destination + " is not here: nothing was restored");
}

Container runc_restore(const RestoreRequest& q) {
  const ContainerRecord& r = *q.record;
  const fs::path bundle = fs::path(kBundlesDir) / q.id;
  fs::create_directories(bundle);
  ::chmod(fs::path(kBundlesDir).c_str(), 0700);
  std::string conf;
  for (const auto& l : q.criu_config) conf += l + "\n";
  write_file_atomic(bundle / "criu.conf", conf);
  json spec = r.spec;
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
  fs::path stdio = q.stdio_log;
  if (stdio.empty()) {
    fs::create_directories(kLogsDir);
    stdio = fs::path(kLogsDir) / (q.id + ".log");
  }
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw_errno(Errc::kInternal, "pipe2");
  UniqueFd drain(ends[0]), feed(ends[1]);
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
  Child c = spawn(argv, so);
  feed.reset();
  const Container made{StateRoot{Runtime::kRunc, r.root, ""}, q.id};
  auto undo = [&] {
    destroy(made);
    remove_restore_bundle(q.id);
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
    const fs::path kept = criu::preserve_log(q.work / criu::kRestoreLogName, "runc-criu-restore");
    throw Error(Errc::kCriu, "runc restore of container " + q.id + " failed (" + st->describe() +
                                 "):\n" + criu::log_tail(runc_log, 4) + criu::log_excerpt(kept) +
                                 "CRIU's log: " + kept.string());
  }
  for (auto& found : running())
    if (found.id == q.id && found.root.path == r.root) return std::move(found);
  undo();
  throw Error(Errc::kProcess, "runc restored container " + q.id + ", but runc (root " + r.root +
                                  ") does not list it running");
}

std::string in_container_network(const ContainerRecord& r, pid_t init,
                                 const std::function<std::string()>& fn) {
  return r.own_network ? in_network_of(init, fn) : fn();
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
