// Page-aligned anonymous memory for chunk buffers: O_DIRECT needs aligned addresses and
// lengths, and io_uring registers (pins) these buffers once for the whole transfer.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "gpuckpt/error.h"

namespace gpuckpt::image {

// Alignment of chunk offsets in blobs, of O_DIRECT transfers and of buffers. 4 KiB covers
// every logical block size in use (512 B and 4 KiB).
inline constexpr std::uint64_t kIoAlign = 4096;

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a = kIoAlign) {
  return (v + a - 1) / a * a;
}
constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t a = kIoAlign) {
  return v / a * a;
}

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Plain 4 KiB pages on purpose: MADV_HUGEPAGE made io_uring's pinning cheaper but cost
  // 300 ms direct-compaction stalls on some runs (docs/PERFORMANCE.md).
  explicit AlignedBuffer(std::size_t size) : size_(align_up(size)) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw_errno(Errc::kIo, "allocate chunk buffer");
    data_ = static_cast<std::byte*>(p);
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { release(); }

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void release() {
    if (data_) ::munmap(data_, size_);
    data_ = nullptr;
  }
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gpuckpt::image
