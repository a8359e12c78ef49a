// What /proc says about a target process: identity for the checkpoint's record, liveness for
// the orchestration (a zombie counts as ended), and the NVIDIA GPUs it has open.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuckpt::process {

struct ProcInfo {
  pid_t pid = 0;
  std::string comm;
  std::vector<std::string> cmdline;
  char state = '?';  // R, S, D, T (stopped), t (traced), Z (zombie), ...
  pid_t ppid = 0, pgrp = 0, sid = 0;
  int tty_nr = 0;
  std::string exe;  // empty when unreadable
};

// nullopt: no such process.
std::optional<ProcInfo> read_proc(pid_t pid);

// Whether the process's session or process group lead is outside a tree rooted at it, or it has
// a controlling terminal: then CRIU needs --shell-job.
bool needs_shell_job(const ProcInfo& p);

// Peak resident memory (VmHWM) of a live process in bytes; 0 if it is gone.
std::uint64_t peak_rss_bytes(pid_t pid);
// Anonymous memory mapped by transparent huge pages (AnonHugePages) in bytes; 0 if it is gone.
std::uint64_t huge_page_bytes(pid_t pid);

// Alive = exists and is not a zombie.
bool alive(pid_t pid);

// Now, in clock ticks since boot: the clock and unit of a process's start time in /proc, so that
// a pid read later can be told from one reused by a process that started before this moment.
std::uint64_t boot_ticks_now();
// When the process started, in the same ticks; nullopt if it is gone.
std::optional<std::uint64_t> start_ticks(pid_t pid);

// The inode of the process's pid namespace (/proc/PID/ns/pid), which names the namespace on this
// boot; nullopt if the process is gone. 0: this process's own (/proc/self, which is right where
// /proc was mounted for another namespace and /proc/getpid() is not this process).
std::optional<std::uint64_t> pid_namespace_inode(pid_t pid);

// Sends `sig` (0 = none) and polls until the process is gone or a zombie. Returns false on
// timeout. For processes that are not our children (we cannot reap them).
bool wait_ended(pid_t pid, std::chrono::milliseconds timeout);

// Bytes of the process's memory CRIU will write as page images: anonymous and shmem pages,
// resident or swapped (RssAnon + RssShmem + VmSwap of every thread group member).
std::uint64_t dumpable_memory_bytes(pid_t pid);

// UUIDs of the NVIDIA GPUs whose device files (/dev/nvidiaN) the process holds open, from
// /proc/driver/nvidia/gpus/*/information. Empty without the NVIDIA driver.
std::vector<std::string> nvidia_gpu_uuids(pid_t pid);

// The value of option `name` in a command line ("--name V" or "--name=V"; Go's flags take one
// dash too); "" when absent.
std::string cmdline_option(const std::vector<std::string>& argv, const std::string& name);

// The value of `name` in the process's environment (as it was at its exec); nullopt where it is
// unset, or the process is gone or unreadable.
std::optional<std::string> environment_value(pid_t pid, std::string_view name);

// Live (not zombie) processes for which `pred` holds: as read for `pred`, or their pids.
std::vector<ProcInfo> live_procs_where(const std::function<bool(const ProcInfo&)>& pred);
std::vector<pid_t> live_pids_where(const std::function<bool(const ProcInfo&)>& pred);

// The tree CRIU dumps for `root`: root first, then every descendant (children of all its
// threads, recursively), parents before children. Empty if root does not exist. Stable only
// while the tree is frozen; before that it is a preflight's best view.
std::vector<pid_t> process_tree(pid_t root);

// Why CRIU cannot dump this process, found before anything is frozen: "" if nothing is known
// to stop it. Covers kernel threads, io_uring instances (CRIU 4.2 cannot dump them) and
// processes stopped, traced or cgroup-frozen by someone else.
std::string undumpable_reason(const ProcInfo& p);
// The cgroup path of `pid` if a cgroup freezer (v1 or v2) holds it frozen, else "".
std::string frozen_cgroup(pid_t pid);

// Size of the largest deleted (unlinked) regular file the process holds open or mapped, such as
// a /dev/shm segment removed once every worker mapped it. CRIU copies such "ghost" files into
// the images and refuses ones above its --ghost-limit (1 MiB by default).
std::uint64_t largest_deleted_file_bytes(pid_t pid);

// True if the process has a SysV shared memory segment attached (a "/SYSV" mapping), which CRIU
// dumps only with the ipc namespace it belongs to.
bool maps_sysv_shm(pid_t pid);

// True if the process lives in a pid namespace below ours (e.g. one that `restore --new-pidns`
// or a same-host migration created): CRIU can dump such a process only with its namespace's
// init, which gpuckpt does not dump.
bool in_child_pid_namespace(pid_t pid);

// True if the process holds a listening TCP socket (same-host migration cannot keep the old
// process frozen while a new one binds the same port; see docs/PROCESS.md).
bool has_tcp_listener(pid_t pid);

// Listening unix sockets of the process: filesystem paths, or abstract names ("@name").
struct UnixListener {
  std::string path;
  bool abstract = false;
};
std::vector<UnixListener> unix_listeners(pid_t pid);

// Error(kProcess) unless `info` (read_proc(pid)) is a live process: "no process with pid N", or
// for a zombie, that it has exited and waits for its parent to reap it.
void require_live(pid_t pid, const std::optional<ProcInfo>& info);

}  // namespace gpuckpt::process
