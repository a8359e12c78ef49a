#include "image/stream_pack.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>

#include "gpuckpt/error.h"
#include "gpuckpt/gpuckpt.h"
#include "gpuckpt/names.h"
#include "gpuckpt/support.h"
#include "image/async_io.h"
#include "image/blob_files.h"
#include "image/chunk_codec.h"
#include "image/pipeline.h"
#include "image/publish.h"
#include "image/transfer_common.h"
#include "trust/keys.h"
#include "util/no_sigpipe.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;

namespace gpuckpt::image {

namespace {

// A file's first buffer: most CRIU images are a few hundred bytes, and one is open per image
// CRIU has open, so small files must not each cost a whole chunk.
constexpr std::size_t kSmallBuffer = 64u << 10;

double seconds_since(Timeline::Clock::time_point t) {
  return std::chrono::duration<double>(Timeline::Clock::now() - t).count();
}

}  // namespace

// Chunk-sized buffers are recycled: mapping and faulting in 4 MiB per chunk would cost a
// noticeable share of the bandwidth.
class StreamPacker::BufferPool {
 public:
  BufferPool(std::size_t bytes, std::size_t keep) : bytes_(bytes), keep_(keep) {}
  AlignedBuffer get() {
    std::lock_guard lock(mu_);
    if (free_.empty()) return AlignedBuffer(bytes_);
    AlignedBuffer b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void put(AlignedBuffer b) {
    if (b.size() != align_up(bytes_)) return;  // a small buffer: unmapped here
    std::lock_guard lock(mu_);
    if (free_.size() < keep_) free_.push_back(std::move(b));
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_, keep_;
  std::mutex mu_;
  std::vector<AlignedBuffer> free_;
};

struct StreamPacker::Job {
  FileId file = 0;
  std::uint32_t index = 0;  // chunk index within the file
  AlignedBuffer raw, out;
  std::uint32_t raw_len = 0;
  // Set by the worker.
  std::byte* data = nullptr;  // raw or out; its padding is written in place
  std::uint32_t data_len = 0;
  Codec codec = Codec::kRaw;
  std::uint64_t hash = 0;
  Digest digest{};
  // Set by the writer.
  ChunkRecord rec;
  std::uint64_t write_seq = 0;  // the write's place in submission order
};

struct StreamPacker::OpenFile {
  std::uint32_t entry = 0;  // index into m_.entries
  AlignedBuffer buf;
  std::size_t len = 0;  // bytes in buf
  std::uint32_t next_chunk = 0;
  std::uint64_t size = 0;
  std::unique_ptr<StreamHash> hash = std::make_unique<StreamHash>();
  bool open = true;
};

StreamPacker::StreamPacker(const fs::path& output, const PackOptions& opts, const fs::path& source,
                           PackCopy copy)
    : output_(output), opts_(opts), copy_(copy) {
  validate_pack_options(opts_);
  if (output.empty()) throw Error(Errc::kUsage, "no output path given");
  check_pack_output(output, opts_.force);
  if (!opts_.sign_key.empty())
    key_ = std::make_unique<trust::SigningKey>(trust::SigningKey::load(opts_.sign_key));
  digest_ = key_ != nullptr;
  checked_extra(opts_.extra);  // refused now rather than after the whole stream

  m_.major = kImageFormatMajor;
  m_.minor = kImageFormatMinor;
  m_.created_by = std::string("gpuckpt ") + version();
  m_.created_at = utc_now_iso8601();
  m_.host = host_name();
  m_.source = fs::absolute(source).lexically_normal().string();
  m_.input_kind = "directory";
  m_.chunk_bytes = opts_.chunk_bytes;
  m_.zstd_level = opts_.zstd_level;

  const unsigned threads = resolve_threads(opts_.threads);
  const std::size_t buf = slot_buffer_bytes(opts_.chunk_bytes);
  // The pipeline's slot budget (the same auto-sizing as pack): each chunk in flight holds its
  // raw and its compressed form.
  max_inflight_ = resolve_slots(opts_.inflight_chunks, threads, buf, ~0ull);
  pool_ = std::make_unique<BufferPool>(opts_.chunk_bytes, 2 * max_inflight_ + 2);

  tmp_ = TempDir::beside(output, opts_.on_temp_path);

  threads_ = threads;
  adaptive_ = compression_adapts(opts_.compression, copy_.tap != nullptr);
  try {
    for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
    writer_ = std::thread([this] { writer_loop(); });
  } catch (...) {
    stop_threads();
    throw;
  }
}

StreamPacker::~StreamPacker() {
  stop_threads();
}

void StreamPacker::stop_threads() {
  {
    std::lock_guard lock(mu_);
    if (!error_ && !finished_)
      error_ = std::make_exception_ptr(Error(Errc::kInternal, "the checkpoint was abandoned"));
    closing_ = true;
    workers_done_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  if (writer_.joinable()) writer_.join();
}

void StreamPacker::fail(std::exception_ptr e) {
  {
    std::lock_guard lock(mu_);
    if (!error_) error_ = e;
  }
  cv_.notify_all();
}

void StreamPacker::check_failed() {
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

StreamPacker::FileId StreamPacker::open(const std::string& name, std::uint32_t mode) {
  check_failed();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name == kManifestName || name == kSealName || name == kTempMarker)
    throw Error(Errc::kInvalidInput, "cannot store a file named '" + name + "' in a checkpoint");
  for (const auto& e : m_.entries)
    if (e.path == name) throw Error(Errc::kInvalidInput, "file '" + name + "' was sent twice");
  ManifestEntry e;
  e.path = name;
  e.type = EntryType::kFile;
  e.mode = mode & 07777;
  e.xxh3 = xxh3(nullptr, 0);
  m_.entries.push_back(std::move(e));
  OpenFile f;
  f.entry = static_cast<std::uint32_t>(m_.entries.size() - 1);
  files_.push_back(std::move(f));
  ++open_;
  return static_cast<FileId>(files_.size() - 1);
}

std::span<std::byte> StreamPacker::space(FileId id) {
  OpenFile& f = files_.at(id);
  const std::size_t chunk = opts_.chunk_bytes;
  if (f.buf.size() == 0) {
    // A file that already filled a chunk is a large one: go straight to a chunk buffer.
    f.buf = f.next_chunk > 0 ? pool_->get() : AlignedBuffer(std::min(kSmallBuffer, chunk));
  } else if (f.len == std::min(f.buf.size(), chunk)) {
    const std::size_t want = std::min(f.buf.size() * 2, chunk);
    AlignedBuffer bigger = want >= chunk ? pool_->get() : AlignedBuffer(want);
    std::memcpy(bigger.data(), f.buf.data(), f.len);
    pool_->put(std::move(f.buf));
    f.buf = std::move(bigger);
  }
  const std::size_t cap = std::min(f.buf.size(), chunk);
  return {f.buf.data() + f.len, cap - f.len};
}

void StreamPacker::commit(FileId id, std::size_t n) {
  if (n == 0) return;
  OpenFile& f = files_.at(id);
  if (raw_.load(std::memory_order_relaxed) == 0) first_byte = Timeline::Clock::now();
  f.hash->update(f.buf.data() + f.len, n);
  f.len += n;
  f.size += n;
  raw_.fetch_add(n, std::memory_order_relaxed);
  if (f.len == opts_.chunk_bytes) submit_chunk(id);
  if (opts_.progress) {
    // At most a few calls a second (ProgressFn's contract), not one per pipe read.
    const auto now = Timeline::Clock::now();
    if (now - last_progress_ >= std::chrono::milliseconds(200)) {
      last_progress_ = now;
      opts_.progress(Progress{"criu_dump", raw_bytes(), 0, seconds_since(created_)});
    }
  }
}

void StreamPacker::submit_chunk(FileId id) {
  OpenFile& f = files_.at(id);
  auto job = std::make_unique<Job>();
  job->file = id;
  job->index = f.next_chunk++;
  job->raw_len = static_cast<std::uint32_t>(f.len);
  job->raw = std::move(f.buf);
  f.buf = AlignedBuffer();
  f.len = 0;
  std::unique_lock lock(mu_);
  // The memory bound: the producer (and so CRIU behind its pipe) waits for the disk.
  const auto room = [&] { return inflight_ < max_inflight_ || error_; };
  if (!room()) {
    const auto t0 = Timeline::Clock::now();
    cv_.wait(lock, room);
    waited_for_room += Timeline::Clock::now() - t0;
  }
  if (error_) std::rethrow_exception(error_);
  ++inflight_;
  to_work_.push_back(std::move(job));
  lock.unlock();
  cv_.notify_all();
}

void StreamPacker::close(FileId id) {
  OpenFile& f = files_.at(id);
  if (!f.open) return;
  if (f.len > 0) submit_chunk(id);
  f.buf = AlignedBuffer();
  ManifestEntry& e = m_.entries[f.entry];
  e.size = f.size;
  e.xxh3 = f.hash->digest();
  f.hash.reset();
  f.open = false;
  --open_;
}

void StreamPacker::add_file(const std::string& name, const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) throw_errno(Errc::kIo, "open ", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno(Errc::kIo, "stat ", path);
  add_fd(name, fd.get(), st.st_mode & 07777);
}

std::uint64_t StreamPacker::add_fd(const std::string& name, int fd, std::uint32_t mode) {
  const FileId id = open(name, mode);
  std::uint64_t bytes = 0;
  for (;;) {
    const auto room = space(id);
    const ssize_t n = ::read(fd, room.data(), room.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::kIo, "read ", name, " for the checkpoint");
    if (n == 0) break;
    commit(id, static_cast<std::size_t>(n));
    bytes += static_cast<std::uint64_t>(n);
  }
  close(id);
  return bytes;
}

void StreamPacker::worker_loop() {
  try {
    Compressor comp(opts_.zstd_level);
    for (;;) {
      std::unique_ptr<Job> job;
      bool skip = false;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return error_ || !to_work_.empty() || closing_; });
        if (error_ || to_work_.empty()) return;
        skip = adaptive_ && skip_compression(to_work_.size(), threads_, working_, unwritten_);
        job = std::move(to_work_.front());
        to_work_.pop_front();
        ++working_;
        if (skip) skipped_ += job->raw_len;
      }
      const auto t0 = Timeline::Clock::now();
      std::size_t n = 0;
      if (!skip) {
        job->out = job->raw_len > kSmallBuffer ? pool_->get() : AlignedBuffer(job->raw_len);
        n = comp.compress(job->raw.data(), job->raw_len, job->out.data(),
                          std::min<std::size_t>(job->out.size(), job->raw_len));
      }
      if (n > 0) {
        job->data = job->out.data();
        job->data_len = static_cast<std::uint32_t>(n);
        job->codec = Codec::kZstd;
      } else {  // incompressible: stored as is
        job->data = job->raw.data();
        job->data_len = job->raw_len;
        job->codec = Codec::kRaw;
      }
      job->hash = xxh3(job->data, job->data_len);
      if (digest_) job->digest = blake2b(job->data, job->data_len);
      const double busy = seconds_since(t0);
      {
        std::lock_guard lock(mu_);
        busy_ += busy;
        --working_;
        ++unwritten_;
        to_write_.push_back(std::move(job));
      }
      cv_.notify_all();
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

void StreamPacker::writer_loop() {
  BlobFiles files(tmp_.path(), opts_.direct_io, opts_.max_blob_bytes);
  // For a tap, each blob's writes in flight in submission (= offset) order: write_seq, end of
  // its chunk. The completed prefix is what the tap may read.
  std::vector<std::deque<std::pair<std::uint64_t, std::uint64_t>>> inflight;
  // Jobs whose writes are in flight, by tag; declared before `io` so that io's destructor
  // (which waits for the kernel) runs first.
  std::vector<std::unique_ptr<Job>> pending;
  std::vector<std::uint64_t> free_tags;
  // Writes completed behind an earlier one of their blob, by write_seq.
  std::set<std::uint64_t> done_writes;
  std::uint64_t next_write = 0;
  try {
    AsyncIo::Config cfg;
    cfg.depth = opts_.queue_depth;
    cfg.allow_uring = io_uring_allowed();
    AsyncIo io(cfg);
    {
      std::lock_guard lock(mu_);
      uring_ = io.uring();
    }
    std::vector<IoResult> done;
    auto complete = [&] {
      for (const auto& r : done) {
        auto& job = pending[r.req.tag];
        if (r.res < 0)
          throw_syserr(Errc::kIo, -r.res, "write ", (tmp_.path() / blob_name(job->rec.blob)));
        if (copy_.tap) {
          auto& q = inflight[job->rec.blob];
          done_writes.insert(job->write_seq);
          std::uint64_t end = 0;
          while (!q.empty() && done_writes.erase(q.front().first)) {
            end = q.front().second;
            q.pop_front();
          }
          if (end) copy_.tap->blob_written(job->rec.blob, end);
        }
        pool_->put(std::move(job->raw));
        pool_->put(std::move(job->out));
        {
          std::lock_guard lock(mu_);
          written_.push_back({job->file, job->index, job->rec});
          stored_ += job->rec.stored;
          --inflight_;
          --unwritten_;
        }
        cv_.notify_all();
        job.reset();
        free_tags.push_back(r.req.tag);
      }
      done.clear();
    };
    for (;;) {
      std::unique_ptr<Job> job;
      {
        std::unique_lock lock(mu_);
        if (to_write_.empty() && io.inflight() > 0) {
          lock.unlock();
          io.reap(true, done);
          complete();
          continue;
        }
        cv_.wait(lock, [&] { return error_ || !to_write_.empty() || workers_done_; });
        if (error_) return;
        if (to_write_.empty()) break;  // workers done, everything written
        job = std::move(to_write_.front());
        to_write_.pop_front();
      }
      while (io.full()) {
        io.reap(true, done);
        complete();
      }
      const bool opens = files.starts_new(job->data_len);
      const BlobFiles::Place at = files.append(job->data, job->data_len);
      if (opens) {
        inflight.emplace_back();
        if (copy_.tap) copy_.tap->blob_created(at.blob, files.path(at.blob));
      }
      job->rec = {at.blob,   at.offset,  job->data_len, job->raw_len,
                  job->hash, job->codec, digest_,       job->digest};
      IoRequest w;
      w.kind = IoRequest::Kind::kWrite;
      w.fd = at.fd;
      w.buf = job->data;
      w.len = at.padded;
      w.offset = at.offset;
      if (free_tags.empty()) {
        free_tags.push_back(pending.size());
        pending.emplace_back();
      }
      w.tag = free_tags.back();
      free_tags.pop_back();
      pending[w.tag] = std::move(job);
      pending[w.tag]->write_seq = next_write++;
      if (copy_.tap) inflight[at.blob].emplace_back(pending[w.tag]->write_seq, files.end(at.blob));
      io.submit(w);
      io.flush();
      io.reap(false, done);
      complete();
    }
    io.drain(done);
    complete();
    const auto written_at = Timeline::Clock::now();
    // The last chunk of each blob was written padded: cut to the real end, then make durable.
    for (std::uint32_t i = 0; i < files.count(); ++i) {
      files.truncate(i);
      if (copy_.durable) files.sync(i);
    }
    m_blobs_ = files.records();
    direct_used_ = files.direct_used();
    last_write = Timeline::Clock::now();
    // The disk may hold the writes in a volatile cache until fsync: that flush is part of the
    // cost of a durable checkpoint, and can be as long as the writes themselves.
    spdlog::debug("blobs written; made durable in {:.3f} s",
                  std::chrono::duration<double>(last_write - written_at).count());
  } catch (...) {
    fail(std::current_exception());
  }
}

TransferResult StreamPacker::finish(const nlohmann::json& extra) {
  check_failed();
  for (const auto& f : files_)
    if (f.open)
      throw Error(Errc::kInternal,
                  "file '" + m_.entries[f.entry].path + "' of the checkpoint was not closed");
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  {
    std::lock_guard lock(mu_);
    workers_done_ = true;
  }
  cv_.notify_all();
  writer_.join();
  check_failed();

  TransferResult res;
  if (raw_bytes() == 0) first_byte = last_write = Timeline::Clock::now();
  for (const auto& w : written_) {
    auto& chunks = m_.entries[files_[w.file].entry].chunks;
    if (chunks.size() <= w.index) chunks.resize(w.index + 1);
    chunks[w.index] = w.rec;
  }
  m_.blobs = m_blobs_;
  std::uint64_t nchunks = 0;
  for (const auto& e : m_.entries) {
    std::uint64_t sum = 0;
    for (const auto& c : e.chunks) sum += c.raw;
    if (sum != e.size)
      throw Error(Errc::kInternal, "chunks of '" + e.path + "' went missing on the way to disk");
    nchunks += e.chunks.size();
  }
  // Manifest order is byte-wise sorted (docs/FORMAT.md); arrival order stays in the blobs.
  std::sort(m_.entries.begin(), m_.entries.end(),
            [](const ManifestEntry& a, const ManifestEntry& b) { return a.path < b.path; });
  m_.extra = checked_extra(extra);
  {
    auto s = res.timeline.scope(stage::kCommit);
    const std::string text = serialize(m_);
    if (text.size() > kMaxManifestBytes)
      throw Error(Errc::kUsage, "the manifest would be " + std::to_string(text.size() >> 20) +
                                    " MiB, more than readers accept: use a larger chunk size");
    write_private_file(tmp_.path(), kSealName, make_seal(text, key_.get()));
    write_private_file(tmp_.path(), kManifestName, text);
    fsync_dir(tmp_.path());
    publish(tmp_, output_, opts_.force);
  }
  finished_ = true;
  res.raw_bytes = raw_bytes();
  res.compressed_bytes = stored_;
  res.skipped_compression_bytes = skipped_;
  res.chunks = nchunks;
  res.files = m_.entries.size();
  res.threads = threads_;
  res.buffer_bytes = static_cast<std::uint64_t>(max_inflight_) * 2 * pool_->bytes();
  res.worker_busy_seconds = busy_;
  res.io_uring = uring_;
  res.direct_io = direct_used_;
  return res;
}

// ---- reading ----------------------------------------------------------------------------------

CheckpointSource::CheckpointSource(const fs::path& checkpoint, const BlobArrival* arrival,
                                   SourceLimits limits)
    : ckpt_(checkpoint),
      arrival_(arrival),
      threads_(resolve_threads(limits.threads)),
      budget_(limits.buffer_bytes) {
  m_ = load_manifest(checkpoint);
  // A signature that fails is a manifest changed after signing: nothing is served from it.
  enforce_signature(m_.signature, TrustOptions{}, checkpoint);
  check_blobs(m_, checkpoint);
  for (const auto& b : m_.blobs) {
    const fs::path p = checkpoint / b.name;
    UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd) throw_errno(Errc::kIo, "open ", p);
    blobs_.push_back(std::move(fd));
  }
}

const ManifestEntry* CheckpointSource::find(std::string_view path) const {
  for (const auto& e : m_.entries)
    if (e.type == EntryType::kFile && e.path == path) return &e;
  return nullptr;
}

Error CheckpointSource::corrupt(const ManifestEntry& e, std::size_t k,
                                const std::string& why) const {
  const ChunkRecord& c = e.chunks[k];
  return Error(Errc::kCorrupt, "checkpoint " + ckpt_.string() + " is corrupt: chunk " +
                                   std::to_string(k) + " of '" + e.path + "' (" +
                                   m_.blobs[c.blob].name + " at offset " +
                                   std::to_string(c.offset) + "): " + why);
}

// Reads, checks and decompresses chunk `k` of `e` into `in`/`out`; returns where its raw bytes
// are. Throws Error(kCorrupt) naming the chunk.
const std::byte* CheckpointSource::decode(const ManifestEntry& e, std::size_t k, AlignedBuffer& in,
                                          AlignedBuffer& out, Decompressor& dec) const {
  const ChunkRecord& c = e.chunks[k];
  if (arrival_) arrival_->wait(c.blob, c.offset, c.offset + c.stored);
  for (std::uint32_t got = 0; got < c.stored;) {
    const ssize_t n = ::pread(blobs_[c.blob].get(), in.data() + got, c.stored - got,
                              static_cast<off_t>(c.offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::kIo, "read ", (ckpt_ / m_.blobs[c.blob].name));
    if (n == 0) throw corrupt(e, k, "the blob ends inside the chunk");
    got += static_cast<std::uint32_t>(n);
  }
  stored_read_ += c.stored;
  // Checked before CRIU sees any of its bytes.
  return check_and_decode(c, in.data(), out.data(), dec,
                          [&](const std::string& why) { throw corrupt(e, k, why); });
}

std::vector<std::byte> CheckpointSource::raw_chunk(const ManifestEntry& e, std::size_t k) const {
  const ChunkRecord& c = e.chunks.at(k);
  AlignedBuffer in(c.raw), out(c.raw);
  Decompressor dec;
  const std::byte* d = decode(e, k, in, out, dec);
  return {d, d + c.raw};
}

namespace {

// CRIU closed its end of the pipe before the end of the file: it needed no more of it.
struct ReaderClosed {};

// Writes `len` bytes to `fd`, counting them in `written`; false if the reader closed its end
// (EPIPE).
bool write_all(int fd, const std::byte* data, std::uint32_t len, const std::string& path,
               std::atomic<std::uint64_t>& written) {
  const int err = write_fully(fd, data, len, &written);
  if (err == EPIPE) return false;
  if (err) throw_syserr(Errc::kIo, err, "write '", path, "'");
  return true;
}

// The capacity of `fd` if it is a pipe, else 0.
std::size_t pipe_capacity(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return 0;
  const int n = ::fcntl(fd, F_GETPIPE_SZ);
  return n > 0 ? static_cast<std::size_t>(n) : 0;
}

// Adds the time its scope took to a total: writing into CRIU's pipe blocks while the pipe is
// full, so the total is how long a restore's feed waited for CRIU to read.
class WaitClock {
 public:
  explicit WaitClock(std::atomic<std::int64_t>& total_ns)
      : total_ns_(total_ns), start_(Timeline::Clock::now()) {}
  ~WaitClock() {
    total_ns_ +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(Timeline::Clock::now() - start_)
            .count();
  }
  WaitClock(const WaitClock&) = delete;
  WaitClock& operator=(const WaitClock&) = delete;

 private:
  std::atomic<std::int64_t>& total_ns_;
  Timeline::Clock::time_point start_;
};

// Writes one file's chunks into a descriptor in order, hashing them on the way. Into a pipe
// (CRIU's), the chunk's pages are spliced by reference (vmsplice) instead of copied: a write()
// holds the pipe's lock while it copies, and CRIU's read() holds it while it copies into (and
// faults in) the restored memory, so the two copies ran one after the other. A spliced slot
// stays held until the pipe has been read past its last byte.
class DescriptorSink : public ChunkSink {
 public:
  DescriptorSink(int fd, const std::string& path, std::atomic<std::uint64_t>& written,
                 std::atomic<std::int64_t>& waited_ns)
      : fd_(fd),
        path_(path),
        written_(written),
        waited_ns_(waited_ns),
        splice_(pipe_capacity(fd) > 0) {}
  std::uint64_t consume(Slot& s, SinkIo& io) override {
    hash.update(s.data, s.data_len);
    const WaitClock w(waited_ns_);
    if (splice_)
      splice_out(s, io);
    else if (!write_all(fd_, s.data, s.data_len, path_, written_))
      throw ReaderClosed{};
    return s.data_len;
  }
  void on_complete(const IoResult&, SinkIo&) override {}
  StreamHash hash;

 private:
  void splice_out(Slot& s, SinkIo& io) {
    for (std::uint32_t off = 0; off < s.data_len;) {
      iovec iov{s.data + off, s.data_len - off};
      const ssize_t w = ::vmsplice(fd_, &iov, 1, 0);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EPIPE) throw ReaderClosed{};
      if (w < 0) throw_errno(Errc::kIo, "vmsplice '", path_, "'");
      off += static_cast<std::uint32_t>(w);
      spliced_ += static_cast<std::uint64_t>(w);
      written_ += static_cast<std::uint64_t>(w);
      release_read(io);
    }
    io.hold(s);
    held_.push_back({s.id, spliced_});
    release_read(io);
  }
  // Slots whose bytes the reader has taken out of the pipe go back to the pipeline.
  void release_read(SinkIo& io) {
    if (held_.empty()) return;
    int unread = 0;
    if (::ioctl(fd_, FIONREAD, &unread) != 0) throw_errno(Errc::kIo, "FIONREAD '", path_, "'");
    const std::uint64_t read_up_to = spliced_ - static_cast<std::uint64_t>(unread);
    while (!held_.empty() && held_.front().end <= read_up_to) {
      io.release(held_.front().slot);
      held_.pop_front();
    }
  }
  struct Held {
    unsigned slot;
    std::uint64_t end;  // spliced_ after its last byte
  };
  int fd_;
  const std::string& path_;
  std::atomic<std::uint64_t>& written_;
  std::atomic<std::int64_t>& waited_ns_;
  bool splice_;
  std::uint64_t spliced_ = 0;
  std::deque<Held> held_;
};

}  // namespace

std::optional<std::uint64_t> CheckpointSource::decode_serially(
    const ManifestEntry& e,
    const std::function<bool(const std::byte*, std::uint32_t)>& each) const {
  std::uint32_t largest = 1;
  for (const auto& c : e.chunks) largest = std::max(largest, c.raw);
  StreamHash hash;
  AlignedBuffer in(largest), out(largest);
  Decompressor dec;
  for (std::size_t k = 0; k < e.chunks.size(); ++k) {
    const std::byte* data = decode(e, k, in, out, dec);
    const std::uint32_t len = e.chunks[k].raw;
    hash.update(data, len);
    if (!each(data, len)) return std::nullopt;
  }
  return hash.digest();
}

void CheckpointSource::check_whole(const ManifestEntry& e, std::uint64_t digest) const {
  if (digest != e.xxh3)
    throw Error(Errc::kCorrupt, "checkpoint " + ckpt_.string() + " is corrupt: '" + e.path +
                                    "' fails its whole-file xxh3 checksum");
}

std::vector<Error> CheckpointSource::check_unread(std::vector<std::string>* not_arrived) const {
  std::vector<Error> damaged;
  for (std::size_t i = 0; i < m_.entries.size(); ++i) {
    const ManifestEntry& e = m_.entries[i];
    {
      std::lock_guard lk(asked_mu_);
      if (e.type != EntryType::kFile || (i < asked_.size() && asked_[i])) continue;
    }
    if (arrival_ && !std::all_of(e.chunks.begin(), e.chunks.end(), [&](const ChunkRecord& c) {
          return arrival_->has(c.blob, c.offset, c.offset + c.stored);
        })) {
      if (not_arrived) not_arrived->push_back(e.path);
      continue;
    }
    try {
      check_whole(e, *decode_serially(e, [](const std::byte*, std::uint32_t) { return true; }));
    } catch (const Error& err) {
      if (err.code() != Errc::kCorrupt) throw;
      damaged.push_back(err);
    }
  }
  return damaged;
}

CheckpointSource::BufferGrant::BufferGrant(const CheckpointSource& src, std::size_t least,
                                           std::size_t wanted, std::size_t slot_bytes)
    : src_(src) {
  std::lock_guard lk(src.budget_mu_);
  std::uint64_t left = src.budget_ > src.held_ ? src.budget_ - src.held_ : 0;
  if (const unsigned feeds = src.feeds_.load())
    left = std::min<std::uint64_t>(left, src.budget_ / feeds);
  slots_ = std::max<std::size_t>(least, std::min<std::uint64_t>(wanted, left / slot_bytes));
  bytes_ = static_cast<std::uint64_t>(slots_) * slot_bytes;
  src.held_ += bytes_;
  src.peak_ = std::max(src.peak_, src.held_);
}

CheckpointSource::BufferGrant::~BufferGrant() {
  std::lock_guard lk(src_.budget_mu_);
  src_.held_ -= bytes_;
}

std::uint64_t CheckpointSource::buffer_bytes_held() const {
  std::lock_guard lk(budget_mu_);
  return held_;
}

std::uint64_t CheckpointSource::buffer_bytes_peak() const {
  std::lock_guard lk(budget_mu_);
  return peak_;
}

void CheckpointSource::mark_asked(const ManifestEntry& e) const {
  std::lock_guard lk(asked_mu_);
  asked_.resize(m_.entries.size());
  asked_[static_cast<std::size_t>(&e - m_.entries.data())] = true;
}

bool CheckpointSource::write_to(const ManifestEntry& e, int fd) const {
  mark_asked(e);
  const std::size_t n = e.chunks.size();
  NoSigpipe nosig;
  std::optional<std::uint64_t> digest;
  if (n <= 2) {  // small files (most CRIU images): decoded right here
    digest = decode_serially(e, [&](const std::byte* data, std::uint32_t len) {
      const WaitClock w(fed_wait_ns_);
      return write_all(fd, data, len, e.path, raw_written_);
    });
  } else {
    digest = pipe_chunks(e, 0, n, 0, e.size, fd);
  }
  if (!digest) return false;
  check_whole(e, *digest);
  return true;
}

namespace {

// The slots a feed into a pipe of `pipe_bytes` needs to move, whatever the budget: the spliced
// chunks the pipe's bytes keep held (one more, for a chunk that straddles its read point), and
// two more. pipe_chunks grants it; feeds_within_budget counts on it.
std::size_t least_feed_slots(std::size_t pipe_bytes, std::uint32_t chunk) {
  return (pipe_bytes + chunk - 1) / chunk + 1 + 2;
}

}  // namespace

unsigned CheckpointSource::feeds_within_budget() const {
  // pipe_chunks' least for a chunk of the manifest's size into a pipe the streamer grew to 4 MiB.
  const std::uint32_t chunk = std::max<std::uint32_t>(m_.chunk_bytes, 1);
  const std::uint64_t least = least_feed_slots(4u << 20, chunk) * 2 * slot_buffer_bytes(chunk);
  return static_cast<unsigned>(std::max<std::uint64_t>(1, budget_ / least));
}

bool CheckpointSource::write_range_to(const ManifestEntry& e, std::uint64_t offset,
                                      std::uint64_t length, int fd) const {
  if (length == 0 || offset > e.size || length > e.size - offset || m_.chunk_bytes == 0)
    throw Error(Errc::kInvalidInput, "bytes " + std::to_string(offset) + "+" +
                                         std::to_string(length) + " are not inside '" + e.path +
                                         "' (" + std::to_string(e.size) + " bytes)");
  mark_asked(e);
  NoSigpipe nosig;
  // Every chunk but the last holds chunk_bytes (the manifest reader checks it).
  const std::size_t first = offset / m_.chunk_bytes;
  const std::size_t last = (offset + length - 1) / m_.chunk_bytes;
  return pipe_chunks(e, first, last - first + 1, offset - first * std::uint64_t{m_.chunk_bytes},
                     length, fd)
      .has_value();
}

std::optional<std::uint64_t> CheckpointSource::pipe_chunks(const ManifestEntry& e,
                                                           std::size_t first, std::size_t count,
                                                           std::uint64_t skip, std::uint64_t length,
                                                           int fd) const {
  std::uint32_t largest = 1;
  for (std::size_t k = first; k < first + count; ++k) largest = std::max(largest, e.chunks[k].raw);
  // Large files (pages-*.img): the pipeline reads ahead with O_DIRECT through io_uring (cold
  // buffered reads ran at a third of the disk's speed here, docs/PERFORMANCE.md), workers
  // check and decompress, and this file's sink writes the chunks into the pipe in order.
  std::vector<ReadSource> sources;
  for (std::size_t b = 0; b < m_.blobs.size(); ++b) {
    // Through our own descriptors: the blobs read are the ones checked when this opened.
    const fs::path self = "/proc/self/fd/" + std::to_string(blobs_[b].get());
    // Arriving blobs are in the page cache, where O_DIRECT would first write them back.
    const bool direct = !arrival_ && m_.blobs[b].size > 0 && !looks_cached(self, m_.blobs[b].size);
    sources.push_back({self, "blob " + (ckpt_ / m_.blobs[b].name).string(), direct});
  }
  std::vector<ReadRange> ranges;
  ranges.reserve(count);
  for (std::size_t k = first; k < first + count; ++k)
    ranges.push_back({e.chunks[k].blob, e.chunks[k].offset, e.chunks[k].stored});
  PipelineConfig cfg;
  cfg.phase = "restore";
  // A few reads in flight beyond the workers' chunks keep the disk busy. Spliced chunks stay
  // held while the pipe holds their bytes: room for those as well. Several images stream at
  // once (a tree's tasks restore in parallel) and share one budget; one that finds it spent
  // still gets what it needs to move, never waiting for another file: that one's reader, a
  // CRIU task, may be waiting for this file's.
  const std::size_t least = least_feed_slots(pipe_capacity(fd), largest);
  cfg.buffer_bytes = slot_buffer_bytes(largest);
  const std::size_t wanted = std::min<std::size_t>(count, std::size_t{threads_} + 2 + least);
  const BufferGrant grant(*this, std::min(wanted, least), wanted, 2 * cfg.buffer_bytes);
  cfg.slots = static_cast<unsigned>(grant.slots());
  const unsigned feeds = feeds_.load();
  cfg.workers = feeds ? std::max(1u, threads_ / feeds) : threads_;
  cfg.queue_depth = cfg.slots;
  cfg.short_read_errc = Errc::kCorrupt;
  if (arrival_)
    cfg.await_range = [this](const ReadRange& r) {
      arrival_->wait(r.source, r.offset, r.offset + r.length);
    };
  DescriptorSink sink(fd, e.path, raw_written_, fed_wait_ns_);
  const std::uint64_t begin = first * std::uint64_t{m_.chunk_bytes} + skip;
  const WorkerFactory make_worker = [&]() -> std::unique_ptr<ChunkWorker> {
    struct Worker : ChunkWorker {
      Worker(const CheckpointSource& src, const ManifestEntry& entry, std::size_t first,
             std::uint64_t begin, std::uint64_t end)
          : src(src), e(entry), first(first), begin(begin), end(end) {}
      void process(Slot& s) override {
        const std::size_t k = first + s.seq;
        const ChunkRecord& c = e.chunks[k];
        const std::byte* d =
            check_and_decode(c, s.chunk(), s.out, dec,
                             [&](const std::string& why) { throw src.corrupt(e, k, why); });
        s.data = d == s.out ? s.out : s.chunk();
        // Only the asked-for bytes of the first and last chunk of a range.
        const std::uint64_t at = k * std::uint64_t{src.m_.chunk_bytes};
        const std::uint64_t from = std::max(at, begin), to = std::min(at + c.raw, end);
        s.data += from - at;
        s.data_len = static_cast<std::uint32_t>(to - from);
      }
      const CheckpointSource& src;
      const ManifestEntry& e;
      std::size_t first;
      std::uint64_t begin, end;
      Decompressor dec;
    };
    return std::make_unique<Worker>(*this, e, first, begin, begin + length);
  };
  try {
    const PipelineStats st = run_pipeline(cfg, sources, ranges, make_worker, sink);
    stored_read_ += st.bytes_read;
  } catch (const ReaderClosed&) {
    return std::nullopt;
  }
  return sink.hash.digest();
}

}  // namespace gpuckpt::image
