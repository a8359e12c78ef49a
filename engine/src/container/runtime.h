// The containers that OCI runtimes run on this host, read from the runtimes' own state (runc's
// state.json under its root, crun's status), never guessed from process names. Docker (dockerd's
// runc) and containerd (its runc shim, one root per namespace) keep that state under roots of
// their own.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gpuckpt/process.h"
#include "gpuckpt/unique_fd.h"

namespace gpuckpt::container {

using Runtime = ContainerRuntime;

// runc's own root (runc without --root).
inline constexpr const char* kRuncRoot = "/run/runc";
// crun's own root (crun run by root without --root; podman and CRI-O keep theirs there too).
inline constexpr const char* kCrunRoot = "/run/crun";

// One runtime root and whose it is.
struct StateRoot {
  Runtime runtime = Runtime::kRunc;
  std::filesystem::path path;  // e.g. /run/runc, /run/crun, /run/docker/runtime-runc/moby
  std::string ns;              // containerd's namespace ("default", "k8s.io"); else empty
};

// The roots to look in: runc's (kRuncRoot), crun's (kCrunRoot), dockerd's, every containerd
// namespace's, and each directory of $GPUCKPT_RUNC_ROOTS (colon-separated: runc or crun started
// with --root), where each container's own state says whether it is runc's or crun's.
std::vector<StateRoot> state_roots();

// The known root at `path` (its runtime and containerd namespace); a runc root of its own
// (Runtime::kRunc) for a path that no runtime is known to keep. With `id`: crun's, where that
// container's state there is crun's.
StateRoot root_at(const std::filesystem::path& path, const std::string& id = {});

struct Container {
  StateRoot root;
  std::string id;
  pid_t init_pid = 0;               // on this host
  std::uint64_t init_start = 0;     // its start tick, as runc recorded it
  std::uint64_t pid_namespace = 0;  // the inode of its init's pid namespace
  std::filesystem::path rootfs;     // its rootfs on the host, as runc's config has it
  // containerd's or Docker's, its shim running crun rather than runc: not dumped (find()).
  bool under_crun = false;

  // How the operator names it to its runtime: "runc container web", "Docker container 3f2a...".
  std::string describe() const;
};

// runc's state.json of container `id` under `root` (its init's pid and start, runc's own
// config of it); for crun's, its status and spec read into the same shape (init_process_pid,
// init_process_start, external_descriptors, and config's rootfs, labels, mounts, namespaces,
// mask_paths and devices), with crun's cgroup_path and systemd_cgroup under "crun". nullopt if
// there is none, or it is not JSON.
std::optional<nlohmann::json> state_json(const StateRoot& root, const std::string& id);

// Every container of those roots whose init runs now (state of a container that has ended, or
// whose pid was reused since, is skipped).
std::vector<Container> running();

// The container of those roots, and of `more_roots`, that runs on `rootfs` (its runc config's),
// described; "" if none.
std::string rootfs_user(const std::filesystem::path& rootfs,
                        const std::vector<std::filesystem::path>& more_roots = {});

// A restore's shared lock (flock) on the rootfs directory it runs on, held until its container
// runs (hold_rootfs). Its fd is close-on-exec: the lock goes with the restore, not with runc or
// the container. It is let go when destroyed, or when the operation is aborted
// (release_rootfs_holds), so that the abort's own recovery may take the rootfs exclusively.
class RootfsHold {
 public:
  RootfsHold() = default;
  explicit RootfsHold(UniqueFd fd);
  RootfsHold(RootfsHold&& o) noexcept : fd_(std::move(o.fd_)) {}
  RootfsHold& operator=(RootfsHold&& o) noexcept;
  ~RootfsHold() { reset(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  int fd() const { return fd_.get(); }
  void reset() noexcept;
  // The fd, its lock kept, out of the holds that an abort lets go of.
  UniqueFd release() noexcept;

 private:
  UniqueFd fd_;
};

// The rootfs directory at `path`, held shared; an empty hold where no directory is at `path`.
// Taken before the caller checks what the directory is, so that one removed while this waited
// is seen as gone.
RootfsHold hold_rootfs(const std::filesystem::path& path);

// Lets go of every RootfsHold of this process (their fds stay open): the operation is being
// aborted, and its recovery removes what it unpacked. Async-signal-safe it is not; a thread's.
void release_rootfs_holds() noexcept;

// Removes the rootfs at `path` that a restore unpacked, unless a running container uses it (as
// rootfs_user, with `more_roots`) or another restore holds it (hold_rootfs). `held`: the
// caller's own hold of it, given up. Returns "" once it is removed (or gone), else why it stays
// ("the runc container web runs on it"); Error(kIo) if it cannot be removed.
std::string remove_unused_rootfs(const std::filesystem::path& path,
                                 const std::vector<std::filesystem::path>& more_roots,
                                 RootfsHold held = {});

// The container whose own pid namespace holds `pid` (its init or any process under it); nullopt
// for a process of this host's pid namespace, or of a namespace no known runtime made.
std::optional<Container> holding(pid_t pid);

}  // namespace gpuckpt::container
