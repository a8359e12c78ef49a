// The blob files of a checkpoint being written: chunks appended to blob-NNNNNN.bin in order,
// each at a 4 KiB-aligned offset with zero padding between chunks (O_DIRECT writes whole
// aligned blocks, and the padding must not depend on what a buffer held before), a new blob
// once the current one would pass its size bound. pack (through the pipeline's SinkIo) and
// the stream packer (through its own AsyncIo) submit the writes; this owns the layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "image/manifest.h"
#include "util/unique_fd.h"

namespace gpuckpt::image {

class BlobFiles {
 public:
  // Blobs go in `dir`, opened with O_DIRECT when `direct` and the file system allows it; a blob
  // takes another chunk only while it stays within `max_blob` bytes (its first always fits).
  BlobFiles(std::filesystem::path dir, bool direct, std::uint64_t max_blob);

  // Where a write of one chunk goes.
  struct Place {
    std::uint32_t blob = 0;
    std::uint64_t offset = 0;  // aligned
    std::uint32_t padded = 0;  // the write's length: the chunk and its zero padding
    int fd = -1;
  };

  // Whether a chunk of `len` bytes starts a new blob: none is open, or the open one would pass
  // its bound. A caller that finalizes blobs as it goes closes the open one first.
  bool starts_new(std::uint32_t len) const;
  // Lays a chunk of `len` bytes at the next aligned offset, opening a new blob when
  // starts_new(len). Zero-fills `buf[len, padded)`: `buf` must have room up to the next
  // alignment (AlignedBuffer's sizes do). Error(kIo) if a blob cannot be created.
  Place append(std::byte* buf, std::uint32_t len);

  // Cuts blob `index` to its real end (its last chunk was written padded). Error(kIo).
  void truncate(std::uint32_t index);
  // fsync(2) of blob `index`, for a caller that syncs outside its I/O queue. Error(kIo).
  void sync(std::uint32_t index);
  // Closes blob `index`'s descriptor (after its writes and its sync have completed).
  void close(std::uint32_t index) { blobs_.at(index).fd.reset(); }

  int fd(std::uint32_t index) const { return blobs_.at(index).fd.get(); }
  std::filesystem::path path(std::uint32_t index) const { return dir_ / blob_name(index); }
  std::uint32_t count() const { return static_cast<std::uint32_t>(blobs_.size()); }
  // The current blob's index (count() - 1); only while count() > 0.
  std::uint32_t current() const { return count() - 1; }
  // End of blob `index`'s real bytes, as the manifest records it.
  std::uint64_t end(std::uint32_t index) const { return blobs_.at(index).end; }
  // Every blob, as the manifest lists them.
  std::vector<BlobRecord> records() const;
  // Whether any blob was opened with O_DIRECT.
  bool direct_used() const { return direct_used_; }

 private:
  struct Blob {
    UniqueFd fd;
    std::uint64_t pos = 0;  // next aligned write offset
    std::uint64_t end = 0;  // end of the last chunk's real bytes
  };

  std::filesystem::path dir_;
  bool direct_;
  std::uint64_t max_blob_;
  bool direct_used_ = false;
  std::vector<Blob> blobs_;
};

}  // namespace gpuckpt::image
