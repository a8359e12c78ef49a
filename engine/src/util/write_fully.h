// Writing a whole buffer to a descriptor: the one loop behind every pipe, socket and file write
// of gpuckpt that is not io_uring's.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gpuckpt {

// Writes all `n` bytes at `data` to `fd`, retrying after EINTR and short writes. `moved`, when
// given, grows by each write's bytes as they go (a stall detector sees partial progress).
// Returns 0, or the errno of the write that failed; a write that took no byte reports EIO.
// What an error means is the caller's: with SIGPIPE blocked (NoSigpipe), a reader that is gone
// comes back as EPIPE instead of killing gpuckpt.
int write_fully(int fd, const void* data, std::size_t n,
                std::atomic<std::uint64_t>* moved = nullptr);

// The same at `offset` of a file (pwrite): the descriptor's own offset is left alone, so threads
// may write ranges of one file at once. Returns 0 or the errno; EIO for a write of no byte.
int pwrite_fully(int fd, const void* data, std::size_t n, std::uint64_t offset);

}  // namespace gpuckpt
