// What a container checkpoint records of its container (ProcessRecord::container): the
// runtime's names for it, its OCI spec, its mounts and namespaces, its writable layer, and what
// containerd or dockerd kept of it; and that record as JSON in the manifest.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "container/runtime.h"

namespace gpuckpt::container {

// runc's own rule for container IDs; anything else could name a path outside a directory of
// bundles.
bool valid_id(const std::string& id);

struct ExternalMount {
  std::string destination;  // inside the container (CRIU's key)
  std::string source;       // on the host
  // Not in the spec: a hook made it (the NVIDIA container toolkit's binds the driver's files
  // in). The runtime maps only the spec's mounts for its CRIU, so the restore maps these.
  bool outside_spec = false;
};

// What containerd kept of the container (its record, not its task): what a restore needs to
// make it again where containerd has no container of that ID (another host, a replica).
struct ContainerdRecord {
  std::string ns;
  std::string image;
  std::string image_digest;  // what `image` pointed at: its manifest's or index's digest
  std::map<std::string, std::string> labels;
  std::string runtime;                       // "io.containerd.runc.v2"
  std::string options_type, options;         // the runc shim's options (packed protobuf)
  std::string snapshotter, snapshot_parent;  // the image's top layer, under the rw layer
  std::string sandbox;
};

// What dockerd kept of it: enough to create it again, as `docker run` made it.
struct DockerRecord {
  std::string name;  // without Docker's leading '/'
  nlohmann::json config, host_config;
  std::string image_id;  // the image it runs, by ID ("sha256:..."), whatever its tag names now
};

// A namespace that a container joined by path, as the dump found it.
struct JoinedNamespace {
  std::uint64_t inode = 0;  // nsfs inodes are reused once a namespace is gone: not enough alone
  // For a /proc/PID/ns/ path: the boot, and when the process PID (the pod's sandbox) started.
  std::string boot_id;
  std::uint64_t holder_started = 0;
  bool operator==(const JoinedNamespace&) const = default;
};

// Of a runc bundle's rootfs that the checkpoint carries (WritableLayer::kRootfs): how a restore
// tells a rootfs it may run on from one holding other files. The dumped directory is known by its
// boot, device, inode and birth time (an inode number alone is reused once the directory is
// gone); one a restore unpacked from this checkpoint by `token` (random, one per dump), in its
// kRootfsTokenXattr attribute.
struct DirIdentity {
  std::uint64_t dev = 0, ino = 0;
  std::int64_t btime_ns = 0;  // 0: the file system keeps none
  bool operator==(const DirIdentity&) const = default;
};
struct RootfsOrigin {
  std::string token, boot_id;
  DirIdentity dir;
};
// The identity of the directory at `path` (not followed if a link); nullopt if there is none.
std::optional<DirIdentity> dir_identity(const std::string& path);
inline constexpr const char* kRootfsTokenXattr = "trusted.gpuckpt.rootfs";

// What a container checkpoint records, beside the process record (ProcessRecord::container).
struct ContainerRecord {
  Runtime runtime = Runtime::kRunc;
  std::string root;    // runc's root the container was under
  std::string id;      // its ID then
  std::string bundle;  // its bundle directory then
  std::string rootfs;  // its root filesystem (absolute)
  // The bundle's config.json (the OCI spec) as it was at the dump: the restore's container is
  // made from it, wherever that bundle is now.
  nlohmann::json spec;
  std::vector<std::string> stdio;     // the init's fds 0-2, as runc recorded them
  std::vector<ExternalMount> mounts;  // bind mounts and device nodes from the host
  bool own_network = false;           // a network namespace of its own (no path in the spec)
  bool loopback_up = false;           // its loopback was up at the dump
  // OCI type -> each namespace it joined by path, as its init was in it at the dump: a
  // /proc/PID/ns/ path in the spec names another once the pid is another process's.
  std::map<std::string, JoinedNamespace> joined;
  // The files it wrote into its image's rootfs: a restore starts it with them, whether into a
  // container made for it (a replica, one on a spare) or into the one dumped, whose layer may
  // have changed since (a container moved away and back, a rollback to an older checkpoint).
  WritableLayer layer = WritableLayer::kNone;
  std::string layer_why;  // kNotCarried: why not (its snapshotter or storage driver)
  std::optional<RootfsOrigin> rootfs_origin;   // kRootfs
  std::optional<ContainerdRecord> containerd;  // Runtime::kContainerd
  std::optional<DockerRecord> docker;          // Runtime::kDocker
  // Runtime::kCrun: how crun ran its cgroups ("cgroupfs", "systemd", or "disabled": none of its
  // own), which crun's restore must be told again, as its global --cgroup-manager.
  std::string cgroup_manager;
};

// A runtime that runs a container from a bundle directory (runc's, crun's), not from an image
// that a daemon keeps.
inline bool runs_bundles(Runtime r) {
  return r == Runtime::kRunc || r == Runtime::kCrun;
}

nlohmann::json to_json(const ContainerRecord& r);
// What check_restore_target reads of `r`, as to_json writes it: the record less what only the
// restore itself needs (its OCI spec, labels, the runtime's options, Docker's config), which
// container_record_from_json reads back. Small enough for a command line (one argument may hold
// 128 KiB) whatever the container's spec.
nlohmann::json target_check_json(const ContainerRecord& r);
// Throws Error(kCorrupt) if `j` is not a container record.
ContainerRecord container_record_from_json(const nlohmann::json& j);

}  // namespace gpuckpt::container
