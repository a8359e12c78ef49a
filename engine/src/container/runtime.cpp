#include "container/runtime.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "container/record.h"
#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "process/proc_info.h"
#include "util/fs.h"

namespace fs = std::filesystem;

namespace gpuckpt::container {

namespace {

// A container's state is small; anything larger is not runc's.
constexpr std::uintmax_t kMaxStateBytes = 16u << 20;

// crun keeps `status` where runc keeps state.json, and its copy of the spec (config.json, which
// runc keeps none of) from the start, before the status. A root named in $GPUCKPT_RUNC_ROOTS may
// be either's: each container's own files say whose it is.
bool crun_state_at(const fs::path& dir) {
  std::error_code ec;
  return !fs::exists(dir / "state.json", ec) &&
         (fs::exists(dir / "status", ec) || fs::exists(dir / "config.json", ec));
}

std::optional<Container> read_state(const StateRoot& root, const fs::path& dir) {
  const auto j = state_json(root, dir.filename().string());
  if (!j) return std::nullopt;
  Container c;
  c.root = root;
  if (crun_state_at(dir)) {
    if (root.runtime == Runtime::kRunc) c.root.runtime = Runtime::kCrun;
    c.under_crun = root.runtime == Runtime::kContainerd || root.runtime == Runtime::kDocker;
  }
  c.id = j->value("id", dir.filename().string());
  const auto pid = j->value("init_process_pid", 0);
  c.init_start = j->value("init_process_start", std::uint64_t{0});
  if (pid <= 0) return std::nullopt;
  c.init_pid = static_cast<pid_t>(pid);
  // Its init must be the process runc started, not a later one that reuses the pid.
  if (process::start_ticks(c.init_pid) != c.init_start || !process::alive(c.init_pid))
    return std::nullopt;
  c.pid_namespace = process::pid_namespace_inode(c.init_pid).value_or(0);
  if (const auto cfg = j->find("config"); cfg != j->end() && cfg->is_object())
    c.rootfs = cfg->value("rootfs", "");
  return c;
}

}  // namespace

namespace {

// A runtime's state file (runc's state.json, crun's status) as a JSON object; nullopt where there
// is none, it is too large to be a runtime's, or it is no JSON object.
std::optional<nlohmann::json> state_file(const fs::path& file) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec || size > kMaxStateBytes) return std::nullopt;
  std::ifstream in(file);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  return j;
}

}  // namespace

namespace {

// OCI's namespace types as libcontainer's configuration names them.
const char* libcontainer_ns(const std::string& oci) {
  static const std::map<std::string, const char*> names = {
      {"pid", "NEWPID"}, {"network", "NEWNET"}, {"mount", "NEWNS"},      {"ipc", "NEWIPC"},
      {"uts", "NEWUTS"}, {"user", "NEWUSER"},   {"cgroup", "NEWCGROUP"}, {"time", "NEWTIME"}};
  const auto it = names.find(oci);
  return it == names.end() ? nullptr : it->second;
}

// crun's state of the container in `dir` (its `status`, and the OCI spec it ran, which crun
// keeps beside it) in the shape of runc's state.json, as far as gpuckpt reads that: its init,
// and of runc's configuration the rootfs, the bundle, the bind mounts, the namespaces, the
// masked paths and the devices. nullopt where either file is missing or malformed.
std::optional<nlohmann::json> crun_state_of(const fs::path& dir);
std::optional<nlohmann::json> crun_state(const fs::path& dir) {
  try {
    return crun_state_of(dir);
  } catch (const nlohmann::json::exception& e) {
    // A field of another type than crun writes: no state of crun's.
    spdlog::debug("{}: {}", dir.string(), e.what());
    return std::nullopt;
  }
}

std::optional<nlohmann::json> crun_state_of(const fs::path& dir) {
  using nlohmann::json;
  const auto status = state_file(dir / "status");
  const auto spec = state_file(dir / "config.json");
  if (!status || !spec) return std::nullopt;
  const json& s = *status;
  // Without its init's start time (an older crun's), a process that reused the pid of an ended
  // one would be taken for it: such a container is not read.
  if (!s.contains("pid") || !s["pid"].is_number_integer() || !s.contains("process-start-time") ||
      !s["process-start-time"].is_number_unsigned() || !s.contains("bundle") ||
      !s["bundle"].is_string())
    return std::nullopt;
  const fs::path bundle = s["bundle"].get<std::string>();
  const json root = spec->value("root", json::object());
  if (!root.is_object() || !root.contains("path") || !root["path"].is_string()) return std::nullopt;
  json config = {{"rootfs", (bundle / root["path"].get<std::string>()).lexically_normal().string()},
                 {"labels", {"bundle=" + bundle.string()}},
                 {"mounts", json::array()},
                 {"namespaces", json::array()},
                 {"mask_paths", json::array()},
                 {"devices", json::array()}};
  for (const auto& m : spec->value("mounts", json::array())) {
    if (!m.is_object()) continue;
    const auto opts = m.value("options", std::vector<std::string>{});
    // crun's own test of a bind mount (criu.c): "bind" or "rbind" among its options.
    if (std::find(opts.begin(), opts.end(), "bind") == opts.end() &&
        std::find(opts.begin(), opts.end(), "rbind") == opts.end())
      continue;
    // runc's state has each source absolute; crun's spec as it was given (relative: to the
    // bundle).
    fs::path source = m.value("source", "");
    if (source.is_relative()) source = (bundle / source).lexically_normal();
    config["mounts"].push_back({{"device", "bind"},
                                {"source", source.string()},
                                {"destination", m.value("destination", "")}});
  }
  const json linux = spec->value("linux", json::object());
  if (!linux.is_object()) return std::nullopt;
  for (const auto& n : linux.value("namespaces", json::array()))
    if (const char* type = n.is_object() ? libcontainer_ns(n.value("type", "")) : nullptr)
      config["namespaces"].push_back({{"type", type}, {"path", n.value("path", "")}});
  config["mask_paths"] = linux.value("maskedPaths", std::vector<std::string>{});
  for (const auto& d : linux.value("devices", json::array()))
    if (d.is_object()) config["devices"].push_back({{"path", d.value("path", "")}});
  json state = {{"init_process_pid", s["pid"]},
                {"init_process_start", s["process-start-time"]},
                {"config", std::move(config)},
                {"crun",
                 {{"cgroup_path", s.value("cgroup-path", "")},
                  {"systemd_cgroup", s.value("systemd-cgroup", false)}}}};
  // crun writes the init's fds 0-2 as a JSON array inside a string.
  const json fds = json::parse(s.value("external_descriptors", ""), nullptr, false);
  if (fds.is_array()) state["external_descriptors"] = fds;
  return state;
}

}  // namespace

std::optional<nlohmann::json> state_json(const StateRoot& root, const std::string& id) {
  if (id.empty() || id.find('/') != std::string::npos || id == "." || id == "..")
    return std::nullopt;
  const fs::path dir = root.path / id;
  // Also one of crun's under a daemon's root (its shim running crun): read, so that it is
  // named for what it is (Container::under_crun), though not dumped.
  if (root.runtime == Runtime::kCrun || crun_state_at(dir)) return crun_state(dir);
  return state_file(dir / "state.json");
}

namespace {

void add_root(std::vector<StateRoot>& roots, StateRoot r) {
  if (std::none_of(roots.begin(), roots.end(),
                   [&](const StateRoot& k) { return k.path == r.path; }))
    roots.push_back(std::move(r));
}

// dockerd keeps a runc root per runtime under its exec root (--exec-root, /run/docker by
// default): runtime-runc, and one for each runtime it was given (runtime-nvidia for the NVIDIA
// container toolkit's). Each running dockerd's exec root is read from its command line.
void add_docker_roots(std::vector<StateRoot>& roots) {
  std::vector<fs::path> execs{"/run/docker"};
  for (const auto& d :
       process::live_procs_where([](const process::ProcInfo& i) { return i.comm == "dockerd"; }))
    if (std::string e = process::cmdline_option(d.cmdline, "exec-root"); !e.empty())
      execs.push_back(e);
  for (const auto& exec : execs) {
    add_root(roots, {Runtime::kDocker, exec / "runtime-runc" / "moby", ""});
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(exec, ec))
      if (e.path().filename().string().rfind("runtime-", 0) == 0 &&
          fs::is_directory(e.path() / "moby", ec))
        add_root(roots, {Runtime::kDocker, e.path() / "moby", ""});
  }
}

// containerd's runc shims keep a root per namespace under /run/containerd/runc, or under the
// Root of the runtime's options (a CRI runtime class may name one). A running shim's options
// are in its bundle, its working directory, as options.json; its namespace is on its command
// line.
void add_containerd_roots(std::vector<StateRoot>& roots) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/run/containerd/runc", ec))
    if (e.is_directory(ec))
      add_root(roots, {Runtime::kContainerd, e.path(), e.path().filename().string()});
  for (const auto& shim : process::live_procs_where(
           [](const process::ProcInfo& i) { return i.comm.rfind("containerd-shim", 0) == 0; })) {
    const std::string ns = process::cmdline_option(shim.cmdline, "namespace");
    if (ns.empty() || ns.find('/') != std::string::npos) continue;
    const fs::path bundle = fs::read_symlink("/proc/" + std::to_string(shim.pid) + "/cwd", ec);
    if (ec) continue;
    std::ifstream in(bundle / "options.json");
    const auto o = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!o.is_object() || !o.contains("root") || !o["root"].is_string()) continue;
    if (const std::string root = o["root"].get<std::string>(); !root.empty())
      add_root(roots, {Runtime::kContainerd, fs::path(root) / ns, ns});
  }
}

// The directories of $GPUCKPT_RUNC_ROOTS: runtimes started with --root DIR.
std::vector<fs::path> roots_from_env() {
  std::vector<fs::path> out;
  if (const char* extra = std::getenv("GPUCKPT_RUNC_ROOTS"); extra && *extra) {
    std::istringstream in(extra);
    for (std::string p; std::getline(in, p, ':');)
      if (!p.empty()) out.emplace_back(p);
  }
  return out;
}

}  // namespace

std::vector<StateRoot> state_roots() {
  std::vector<StateRoot> roots{{Runtime::kRunc, kRuncRoot, ""}, {Runtime::kCrun, kCrunRoot, ""}};
  add_docker_roots(roots);
  add_containerd_roots(roots);
  for (auto& p : roots_from_env()) add_root(roots, {Runtime::kRunc, std::move(p), ""});
  return roots;
}

StateRoot root_at(const fs::path& path, const std::string& id) {
  StateRoot found{Runtime::kRunc, path, ""};
  for (auto& r : state_roots())
    if (r.path == path) found = std::move(r);
  if (found.runtime == Runtime::kRunc && !id.empty() && valid_id(id) && crun_state_at(path / id))
    found.runtime = Runtime::kCrun;
  return found;
}

namespace {

std::vector<Container> running_under(const std::vector<StateRoot>& roots) {
  std::vector<Container> out;
  for (const auto& root : roots) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root.path, ec)) {
      if (!e.is_directory(ec)) continue;
      try {
        if (auto c = read_state(root, e.path())) out.push_back(std::move(*c));
      } catch (const std::exception& ex) {
        // Another runtime's file, or one being rewritten: not a container to name.
        spdlog::debug("{}: {}", e.path().string(), ex.what());
      }
    }
  }
  return out;
}

}  // namespace

std::vector<Container> running() {
  return running_under(state_roots());
}

std::string rootfs_user(const fs::path& rootfs, const std::vector<fs::path>& more_roots) {
  auto roots = state_roots();
  for (const auto& m : more_roots) {
    std::error_code ec;
    if (std::none_of(roots.begin(), roots.end(),
                     [&](const StateRoot& r) { return fs::equivalent(r.path, m, ec); }))
      roots.push_back(root_at(m));
  }
  for (const auto& c : running_under(roots)) {
    std::error_code ec;
    if (!c.rootfs.empty() && fs::equivalent(c.rootfs, rootfs, ec)) return c.describe();
  }
  return {};
}

namespace {

// The fds of this process's RootfsHolds, for release_rootfs_holds. A hold leaves it, under the
// mutex, before its fd is closed: no number released here is another file's by then.
std::mutex g_holds_mu;
std::set<int> g_holds;

}  // namespace

RootfsHold::RootfsHold(UniqueFd fd) : fd_(std::move(fd)) {
  if (!fd_) return;
  std::lock_guard lk(g_holds_mu);
  g_holds.insert(fd_.get());
}

RootfsHold& RootfsHold::operator=(RootfsHold&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::move(o.fd_);
  }
  return *this;
}

void RootfsHold::reset() noexcept {
  (void)release();
}

UniqueFd RootfsHold::release() noexcept {
  if (!fd_) return {};
  std::lock_guard lk(g_holds_mu);
  g_holds.erase(fd_.get());
  return std::move(fd_);
}

void release_rootfs_holds() noexcept {
  std::lock_guard lk(g_holds_mu);
  for (const int fd : g_holds) (void)::flock(fd, LOCK_UN);
}

RootfsHold hold_rootfs(const fs::path& path) {
  for (;;) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) {
      // Nothing, or no directory (a link, a file): nothing to hold, for the caller to refuse.
      if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) return {};
      throw_errno(Errc::kIo, "open the rootfs ", path);
    }
    while (::flock(fd.get(), LOCK_SH) != 0)
      if (errno != EINTR) throw_errno(Errc::kIo, "lock the rootfs ", path);
    // A restore that removed it held it exclusively until it was gone; another may be there now.
    if (still_at(fd, path)) return RootfsHold(std::move(fd));
  }
}

std::string remove_unused_rootfs(const fs::path& path, const std::vector<fs::path>& more_roots,
                                 RootfsHold held) {
  // Out of the holds that an abort lets go of: the exclusive lock must last the removal.
  UniqueFd fd = held.release();
  if (!fd) {
    fd.reset(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) {
      if (errno == ENOENT) return {};
      throw_errno(Errc::kIo, "open the rootfs ", path);
    }
  }
  // Converting one's own shared lock fails as taking a new one does while another restore holds
  // it shared.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return "another restore of its checkpoint runs on it";
    throw_errno(Errc::kIo, "lock the rootfs ", path);
  }
  if (!still_at(fd, path)) return "another directory is at its path now";
  if (std::string user = rootfs_user(path, more_roots); !user.empty())
    return "the " + user + " runs on it";
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) throw Error(Errc::kIo, "cannot remove " + path.string() + ": " + ec.message());
  return {};
}

namespace {

// Of `all`, the container whose own pid namespace holds `pid`: the one whose init it is, where
// containers share a namespace (a pod's, with its pause container's init), else the first.
template <class C>
std::optional<C> holder_of(pid_t pid, std::vector<C> all) {
  const auto ns = process::pid_namespace_inode(pid);
  // A container that shares this host's pid namespace (docker --pid=host) holds no process of
  // its own by namespace.
  if (!ns || ns == process::pid_namespace_inode(0)) return std::nullopt;
  std::optional<C> first;
  for (auto& c : all) {
    if (c.pid_namespace != *ns) continue;
    if (c.init_pid == pid) return std::move(c);
    if (!first) first = std::move(c);
  }
  return first;
}

}  // namespace

std::optional<Container> holding(pid_t pid) {
  return holder_of(pid, running());
}

std::string Container::describe() const {
  switch (root.runtime) {
    case Runtime::kDocker:
      return "Docker container " + id;
    case Runtime::kContainerd:
      return "containerd container " + id + " (namespace " + root.ns + ")";
    case Runtime::kCrun:
      return "crun container " + id +
             (root.path == kCrunRoot ? "" : " (crun root " + root.path.string() + ")");
    case Runtime::kRunc:
      break;
  }
  return "runc container " + id +
         (root.path == kRuncRoot ? "" : " (runc root " + root.path.string() + ")");
}

}  // namespace gpuckpt::container
