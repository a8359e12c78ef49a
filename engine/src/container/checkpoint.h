// A whole runc container as one checkpoint: what its dump must tell CRIU beyond a bare tree
// (its rootfs, the runtime's bind mounts as external mounts, its namespaces, its stdio), what
// the record keeps of it, and its restore as a container that runc knows again (`runc list`).
//
// gpuckpt runs CRIU itself for the dump, with the options runc's own checkpoint would pass
// (libcontainer/criu_linux.go), so that the images stream and the guard covers the freeze; and
// it restores through `runc restore`, which recreates what only the runtime may (its state,
// cgroups, the rootfs mount points) from the same images. docs/PROCESS.md, "Containers".
//
// The record is record.h's, the pod namespaces' checks pod.h's; checkpoint.cpp is the dump,
// restore.cpp the restore.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "container/pod.h"
#include "container/record.h"
#include "container/runtime.h"
#include "gpuckpt/process.h"
#include "gpuckpt/timing.h"
#include "process/support.h"

namespace gpuckpt::container {

// runc's file in the images directory: the init's fds 0-2 as runc recorded them at its start,
// read back by `runc restore` to connect stdio pipes.
inline constexpr const char* kDescriptorsFile = "descriptors.json";
// gpuckpt's file in the images directory: the container's writable layer (the files it wrote
// into its image's rootfs, overlay whiteouts included), as podman's rootfs-diff.tar carries it.
inline constexpr const char* kRootfsDiffFile = "rootfs-diff.tar";
// gpuckpt's file in the images directory: a runc bundle's whole rootfs (WritableLayer::kRootfs).
inline constexpr const char* kRootfsFile = "rootfs.tar";
// The file in the images directory that holds what the record's layer carries (kRootfsDiffFile
// or kRootfsFile); nullptr for a layer that carries no files.
const char* layer_file(WritableLayer layer);

// The container `id` of a known runtime root (runtime.h) whose init runs. Throws
// Error(kInvalidInput) naming what was found instead: no such container (with the IDs there
// are), or one that has stopped; Error(kProcess) for one that is paused (frozen by its runtime).
Container find(const std::string& id);

struct DumpPlan {
  ContainerRecord record;
  std::vector<std::string> criu_args;  // beyond gpuckpt's own (criu/criu.h dump_argv)
  // The namespaces CRIU dumps from inside (criu::DumpArgs::namespace_fds): the ipc and uts ones
  // the container joined by path (a pod's), which are the pod's, not the container's to carry.
  std::vector<std::string> criu_namespaces;
  // The overlay upper directory of an image-based rootfs (containerd's snapshot, Docker's
  // overlay2 layer); empty for a runc bundle's directory, or a snapshotter without one.
  std::filesystem::path upper_dir;
  std::string layer_why;  // an image-based rootfs without upper_dir: why (for the record)
};

// Takes an archive that a dump writes as it is made, under its file name in the images (a
// streamed dump's packer): reads `fd` to its end. Returns the bytes it took.
using ArchiveSink = std::function<std::uint64_t(const std::string& name, int fd)>;

// What a planned dump carries of the container's files, once its processes are stopped: the
// writable layer (kRootfsDiffFile), or with carry_rootfs a runc bundle's whole rootfs
// (kRootfsFile), as a tar into `images_dir`, or into `sink` if one is given. What `out` records
// of it; its size in bytes (0: none carried). Throws Error(kIo), or what `sink` throws.
std::uint64_t write_layer_archive(const DumpPlan& p, const std::filesystem::path& images_dir,
                                  ContainerRecord& out, const ArchiveSink& sink = {});

// Everything a dump of `c` needs, read from runc's state, the bundle, and containerd's or
// dockerd's own record of it, and each refusal that can be known before anything is frozen:
// its runtime's daemon unreachable, stdio that CRIU cannot dump (a host file outside the
// container's mounts), established connections kept in a network namespace of its own, a rootfs
// to carry (`carry_rootfs`, DumpOptions) of a container that runc does not run from a bundle.
// Throws Error.
DumpPlan plan_dump(const Container& c, bool tcp_established, bool carry_rootfs = false);

// runc's descriptors.json for `r`, into the images directory.
void write_descriptors(const ContainerRecord& r, const std::filesystem::path& images_dir);

// Why the runtime of `r`, here, cannot have its CRIU read a checkpoint from gpuckpt's streamer
// (even a CRIU with criu::kRpcStreamPatch), or "" if it can: dockerd copies a checkpoint's files
// into its own directory, and containerd 2.0's shims run the `criu` on their PATH, which gets no
// configuration of gpuckpt's.
std::string stream_refusal(const ContainerRecord& r);

// Makes the runtime forget the run of a container whose init has ended, so that its ID is free
// for the restore: `runc delete`; containerd's Tasks.Delete (its container record stays, as
// after `ctr task kill`); nothing for Docker, whose daemon does it itself (the container shows
// Exited). Returns why it failed ("" when it did not): the checkpoint is durable either way.
std::string remove_ended(const Container& c);

// The runc binary: $GPUCKPT_RUNC, else runc on PATH. Throws Error(kInvalidInput).
std::filesystem::path runc_binary();
// A crun that can checkpoint and restore (built with libcriu: +CRIU in `crun --version`):
// $GPUCKPT_CRUN, else crun on PATH, else the one that scripts/install-crun.sh builds beside
// gpuckpt's CRIU. Throws Error(kUsage) naming each crun found and why it cannot.
std::filesystem::path crun_binary();

struct RestoreRequest {
  const ContainerRecord* record = nullptr;
  std::string id;  // the new container's ID
  // CRIU's images, unpacked (with descriptors.json); or, for a streamed restore
  // (`stream` among criu_config), the directory where a criu::RestoreStreamer serves them, which
  // holds descriptors.json alone.
  std::filesystem::path images;
  // A streamed restore's writable layer or rootfs (the checkpoint's layer_file(), `layer_bytes`
  // long): writes it into `fd`. Unset: the layer is a file in `images`.
  std::function<void(int fd)> write_layer;
  std::uint64_t layer_bytes = 0;
  std::filesystem::path work;            // runc's work directory (CRIU's restore log goes here)
  std::filesystem::path criu;            // the CRIU binary runc must run
  std::vector<std::string> criu_config;  // lines of a CRIU configuration file for this restore
  std::vector<std::string> env;          // for runc, and so for criu and its plugins
  // The container's stdout and stderr, appended; "" = /var/log/gpuckpt/containers/ID.log.
  std::filesystem::path stdio_log;
  // The namespaces it joins in place of those it joined at the dump (none named: those).
  PodNamespaces joins;
  std::chrono::seconds timeout{1800};
  // Where the runtime's own steps are timed, if anywhere: rootfs_apply (the writable layer into
  // a new container's snapshot), checkpoint_dir (the images into Docker's directory).
  Timeline* timeline = nullptr;
  // Called with runc's pid as soon as it runs (it leads its own process group, its criu in it),
  // before it has restored anything: for the guard, which must wait for it. Only for runc's own
  // restores: a runtime's shim runs runc for containerd and Docker.
  std::function<void(pid_t)> on_runc_started;
  // Called with the ID that the runtime will know the container by, and the runc root it will be
  // under, before the runtime is asked to restore it (Docker names a container it creates).
  // `made`: its runtime's record was made for this restore (a replica's), not the one dumped.
  std::function<void(const std::string& root, const std::string& id, bool made)> on_container_id;
  // ... and, for one that Docker creates (named to on_container_id by its name), the ID
  // dockerd gave it, once it has.
  std::function<void(const std::string& id)> on_container_named;
  // ... and the token that marks the copies of the images its runtime unpacks (containerd's,
  // for Docker's start: containerd::remove_unpacked_copies), before that start is asked for.
  std::function<void(const std::string& token)> on_unpacked_token;
  // A directory made for the restore outside its staging (Docker's checkpoint directory of the
  // container, a carried rootfs being unpacked): the guard removes it should gpuckpt die before
  // it does.
  std::function<void(const std::filesystem::path&)> on_path_made;
  // A carried rootfs about to be renamed into place for this restore (a runc bundle's, on a
  // host that had none), and the identity it has: the guard removes it with the copy, unless
  // the copy is kept. Throwing keeps it from being placed.
  std::function<void(const std::filesystem::path&, const DirIdentity&)> on_rootfs_placed;
};

// Before anything runs: the ID is one runc accepts (kUsage), the record's runc root is one
// gpuckpt knows here, no running container has the ID (kExists; a stopped one, left by a dump
// ended before runc forgot it, is deleted), the rootfs and every external mount's source exist
// (kInvalidInput, naming what is missing); a rootfs that the checkpoint carries may be missing,
// but one that is there must be the one dumped or one unpacked from this checkpoint (kExists). For
// containerd and Docker: the daemon answers, and either the container is the one dumped (restored
// in place) or the image it needs is here. And the namespaces it joins (check_joined_namespaces,
// with `joins`).
void check_restore_target(const ContainerRecord& r, const std::string& id,
                          const PodNamespaces& joins = {});

// The directory the CRIU that runc runs loads plugins from: `libdir` in /etc/criu/runc.conf,
// else CRIU's default, /usr/lib/criu.
std::filesystem::path runc_criu_libdir();
// A restore of CUDA state by a runtime whose CRIU gets nothing of gpuckpt's (`why`, from
// stream_refusal: dockerd, containerd 2.0): gpuckpt's plugin must be in runc_criu_libdir().
// Throws Error(kUsage) naming the link to make (`plugin_dir`: this gpuckpt's plugin directory).
void require_runc_criu_loads_plugin(const std::filesystem::path& plugin_dir,
                                    const std::string& why);

// The images restored as container `id` by the container's own runtime. runc: `runc restore
// --detach` from a bundle made of the recorded spec (annotated with the CRIU configuration).
// containerd: Tasks.Create with the images as the shim's criu_image_path, in the container
// record it had, or in a new one made from the checkpoint's. Docker: `start` from a checkpoint
// directory of the container's (created first from the record, for a new ID). Returns the
// container as its runtime now runs it. Throws Error(kCriu) with runc's and CRIU's error lines.
Container restore_container(const RestoreRequest& q);

// A network namespace of its own comes back empty from runc (it leaves the network to the
// runtime's caller): its loopback is brought up again here if it was up at the dump.
void restore_loopback(const ContainerRecord& r, pid_t init);

// Removes the directory that a restore wrote for container `id` under the runc root `root`
// (runc's bundle, the CRIU wrapper for containerd's shim), if any: a restore that runc left
// unmade (the container's own deletion, remove_ended, removes it with it).
void remove_restore_bundle(const std::filesystem::path& root, const std::string& id);
// The directory that a restore writes for container `id` under the runtime root `root` (the
// bundle, the CRIU wrapper, crun's pidfile): one per root as the kernel resolves it. Its lock
// is beside it (lock_restore_target). Error(kUsage) for an ID no runtime takes.
std::filesystem::path restore_dir(const std::filesystem::path& root, const std::string& id);
// Locks the restore of a container under `id` in the runtime root `root`: a file beside the
// directory that the restore writes for it (restore_dir's, with ".lock"), for two restores under
// one ID shared that directory, and the loser's undo killed and deleted the winner's container.
// Error(kExists) while another gpuckpt holds it; Error(kUsage) for an ID no runtime takes.
process::HeldLockFile lock_restore_target(const std::string& root, const std::string& id);
// Whether the container that runc or crun lists as `state` under c's ID is one a restore of
// gpuckpt's made (its bundle is the restore's): another made under that ID meanwhile, with
// `runc run` say, is not a failed restore's to kill. True for containerd's and Docker's, whose
// bundles are their shims'.
bool made_by_restore(const Container& c, const nlohmann::json& state);
// crun's restore makes ROOT/ID (its copy of the spec) before CRIU runs and its status only once
// CRIU has restored; one that failed leaves the directory, which holds the ID. Removes it
// (`crun delete --force`) where it is what a restore of gpuckpt's made for that ID (the spec
// names that restore's CRIU configuration); nothing for another runtime, a container with its
// status, or a directory another made. Returns why it failed ("" when it did not).
std::string remove_half_made(const Container& c);
// Waits until the runtime has no start of container `c` in flight: a start that gpuckpt asked
// dockerd for goes on after gpuckpt dies (containerd unpacking the images, its runc restoring),
// and what it leaves is known only then. False if that is not known within `limit` (dockerd
// does not answer). Immediately true for runc and containerd, whose restores gpuckpt runs
// itself (the guard waits for their runc).
bool await_runtime_start(const Container& c, std::chrono::seconds limit) noexcept;
// Deletes the task that containerd created from the images for container `c` but never started
// (gpuckpt died between Tasks.Create and Tasks.Start); nothing for another runtime, or a task
// that started. Returns why it failed ("" when it did not).
std::string remove_unstarted(const Container& c);
// Runs `fn` where the container's network is: on a thread that has entered its network
// namespace (that of `init`: its own, or a pod's it joined), else, on the host's, on this one. A
// readiness probe's 127.0.0.1 is then the container's loopback.
std::string in_container_network(const ContainerRecord& r, pid_t init,
                                 const std::function<std::string()>& fn);
// Removes the record that a restore made in containerd (with its snapshot) or Docker for a
// container whose run has ended; nothing for runc. Returns why it failed ("" when it did not).
std::string remove_record(const Container& c);

// `runc kill KILL` and `runc delete --force` (through containerd or dockerd for theirs): a
// restore that failed after its runtime made it.
void destroy(const Container& c);

}  // namespace gpuckpt::container
