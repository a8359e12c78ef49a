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

struct PackOptions {
  int zstd_level = 1;               // fast levels: the pipeline is throughput-bound
  unsigned threads = 0;             // compression workers; 0 = hardware concurrency
  std::uint32_t chunk_bytes = 4u << 20;
  unsigned queue_depth = 16;        // io_uring submission queue depth
  bool direct_io = true;            // O_DIRECT where the filesystem allows it
  bool force = false;               // replace an existing checkpoint
  ProgressFn progress;
  // Free-form metadata stored in the manifest (e.g. the process record and stage timings of
  // a dump). Must be a JSON object serialised as text; empty = none.
  std::string extra_json;
};

struct UnpackOptions {
  unsigned threads = 0;
  unsigned queue_depth = 16;
  bool direct_io = true;
  bool force = false;  // allow a non-empty output directory
  ProgressFn progress;
};

struct FileEntry {
  std::string path;  // relative to the packed root, '/'-separated
  std::uint64_t size = 0;
  std::uint32_t mode = 0;
  std::uint64_t compressed_size = 0;
};

struct ImageInfo {
  std::uint32_t format_version = 0;
  std::string created_by;   // gpuckpt version
  std::string created_at;   // ISO 8601 UTC
  std::uint64_t raw_bytes = 0;
  std::uint64_t compressed_bytes = 0;
  std::uint64_t chunk_count = 0;
  std::vector<FileEntry> files;
  std::string extra_json;   // as given in PackOptions::extra_json ("" if none)
};

struct TransferResult {
  std::uint64_t raw_bytes = 0;
  std::uint64_t compressed_bytes = 0;
  Timeline timeline;
};

// Packs `input` (a directory, or a single file) into the checkpoint directory `output`.
// Atomic: writes to a temporary sibling, fsyncs, then renames, so `output` either does not
// exist or is complete and valid.
TransferResult pack(const std::filesystem::path& input, const std::filesystem::path& output,
                    const PackOptions& opts = {});

// Unpacks `checkpoint` into directory `output` (created). Every chunk is checksum-verified
// before it is used; on any error nothing is left at `output`.
TransferResult unpack(const std::filesystem::path& checkpoint,
                      const std::filesystem::path& output, const UnpackOptions& opts = {});

// Reads the manifest only (cheap).
ImageInfo inspect(const std::filesystem::path& checkpoint);

// Reads and checksums every chunk, decompresses and checks whole-file hashes; throws
// Error(kCorrupt/kVersion/...) on the first problem.
TransferResult verify(const std::filesystem::path& checkpoint, const UnpackOptions& opts = {});

}  // namespace gpuckpt
