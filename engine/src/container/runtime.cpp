#include "container/runtime.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gpuckpt/support.h"
#include "process/proc_info.h"

namespace fs = std::filesystem;

namespace gpuckpt::container {

namespace {

// A container's state is small; anything larger is not runc's.
constexpr std::uintmax_t kMaxStateBytes = 16u << 20;

std::optional<Container> read_state(const StateRoot& root, const fs::path& dir) {
  const auto j = state_json(root, dir.filename().string());
  if (!j) return std::nullopt;
  Container c;
  c.root = root;
  c.id = j->value("id", dir.filename().string());
  const auto pid = j->value("init_process_pid", 0);
  c.init_start = j->value("init_process_start", std::uint64_t{0});
  if (pid <= 0) return std::nullopt;
  c.init_pid = static_cast<pid_t>(pid);
  // Its init must be the process runc started, not a later one that reuses the pid.
  if (process::start_ticks(c.init_pid) != c.init_start || !process::alive(c.init_pid))
    return std::nullopt;
  c.pid_namespace = process::pid_namespace_inode(c.init_pid).value_or(0);
  return c;
}

}  // namespace

std::optional<nlohmann::json> state_json(const StateRoot& root, const std::string& id) {
  if (id.empty() || id.find('/') != std::string::npos || id == "." || id == "..")
    return std::nullopt;
  const fs::path file = root.path / id / "state.json";
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec || size > kMaxStateBytes) return std::nullopt;
  std::ifstream in(file);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  return j;
}

namespace {

// dockerd keeps its runc root under its exec root (--exec-root, /var/run/docker by default):
// each running dockerd's, read from its command line.
std::vector<fs::path> docker_roots() {
  std::vector<fs::path> out{"/run/docker/runtime-runc/moby"};
  for (const pid_t d :
       process::live_pids_where([](const process::ProcInfo& i) { return i.comm == "dockerd"; })) {
    const auto info = process::read_proc(d);
    if (!info) continue;
    const auto& a = info->cmdline;
    for (std::size_t i = 0; i < a.size(); ++i) {
      std::string exec;
      if (a[i] == "--exec-root" && i + 1 < a.size()) exec = a[i + 1];
      if (a[i].rfind("--exec-root=", 0) == 0) exec = a[i].substr(12);
      if (exec.empty()) continue;
      fs::path root = fs::path(exec) / "runtime-runc" / "moby";
      if (std::find(out.begin(), out.end(), root) == out.end()) out.push_back(std::move(root));
    }
  }
  return out;
}

}  // namespace

std::vector<StateRoot> state_roots() {
  std::vector<StateRoot> roots{{Runtime::kRunc, kRuncRoot, ""}};
  for (auto& d : docker_roots()) roots.push_back({Runtime::kDocker, std::move(d), ""});
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/run/containerd/runc", ec))
    if (e.is_directory(ec)) roots.push_back({Runtime::kContainerd, e.path(), e.path().filename()});
  if (const char* extra = std::getenv("GPUCKPT_RUNC_ROOTS"); extra && *extra) {
    std::istringstream in(extra);
    for (std::string p; std::getline(in, p, ':');)
      if (!p.empty()) roots.push_back({Runtime::kRunc, p, ""});
  }
  return roots;
}

StateRoot root_at(const fs::path& path) {
  for (auto& r : state_roots())
    if (r.path == path) return r;
  return {Runtime::kRunc, path, ""};
}

std::vector<Container> running() {
  std::vector<Container> out;
  for (const auto& root : state_roots()) {
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

std::optional<Container> holding(pid_t pid) {
  const auto ns = process::pid_namespace_inode(pid);
  // A container that shares this host's pid namespace (docker --pid=host) holds no process of
  // its own by namespace.
  if (!ns || ns == process::pid_namespace_inode(0)) return std::nullopt;
  for (auto& c : running())
    if (c.pid_namespace == *ns) return std::move(c);
  return std::nullopt;
}

std::string Container::describe() const {
  switch (root.runtime) {
    case Runtime::kDocker:
      return "Docker container " + id;
    case Runtime::kContainerd:
      return "containerd container " + id + " (namespace " + root.ns + ")";
    case Runtime::kRunc:
      break;
  }
  return "runc container " + id +
         (root.path == kRuncRoot ? "" : " (runc root " + root.path.string() + ")");
}

}  // namespace gpuckpt::container
