// Checkpoint images on disk: pack a directory (e.g. CRIU's image dir) into a checkpoint,
// unpack it back, inspect and verify it. Format: docs/FORMAT.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gpuckpt/progress.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {

// Checkpoint format version written by this build; readers accept any minor of this major
// and reject other majors with Errc::kVersion.
inline constexpr std::uint32_t kImageFormatMajor = 1;
inline constexpr std::uint32_t kImageFormatMinor = 0;

struct PackOptions {
  int zstd_level = 1;                    // fast levels: the pipeline is throughput-bound
  unsigned threads = 0;                  // compression workers; 0 = hardware concurrency
  std::uint32_t chunk_bytes = 4u << 20;  // multiple of 4 KiB, 64 KiB .. 256 MiB
  unsigned queue_depth = 16;             // io_uring submission queue depth (1 .. 4096)
  bool direct_io = true;                 // O_DIRECT where the filesystem allows it
  bool force = false;                    // replace an existing checkpoint
  // Chunk buffers in flight (each holds two chunk-sized buffers); bounds memory.
  // 0 = auto: 2 * threads + 8, capped to ~512 MiB of buffers and to the number of chunks.
  unsigned inflight_chunks = 0;
  // A blob file is closed and the next one started once it would exceed this size.
  std::uint64_t max_blob_bytes = 1ull << 30;
  ProgressFn progress;
  // Free-form metadata stored in the manifest (e.g. the process record and stage timings of
  // a dump). Must be a JSON object serialised as text; empty = none.
  std::string extra_json;
};

struct UnpackOptions {
  unsigned threads = 0;  // decompression workers; 0 = hardware concurrency
  unsigned queue_depth = 16;
  bool direct_io = true;
  bool force = false;            // allow (and replace) a non-empty output directory
  unsigned inflight_chunks = 0;  // as in PackOptions
  ProgressFn progress;
};

struct FileEntry {
  std::string path;  // relative to the packed root, '/'-separated
  std::string type;  // "file", "dir" or "symlink"
  std::uint64_t size = 0;
  std::uint32_t mode = 0;             // permission bits (07777)
  std::uint64_t compressed_size = 0;  // stored bytes of its chunks
  std::uint64_t chunks = 0;
  std::uint64_t xxh3 = 0;  // XXH3-64 of the whole file (what `xxhsum -H3` prints)
  std::string target;      // symlink target
};

struct ImageInfo {
  std::uint32_t format_version = 0;  // major
  std::uint32_t format_minor = 0;
  std::string created_by;  // gpuckpt version
  std::string created_at;  // ISO 8601 UTC
  std::string host;        // hostname of the packing machine
  std::string source;      // absolute input path at pack time
  std::string input_kind;  // "directory" or "file"
  std::uint32_t chunk_bytes = 0;
  int zstd_level = 0;
  std::uint64_t raw_bytes = 0;
  std::uint64_t compressed_bytes = 0;
  std::uint64_t chunk_count = 0;
  std::uint64_t blob_count = 0;
  std::vector<FileEntry> files;  // every entry: files, directories, symlinks
  std::string extra_json;        // as given in PackOptions::extra_json ("" if none)
};

struct TransferResult {
  std::uint64_t raw_bytes = 0;
  std::uint64_t compressed_bytes = 0;
  std::uint64_t chunks = 0;
  std::uint64_t files = 0;         // entries of every type
  unsigned threads = 0;            // workers used
  std::uint64_t buffer_bytes = 0;  // chunk buffer memory of the pipeline (the RSS bound)
  double worker_busy_seconds = 0;  // CPU time the workers spent (de)compressing and hashing
  bool io_uring = false;           // false: fell back to pread/pwrite
  bool direct_io = false;          // O_DIRECT was used for the checkpoint's blobs
  Timeline timeline;
};

// Packs `input` (a directory, or a single file) into the checkpoint directory `output`.
// Atomic: writes to a temporary sibling, fsyncs, then renames, so `output` either does not
// exist or is complete and valid.
TransferResult pack(const std::filesystem::path& input, const std::filesystem::path& output,
                    const PackOptions& opts = {});

// Unpacks `checkpoint` into directory `output` (created). Every chunk is checksum-verified
// before it is used; on any error nothing is left at `output`. A single-file checkpoint
// unpacks to `output`/<file name>.
TransferResult unpack(const std::filesystem::path& checkpoint, const std::filesystem::path& output,
                      const UnpackOptions& opts = {});

// Reads the manifest only (cheap).
ImageInfo inspect(const std::filesystem::path& checkpoint);

// Reads and checksums every chunk, decompresses and checks whole-file hashes; throws
// Error(kCorrupt/kVersion/...) on the first problem.
TransferResult verify(const std::filesystem::path& checkpoint, const UnpackOptions& opts = {});

}  // namespace gpuckpt
