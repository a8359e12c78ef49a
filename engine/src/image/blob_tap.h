// Watches a StreamPacker's blobs fill, for a copy of the checkpoint made while it is written:
// the transfer of `migrate --to ssh://` runs beside the dump (remote/ssh.h) and reads the
// written bytes back from the blob files.
#pragma once

#include <fcntl.h>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <string>

#include "gpuckpt/error.h"
#include "image/manifest.h"
#include "util/unique_fd.h"

namespace gpuckpt::image {

class BlobTap {
 public:
  virtual ~BlobTap() = default;
  // Both on the packer's writer thread; neither may block for long (the writer, and CRIU
  // behind it, would wait). A throw fails the checkpoint as a failed disk write does.
  //
  // Blob number `blob` was created at `path`, in the packer's temporary directory (renamed with
  // it when the checkpoint is published: a descriptor opened now stays valid).
  virtual void blob_created(std::uint32_t blob, const std::filesystem::path& path) = 0;
  // Bytes [0, end) of `blob` are written and readable; the gaps between chunks are zeros.
  virtual void blob_written(std::uint32_t blob, std::uint64_t end) = 0;
};

// What a BlobTap has been told, for a copy that reads the written bytes back from the blob
// files: each blob's descriptor, name and written prefix, plus the copy's own `Extra` state.
// Not locked: the copy holds its own lock around every call. A deque, so that a reference to
// a blob stays valid while a later one is added.
template <class Extra>
class TappedBlobs {
 public:
  struct Blob : Extra {
    UniqueFd fd;
    std::string name;
    std::uint64_t written = 0;  // bytes [0, written) are on the disk
  };

  void created(std::uint32_t i, const std::filesystem::path& path) {
    Blob& b = at_least(i);
    b.fd = open_blob(path);
    b.name = path.filename().string();
  }
  void written(std::uint32_t i, std::uint64_t end) {
    Blob& b = blobs_.at(i);
    if (end > b.written) b.written = end;
  }
  // The checkpoint is published at `dir` with manifest `m`: a blob no tap call told of (all of
  // them after a staged dump, which packs after CRIU) is opened there, and every blob is
  // written in full. Error(kInternal) if what was told disagrees with the manifest.
  void published(const std::filesystem::path& dir, const Manifest& m) {
    if (!blobs_.empty() && blobs_.size() != m.blobs.size())
      throw Error(Errc::kInternal, "the checkpoint has " + std::to_string(m.blobs.size()) +
                                       " blobs, but " + std::to_string(blobs_.size()) +
                                       " were written");
    for (std::size_t i = 0; i < m.blobs.size(); ++i) {
      Blob& b = at_least(i);
      if (!b.fd) {
        b.fd = open_blob(dir / m.blobs[i].name);
        b.name = m.blobs[i].name;
      }
      if (b.name != m.blobs[i].name || b.written > m.blobs[i].size)
        throw Error(Errc::kInternal, "blob " + b.name + " was not written as its manifest says");
      b.written = m.blobs[i].size;
    }
  }
  std::size_t size() const { return blobs_.size(); }
  Blob& operator[](std::size_t i) { return blobs_[i]; }
  const Blob& operator[](std::size_t i) const { return blobs_[i]; }

 private:
  Blob& at_least(std::size_t i) {
    if (blobs_.size() <= i) blobs_.resize(i + 1);
    return blobs_[i];
  }
  static UniqueFd open_blob(const std::filesystem::path& p) {
    UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd) throw_errno(Errc::kIo, "open ", p, " to copy it");
    return fd;
  }
  std::deque<Blob> blobs_;
};

}  // namespace gpuckpt::image
