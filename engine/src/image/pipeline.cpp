#include "image/pipeline.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "image/aligned_buffer.h"
#include "image/channel.h"
#include "image/event_fd.h"
#include "util/unique_fd.h"

namespace gpuckpt::image {

using Clock = std::chrono::steady_clock;

bool io_uring_allowed() {
  const char* v = std::getenv("GPUCKPT_IO_URING");
  return !(v && std::strcmp(v, "0") == 0);
}

int open_maybe_direct(const std::filesystem::path& path, int flags, mode_t mode, bool direct,
                      bool* direct_used) {
  *direct_used = false;
  if (direct) {
    const int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, mode);
    if (fd >= 0) {
      *direct_used = true;
      return fd;
    }
    // EINVAL: the filesystem has no O_DIRECT (e.g. older tmpfs); anything else is real.
    if (errno != EINVAL) return -1;
  }
  return ::open(path.c_str(), flags | O_CLOEXEC, mode);
}

bool skip_compression(std::size_t waiting_for_workers, unsigned workers, unsigned busy_others,
                      std::size_t unwritten) {
  workers = std::max(1u, workers);
  return busy_others + 1 >= workers && waiting_for_workers > workers &&
         unwritten <= std::min(workers + 1, kMostUnwrittenForRaw);
}

class PipelineRun {
 public:
  PipelineRun(const PipelineConfig& cfg, const std::vector<ReadSource>& sources,
              const std::vector<ReadRange>& ranges, const WorkerFactory& make_worker,
              ChunkSink& sink)
      : cfg_(cfg),
        sources_(sources),
        ranges_(ranges),
        make_worker_(make_worker),
        sink_(sink),
        free_(&reader_efd_),
        done_(&sink_efd_) {
    const unsigned n = std::max(1u, cfg.slots);
    buffers_.reserve(2 * n);
    slots_.resize(n);
    for (unsigned i = 0; i < n; ++i) {
      buffers_.emplace_back(cfg.buffer_bytes);
      buffers_.emplace_back(cfg.buffer_bytes);
      slots_[i].id = i;
      slots_[i].in = buffers_[2 * i].data();
      slots_[i].out = buffers_[2 * i + 1].data();
      slots_[i].capacity = buffers_[2 * i].size();
      free_.push(i);
    }
    for (const auto& b : buffers_) iovecs_.push_back({b.data(), b.size()});
  }

  PipelineStats run() {
    stats_.start = Clock::now();
    {
      std::vector<std::jthread> threads;
      try {
        threads.emplace_back([this] { guarded([this] { reader_main(); }); });
        // A worker without a slot would only wait.
        workers_ = std::clamp(cfg_.workers, 1u, std::max(1u, cfg_.slots));
        for (unsigned i = 0; i < workers_; ++i)
          threads.emplace_back([this] { guarded([this] { worker_main(); }); });
        threads.emplace_back([this] { guarded([this] { sink_main(); }); });
      } catch (...) {
        fail(std::current_exception());  // unblock the threads already started, then join
      }
    }
    stats_.end = Clock::now();
    if (error_) std::rethrow_exception(error_);
    return stats_;
  }

 private:
  friend class SinkIo;

  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      fail(std::current_exception());
    }
  }

  void fail(std::exception_ptr e) {
    {
      std::lock_guard lock(mu_);
      if (!error_) error_ = e;
    }
    failed_ = true;
    free_.cancel();
    work_.cancel();
    done_.cancel();
    reader_efd_.notify();
    sink_efd_.notify();
  }

  AsyncIo::Config io_config(EventFd* efd) const {
    return {cfg_.queue_depth, iovecs_, efd, io_uring_allowed()};
  }

  // --- reader -----------------------------------------------------------------------------

  struct SourceState {
    UniqueFd fd;
    bool direct = false;
    std::uint64_t remaining = 0;  // ranges not yet read
  };

  void reader_main() {
    AsyncIo io(io_config(&reader_efd_));
    {
      std::lock_guard lock(mu_);
      stats_.uring = io.uring();
      stats_.fixed_buffers = io.fixed_buffers();
    }
    std::vector<SourceState> st(sources_.size());
    for (const auto& r : ranges_) st.at(r.source).remaining++;
    std::vector<IoResult> done;
    std::size_t next = 0;
    while (!failed_) {
      bool progress = false;
      done.clear();
      io.reap(false, done);
      for (const auto& r : done) {
        read_done(r, st);
        progress = true;
      }
      while (next < ranges_.size() && !io.full()) {
        auto id = free_.try_pop();
        if (!id) break;
        if (cfg_.await_range) cfg_.await_range(ranges_[next]);
        if (next == 0) stats_.read_first = Clock::now();
        submit_read(io, st, next, slots_[*id]);
        ++next;
        progress = true;
      }
      io.flush();
      if (next == ranges_.size() && io.inflight() == 0) {
        done.clear();
        io.reap(false, done);  // the synchronous fallback completes inside submit
        for (const auto& r : done) read_done(r, st);
        if (io.inflight() == 0 && done.empty()) break;
        continue;
      }
      if (!progress) reader_efd_.wait();
    }
    work_.close();
  }

  void submit_read(AsyncIo& io, std::vector<SourceState>& st, std::size_t seq, Slot& s) {
    const ReadRange& rg = ranges_[seq];
    SourceState& ss = st[rg.source];
    const ReadSource& src = sources_[rg.source];
    if (!ss.fd) {
      bool direct = false;
      ss.fd.reset(open_maybe_direct(src.path, O_RDONLY, 0, src.direct, &direct));
      if (!ss.fd) throw_errno(Errc::kIo, "open ", src.what);
      ss.direct = direct;
      if (direct) stats_.direct_reads = true;
    }
    s.seq = seq;
    s.pending = 0;
    s.data = nullptr;
    s.data_len = 0;
    s.data_index = -1;
    std::uint64_t start = rg.offset, end = rg.offset + rg.length;
    if (ss.direct) {
      start = align_down(start);
      end = align_up(end);
    }
    if (end - start > s.capacity)
      throw Error(Errc::kInternal, "read range larger than the chunk buffer");
    s.in_off = static_cast<std::uint32_t>(rg.offset - start);
    s.in_len = rg.length;
    IoRequest req;
    req.kind = IoRequest::Kind::kRead;
    req.fd = ss.fd.get();
    req.buf = s.in;
    req.len = static_cast<std::uint32_t>(end - start);
    req.min_len = s.in_off + rg.length;
    req.offset = start;
    req.buf_index = s.in_index();
    req.slot = static_cast<int>(s.id);
    req.tag = seq;
    io.submit(req);
  }

  void read_done(const IoResult& r, std::vector<SourceState>& st) {
    const ReadRange& rg = ranges_[r.req.tag];
    const ReadSource& src = sources_[rg.source];
    if (r.res < 0) throw_syserr(Errc::kIo, -r.res, "read ", src.what);
    if (r.res < r.req.min_len) {
      throw Error(cfg_.short_read_errc,
                  src.what + " ends early: bytes up to offset " +
                      std::to_string(rg.offset + rg.length) + " were expected, it ends at " +
                      std::to_string(r.req.offset + static_cast<std::uint64_t>(r.res)));
    }
    stats_.read_last = Clock::now();
    stats_.bytes_read += rg.length;
    SourceState& ss = st[rg.source];
    if (--ss.remaining == 0) ss.fd.reset();
    work_.push(static_cast<unsigned>(r.req.slot));
  }

  // --- workers ----------------------------------------------------------------------------

  void worker_main() {
    std::unique_ptr<ChunkWorker> w = make_worker_();
    Clock::time_point first{}, last{};
    Clock::duration busy{};
    while (auto id = work_.pop()) {
      if (failed_) break;
      const auto t0 = Clock::now();
      Slot& s = slots_[*id];
      const unsigned busy_others = busy_.fetch_add(1);
      s.workers_behind = skip_compression(work_.size() + 1, workers_, busy_others, unsunk_.load());
      w->process(s);
      --busy_;
      const auto t1 = Clock::now();
      if (first == Clock::time_point{}) first = t0;
      last = t1;
      busy += t1 - t0;
      ++unsunk_;  // before the sink can release it
      done_.push(*id);
    }
    std::lock_guard lock(mu_);
    stats_.worker_busy_seconds += std::chrono::duration<double>(busy).count();
    if (first != Clock::time_point{} &&
        (stats_.work_first == Clock::time_point{} || first < stats_.work_first))
      stats_.work_first = first;
    stats_.work_last = std::max(stats_.work_last, last);
  }

  // --- sink -------------------------------------------------------------------------------

  void release(Slot& s) {
    --unsunk_;
    free_.push(s.id);
  }

  void io_done(const IoResult& r) {
    if (r.req.slot < 0) return;
    Slot& s = slots_[r.req.slot];
    if (--s.pending == 0 && !s.consuming) release(s);
  }

  void sink_main() {
    AsyncIo io(io_config(&sink_efd_));
    SinkIo sio(io, sink_, *this);
    const std::size_t n = slots_.size();
    std::vector<int> window(n, -1);  // unconsumed sequence numbers span fewer than n
    std::uint64_t next = 0, done_bytes = 0;
    Clock::time_point last_report{};
    while (!failed_) {
      bool progress = false;
      io.reap(false, sio.completed_);
      if (!sio.completed_.empty()) {
        sio.dispatch();
        progress = true;
      }
      while (auto id = done_.try_pop()) {
        window[slots_[*id].seq % n] = static_cast<int>(*id);
        progress = true;
      }
      while (next < ranges_.size()) {
        const int id = window[next % n];
        if (id < 0 || slots_[id].seq != next) break;
        window[next % n] = -1;
        Slot& s = slots_[id];
        if (next == 0) stats_.sink_first = Clock::now();
        s.consuming = true;
        done_bytes += sink_.consume(s, sio);
        s.consuming = false;
        if (s.pending == 0) release(s);
        ++next;
        progress = true;
        const auto now = Clock::now();
        if (cfg_.progress && now - last_report >= std::chrono::milliseconds(100)) {
          last_report = now;
          report(done_bytes, now);
        }
      }
      io.flush();
      if (next == ranges_.size() && io.inflight() == 0 && sio.completed_.empty()) {
        io.reap(false, sio.completed_);  // the synchronous fallback completes inside submit
        if (sio.completed_.empty()) break;
        continue;
      }
      if (!progress) sink_efd_.wait();
    }
    if (failed_) return;
    stats_.sink_last = Clock::now();  // every chunk's I/O has completed
    sio.drain();
    sink_.finish(sio);
    sio.drain();
    if (cfg_.progress) report(done_bytes, Clock::now());
  }

  void report(std::uint64_t done_bytes, Clock::time_point now) {
    Progress p;
    p.phase = cfg_.phase;
    p.done_bytes = done_bytes;
    p.total_bytes = cfg_.total_bytes;
    p.elapsed_seconds = std::chrono::duration<double>(now - stats_.start).count();
    cfg_.progress(p);
  }

  const PipelineConfig& cfg_;
  const std::vector<ReadSource>& sources_;
  const std::vector<ReadRange>& ranges_;
  const WorkerFactory& make_worker_;
  ChunkSink& sink_;

  std::vector<AlignedBuffer> buffers_;
  std::vector<iovec> iovecs_;
  std::vector<Slot> slots_;
  EventFd reader_efd_, sink_efd_;
  Channel<unsigned> free_;  // sink -> reader
  Channel<unsigned> work_;  // reader -> workers
  unsigned workers_ = 1;
  std::atomic<unsigned> unsunk_{0};  // slots the workers finished that the sink has not released
  std::atomic<unsigned> busy_{0};    // workers inside ChunkWorker::process
  Channel<unsigned> done_;           // workers -> sink

  std::mutex mu_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  PipelineStats stats_;
};

void SinkIo::submit(IoRequest r) {
  while (io_.full()) io_.reap(true, completed_);
  if (r.slot >= 0) run_.slots_[r.slot].pending++;
  io_.submit(r);
}

void SinkIo::hold(Slot& s) {
  s.pending++;
}

void SinkIo::release(unsigned slot) {
  Slot& s = run_.slots_.at(slot);
  if (--s.pending == 0 && !s.consuming) run_.release(s);
}

void SinkIo::dispatch() {
  while (!completed_.empty()) {
    std::vector<IoResult> batch;
    batch.swap(completed_);
    for (const auto& r : batch) {
      sink_.on_complete(r, *this);
      run_.io_done(r);
    }
  }
}

void SinkIo::drain() {
  io_.flush();
  for (;;) {
    io_.reap(false, completed_);
    if (completed_.empty()) {
      if (io_.inflight() == 0) break;
      io_.reap(true, completed_);
      continue;
    }
    dispatch();
  }
}

PipelineStats run_pipeline(const PipelineConfig& cfg, const std::vector<ReadSource>& sources,
                           const std::vector<ReadRange>& ranges, const WorkerFactory& make_worker,
                           ChunkSink& sink) {
  PipelineRun run(cfg, sources, ranges, make_worker, sink);
  return run.run();
}

}  // namespace gpuckpt::image
