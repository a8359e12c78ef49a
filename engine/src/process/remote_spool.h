// dump to and restore from s3:// (remote/remote_checkpoint.h): the checkpoint passes through
// a spool directory that the guard removes on recovery, and the move to or from the object
// store is one stage of the operation's timeline ("upload", "download").
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "gpuckpt/progress.h"
#include "gpuckpt/timing.h"
#include "process/guard.h"
#include "remote/remote_checkpoint.h"
#include "remote/s3.h"
#include "remote/ssh.h"
#include "util/fs.h"

namespace gpuckpt::process {

class RemoteSpool {
 public:
  // nullopt unless `where` is an s3:// URL. Reads the S3 configuration before anything is
  // frozen. The spool is made under `spool_root` (or $TMPDIR, /var/tmp) and handed to the
  // guard.
  static std::optional<RemoteSpool> for_dump(const std::filesystem::path& where,
                                             const std::filesystem::path& spool_root, bool replace,
                                             Guard& guard);
  // Also for "-": a checkpoint stream on stdin (remote/ssh.h).
  static std::optional<RemoteSpool> for_restore(const std::filesystem::path& where,
                                                const std::filesystem::path& spool_root,
                                                Guard& guard);

  // Where the local checkpoint is written to (dump) or downloaded to (restore).
  const std::filesystem::path& local() const { return local_; }
  // A dump: the upload, started before anything is frozen (its check that the URL holds no
  // checkpoint, unless replacing, is done here) and fed while the checkpoint is written.
  remote::Upload& start_upload(const ProgressFn& progress);
  // Its rest, once the checkpoint is published: the "upload" stage, from its first request.
  void finish_upload(Timeline& tl);
  // s3:// only ("-" is received by restore() itself): the manifest now, the blobs on threads
  // of their own, for a restore that reads them as they arrive.
  std::unique_ptr<remote::Download> start_download() const;

 private:
  RemoteSpool(const std::filesystem::path& where, const std::filesystem::path& spool_root,
              const char* prefix, Guard& guard);
  std::optional<remote::S3Url> url_;  // nullopt: a stream on stdin
  std::optional<remote::S3Client> s3_;
  TempDir spool_;
  std::filesystem::path local_;
  bool replace_ = false;
  std::unique_ptr<remote::Upload> upload_;
};

}  // namespace gpuckpt::process
