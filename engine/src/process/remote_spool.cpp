#include "process/remote_spool.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/support.h"
#include "process/support.h"

namespace fs = std::filesystem;

namespace gpuckpt::process {

RemoteSpool::RemoteSpool(const fs::path& where, const fs::path& spool_root, const char* prefix,
                         Guard& guard)
    :  // The staging helper sweeps the spools that a SIGKILL of both gpuckpt and its guard
       // left behind.
      spool_(make_staging(remote::spool_root(spool_root), prefix)) {
  guard.remove_on_recovery(spool_.path());
  if (::chmod(spool_.path().c_str(), 0700) != 0) throw_errno(Errc::kIo, "chmod ", spool_.path());
  local_ = spool_.path() / "checkpoint";
  if (where != "-") {
    url_ = remote::parse_s3_url(where.string());
    s3_.emplace(remote::S3Config::from_environment());
  }
}

std::optional<RemoteSpool> RemoteSpool::for_dump(const fs::path& where, const fs::path& spool_root,
                                                 bool replace, Guard& guard) {
  if (!remote::is_s3_url(where.string())) return std::nullopt;
  std::optional<RemoteSpool> s(RemoteSpool(where, spool_root, "gpuckpt-dump-spool", guard));
  s->replace_ = replace;
  return s;
}

std::optional<RemoteSpool> RemoteSpool::for_restore(const fs::path& where,
                                                    const fs::path& spool_root, Guard& guard) {
  if (!remote::is_s3_url(where.string()) && where != "-") return std::nullopt;
  std::optional<RemoteSpool> s(RemoteSpool(where, spool_root, "gpuckpt-restore-spool", guard));
  if (::mkdir(s->local_.c_str(), 0700) != 0) throw_errno(Errc::kIo, "mkdir ", s->local_);
  return s;
}

remote::Upload& RemoteSpool::start_upload(const ProgressFn& progress) {
  remote::TransferOptions o;
  o.progress = progress;
  upload_ = std::make_unique<remote::Upload>(*s3_, *url_, replace_, o);
  return *upload_;
}

void RemoteSpool::finish_upload(Timeline& tl) {
  const remote::TransferStats st = upload_->finish(local_);
  tl.add(stage::kUpload, upload_->first_request(), Timeline::Clock::now(), st.bytes);
  spdlog::info("uploaded {} in {} objects to {} in {} ({} connections)", st.bytes, st.objects,
               url_->str(), format_seconds(st.seconds), st.connections);
  upload_.reset();
}

std::unique_ptr<remote::Download> RemoteSpool::start_download() const {
  auto d = std::make_unique<remote::Download>(*s3_, *url_, local_);
  d->start();
  return d;
}

}  // namespace gpuckpt::process
