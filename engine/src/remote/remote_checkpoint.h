// Checkpoints in object storage (docs/FORMAT.md, "In object storage"): the files of a
// checkpoint directory become the objects PREFIX/<name>. Every blob goes up in parallel
// multipart parts and comes down in parallel ranged reads; manifest.json goes up last and is
// taken away first, so a reader never sees a manifest whose blobs are not all there.
//
// gpuckpt spools through a private local directory: a dump writes the checkpoint there
// (the usual atomic, checksummed writer) and uploads it while it is written (Upload); a
// restore reads it there while it downloads (Download), inspect and verify once it is down,
// so every chunk goes through the same verification as on local storage.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpuckpt/progress.h"
#include "image/arrival.h"
#include "image/blob_tap.h"
#include "image/manifest.h"
#include "remote/s3.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace gpuckpt {
class OnInterrupt;
}

namespace gpuckpt::remote {

class PrefixClaim;

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
// dump calls it (through Upload) before anything is frozen.
void check_remote_output(const S3Client& s3, const S3Url& url, bool replace);

// Uploads the checkpoint directory `local` (an Upload fed by nothing but its finish()).
TransferStats upload_checkpoint(const S3Client& s3, const std::filesystem::path& local,
                                const S3Url& url, bool replace, const TransferOptions& o = {});

// An upload fed while the checkpoint is written (a dump to s3://). A StreamPacker tells it how
// far each blob is written (image::BlobTap); every whole part goes up as soon as it is there,
// read back from the spool's blob files by `connections` threads of its own, so the dump
// neither waits for the store nor holds memory for it. finish() sends the rest, the seal, and
// the manifest last: a reader never sees a manifest whose blobs are not all there.
// Nothing in the store changes before finish(): parts are invisible until their upload is
// completed. Replacing a checkpoint then removes its manifest first (the prefix holds no
// checkpoint until the new one is complete), and afterwards the old blobs the new one lacks.
// Two writers of one prefix would each overwrite the other's blobs and manifest, and both
// report success: an upload first claims the prefix (an object of its own under
// PREFIX/.gpuckpt-writers/, then a listing that must show no other writer's), holds it until
// its manifest is in, and writes that manifest only where none is (If-None-Match), reading it
// back before it counts as durable.
class Upload : public image::BlobTap {
 public:
  // Error(kExists) if another writer holds the prefix (a claim of a gpuckpt that died on this
  // host is taken over), or if `url` already holds a checkpoint and !replace.
  Upload(const S3Client& s3, const S3Url& url, bool replace, const TransferOptions& o = {});
  ~Upload() override;  // unfinished: stops the threads, aborts its multipart uploads
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;

  // Throw Error(kIo) once an upload has failed: the dump fails early, and its process resumes.
  void blob_created(std::uint32_t blob, const std::filesystem::path& path) override;
  void blob_written(std::uint32_t blob, std::uint64_t end) override;
  // The checkpoint is published at `dir` (the blobs whole, if nothing fed this): its last
  // parts, then the seal, then the manifest. Rethrows the first error.
  TransferStats finish(const std::filesystem::path& dir);
  // When the first request went out (valid after finish()).
  std::chrono::steady_clock::time_point first_request() const { return first_; }

 private:
  struct Parts {
    std::uint64_t queued = 0;  // bytes [0, queued) have a task
    std::string upload_id;     // once created (a create task precedes the first part)
    bool creating = false, completed = false;
    std::vector<std::string> etags;
  };
  using Blob = image::TappedBlobs<Parts>::Blob;
  struct Task {
    std::size_t blob;
    unsigned part;  // 0: the whole blob in one PUT
    std::uint64_t offset, len;
  };
  void claim_prefix();
  void release_claim() noexcept;
  void queue_parts(std::size_t blob, bool last);
  void work();
  void check() const;
  S3Client s3_;
  S3Url url_;
  TransferOptions o_;
  std::uint64_t part_ = 0;
  bool replace_ = false;
  std::shared_ptr<PrefixClaim> claim_;         // this upload's claim on the prefix
  std::unique_ptr<OnInterrupt> on_interrupt_;  // releases it if gpuckpt is interrupted
  std::set<std::string> old_blobs_;
  TransferStats st_;
  std::mutex mu_;
  std::condition_variable cv_;
  image::TappedBlobs<Parts> blobs_;
  std::deque<Task> tasks_;
  unsigned busy_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::string why_;
  std::chrono::steady_clock::time_point first_{};
  std::function<void(std::uint64_t)> uploaded_;  // progress, once finish() knows the total
  std::vector<std::thread> threads_;
};

// Downloads manifest.json and manifest.seal of `url` into the existing directory `dir`
// (mode 0600 files): enough for inspect and signature checks.
TransferStats download_manifest(const S3Client& s3, const S3Url& url,
                                const std::filesystem::path& dir);

// Downloads the whole checkpoint into the existing, empty directory `dir`: the manifest, read
// and checked first (its seal, its format), then every blob it lists, in parallel ranges.
TransferStats download_checkpoint(const S3Client& s3, const S3Url& url,
                                  const std::filesystem::path& dir, const TransferOptions& o = {});

// The same, read while it arrives (a restore from s3://): the constructor fetches and checks the
// manifest and creates every blob at its full size; start() fetches the blobs on threads of
// their own (what a restore reads first, first: image/arrival.h), and arrival() tells which
// bytes are in.
class Download {
 public:
  Download(const S3Client& s3, const S3Url& url, const std::filesystem::path& dir,
           const TransferOptions& o = {});
  ~Download();  // cancels and waits
  Download(const Download&) = delete;
  Download& operator=(const Download&) = delete;
  void start();
  const image::BlobArrival& arrival() const { return *arrival_; }
  // Stops taking more ranges, and those in flight within about a second: a restore that failed
  // needs no more bytes.
  void cancel() { cancelled_ = true; }
  // Waits for the last range; rethrows the first error.
  TransferStats join();
  // When the last byte arrived (valid after join()).
  std::chrono::steady_clock::time_point ended() const { return ended_; }

 private:
  struct Range {
    std::size_t blob;
    std::uint64_t offset, len;
  };
  void run();
  S3Client s3_;
  S3Url url_;
  TransferOptions o_;
  std::chrono::steady_clock::time_point t0_;
  TransferStats st_;
  image::Manifest m_;
  std::vector<UniqueFd> fds_;
  std::vector<Range> ranges_;
  std::uint64_t total_ = 0;
  std::unique_ptr<image::BlobArrival> arrival_;
  std::atomic<bool> cancelled_{false};
  std::chrono::steady_clock::time_point ended_{};
  std::exception_ptr error_;
  std::thread thread_;
};

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
