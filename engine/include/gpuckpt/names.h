// The names that gpuckpt's timelines, reports and tests share, each spelled once: a stage's name
// is how a report, a floor and a benchmark find it (docs/PROCESS.md, "Stages"), and a fault
// point's is how a test stops gpuckpt there (gpuckpt/support.h, fault_point). Spelled as a
// constant, a typo is a compile error instead of a floor silently missing or a test that never
// pauses where it means to.
#pragma once

namespace gpuckpt {

namespace stage {
inline constexpr const char kPreflight[] = "preflight";
inline constexpr const char kCriuDump[] = "criu_dump";
inline constexpr const char kDeviceLock[] = "device_lock";
inline constexpr const char kFreeze[] = "freeze";
inline constexpr const char kDeviceCheckpoint[] = "device_checkpoint";
inline constexpr const char kFrozen[] = "frozen";
inline constexpr const char kCriuMemdump[] = "criu_memdump";
inline constexpr const char kCriuMemwrite[] = "criu_memwrite";
inline constexpr const char kDeviceResume[] = "device_resume";
inline constexpr const char kCompressWrite[] = "compress_write";
inline constexpr const char kRootfsDiff[] = "rootfs_diff";
inline constexpr const char kRuntimeDelete[] = "runtime_delete";
inline constexpr const char kCaptureWait[] = "capture_wait";
inline constexpr const char kReadDecompress[] = "read_decompress";
inline constexpr const char kFeedWait[] = "feed_wait";
inline constexpr const char kCriuRestore[] = "criu_restore";
inline constexpr const char kRootfsApply[] = "rootfs_apply";
inline constexpr const char kCheckpointDir[] = "checkpoint_dir";
inline constexpr const char kCriuForking[] = "criu_forking";
inline constexpr const char kCriuRestoreTasks[] = "criu_restore_tasks";
inline constexpr const char kMemoryFill[] = "memory_fill";
inline constexpr const char kMemoryCopy[] = "memory_copy";
inline constexpr const char kDeviceRestore[] = "device_restore";
inline constexpr const char kFirstAnswer[] = "first_answer";
inline constexpr const char kEndOriginal[] = "end_original";
inline constexpr const char kNetwork[] = "network";
inline constexpr const char kTransfer[] = "transfer";
inline constexpr const char kTargetPreflight[] = "target_preflight";
inline constexpr const char kTargetRestore[] = "target_restore";
inline constexpr const char kCommit[] = "commit";
inline constexpr const char kDownload[] = "download";
inline constexpr const char kUpload[] = "upload";
inline constexpr const char kReceive[] = "receive";
inline constexpr const char kSync[] = "sync";
inline constexpr const char kScan[] = "scan";
inline constexpr const char kSpawn[] = "spawn";
inline constexpr const char kCreateTree[] = "create_tree";
inline constexpr const char kCudaCheckpoint[] = "cuda_checkpoint";
inline constexpr const char kCudaInit[] = "cuda_init";
inline constexpr const char kCudaLock[] = "cuda_lock";
inline constexpr const char kCudaRestore[] = "cuda_restore";
inline constexpr const char kCudaUnlock[] = "cuda_unlock";
inline constexpr const char kReady[] = "ready";
inline constexpr const char kManifest[] = "manifest";
inline constexpr const char kCompress[] = "compress";
inline constexpr const char kRead[] = "read";
inline constexpr const char kWrite[] = "write";
inline constexpr const char kDecompress[] = "decompress";
// Every stage above: what docs/PROCESS.md, "Stages", must describe.
inline constexpr const char* kAll[] = {
    kPreflight,   kCriuDump,        kDeviceLock,    kFreeze,         kDeviceCheckpoint,
    kFrozen,      kCriuMemdump,     kCriuMemwrite,  kDeviceResume,   kCompressWrite,
    kRootfsDiff,  kRuntimeDelete,   kCaptureWait,   kReadDecompress, kFeedWait,
    kCriuRestore, kRootfsApply,     kCheckpointDir, kCriuForking,    kCriuRestoreTasks,
    kMemoryFill,  kDeviceRestore,   kFirstAnswer,   kEndOriginal,    kNetwork,
    kTransfer,    kTargetPreflight, kTargetRestore, kCommit,         kDownload,
    kUpload,      kReceive,         kSync,          kScan,           kSpawn,
    kCreateTree,  kCudaCheckpoint,  kCudaInit,      kCudaLock,       kCudaRestore,
    kCudaUnlock,  kReady,           kManifest,      kCompress,       kRead,
    kWrite,       kDecompress,      kMemoryCopy};
}  // namespace stage

namespace fault {
inline constexpr const char kParse[] = "parse";
inline constexpr const char kCriuDump[] = "criu_dump";
inline constexpr const char kCompressWrite[] = "compress_write";
inline constexpr const char kPublished[] = "published";
inline constexpr const char kDurable[] = "durable";
inline constexpr const char kUpload[] = "upload";
inline constexpr const char kUploadManifest[] = "upload_manifest";
inline constexpr const char kCriuRestore[] = "criu_restore";
inline constexpr const char kRuntimeCreated[] = "runtime_created";
// A container's runtime is about to restore it: runc or crun is about to start, or the start
// request (dockerd's runc restores) has reached dockerd and has no answer yet.
inline constexpr const char kRuntimeStarting[] = "runtime_starting";
inline constexpr const char kRestorePages[] = "restore_pages";
inline constexpr const char kFirstAnswer[] = "first_answer";
inline constexpr const char kEndOriginal[] = "end_original";
inline constexpr const char kPackCommit[] = "pack_commit";
inline constexpr const char kUnpackCommit[] = "unpack_commit";
inline constexpr const char kBenchStop[] = "bench_stop";
inline constexpr const char kReplaced[] = "replaced";
inline constexpr const char kRemoveCheckpoint[] = "remove_checkpoint";
inline constexpr const char kUnpublished[] = "unpublished";
inline constexpr const char kCriuRestored[] = "criu_restored";
inline constexpr const char kCommit[] = "commit";
inline constexpr const char kTransfer[] = "transfer";
// A restore's carried rootfs (restore --container of a dump --with-rootfs) is unpacked beside
// where it goes, not yet renamed there.
inline constexpr const char kRootfsUnpacked[] = "rootfs_unpacked";
// Every point above: where a test's name for one is checked.
inline constexpr const char* kAll[] = {
    kParse,       kCriuDump,         kCompressWrite, kPublished,      kDurable,
    kUpload,      kUploadManifest,   kCriuRestore,   kRuntimeCreated, kRestorePages,
    kFirstAnswer, kEndOriginal,      kPackCommit,    kUnpackCommit,   kBenchStop,
    kReplaced,    kRemoveCheckpoint, kUnpublished,   kCriuRestored,   kCommit,
    kTransfer,    kRuntimeStarting,  kRootfsUnpacked};
}  // namespace fault

}  // namespace gpuckpt
