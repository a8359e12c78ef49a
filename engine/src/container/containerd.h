// containerd's own API, over its unix socket: what gpuckpt needs to dump a container that
// containerd runs (Kubernetes' pods, `ctr run`) and to bring it back as a task that containerd
// knows (`ctr task ls`), in the container record it had or in a new one beside it.
//
// The restore is containerd's own: Tasks.Create with the runc shim's `criu_image_path` makes
// the shim run `runc restore` of gpuckpt's unpacked images (services/tasks/local.go), as
// `ctr`'s Go client does with WithRestoreImagePath. docs/research/docker-containerd.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gpuckpt::container::containerd {

// containerd's socket: $CONTAINERD_ADDRESS (as `ctr` reads it), else
// /run/containerd/containerd.sock.
std::filesystem::path address();

struct Mount {
  std::string type, source, target;
  std::vector<std::string> options;
};

// What containerd keeps of a container (not of its task).
struct ContainerInfo {
  std::string id;
  std::map<std::string, std::string> labels;
  std::string image;                 // the image it was made from ("docker.io/library/redis:7")
  std::string runtime;               // "io.containerd.runc.v2"
  std::string runtime_options_type;  // "containerd.runc.v1.Options", or ""
  std::string runtime_options;       // its packed protobuf
  std::string spec;                  // the OCI spec, JSON
  std::string snapshotter, snapshot_key;
  std::string sandbox;
};

enum class TaskStatus { kUnknown, kCreated, kRunning, kStopped, kPaused, kPausing };

struct TaskState {
  pid_t pid = 0;
  TaskStatus status = TaskStatus::kUnknown;
};

struct CreateTask {
  std::string container_id;
  std::vector<Mount> rootfs;
  std::string stdout_uri, stderr_uri;  // "file:///var/log/...": the shim makes the pipes
  std::string stdin_fifo;              // a FIFO the shim reads the task's stdin from; "" = none
  // The runc shim's options for this task (they replace the container's for the shim).
  std::string options_type, options;
  std::chrono::seconds timeout{1800};
};

// The runc shim's options `base` (packed; "" = none) with CRIU's binary and the images to
// restore from set: what makes Tasks.Create a restore. `criu` is the binary the shim's runc is to
// run (containerd 1.6 and 1.7; 2.0 ignores it and runs the criu on its own PATH).
std::string restore_options(const std::string& base, const std::filesystem::path& criu,
                            const std::filesystem::path& images, const std::filesystem::path& work);
// The runc root the shim's options name ("" = containerd's default, /run/containerd/runc).
std::string options_root(const std::string& options);

// The file by which a restore's images carry its token (random, hex): what containerd unpacks of
// them is then told from anything else in its temporary directory.
inline constexpr const char* kRestoreTokenFile = "gpuckpt-restore-token";
// A fresh token: 128 random bits.
std::string new_restore_token();
// The token in `dir`'s kRestoreTokenFile (a small regular file, not followed through a link); ""
// where there is none.
std::string restore_token_in(const std::filesystem::path& dir);

// containerd's tasks service unpacks a checkpoint handed to it as content (every Docker restore)
// into MkdirTemp($XDG_RUNTIME_DIR, "ctrd-checkpoint") and never removes it: a full copy of the
// images per restore. Removes those copies whose kRestoreTokenFile holds `token`, in the
// temporary directory of every running containerd (seen through its /proc root, so a private
// /tmp too). Returns the bytes removed; never throws (a failure is logged).
std::uint64_t remove_unpacked_copies(const std::string& token) noexcept;
// Copies the file `name` out of those copies (where the restore's CRIU wrote it: the plugin's
// report) to `to`; false if none of them has it. Never throws.
bool take_from_unpacked_copy(const std::string& token, const std::string& name,
                             const std::filesystem::path& to) noexcept;

// Whether every running containerd of this root (through its /proc root; one in a root of its
// own, a node of kind, is none of this host's) sees at `dir` the very directory that this
// process does: what its shims' CRIU reaches by that path. False if none is seen.
bool containerd_sees_as_here(const std::filesystem::path& dir);

// One namespace of one containerd. Each call is one gRPC request; an error is an Error naming
// the call and containerd's own message (kProcess; kExists for ALREADY_EXISTS).
class Client {
 public:
  Client(std::filesystem::path socket, std::string ns);

  std::string version();
  std::optional<ContainerInfo> container(const std::string& id);
  void create_container(const ContainerInfo& c);
  void delete_container(const std::string& id);

  // The digest of what image `name` points at (its manifest or index); nullopt if there is no
  // such image.
  std::optional<std::string> image_digest(const std::string& name);

  std::vector<Mount> snapshot_mounts(const std::string& snapshotter, const std::string& key);
  // The committed snapshot that `key` was prepared from ("" if none); nullopt if there is no
  // snapshot `key`.
  std::optional<std::string> snapshot_parent(const std::string& snapshotter,
                                             const std::string& key);
  std::vector<Mount> prepare_snapshot(const std::string& snapshotter, const std::string& key,
                                      const std::string& parent);
  void remove_snapshot(const std::string& snapshotter, const std::string& key);

  std::optional<TaskState> task(const std::string& container_id);
  pid_t create_task(const CreateTask& t);
  // A task created from a checkpoint is restored here, by the shim's `runc restore`: `timeout`
  // bounds that.
  void start_task(const std::string& container_id,
                  std::chrono::seconds timeout = std::chrono::seconds(60));
  void kill_task(const std::string& container_id, int signal);
  void delete_task(const std::string& container_id);

  const std::string& ns() const { return ns_; }
  const std::filesystem::path& socket() const { return socket_; }

 private:
  // The packed answer of `method`; nullopt for NOT_FOUND when `missing_ok`.
  std::optional<std::string> call(const std::string& method, const std::string& request,
                                  bool missing_ok = false,
                                  std::chrono::seconds timeout = std::chrono::seconds(60));
  std::filesystem::path socket_;
  std::string ns_;
};

}  // namespace gpuckpt::container::containerd
