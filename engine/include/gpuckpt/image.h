// Checkpoint images on disk: pack a directory (e.g. CRIU's image dir) into a checkpoint,
// unpack it back, inspect and verify it. Format: docs/FORMAT.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpuckpt/progress.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {

// Checkpoint format version written by this build; readers accept any minor of this major
// and reject other majors with Errc::kVersion.
inline constexpr std::uint32_t kImageFormatMajor = 1;
// 1.1: manifest.seal (whole-manifest checksum, optional ed25519 signature).
inline constexpr std::uint32_t kImageFormatMinor = 1;

// Which chunks zstd is tried on (docs/PERFORMANCE.md, "Compressing what the CPUs can afford").
enum class Compression : std::uint8_t {
  // Every chunk; one that would not get smaller is stored raw.
  kAlways,
  // A chunk is stored raw without trying zstd while the compression workers are the bound and
  // the writes would run dry waiting for them: the checkpoint grows by what the CPUs could not
  // afford, and is durable sooner.
  kAdaptive,
  // For a dump or a migration: kAdaptive when the checkpoint goes to storage only, kAlways when
  // a copy goes over a network as it is written (s3://, ssh://), where the bytes are the bound.
  // For pack(): kAlways, so that the same input packs to the same checkpoint whatever the
  // threads' timing (kAdaptive gives that up).
  kAuto,
};
const char* compression_name(Compression c);  // "always", "adaptive", "auto"
// Whether a dump's `c` stores chunks uncompressed when the workers fall behind: kAuto resolved,
// for a checkpoint of which a copy goes over a network as it is written (`network_copy`) or not.
bool compression_adapts(Compression c, bool network_copy);

struct PackOptions {
  int zstd_level = 1;  // fast levels: the pipeline is throughput-bound
  Compression compression = Compression::kAuto;
  unsigned threads = 0;                  // compression workers; 0 = one per usable CPU, <= 32
  std::uint32_t chunk_bytes = 4u << 20;  // multiple of 4 KiB, 64 KiB .. 256 MiB
  unsigned queue_depth = 16;             // io_uring submission queue depth (1 .. 4096)
  bool direct_io = true;                 // O_DIRECT where the filesystem allows it
  bool force = false;                    // replace an existing checkpoint
  // Chunk buffers in flight (each holds two chunk-sized buffers); bounds memory.
  // 0 = auto: 2 * threads + 8, capped to ~330 MiB of buffers (but at least 4 slots) and to the
  // number of chunks.
  unsigned inflight_chunks = 0;
  // A blob file is closed and the next one started once it would exceed this size.
  std::uint64_t max_blob_bytes = 1ull << 30;
  ProgressFn progress;
  // Called with the temporary sibling the checkpoint is built in, before anything is written
  // there: a caller that may be killed (dump's guard) removes it if the pack never finishes.
  std::function<void(const std::filesystem::path&)> on_temp_path;
  // Free-form metadata stored in the manifest (e.g. the process record and stage timings of
  // a dump): a JSON object, or null for none.
  nlohmann::json extra;
  // ed25519 secret key file (`gpuckpt keygen`) that signs the manifest; empty = unsigned.
  std::filesystem::path sign_key;
};

struct UnpackOptions {
  unsigned threads = 0;  // decompression workers; 0 = one per usable CPU, at most 32
  unsigned queue_depth = 16;
  bool direct_io = true;
  bool force = false;            // allow (and replace) a non-empty output directory
  unsigned inflight_chunks = 0;  // as in PackOptions
  ProgressFn progress;
};

enum class EntryType : std::uint8_t { kFile, kDir, kSymlink };
const char* entry_type_name(EntryType t);  // "file", "dir", "symlink": as in the manifest

struct FileEntry {
  std::string path;  // relative to the packed root, '/'-separated
  EntryType type = EntryType::kFile;
  std::uint64_t size = 0;
  std::uint32_t mode = 0;             // permission bits (07777)
  std::uint64_t compressed_size = 0;  // stored bytes of its chunks
  std::uint64_t chunks = 0;
  std::uint64_t xxh3 = 0;  // XXH3-64 of the whole file (what `xxhsum -H3` prints)
  std::string target;      // symlink target
};

enum class SignatureState {
  kUnsigned,  // no signature in manifest.seal
  kValid,     // the signature matches the manifest and its own public key
  kInvalid,   // present but does not verify (tampered or damaged)
};

struct SignatureInfo {
  SignatureState state = SignatureState::kUnsigned;
  std::string key_id;      // signer's key id (16 hex digits), when signed
  std::string public_key;  // signer's public key (base64), when signed
  std::string problem;     // kInvalid: why
  // Set by signature_status(): the trusted key file holding the signer's key (kValid only);
  // empty when the signer is not among the trusted keys.
  std::filesystem::path trusted_by;
  bool trusted() const { return state == SignatureState::kValid && !trusted_by.empty(); }
};

const char* signature_state_name(SignatureState s);  // "unsigned", "valid", "invalid"

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
  nlohmann::json extra;          // as given in PackOptions::extra (null if none)
  bool sealed = false;           // manifest.seal checksums the whole manifest (format >= 1.1)
  SignatureInfo signature;       // trusted_by is not filled in (see signature_status)
};

struct TransferResult {
  std::uint64_t raw_bytes = 0;
  std::uint64_t compressed_bytes = 0;
  // Raw bytes of the chunks stored without trying zstd (Compression::kAdaptive).
  std::uint64_t skipped_compression_bytes = 0;
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

// ---- Trust: who may hand us a checkpoint to restore (docs/OPERATORS.md) ---------------------

struct TrustOptions {
  // Skip the ownership/mode checks of check_trust (like sshd's StrictModes=no). Signature
  // checks still apply.
  bool allow_untrusted = false;
  // Refuse a checkpoint that is not signed by one of `trusted_keys`.
  bool require_signature = false;
  // A public key file (`gpuckpt keygen` writes KEY.pub; several keys, one per line, may be
  // concatenated) or a directory of *.pub files. Empty = no trusted keys.
  std::filesystem::path trusted_keys;
};

// Restore runs what a checkpoint holds, as root: refuses (Error(kInvalidInput)) a checkpoint
// whose directory, manifest, seal or blobs are not owned by root or the effective uid, or are
// writable by group or others, or that lies under such a directory (sticky ones excepted);
// unless opts.allow_untrusted. Then applies the signature policy (enforce_signature).
void check_trust(const std::filesystem::path& checkpoint, const TrustOptions& opts);

// The manifest's signature state, with trusted_by filled in from `trusted_keys` (empty = none).
// Throws only when the checkpoint or the keys cannot be read.
SignatureInfo signature_status(const std::filesystem::path& checkpoint,
                               const std::filesystem::path& trusted_keys);

// Throws unless `sig` passes the policy: an invalid signature always fails (kCorrupt); with
// opts.require_signature, so do a missing signature and one by an untrusted key
// (kInvalidInput).
void enforce_signature(const SignatureInfo& sig, const TrustOptions& opts,
                       const std::filesystem::path& checkpoint);

struct KeyPairInfo {
  std::filesystem::path secret_key;  // mode 0600
  std::filesystem::path public_key;  // secret_key + ".pub", mode 0644
  std::string key_id;
};

// Generates an ed25519 key pair for signing checkpoints. Error(kExists) if either file exists
// and !force.
KeyPairInfo generate_signing_key(const std::filesystem::path& secret_key,
                                 const std::string& comment, bool force = false);

// Site defaults for signing and trust, from the JSON file named by $GPUCKPT_CONFIG, else
// /etc/gpuckpt/config.json when it exists (docs/OPERATORS.md):
//   {"sign_key": PATH, "trusted_keys": PATH, "require_signature": BOOL}
// The file must be owned by root (or the effective uid) and not writable by group/others.
struct SecurityConfig {
  std::filesystem::path file;          // the file read; empty = none
  std::filesystem::path sign_key;      // default PackOptions::sign_key
  std::filesystem::path trusted_keys;  // default TrustOptions::trusted_keys; else
                                       // /etc/gpuckpt/trusted-keys when it exists
  bool require_signature = false;      // default TrustOptions::require_signature
};
SecurityConfig load_security_config();

}  // namespace gpuckpt
