// Watches a StreamPacker's blobs fill, for a copy of the checkpoint made while it is written:
// the transfer of `migrate --to ssh://` runs beside the dump (remote/ssh.h) and reads the
// written bytes back from the blob files.
#pragma once

#include <cstdint>
#include <filesystem>

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

}  // namespace gpuckpt::image
