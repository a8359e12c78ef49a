// Checkpoints in object storage (docs/FORMAT.md, "In object storage"): the files of a
// checkpoint directory become the objects PREFIX/<name>. Every blob goes up in parallel
// multipart parts and comes down in parallel ranged reads; manifest.json goes up last and is
// taken away first, so a reader never sees a manifest whose blobs are not all there.
//
// gpuckpt spools through a private local directory: a dump writes the checkpoint there
// (the usual atomic, checksummed writer), then uploads it; a restore, inspect or verify
// downloads it there and then reads it as a local checkpoint, so every chunk goes through
// the same verification as on local storage.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "gpuckpt/progress.h"
#include "remote/s3.h"
#include "util/fs.h"

namespace gpuckpt::remote {

struct TransferOptions {
  unsigned connections = 0;                // parallel requests; 0 = $GPUCKPT_S3_CONNECTIONS or 8
  std::uint64_t part_bytes = 32ull << 20;  // multipart part and ranged-read size (>= 5 MiB)
  ProgressFn progress;
};

struct TransferStats {
  std::uint64_t bytes = 0;    // object bytes moved
  std::uint64_t objects = 0;  // objects written or read
  std::uint64_t requests = 0;
  unsigned connections = 0;
  double seconds = 0;
};

// Error(kExists) if `url` already holds a checkpoint (a manifest.json) and !replace. One HEAD:
// dump calls it before anything is frozen.
void check_remote_output(const S3Client& s3, const S3Url& url, bool replace);

// Uploads the checkpoint directory `local`: blobs and the seal first, in parallel, then
// manifest.json. Replacing a checkpoint first removes its manifest, and afterwards the blobs
// of the old one that the new one does not have.
TransferStats upload_checkpoint(const S3Client& s3, const std::filesystem::path& local,
                                const S3Url& url, bool replace, const TransferOptions& o = {});

// Downloads manifest.json and manifest.seal of `url` into the existing directory `dir`
// (mode 0600 files): enough for inspect and signature checks.
TransferStats download_manifest(const S3Client& s3, const S3Url& url,
                                const std::filesystem::path& dir);

// Downloads the whole checkpoint into the existing, empty directory `dir`: the manifest, read
// and checked first (its seal, its format), then every blob it lists, in parallel ranges.
TransferStats download_checkpoint(const S3Client& s3, const S3Url& url,
                                  const std::filesystem::path& dir, const TransferOptions& o = {});

// Where spools go: `given` if set, else $TMPDIR, else /var/tmp (disk, not tmpfs: a spool holds
// a whole compressed checkpoint).
std::filesystem::path spool_root(const std::filesystem::path& given);
// A private (0700) temporary directory for spooling a checkpoint, under spool_root(root).
TempDir make_spool(const std::filesystem::path& root, const std::string& prefix);

// A checkpoint named by a local path or an s3:// URL, readable as a local directory: a URL is
// fetched (the manifest only, or everything) into a spool directory removed with this object.
class LocalView {
 public:
  enum class Fetch { kManifest, kEverything };
  LocalView(const std::string& where, Fetch what, const std::filesystem::path& spool_root = {},
            const TransferOptions& o = {});
  const std::filesystem::path& path() const { return path_; }
  bool remote() const { return spool_.has_value(); }
  const TransferStats& stats() const { return stats_; }

 private:
  std::optional<TempDir> spool_;
  std::filesystem::path path_;
  TransferStats stats_;
};

}  // namespace gpuckpt::remote
