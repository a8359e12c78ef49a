#include "process/proc_info.h"

#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "gpuckpt/error.h"
#include "util/fs.h"
#include "util/mountinfo.h"

namespace fs = std::filesystem;

namespace gpuckpt::process {

namespace {

// A /proc file, or "" if it cannot be read: the process may exit between the directory scan
// and the read (reads then fail with ESRCH, which libstdc++ streams throw as an exception).
std::string slurp(const fs::path& p) {
  try {
    return read_file(p);
  } catch (const Error&) {
    return {};
  }
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Socket inodes the process holds, from its fd links "socket:[12345]".
std::set<unsigned long> socket_inodes(pid_t pid) {
  std::set<unsigned long> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    const auto target = fs::read_symlink(e.path(), ec2).string();
    if (!ec2 && target.rfind("socket:[", 0) == 0)
      out.insert(std::stoul(target.substr(8, target.size() - 9)));
  }
  return out;
}

}  // namespace

std::optional<ProcInfo> read_proc(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  const fs::path dir = "/proc/" + std::to_string(pid);
  const std::string stat = slurp(dir / "stat");
  if (stat.empty()) return std::nullopt;
  ProcInfo p;
  p.pid = pid;
  const auto open = stat.find('('), close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return std::nullopt;
  p.comm = stat.substr(open + 1, close - open - 1);
  std::istringstream f(stat.substr(close + 2));
  f >> p.state >> p.ppid >> p.pgrp >> p.sid >> p.tty_nr;
  const std::string cmd = slurp(dir / "cmdline");
  for (std::size_t start = 0; start < cmd.size();) {
    auto end = cmd.find('\0', start);
    if (end == std::string::npos) end = cmd.size();
    p.cmdline.push_back(cmd.substr(start, end - start));
    start = end + 1;
  }
  std::error_code ec;
  p.exe = fs::read_symlink(dir / "exe", ec).string();
  return p;
}

bool needs_shell_job(const ProcInfo& p) {
  return p.sid != p.pid || p.pgrp != p.pid || p.tty_nr != 0;
}

namespace {

// A "Key:   N kB" line of a /proc/PID file, in bytes; 0 if the process or the line is gone.
std::uint64_t kib_field(pid_t pid, const char* file, std::string_view key) {
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/" + file));
  for (std::string line; std::getline(in, line);)
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 &&
        line[key.size()] == ':')
      return std::stoull(line.substr(key.size() + 1)) << 10;
  return 0;
}

}  // namespace

std::uint64_t peak_rss_bytes(pid_t pid) {
  return kib_field(pid, "status", "VmHWM");
}

std::uint64_t huge_page_bytes(pid_t pid) {
  return kib_field(pid, "smaps_rollup", "AnonHugePages");
}

bool alive(pid_t pid) {
  auto p = read_proc(pid);
  return p && p->state != 'Z' && p->state != 'X';
}

std::uint64_t boot_ticks_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  const auto hz = static_cast<std::uint64_t>(::sysconf(_SC_CLK_TCK));
  // Truncated as the kernel truncates a start time, so a process started after this call never
  // shows an earlier tick.
  return static_cast<std::uint64_t>(ts.tv_sec) * hz +
         static_cast<std::uint64_t>(ts.tv_nsec) * hz / 1000000000ULL;
}

std::optional<std::uint64_t> start_ticks(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  // Fields after the command: state is field 3, the start time field 22.
  std::istringstream f(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i < 22; ++i)
    if (!(f >> field)) return std::nullopt;
  std::uint64_t ticks = 0;
  if (!(f >> ticks)) return std::nullopt;
  return ticks;
}

std::optional<std::uint64_t> pid_namespace_inode(pid_t pid) {
  struct stat ns = {};
  const std::string path =
      pid == 0 ? "/proc/self/ns/pid" : "/proc/" + std::to_string(pid) + "/ns/pid";
  if (pid < 0 || ::stat(path.c_str(), &ns) != 0) return std::nullopt;
  return ns.st_ino;
}

bool wait_ended(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(1);
  while (alive(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }
  return true;
}

std::uint64_t dumpable_memory_bytes(pid_t pid) {
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/status"));
  std::uint64_t kib = 0;
  for (std::string line; std::getline(in, line);) {
    for (const char* key : {"RssAnon:", "RssShmem:", "VmSwap:"}) {
      if (line.rfind(key, 0) == 0) kib += std::stoull(line.substr(std::strlen(key)));
    }
  }
  return kib * 1024;
}

std::vector<std::string> nvidia_gpu_uuids(pid_t pid) {
  // Minor numbers of the per-GPU device files the process has open (not nvidiactl/nvidia-uvm).
  std::set<int> minors;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    const auto target = fs::read_symlink(e.path(), ec2).string();
    if (ec2 || target.rfind("/dev/nvidia", 0) != 0) continue;
    const auto num = target.substr(11);
    if (!num.empty() && num.find_first_not_of("0123456789") == std::string::npos)
      minors.insert(std::stoi(num));
  }
  std::vector<std::string> uuids;
  if (minors.empty()) return uuids;
  for (const auto& gpu : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    std::istringstream info(slurp(gpu.path() / "information"));
    int minor = -1;
    std::string uuid;
    for (std::string line; std::getline(info, line);) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      const auto key = trim(line.substr(0, colon)), val = trim(line.substr(colon + 1));
      if (key == "Device Minor") minor = std::stoi(val);
      if (key == "GPU UUID") uuid = val;
    }
    if (minors.count(minor) && !uuid.empty()) uuids.push_back(uuid);
  }
  return uuids;
}

std::string cmdline_option(const std::vector<std::string>& argv, const std::string& name) {
  for (std::size_t i = 0; i < argv.size(); ++i)
    for (const std::string dash : {"-", "--"}) {
      const std::string flag = dash + name;
      if (argv[i] == flag && i + 1 < argv.size()) return argv[i + 1];
      if (argv[i].rfind(flag + "=", 0) == 0) return argv[i].substr(flag.size() + 1);
    }
  return {};
}

std::optional<std::string> environment_value(pid_t pid, std::string_view name) {
  const std::string env = slurp("/proc/" + std::to_string(pid) + "/environ");
  for (std::size_t b = 0; b < env.size();) {
    std::size_t e = env.find('\0', b);
    if (e == std::string::npos) e = env.size();
    const std::string_view entry(env.data() + b, e - b);
    if (entry.size() > name.size() && entry.substr(0, name.size()) == name &&
        entry[name.size()] == '=')
      return std::string(entry.substr(name.size() + 1));
    b = e + 1;
  }
  return std::nullopt;
}

std::vector<ProcInfo> live_procs_where(const std::function<bool(const ProcInfo&)>& pred) {
  std::vector<ProcInfo> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (auto p = read_proc(std::stoi(name)); p && p->state != 'Z' && pred(*p))
      out.push_back(std::move(*p));
  }
  return out;
}

std::vector<pid_t> live_pids_where(const std::function<bool(const ProcInfo&)>& pred) {
  std::vector<pid_t> out;
  for (const auto& p : live_procs_where(pred)) out.push_back(p.pid);
  return out;
}

std::vector<pid_t> process_tree(pid_t root) {
  std::vector<pid_t> out;
  if (!read_proc(root)) return out;
  out.push_back(root);
  std::set<pid_t> seen{root};
  for (std::size_t i = 0; i < out.size(); ++i) {
    const fs::path tasks = "/proc/" + std::to_string(out[i]) + "/task";
    std::error_code ec;
    for (const auto& t : fs::directory_iterator(tasks, ec)) {
      std::istringstream in(slurp(t.path() / "children"));
      for (pid_t c; in >> c;)
        if (seen.insert(c).second) out.push_back(c);
    }
  }
  return out;
}

namespace {

// Where cgroup filesystems are mounted (from /proc/self/mountinfo): the v1 freezer hierarchy's
// and the unified (v2) one's, each with the cgroup its mount shows as its root (not "/" in a
// container that sees only its own part of the hierarchy). The latest first: one mounted over
// another's path (a cgroup2 at /sys/fs/cgroup hiding a hybrid host's /sys/fs/cgroup/unified)
// is the one whose files are there.
struct CgroupMount {
  fs::path point;
  std::string root;
  dev_t dev = 0;
};
struct CgroupMounts {
  std::vector<CgroupMount> freezer_v1, unified;
};
CgroupMounts cgroup_mounts() {
  CgroupMounts m;
  for (const auto& n : read_mountinfo("/proc/self/mountinfo")) {
    const auto dev = device_number(n.dev);
    if (!dev) continue;
    if (n.fstype == "cgroup2") m.unified.insert(m.unified.begin(), {n.mount_point, n.root, *dev});
    if (n.fstype == "cgroup" && ("," + n.options + ",").find(",freezer,") != std::string::npos)
      m.freezer_v1.insert(m.freezer_v1.begin(), {n.mount_point, n.root, *dev});
  }
  return m;
}

// The directory of cgroup `path` under the first of `mounts` that shows it; nullopt if none
// does (a hidden mount's path shows what covers it: no such directory, or another device's).
std::optional<fs::path> cgroup_dir(const std::vector<CgroupMount>& mounts,
                                   const std::string& path) {
  for (const auto& m : mounts) {
    auto dir = shown_at(m.point, m.root, path);
    struct stat st {};
    if (dir && ::stat(dir->c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_dev == m.dev)
      return dir;
  }
  return std::nullopt;
}

}  // namespace

std::string frozen_cgroup(pid_t pid) {
  const CgroupMounts m = cgroup_mounts();
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/cgroup"));
  for (std::string line; std::getline(in, line);) {
    // hierarchy-ID:controllers:path
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      // cgroup.events says whether the cgroup is frozen, by its own setting or an ancestor's.
      const auto dir = cgroup_dir(m.unified, path);
      if (!dir) continue;
      std::istringstream ev(slurp(*dir / "cgroup.events"));
      for (std::string key, value; ev >> key >> value;)
        if (key == "frozen" && value == "1") return path;
    } else if (("," + controllers + ",").find(",freezer,") != std::string::npos) {
      const auto dir = cgroup_dir(m.freezer_v1, path);
      if (!dir) continue;
      const std::string state = trim(slurp(*dir / "freezer.state"));
      if (state == "FROZEN" || state == "FREEZING") return path;
    }
  }
  return {};
}

void require_live(pid_t pid, const std::optional<ProcInfo>& info) {
  if (!info) throw Error(Errc::kProcess, "no process with pid " + std::to_string(pid));
  if (info->state == 'Z')
    throw Error(Errc::kProcess, "process " + std::to_string(pid) + " (" + info->comm +
                                    ") has exited: it is a zombie that its parent (pid " +
                                    std::to_string(info->ppid) +
                                    ") has not reaped, so there is nothing to checkpoint");
}

std::string undumpable_reason(const ProcInfo& p) {
  const std::string id = "process " + std::to_string(p.pid) + " (" + p.comm + ")";
  // Kernel threads have no executable and the PF_KTHREAD flag (field 9 of stat).
  {
    const std::string stat = slurp("/proc/" + std::to_string(p.pid) + "/stat");
    const auto close = stat.rfind(')');
    if (close != std::string::npos) {
      std::istringstream f(stat.substr(close + 2));
      std::string field;
      unsigned long flags = 0;
      for (int i = 0; i < 6 && f >> field;) ++i;  // state .. tpgid
      if (f >> flags && (flags & 0x00200000UL))   // PF_KTHREAD
        return id + " is a kernel thread: only user processes can be checkpointed";
    }
  }
  if (p.state == 'T' || p.state == 't')
    return id + " is stopped or traced; resume it (or detach its debugger) before dumping";
  // A tracer that lets it run (strace -p): CRIU must be its only tracer, and would fail to seize.
  {
    const std::string status = slurp("/proc/" + std::to_string(p.pid) + "/status");
    const auto at = status.find("\nTracerPid:");
    const long tracer = at == std::string::npos ? 0 : std::atol(status.c_str() + at + 11);
    if (tracer > 0) {
      const auto t = read_proc(static_cast<pid_t>(tracer));
      return id + " is traced by process " + std::to_string(tracer) +
             (t ? " (" + t->comm + ")" : std::string()) +
             ": CRIU must trace it itself; detach the tracer before dumping. Nothing was frozen";
    }
  }
  // Frozen by someone else's cgroup freezer, CRIU's freeze would wait for its timeout and fail.
  if (const std::string cg = frozen_cgroup(p.pid); !cg.empty())
    return id + " is in the frozen cgroup " + cg + "; thaw it before dumping";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(p.pid) + "/fd", ec)) {
    std::error_code ec2;
    if (fs::read_symlink(e.path(), ec2).string() == "anon_inode:[io_uring]")
      return id + " uses io_uring (fd " + e.path().filename().string() +
             "), which CRIU cannot checkpoint; nothing was frozen";
  }
  return {};
}

std::uint64_t largest_deleted_file_bytes(pid_t pid) {
  std::uint64_t largest = 0;
  const fs::path dir = "/proc/" + std::to_string(pid);
  // fds and mappings alike: /proc/PID/map_files links name the mapped file, "(deleted)" if gone.
  for (const char* sub : {"fd", "map_files"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir / sub, ec)) {
      std::error_code ec2;
      const std::string target = fs::read_symlink(e.path(), ec2).string();
      if (ec2 || target.size() < 10 || target.compare(target.size() - 10, 10, " (deleted)") != 0 ||
          target.rfind("/memfd:", 0) == 0)
        continue;
      struct stat st {};
      if (::stat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
        largest = std::max<std::uint64_t>(largest, static_cast<std::uint64_t>(st.st_size));
    }
  }
  return largest;
}

bool maps_sysv_shm(pid_t pid) {
  // A segment's mapping is named "/SYSV<key as 8 hex digits> (deleted)" after its shm inode.
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/maps"));
  for (std::string line; std::getline(in, line);)
    if (line.find(" /SYSV") != std::string::npos) return true;
  return false;
}

bool in_child_pid_namespace(pid_t pid) {
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream f(line.substr(6));
    int n = 0;
    for (long v; f >> v;) ++n;
    return n > 1;
  }
  return false;
}

bool has_tcp_listener(pid_t pid) {
  const auto inodes = socket_inodes(pid);
  if (inodes.empty()) return false;
  for (const char* table : {"tcp", "tcp6"}) {
    std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/net/" + table));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
      std::istringstream f(line);
      std::string sl, local, remote, st, q, tr, retr, uid, tmo;
      unsigned long inode = 0;
      if (!(f >> sl >> local >> remote >> st >> q >> tr >> retr >> uid >> tmo >> inode)) continue;
      if (st == "0A" && inodes.count(inode)) return true;  // 0A = TCP_LISTEN
    }
  }
  return false;
}

std::vector<UnixListener> unix_listeners(pid_t pid) {
  const auto inodes = socket_inodes(pid);
  std::vector<UnixListener> out;
  if (inodes.empty()) return out;
  std::istringstream in(slurp("/proc/" + std::to_string(pid) + "/net/unix"));
  std::string line;
  std::getline(in, line);  // Num RefCount Protocol Flags Type St Inode Path
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string num, ref, proto, flags, type, st, path;
    unsigned long inode = 0;
    if (!(f >> num >> ref >> proto >> flags >> type >> st >> inode)) continue;
    std::getline(f, path);
    path = trim(path);
    constexpr unsigned long kAcceptCon = 0x10000;  // __SO_ACCEPTCON: listening
    if (path.empty() || !inodes.count(inode) || !(std::stoul(flags, nullptr, 16) & kAcceptCon))
      continue;
    out.push_back({path, path[0] == '@'});
  }
  return out;
}

}  // namespace gpuckpt::process
