// The streaming engine shared by pack, unpack and verify:
//
//   reader thread --work--> N worker threads --done--> sink thread
//        ^  (io_uring reads into free slots)              | (in sequence order; io_uring writes)
//        +------------------- free slots -----------------+
//
// Memory is bounded by a fixed set of slots (two aligned, registered buffers each); a slot
// returns to the reader only when the sink's I/O from it has completed, so peak memory does
// not depend on the amount of data. The sink sees chunks strictly in sequence order, which
// makes the output deterministic whatever the thread timing.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpuckpt/error.h"
#include "gpuckpt/progress.h"
#include "image/async_io.h"
#include "image/manifest.h"

namespace gpuckpt::image {

struct Slot {
  unsigned id = 0;
  std::byte* in = nullptr;   // registered buffer index in_index()
  std::byte* out = nullptr;  // registered buffer index out_index()
  std::size_t capacity = 0;  // of each buffer
  std::uint64_t seq = 0;     // position in the range list
  std::uint32_t in_off = 0;  // the range's bytes start at in + in_off (O_DIRECT alignment)
  std::uint32_t in_len = 0;
  // Set by the worker: the bytes the sink consumes, and what it learnt about them.
  std::byte* data = nullptr;
  std::uint32_t data_len = 0;
  int data_index = -1;  // registered buffer index of `data`
  Codec codec = Codec::kRaw;
  std::uint64_t hash = 0;
  // BLAKE2b-256 of `data`, when the job asks for it (signed checkpoints).
  std::array<unsigned char, 32> digest{};
  // Set by the pipeline before ChunkWorker::process: the workers are the bound and the sink would
  // run dry waiting for them (skip_compression).
  bool workers_behind = false;
  unsigned pending = 0;    // sink I/O outstanding (sink thread only)
  bool consuming = false;  // inside ChunkSink::consume (sink thread only)

  int in_index() const { return static_cast<int>(2 * id); }
  int out_index() const { return static_cast<int>(2 * id + 1); }
  std::byte* chunk() const { return in + in_off; }
};

// Compression::kAdaptive's rule, asked as a worker takes a chunk (here and in StreamPacker):
// store it raw without trying zstd when every other worker is busy (`busy_others`) and still
// more chunks wait, this one included, than there are workers (the CPUs are the bound: workers
// that wait for their input find the queue nearly empty, and a burst of chunks finds some of
// them idle), while the writer has at most one chunk per worker, plus one, left to write, and
// never more than kMostUnwrittenForRaw (the storage would run dry before the busy workers hand
// over their next chunks: each is a compression away, and a chunk compresses several times
// slower than the disk stores it).
// Both conditions together: while the storage is the bound, compressing costs no time, and
// while it has enough queued, a raw chunk would only wait there. Measured on 2 workers
// (docs/PERFORMANCE.md, "How much the writer may hold"): at most 1, 2 and 3 chunks left, dumps
// of 2.77, 2.56 and 2.36 s (medians of 4). The cap keeps the second condition a condition on
// many workers, whose chunks in flight (at most 2 per worker + 8) would otherwise always meet
// it; no host with many workers short of CPU was at hand to measure a larger one.
inline constexpr unsigned kMostUnwrittenForRaw = 3;
bool skip_compression(std::size_t waiting_for_workers, unsigned workers, unsigned busy_others,
                      std::size_t unwritten);

// A file the reader reads ranges of.
struct ReadSource {
  std::filesystem::path path;
  std::string what;     // how messages name it, e.g. "input file a.img"
  bool direct = false;  // try O_DIRECT (falls back if the filesystem refuses)
};

struct ReadRange {
  std::uint32_t source = 0;
  std::uint64_t offset = 0;
  std::uint32_t length = 0;
};

// Per-worker-thread transform (owns its zstd context).
class ChunkWorker {
 public:
  virtual ~ChunkWorker() = default;
  virtual void process(Slot& s) = 0;
};

class SinkIo;
class PipelineRun;

// Runs on the sink thread.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // Called in sequence order; returns the raw bytes the chunk accounts for (progress).
  virtual std::uint64_t consume(Slot& s, SinkIo& io) = 0;
  // Every completion of a request the sink submitted (success or -errno).
  virtual void on_complete(const IoResult& r, SinkIo& io) = 0;
  // After the last chunk was consumed and its I/O completed.
  virtual void finish(SinkIo& io) { (void)io; }
};

class SinkIo {
 public:
  // Waits for room, then queues `r`. With r.slot set, that slot goes back to the reader once
  // all its requests have completed.
  void submit(IoRequest r);
  // Waits until no request is in flight, dispatching completions to the sink.
  void drain();
  // Keeps slot `s` from going back to the reader when consume() returns: its buffers are still
  // read from outside the pipeline (pages spliced into a pipe). release() hands it back.
  void hold(Slot& s);
  void release(unsigned slot);

 private:
  friend class PipelineRun;
  SinkIo(AsyncIo& io, ChunkSink& sink, PipelineRun& run) : io_(io), sink_(sink), run_(run) {}
  void dispatch();
  AsyncIo& io_;
  ChunkSink& sink_;
  PipelineRun& run_;
  std::vector<IoResult> completed_;  // reaped, not yet dispatched
};

struct PipelineConfig {
  std::string phase;     // progress phase, e.g. "pack"
  unsigned workers = 1;  // at most `slots` of them run: a worker without a slot would only wait
  unsigned slots = 4;
  std::size_t buffer_bytes = 0;  // each of a slot's two buffers
  unsigned queue_depth = 16;
  std::uint64_t total_bytes = 0;  // for progress
  ProgressFn progress;
  Errc short_read_errc = Errc::kIo;  // a source ending before a range does
  // Called on the reader thread before each range is read: a source still being written (a
  // checkpoint arriving over the network) waits there for the range's bytes.
  std::function<void(const ReadRange&)> await_range;
};

struct PipelineStats {
  using Clock = std::chrono::steady_clock;
  Clock::time_point start, end;
  Clock::time_point read_first, read_last;  // first read submitted, last one completed
  Clock::time_point work_first, work_last;
  Clock::time_point sink_first, sink_last;
  std::uint64_t bytes_read = 0;
  double worker_busy_seconds = 0;
  bool uring = false;
  bool fixed_buffers = false;
  bool direct_reads = false;  // some source was read with O_DIRECT
};

using WorkerFactory = std::function<std::unique_ptr<ChunkWorker>()>;

// Runs the pipeline to completion; rethrows the first error of any thread after every
// thread has stopped and every in-flight I/O has completed.
PipelineStats run_pipeline(const PipelineConfig& cfg, const std::vector<ReadSource>& sources,
                           const std::vector<ReadRange>& ranges, const WorkerFactory& make_worker,
                           ChunkSink& sink);

// Set GPUCKPT_IO_URING=0 to force the pread/pwrite fallback (also chosen automatically when
// the kernel refuses io_uring).
bool io_uring_allowed();

// Opens `path` with O_DIRECT if `direct` and the filesystem accepts it, else without.
// Returns the fd (or -1 with errno set) and whether O_DIRECT is in effect.
int open_maybe_direct(const std::filesystem::path& path, int flags, mode_t mode, bool direct,
                      bool* direct_used);

}  // namespace gpuckpt::image
