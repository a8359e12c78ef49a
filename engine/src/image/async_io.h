// One thread's asynchronous file I/O: an io_uring with the pipeline's chunk buffers
// registered (read_fixed/write_fixed), or, where io_uring is unavailable (seccomp'd
// containers, old kernels), the same interface over synchronous pread/pwrite.
//
// Short transfers are continued internally, so a completion means "all of it" (reads may end
// early only at end of file). A request that fails with EINVAL on an O_DIRECT descriptor
// (a filesystem that accepts O_DIRECT at open but not for this I/O) is retried once with
// O_DIRECT cleared on that descriptor.
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "image/event_fd.h"

namespace gpuckpt::image {

struct IoRequest {
  enum class Kind : std::uint8_t { kRead, kWrite, kFsync };
  Kind kind = Kind::kRead;
  int fd = -1;
  std::byte* buf = nullptr;
  std::uint32_t len = 0;
  std::uint32_t min_len = 0;  // reads: bytes that must arrive unless EOF comes first (0 = len)
  std::uint64_t offset = 0;
  int buf_index = -1;     // registered buffer holding [buf, buf+len), -1 = none
  int slot = -1;          // pipeline bookkeeping: the chunk slot this request belongs to
  std::uint64_t tag = 0;  // the caller's
};

struct IoResult {
  IoRequest req;     // as submitted
  std::int64_t res;  // bytes transferred, or -errno
};

class AsyncIo {
 public:
  struct Config {
    unsigned depth = 16;
    std::span<const iovec> buffers;  // registered if the kernel allows it
    EventFd* notify = nullptr;       // signalled on every completion
    bool allow_uring = true;         // false: always use the synchronous fallback
  };
  explicit AsyncIo(const Config& cfg);
  AsyncIo(const AsyncIo&) = delete;
  AsyncIo& operator=(const AsyncIo&) = delete;
  // Waits for every in-flight request: the kernel may still be writing into our buffers.
  ~AsyncIo();

  bool uring() const { return uring_; }
  bool fixed_buffers() const { return fixed_; }
  unsigned inflight() const { return inflight_; }
  bool full() const { return inflight_ >= ops_.size(); }

  // Queues a request (precondition: !full()); it is sent to the kernel by flush().
  void submit(const IoRequest& r);
  void flush();
  // Appends finished requests to `out`; with `wait`, blocks until at least one event arrived
  // if requests are in flight (it may still return none when that event was a continuation).
  void reap(bool wait, std::vector<IoResult>& out);
  // Waits until no request is in flight, appending every completion to `out`.
  void drain(std::vector<IoResult>& out);

 private:
  struct Op {
    IoRequest req;
    std::uint64_t done = 0;
    bool busy = false;
    bool direct_retried = false;
  };
  enum class Step { kDone, kAgain };

  Step on_result(unsigned id, std::int64_t res, std::vector<IoResult>& out);
  void queue_sqe(unsigned id);
  std::int64_t run_sync(const Op& op);
  void handle_cqe(io_uring_cqe* cqe, std::vector<IoResult>& out);

  io_uring ring_{};
  bool uring_ = false;
  bool fixed_ = false;
  std::vector<Op> ops_;
  std::vector<unsigned> free_ids_;
  unsigned inflight_ = 0;
  unsigned unsubmitted_ = 0;
  bool draining_ = false;
  std::vector<IoResult> sync_done_;
};

}  // namespace gpuckpt::image
