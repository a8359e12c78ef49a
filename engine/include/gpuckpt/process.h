// Whole-process checkpoint/restore: freeze, CUDA device checkpoint, CRIU dump, streaming to a
// checkpoint image; and the reverse. Every stage is timed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {

// How to tell that a (re)started service answers: connect to a unix or TCP socket, optionally
// send a request and wait for a reply line; ask an HTTP server until it answers 2xx; or wait
// for a line on the child's stdout.
struct ReadinessProbe {
  enum class Kind { kNone, kUnix, kTcp, kStdoutLine, kHttp };
  Kind kind = Kind::kNone;
  std::string target;  // socket path, "host:port" (tcp, http), or the text to wait for on stdout
  std::string path;    // http: the request path ("/health"), with any query
  // Sent after connecting (a '\n' is appended); empty = connect only. http: POSTed as the
  // body (application/json); empty = GET.
  std::string request;
  std::chrono::milliseconds timeout{60000};
};
// Parses "unix:PATH", "tcp:HOST:PORT", "http://HOST:PORT[/PATH]", "stdout:TEXT"; throws
// Error(kUsage).
ReadinessProbe parse_probe(const std::string& spec);
// "unix:/run/llm.sock", "tcp:127.0.0.1:8000", "http://HOST:PORT/health", "stdout:ready", "none":
// the spec again, for messages and reports.
std::string describe_probe(const ReadinessProbe& probe);
// Polls until the probe succeeds; returns the reply line, for http the first line of a 2xx
// answer's body or else its status line (may be empty). Throws kTimeout.
std::string wait_ready(const ReadinessProbe& probe);

// How gpuckpt runs CRIU (docs/CRIU.md, docs/PROCESS.md).
struct CriuSettings {
  std::filesystem::path binary;         // empty: $GPUCKPT_CRIU, else GPUCKPT_CRIU_PREFIX/bin/criu
  std::vector<std::string> extra_args;  // appended verbatim to criu dump/restore
  std::chrono::seconds timeout{1800};   // bound on each criu run (it is killed past it)
  bool check = true;                    // run `criu check` as part of the preflight
};

// How CRIU's images travel between CRIU and the checkpoint (docs/PROCESS.md, "Streaming").
enum class StagingMode {
  // criu --stream: gpuckpt serves CRIU's image-streamer socket, so images flow from CRIU through
  // chunking, zstd and io_uring into the checkpoint while CRIU still dumps (and from the
  // checkpoint through verification and zstd into CRIU on restore). The staging directory holds
  // only the socket, CRIU's log and its stats: no copy of the process's memory.
  kStream,
  // CRIU writes its images to a directory under staging_root first (tmpfs by default), which
  // is then packed; restore unpacks there first. Needs as much free space as the process has
  // memory.
  kStaged,
  // The default: what minimises what matters for the operation (docs/PERFORMANCE.md). A
  // snapshot (--leave-running) is staged when the staging directory has room, since CRIU
  // writes memory faster than it can be compressed and stored, and the process runs again
  // as soon as CRIU is done; everything else streams, which is shorter from decision to a
  // durable checkpoint (or a restored process) and needs no memory for a copy.
  kAuto,
};
const char* staging_mode_name(StagingMode m);  // "stream", "staged", "auto"

// A namespace that a container can join by path and a restore can move it into another of: a
// Kubernetes pod's, which the pod's sandbox holds (containerd's CRI names each by the sandbox's
// pid, /proc/PAUSE/ns/net; CRI-O pins each under /var/run/*ns/).
enum class PodNamespace { kNetwork, kIpc, kUts };
const char* pod_namespace_name(PodNamespace n);  // OCI's type: "network", "ipc", "uts"
// OCI's type, or CRIU's and /proc's name ("net"); nullopt for another.
std::optional<PodNamespace> pod_namespace_from(std::string_view name);
// The namespaces a restored container joins instead of those it joined at the dump.
using PodNamespaces = std::map<PodNamespace, std::filesystem::path>;

// The OCI runtime setup that ran a container: its restore goes through the same.
enum class ContainerRuntime { kRunc, kDocker, kContainerd, kCrun };
// "runc", "docker", "containerd", "crun"
const char* container_runtime_name(ContainerRuntime r);

// A container's writable layer (the files it wrote into its image's rootfs), as its
// checkpoint holds it.
enum class WritableLayer {
  kNone,        // a runc bundle: its rootfs is a host directory, which stays where it is
  kEmpty,       // an image's rootfs that it wrote nothing into
  kCarried,     // in the images (rootfs-diff.tar, as podman carries it)
  kNotCarried,  // an image's rootfs without an overlay upper directory to read it from
  // A runc bundle's whole rootfs, in the images (rootfs.tar, DumpOptions::carry_rootfs): a
  // restore unpacks it where the recorded rootfs is missing (another host, a spare).
  kRootfs,
};
// "none", "empty", "carried", "not_carried", "rootfs"
const char* writable_layer_name(WritableLayer l);

// What a container checkpoint records of its container, as an operator reads it (`inspect`):
// who ran it, where its rootfs and mounts come from, and which namespaces a restore into
// another pod names.
struct ContainerSummary {
  ContainerRuntime runtime = ContainerRuntime::kRunc;
  std::string id, root, bundle, rootfs;  // root: the runc root it ran under
  std::string image, image_digest;       // containerd's by digest, Docker's by image ID
  std::string ns, snapshotter;           // containerd's
  std::string name;                      // Docker's
  WritableLayer layer = WritableLayer::kNone;
  std::string layer_why;  // kNotCarried: why not
  struct Join {
    std::string type, path;  // OCI's type ("network"), the path it joined
    bool movable = false;    // a PodNamespace: --join-ns moves it into another pod's
  };
  std::vector<Join> joins;  // none for Docker's, whose namespaces dockerd makes
  std::vector<std::pair<std::string, std::string>> mounts;  // destination, host source
};
// The container of a checkpoint's manifest (ImageInfo::extra); nullopt for one of a bare
// process tree, or no process checkpoint. Throws Error(kCorrupt) for a malformed container
// record (the rest of the process record is not read).
std::optional<ContainerSummary> container_summary(const nlohmann::json& extra);

struct DumpOptions {
  pid_t pid = 0;
  // A whole container, by its runtime's ID (instead of pid): its init's tree with its pid and
  // mount namespaces, the runtime's mounts as external ones, its stdio and spec. Once the
  // checkpoint is durable the container ends and its runtime forgets it (runc delete), so that
  // its ID is free for the restore. docs/PROCESS.md, "Containers".
  std::string container;
  // With `container`, one that runc runs from a bundle (not containerd's or Docker's, whose
  // image comes by digest and whose writable layer is always carried): its whole rootfs
  // directory goes into the checkpoint too, so that a host without the bundle can restore it.
  bool carry_rootfs = false;
  // A checkpoint directory, or s3://BUCKET/PREFIX (object storage, configured as the AWS tools
  // are: docs/OPERATORS.md, "Object storage"). An s3:// dump writes the checkpoint into a
  // private spool directory under `spool_root`, uploads it (parallel multipart, the manifest
  // last) and only then counts it durable: a process that is to end stays stopped until the
  // upload is complete, and is resumed if it fails.
  std::filesystem::path output;
  std::filesystem::path spool_root;  // "" = $TMPDIR or /var/tmp; needs the checkpoint's size
  // Snapshot: the process continues right after CRIU's dump (it runs while the image is
  // compressed and written). Otherwise it is kept stopped until the checkpoint is durable and
  // then killed; if writing the checkpoint fails it is resumed instead (nothing is lost).
  bool leave_running = false;
  std::filesystem::path staging_root = "/dev/shm";  // CRIU writes its images here first
  // Streaming falls back to kStaged (saying why) when a CRIU option needs image files on disk.
  StagingMode staging_mode = StagingMode::kAuto;
  PackOptions pack;  // pack.force replaces an existing checkpoint; pack.progress is also used
                     // for the CRIU stages
  std::chrono::milliseconds lock_timeout{10000};  // cuCheckpointProcessLock timeout
  // Established TCP connections: false = not dumped (criu --tcp-close: on restore they are
  // gone, a client in mid-request sees its connection reset); true = dumped with their state
  // (criu --tcp-established, the network to them is locked meanwhile), so a client's
  // connection survives. Listening sockets come back either way.
  bool tcp_established = false;
  CriuSettings criu;
};

struct DumpResult {
  Timeline timeline;
  std::uint64_t image_bytes = 0;       // CRIU image bytes before compression
  std::uint64_t checkpoint_bytes = 0;  // bytes on storage
  // Image bytes stored without trying zstd so that the writes kept up (Compression::kAdaptive).
  std::uint64_t skipped_compression_bytes = 0;
  bool gpu = false;                    // the process had CUDA state
  std::vector<std::string> gpu_uuids;  // GPUs the process had open
  std::string criu_version;
  std::string comm;                                 // the process's name
  std::vector<pid_t> tree;                          // every dumped process, root first
  StagingMode staging_mode = StagingMode::kStream;  // the one used
  std::string staging_note;  // why this staging mode was used, when it was not asked for
  std::string container;     // the container dumped, if one was
  // How long the tree was stopped (CRIU's frozen time): for a snapshot, what its service lost.
  double frozen_seconds = 0;
  // From the checkpoint being durable (where the timeline ends) until the dumped tree had ended
  // and freed its memory; 0 for a snapshot.
  double process_end_seconds = 0;
};

DumpResult dump(const DumpOptions& opts);

struct RestoreResult;

struct RestoreOptions {
  // A checkpoint directory, or s3://BUCKET/PREFIX: downloaded first (parallel ranged reads)
  // into a private spool directory under `spool_root`, then restored from there, every chunk
  // verified as for a local checkpoint. "-": a checkpoint stream on stdin (the target side of
  // `migrate --to ssh://`, docs/PROCESS.md), received into the spool first.
  std::filesystem::path checkpoint;
  std::filesystem::path spool_root;  // "" = $TMPDIR or /var/tmp
  GpuMap gpu_map;
  std::filesystem::path staging_root = "/dev/shm";
  StagingMode staging_mode = StagingMode::kAuto;  // as in DumpOptions (kAuto streams)
  UnpackOptions unpack;  // unpack.progress is also used for the CRIU stages
  ReadinessProbe probe;  // if set, "first_answer" is timed as the last stage
  // A container checkpoint restored as a container its runtime knows (`runc list`), under this
  // ID ("" = the one it had). Its images are unpacked to staging_root first: runc reads them.
  std::optional<std::string> container;
  // The restored container's stdout and stderr (appended); "" =
  // /var/log/gpuckpt/containers/ID.log.
  std::filesystem::path container_log;
  // With `container`, for one that joined namespaces by path (a Kubernetes pod's): those it
  // joins instead (a new pod's, here or on a spare host), each an absolute path. Empty: those
  // it joined. Naming any, name every one it joined: a container moved into another pod by its
  // network alone would keep the first pod's ipc and uts.
  PodNamespaces pod_namespaces;
  // Restore into a fresh pid namespace, so that the checkpointed pid may still be in use on
  // this host (the original runs, or is kept frozen by migrate). The restored process then has
  // its old pid inside the namespace and RestoreResult::pid on the host.
  bool new_pid_ns = false;
  // With new_pid_ns: a live process still serving a unix socket path of the checkpoint is
  // refused (the restored copy would silently take the path over); true hands it over.
  bool take_endpoints = false;
  // Dense private anonymous memory is read into transparent huge pages (gpuckpt's CRIU build,
  // docs/CRIU.md "Huge-page fill"): one page fault per 2 MiB instead of 512. false: CRIU fills
  // 4 KiB pages, as upstream CRIU does.
  bool huge_pages = true;
  // Streams each restored task's pages image is copied by, side by side (gpuckpt's CRIU build,
  // docs/CRIU.md "Parallel copy"; streamed restores only). 0: CRIU's default, half the CPUs
  // (at most 9); 1: one stream, as upstream CRIU reads it.
  unsigned copy_streams = 0;
  CriuSettings criu;
  TrustOptions trust;  // who may have written the checkpoint (check_trust, gpuckpt/image.h)
  // If set, called once the copy is restored (and has answered the probe): true keeps it;
  // false, or an exception, kills it again and fails the restore (a migration's two-phase
  // handoff: the controller commits only once it is sure).
  std::function<bool(const RestoreResult&)> confirm;
  // With `container`: the container record the checkpoint will bring (its "container" in
  // `inspect --json`), checked here before anything is read or started, as the restore would
  // check it once the checkpoint is in: the ID free, the runtime answering, its image, rootfs
  // and mount sources here; with "cuda": true beside them, also a runtime whose CRIU loads
  // gpuckpt's plugin. A migration's controller sends it, so that a target that cannot take the
  // container refuses before the freeze.
  nlohmann::json expected_container;
  // A stream ("-") only: called once its spool is ready, just before the stream is read (a
  // migration's controller starts the dump only then, so no frozen time waits on this start).
  std::function<void()> on_receiving;
};

struct RestoreResult {
  pid_t pid = 0;  // the restored process (the tree's root), from the caller's pid namespace
  std::vector<pid_t> tree;  // every restored process, root first, from the caller's namespace
  pid_t ns_pid = 0;         // its pid inside its own namespace (the checkpointed pid)
  pid_t pidns_init = 0;     // host pid of the namespace's init (new_pid_ns only)
  std::string container;    // the restored container's ID (RestoreOptions::container)
  Timeline timeline;
  std::string first_answer;
  bool gpu = false;                                 // the plugin restored CUDA state
  StagingMode staging_mode = StagingMode::kStream;  // the one used
  // Memory of the restored tree mapped by huge pages right after the restore (AnonHugePages).
  std::uint64_t huge_page_bytes = 0;
  // Files of a local checkpoint that the restore did not need (the dump's log) and that fail
  // their checksums, one message each: the restored process is as good, the checkpoint is not.
  std::vector<std::string> damaged_unread;
};

RestoreResult restore(const RestoreOptions& opts);

// Stops what restore() started, as an operator would stop the service: every process of the
// tree gets SIGTERM, and what is still there `grace` later gets SIGKILL, with what it started
// meanwhile (stopped first, so that it starts nothing more); the pid namespace's init
// (new_pid_ns) goes last. Live CUDA processes are locked first (cuda-checkpoint#53: a
// restored one must not be killed running), so their own CUDA calls block during the grace.
// Returns the pids still there 30 s after the grace, the lock included (normally none).
std::vector<pid_t> stop_restored(const RestoreResult& r, std::chrono::milliseconds grace);

enum class MigrateHandoff {
  kAuto,  // kRelease if the tree listens on TCP or an abstract unix socket, else kFrozen
  // The original stays frozen until the copy (in a new pid namespace) answers; a rollback only
  // resumes it. Impossible for endpoints the frozen original keeps bound (TCP ports,
  // abstract unix sockets).
  kFrozen,
  // The original ends once the checkpoint is durable, which releases its ports and pids; the
  // copy is restored in place. A rollback restores the original from the same checkpoint.
  kRelease,
};
const char* handoff_name(MigrateHandoff h);

struct MigrateOptions {
  pid_t pid = 0;
  // A whole runc container, by ID, instead of pid (as DumpOptions::container), which comes back
  // as a container its runtime lists, under `new_container_id` ("" = its own ID). On this host
  // a frozen handoff needs a new ID: the frozen original holds its own until the copy answers.
  std::string container, new_container_id;
  // For a container that joined namespaces by path (a pod's): those its copy joins on the
  // target (RestoreOptions::pod_namespaces); empty: the same paths.
  PodNamespaces pod_namespaces;
  // Where the checkpoint is written and restored from: a directory on this host, or
  // ssh://[USER@]HOST[:PORT], another host running gpuckpt (docs/PROCESS.md, "migrate to
  // another host").
  std::filesystem::path to_dir;
  // ssh:// only: ssh's configuration file (-F; default ssh's own), the gpuckpt to run there,
  // and the spools on both sides ("" = $TMPDIR or /var/tmp).
  std::filesystem::path ssh_config;
  std::string remote_gpuckpt = "gpuckpt";
  std::filesystem::path spool_root, remote_spool_root;
  // ssh:// only: a target that takes none of the checkpoint for this long (alive, but not
  // reading: a hung disk or restore there, a silent network) fails the migration, and the
  // original resumes, instead of staying frozen until ssh notices.
  std::chrono::seconds stall_timeout{60};
  GpuMap gpu_map;
  ReadinessProbe probe;
  bool keep_checkpoint = false;
  PackOptions pack;
  std::filesystem::path staging_root = "/dev/shm";
  StagingMode staging_mode = StagingMode::kAuto;  // for the dump and the restore (kAuto streams)
  std::chrono::milliseconds lock_timeout{10000};
  bool tcp_established = false;  // as in DumpOptions
  bool carry_rootfs = false;     // as in DumpOptions
  bool huge_pages = true;        // as in RestoreOptions
  // How the endpoints pass from the original to the copy on this host (docs/PROCESS.md):
  MigrateHandoff handoff = MigrateHandoff::kAuto;
  CriuSettings criu;
  TrustOptions trust;  // applied to the checkpoint before it is restored
};

class CommitScope;

struct MigrateResult {
  pid_t old_pid = 0, new_pid = 0;                  // new_pid: on the target host for ssh://
  std::string container;                           // the copy's container ID, if one was moved
  std::string target;                              // "this host", or the ssh:// URL
  nlohmann::json target_result;                    // ssh://: the target's `restore --json` result
  MigrateHandoff handoff = MigrateHandoff::kAuto;  // the one used (never kAuto)
  Timeline timeline;                               // dump stages, then restore stages, on one clock
  std::filesystem::path checkpoint;                // kept (keep_checkpoint) or already removed
  std::string first_answer;
  std::uint64_t image_bytes = 0, checkpoint_bytes = 0;  // CRIU's images; on storage
  std::uint64_t huge_page_bytes = 0;                    // as RestoreResult's, of the copy
  // The dump could store chunks uncompressed (compression_adapts), and what it so stored.
  bool adaptive_compression = false;
  std::uint64_t skipped_compression_bytes = 0;
  // Held from the handover on, for as long as the caller keeps this result: an interrupt until
  // the result is reported must not report the completed migration as undone.
  std::shared_ptr<const CommitScope> committed;
};

// Same-host migration (docs/PROCESS.md): the old process is dumped and kept frozen, the
// checkpoint is written to `to_dir` and restored from there into a new pid namespace; the old
// process is killed only after the new one answers the probe (or, without a probe, after the
// restore succeeded). If anything fails the new process is killed and the old one is resumed
// (rollback), and the error says so.
MigrateResult migrate(const MigrateOptions& opts);

// ---- The cold-start measurement: starting a service from nothing to its first answer ----

struct ColdStartOptions {
  std::vector<std::string> argv;  // the service command
  ReadinessProbe probe;           // unix:, tcp:, http: (optionally with a request) or stdout:
  std::chrono::milliseconds stop_timeout{10000};  // SIGTERM -> SIGKILL grace when stopping it
  // The service's stderr (and stdout unless probed); else stdout goes to /dev/null and stderr
  // is inherited.
  std::filesystem::path log_file;
  // Called with the service's pid before it runs anything (it then makes that pid its process
  // group's id, in a session of its own), and with 0 once it is stopped: lets a caller's signal
  // handler stop it if gpuckpt itself is interrupted. Kill the pid and then the group: before
  // its setsid() the group does not exist yet.
  std::function<void(pid_t)> on_running;
};

// Starts the service (own session), times "spawn", "ready" (the probe connects, or the stdout
// line appears) and "first_answer" (reply to the probe's request, if any), then stops its
// whole process group. Throws Error(kProcess) if it exits before answering, kTimeout past
// probe.timeout, kUsage for a request with a stdout probe or no probe.
Timeline measure_cold_start(const ColdStartOptions& opts);

// A step of a recovery that failed: the original not restored, a path not put back, a
// process's CUDA state not given back.
struct RecoveryFailure {
  Errc code = Errc::kInternal;  // of the error that stopped the step
  std::string what;             // as the summary says it
};

// An operation whose gpuckpt was killed together with its guard (a cgroup's SIGKILL, the OOM
// killer), undone from its journal by a later run.
struct RecoveredOperation {
  std::string operation;  // "dump", "restore", "migrate"
  pid_t gpuckpt_pid = 0;  // of the gpuckpt that was killed
  std::string started;    // when it started, UTC (ISO 8601)
  std::string journal;    // the journal it was undone from (removed now)
  std::string summary;    // what was undone, as a guard says it ("process 12 was resumed")
  // What could not be undone (each also in the summary): empty when the recovery is complete.
  std::vector<RecoveryFailure> failures;
};
// Undoes, as their guards would have, the operations whose gpuckpt and guard were both killed on
// this host (in this boot and pid namespace), and returns them; each is also logged. Every dump,
// restore and migrate does this before it starts; `gpuckpt recover` does only this.
std::vector<RecoveredOperation> recover_abandoned_operations();

// For a program's handler of SIGINT, SIGTERM and SIGHUP (the CLI waits for them in a thread of
// its own): every dump, restore or migrate in flight is rolled back by its guard (the target
// resumed, copies killed, staging removed) before this returns; then every temporary
// directory this process still holds (an unfinished pack's or unpack's output, a download) is
// removed. Returns what was undone. The program then exits; an operation's own thread must not
// carry on.
std::vector<std::string> interrupt_operations(std::chrono::milliseconds timeout);

// While one of these lives, an operation has passed its commit (a migration's handover: the
// copy serves, the original is ended): nothing is left to roll back, and an interrupt must not
// report "undone". The program's signal handler asks defer_interrupt() first; a deferred signal
// is raised again when the next operation starts a guard (a benchmark's next run), and
// deferred_interrupt() names it for the program's ending (0: none).
class CommitScope {
 public:
  CommitScope();
  ~CommitScope();
  CommitScope(const CommitScope&) = delete;
  CommitScope& operator=(const CommitScope&) = delete;
};
// True (and `sig` remembered) while a CommitScope lives; false otherwise.
bool defer_interrupt(int sig);
int deferred_interrupt();

// Extra work for interrupt_operations() while this object lives (e.g. a benchmark's service to
// kill); it runs after the guards' rollbacks, in the signal-handling thread, and returns what it
// did for the operator ("" if nothing). It runs a copy of `fn`, possibly after this object is
// gone: what it uses must be shared, not borrowed.
class OnInterrupt {
 public:
  explicit OnInterrupt(std::function<std::string()> fn);
  ~OnInterrupt();
  OnInterrupt(const OnInterrupt&) = delete;
  OnInterrupt& operator=(const OnInterrupt&) = delete;

 private:
  std::function<std::string()> fn_;
};

}  // namespace gpuckpt
