#include "image/async_io.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "gpuckpt/error.h"

namespace gpuckpt::image {

namespace {

bool has_odirect(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_DIRECT);
}

void warn_once(std::atomic<bool>& flag, const char* fmt, int err) {
  if (!flag.exchange(true)) spdlog::warn(fmt::runtime(fmt), std::strerror(err));
}

std::atomic<bool> g_warned_uring{false};
std::atomic<bool> g_warned_register{false};

}  // namespace

AsyncIo::AsyncIo(const Config& cfg) : ops_(cfg.depth ? cfg.depth : 1) {
  free_ids_.reserve(ops_.size());
  for (unsigned i = static_cast<unsigned>(ops_.size()); i-- > 0;) free_ids_.push_back(i);
  if (!cfg.allow_uring) return;
  int rc = ::io_uring_queue_init(static_cast<unsigned>(ops_.size()), &ring_, 0);
  if (rc < 0) {
    warn_once(g_warned_uring, "io_uring unavailable ({}); using pread/pwrite", -rc);
    return;
  }
  uring_ = true;
  if (!cfg.buffers.empty()) {
    rc = ::io_uring_register_buffers(&ring_, cfg.buffers.data(),
                                     static_cast<unsigned>(cfg.buffers.size()));
    if (rc == 0) {
      fixed_ = true;
    } else {
      // Typically RLIMIT_MEMLOCK for unprivileged users; unregistered I/O still works, a
      // little slower, so this is not worth a warning on every run.
      if (!g_warned_register.exchange(true))
        spdlog::debug("io_uring buffer registration failed ({}); continuing without",
                      std::strerror(-rc));
    }
  }
  if (cfg.notify) {
    rc = ::io_uring_register_eventfd(&ring_, cfg.notify->fd());
    if (rc < 0) {
      ::io_uring_queue_exit(&ring_);
      throw_syserr(Errc::kInternal, -rc, "io_uring_register_eventfd");
    }
  }
}

AsyncIo::~AsyncIo() {
  if (!uring_) return;
  draining_ = true;
  std::vector<IoResult> discard;
  if (unsubmitted_) ::io_uring_submit(&ring_);
  while (inflight_ > 0) {
    io_uring_cqe* cqe = nullptr;
    const int rc = ::io_uring_wait_cqe(&ring_, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) break;  // cannot happen with a valid ring; do not spin
    handle_cqe(cqe, discard);
  }
  ::io_uring_queue_exit(&ring_);
}

void AsyncIo::submit(const IoRequest& r) {
  if (free_ids_.empty()) throw Error(Errc::kInternal, "AsyncIo::submit on a full queue");
  const unsigned id = free_ids_.back();
  free_ids_.pop_back();
  Op& op = ops_[id];
  op = Op{r, 0, true, false};
  if (op.req.min_len == 0 || op.req.min_len > op.req.len) op.req.min_len = op.req.len;
  ++inflight_;
  if (uring_) {
    queue_sqe(id);
    return;
  }
  // Synchronous fallback: run to completion now; reap() hands the result out.
  for (;;) {
    if (on_result(id, run_sync(op), sync_done_) == Step::kDone) break;
  }
}

std::int64_t AsyncIo::run_sync(const Op& op) {
  const IoRequest& r = op.req;
  ssize_t n = 0;
  switch (r.kind) {
    case IoRequest::Kind::kRead:
      n = ::pread(r.fd, r.buf + op.done, r.len - op.done, static_cast<off_t>(r.offset + op.done));
      break;
    case IoRequest::Kind::kWrite:
      n = ::pwrite(r.fd, r.buf + op.done, r.len - op.done, static_cast<off_t>(r.offset + op.done));
      break;
    case IoRequest::Kind::kFsync:
      n = ::fsync(r.fd);
      break;
  }
  return n < 0 ? -errno : n;
}

void AsyncIo::queue_sqe(unsigned id) {
  Op& op = ops_[id];
  io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_);
  if (!sqe) {  // the SQ holds at least `depth` entries and each op has at most one queued
    ::io_uring_submit(&ring_);
    unsubmitted_ = 0;
    sqe = ::io_uring_get_sqe(&ring_);
    if (!sqe) throw Error(Errc::kInternal, "io_uring submission queue full");
  }
  const IoRequest& r = op.req;
  std::byte* buf = r.buf + op.done;
  const unsigned len = static_cast<unsigned>(r.len - op.done);
  const __u64 off = r.offset + op.done;
  const bool fixed = fixed_ && r.buf_index >= 0;
  switch (r.kind) {
    case IoRequest::Kind::kRead:
      if (fixed)
        ::io_uring_prep_read_fixed(sqe, r.fd, buf, len, off, r.buf_index);
      else
        ::io_uring_prep_read(sqe, r.fd, buf, len, off);
      break;
    case IoRequest::Kind::kWrite:
      if (fixed)
        ::io_uring_prep_write_fixed(sqe, r.fd, buf, len, off, r.buf_index);
      else
        ::io_uring_prep_write(sqe, r.fd, buf, len, off);
      break;
    case IoRequest::Kind::kFsync:
      ::io_uring_prep_fsync(sqe, r.fd, 0);
      break;
  }
  ::io_uring_sqe_set_data64(sqe, id);
  ++unsubmitted_;
}

void AsyncIo::flush() {
  if (!uring_ || unsubmitted_ == 0) return;
  for (;;) {
    const int rc = ::io_uring_submit(&ring_);
    if (rc >= 0) break;
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
    throw_syserr(Errc::kIo, -rc, "io_uring_submit");
  }
  unsubmitted_ = 0;
}

AsyncIo::Step AsyncIo::on_result(unsigned id, std::int64_t res, std::vector<IoResult>& out) {
  Op& op = ops_[id];
  auto finish = [&](std::int64_t r) {
    out.push_back({op.req, r});
    op.busy = false;
    free_ids_.push_back(id);
    --inflight_;
    return Step::kDone;
  };
  if (draining_) return finish(res < 0 ? res : static_cast<std::int64_t>(op.done + res));
  if (res == -EINTR || res == -EAGAIN) return Step::kAgain;
  if (res == -EINVAL && !op.direct_retried && op.req.kind != IoRequest::Kind::kFsync &&
      has_odirect(op.req.fd)) {
    // Accepted at open(), refused for this transfer: continue on the page cache.
    op.direct_retried = true;
    const int fl = ::fcntl(op.req.fd, F_GETFL);
    if (fl >= 0 && ::fcntl(op.req.fd, F_SETFL, fl & ~O_DIRECT) == 0) {
      spdlog::debug("O_DIRECT refused on fd {}; continuing buffered", op.req.fd);
      return Step::kAgain;
    }
  }
  if (res < 0) return finish(res);
  if (op.req.kind == IoRequest::Kind::kFsync) return finish(0);
  if (res == 0) {
    // End of file for a read; a write that makes no progress would loop forever.
    return finish(op.req.kind == IoRequest::Kind::kRead ? static_cast<std::int64_t>(op.done)
                                                        : -EIO);
  }
  op.done += static_cast<std::uint64_t>(res);
  const std::uint64_t need = op.req.kind == IoRequest::Kind::kRead ? op.req.min_len : op.req.len;
  if (op.done < need) return Step::kAgain;
  return finish(static_cast<std::int64_t>(op.done));
}

void AsyncIo::handle_cqe(io_uring_cqe* cqe, std::vector<IoResult>& out) {
  const auto id = static_cast<unsigned>(::io_uring_cqe_get_data64(cqe));
  const std::int64_t res = cqe->res;
  ::io_uring_cqe_seen(&ring_, cqe);
  if (id >= ops_.size() || !ops_[id].busy) return;
  if (on_result(id, res, out) == Step::kAgain) queue_sqe(id);
}

void AsyncIo::reap(bool wait, std::vector<IoResult>& out) {
  if (!uring_) {
    out.insert(out.end(), sync_done_.begin(), sync_done_.end());
    sync_done_.clear();
    return;
  }
  io_uring_cqe* cqe = nullptr;
  if (wait && inflight_ > 0) {
    flush();
    for (;;) {
      const int rc = ::io_uring_wait_cqe(&ring_, &cqe);
      if (rc == 0) break;
      if (rc != -EINTR) throw_syserr(Errc::kIo, -rc, "io_uring_wait_cqe");
    }
  }
  while (::io_uring_peek_cqe(&ring_, &cqe) == 0) handle_cqe(cqe, out);
  flush();  // continuations queued by handle_cqe
}

void AsyncIo::drain(std::vector<IoResult>& out) {
  flush();
  while (inflight_ > 0) reap(true, out);
  reap(false, out);
}

}  // namespace gpuckpt::image
