// The checkpoint manifest (manifest.json): model, serialisation and strict validation.
// The on-disk format is specified in docs/FORMAT.md; keep the two in step.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/image.h"

namespace gpuckpt::trust {
class SigningKey;
}

namespace gpuckpt::image {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kSealName = "manifest.seal";
inline constexpr const char* kFormatName = "gpuckpt-image";
inline constexpr const char* kSealFormatName = "gpuckpt-seal";
// Readers refuse larger files before reading them (docs/FORMAT.md).
inline constexpr std::uint64_t kMaxManifestBytes = 256ull << 20;
inline constexpr std::uint64_t kMaxSealBytes = 64u << 10;

enum class Codec : std::uint8_t { kRaw, kZstd };

struct ChunkRecord {
  std::uint32_t blob = 0;
  std::uint64_t offset = 0;  // in the blob
  std::uint32_t stored = 0;  // bytes in the blob
  std::uint32_t raw = 0;     // bytes after decompression
  std::uint64_t xxh3 = 0;    // of the stored bytes
  Codec codec = Codec::kZstd;
  bool has_blake2b = false;  // signed checkpoints: BLAKE2b-256 of the stored bytes
  std::array<unsigned char, 32> blake2b{};
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
  // Filled by load_manifest from manifest.seal.
  bool sealed = false;
  SignatureInfo signature;

  std::uint64_t raw_bytes() const;
  std::uint64_t stored_bytes() const;
  std::uint64_t chunk_count() const;
};

std::string blob_name(std::uint32_t index);  // "blob-000000.bin"

std::string serialize(const Manifest& m);
// The text of manifest.seal for manifest text `manifest`: its size and XXH3-64, and an ed25519
// signature of exactly those bytes when `key` is given.
std::string make_seal(std::string_view manifest, const trust::SigningKey* key = nullptr);
// Parses and validates; `origin` names the checkpoint in messages. Throws Error(kVersion)
// for an unsupported major version, Error(kCorrupt) for anything malformed or inconsistent
// (including chunks that overlap in their blob). Chunk arrays are read without building a
// JSON tree for them, so a manifest of millions of chunks costs tens of bytes per chunk.
Manifest parse_manifest(std::string_view text, const std::string& origin);
// Reads <checkpoint>/manifest.json and manifest.seal (regular files only, size-capped) and
// checks the seal before parsing. Error(kInvalidInput) if `checkpoint` is missing or is not a
// checkpoint at all, Error(kCorrupt) if it looks like a damaged one.
Manifest load_manifest(const std::filesystem::path& checkpoint);

}  // namespace gpuckpt::image
