// The checkpoint manifest (manifest.json): model, serialisation and strict validation.
// The on-disk format is specified in docs/FORMAT.md; keep the two in step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace gpuckpt::image {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kFormatName = "gpuckpt-image";

enum class Codec : std::uint8_t { kRaw, kZstd };
enum class EntryType : std::uint8_t { kFile, kDir, kSymlink };

struct ChunkRecord {
  std::uint32_t blob = 0;
  std::uint64_t offset = 0;  // in the blob
  std::uint32_t stored = 0;  // bytes in the blob
  std::uint32_t raw = 0;     // bytes after decompression
  std::uint64_t xxh3 = 0;    // of the stored bytes
  Codec codec = Codec::kZstd;
};

struct ManifestEntry {
  std::string path;  // relative, '/'-separated, no "." / ".." components
  EntryType type = EntryType::kFile;
  std::uint32_t mode = 0;
  std::uint64_t size = 0;  // files
  std::uint64_t xxh3 = 0;  // files: of the whole content
  std::string target;      // symlinks
  std::vector<ChunkRecord> chunks;
  std::uint64_t stored_bytes() const;
};

struct BlobRecord {
  std::string name;
  std::uint64_t size = 0;
};

struct Manifest {
  std::uint32_t major = 0;
  std::uint32_t minor = 0;
  std::string created_by;
  std::string created_at;
  std::string host;
  std::string source;
  std::string input_kind;  // "directory" | "file"
  std::uint32_t chunk_bytes = 0;
  int zstd_level = 0;
  std::vector<BlobRecord> blobs;
  std::vector<ManifestEntry> entries;
  nlohmann::json extra;  // object, or null when none

  std::uint64_t raw_bytes() const;
  std::uint64_t stored_bytes() const;
  std::uint64_t chunk_count() const;
};

std::string blob_name(std::uint32_t index);  // "blob-000000.bin"
const char* entry_type_name(EntryType t);

std::string serialize(const Manifest& m);
// Parses and validates; `origin` names the checkpoint in messages. Throws Error(kVersion)
// for an unsupported major version, Error(kCorrupt) for anything malformed or inconsistent.
Manifest parse_manifest(std::string_view text, const std::string& origin);
// Reads <checkpoint>/manifest.json. Error(kInvalidInput) if `checkpoint` is missing or is not
// a checkpoint at all, Error(kCorrupt) if it looks like a damaged one.
Manifest load_manifest(const std::filesystem::path& checkpoint);

}  // namespace gpuckpt::image
