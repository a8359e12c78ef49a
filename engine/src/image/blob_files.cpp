#include "image/blob_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "gpuckpt/error.h"
#include "image/aligned_buffer.h"
#include "image/pipeline.h"

namespace fs = std::filesystem;

namespace gpuckpt::image {

BlobFiles::BlobFiles(fs::path dir, bool direct, std::uint64_t max_blob)
    : dir_(std::move(dir)), direct_(direct), max_blob_(max_blob) {}

bool BlobFiles::starts_new(std::uint32_t len) const {
  if (blobs_.empty()) return true;
  const Blob& b = blobs_.back();
  return b.pos > 0 && b.pos + align_up(len) > max_blob_;
}

BlobFiles::Place BlobFiles::append(std::byte* buf, std::uint32_t len) {
  if (starts_new(len)) {
    const fs::path p = path(count());
    bool direct = false;
    Blob b;
    b.fd.reset(open_maybe_direct(p, O_WRONLY | O_CREAT | O_EXCL, 0600, direct_, &direct));
    if (!b.fd) throw_errno(Errc::kIo, "create ", p);
    // Whatever the umask: a checkpoint holds a process's memory.
    if (::fchmod(b.fd.get(), 0600) != 0) throw_errno(Errc::kIo, "chmod ", p);
    direct_used_ = direct_used_ || direct;
    blobs_.push_back(std::move(b));
  }
  Blob& b = blobs_.back();
  const auto padded = static_cast<std::uint32_t>(align_up(len));
  std::memset(buf + len, 0, padded - len);
  const Place at{current(), b.pos, padded, b.fd.get()};
  b.end = b.pos + len;
  b.pos += padded;
  return at;
}

void BlobFiles::truncate(std::uint32_t index) {
  if (::ftruncate(fd(index), static_cast<off_t>(end(index))) != 0)
    throw_errno(Errc::kIo, "truncate ", path(index));
}

void BlobFiles::sync(std::uint32_t index) {
  if (::fsync(fd(index)) != 0) throw_errno(Errc::kIo, "fsync ", path(index));
}

std::vector<BlobRecord> BlobFiles::records() const {
  std::vector<BlobRecord> out;
  out.reserve(blobs_.size());
  for (std::uint32_t i = 0; i < count(); ++i) out.push_back({blob_name(i), blobs_[i].end});
  return out;
}

}  // namespace gpuckpt::image
