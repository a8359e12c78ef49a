// Checkpoints written and read file by file, for producers and consumers that hand over byte
// streams instead of a directory (CRIU's image streamer, criu/streamer.h):
//
//   StreamPacker:     bytes of several files at once --> chunks --> zstd workers --> blobs
//                     (io_uring) --> manifest + seal, published by rename like pack();
//   CheckpointSource: one file of a checkpoint --> chunk checksums --> zstd --> a descriptor,
//                     any file, in any order, as often as asked.
//
// Same format as pack()/unpack() (docs/FORMAT.md): only the order of chunks inside the blobs
// follows arrival instead of manifest order, which readers never relied on. Memory is bounded
// by the chunks in flight plus one partial chunk per open file, whatever the file sizes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpuckpt/image.h"
#include "image/aligned_buffer.h"
#include "image/arrival.h"
#include "image/blob_tap.h"
#include "image/chunk_codec.h"
#include "image/manifest.h"
#include "image/transfer_common.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace gpuckpt::trust {
class SigningKey;
}

namespace gpuckpt::image {

// Where else a StreamPacker's checkpoint goes while it is written.
struct PackCopy {
  BlobTap* tap = nullptr;  // sees every chunk's stored bytes as they are placed
  // false: the local checkpoint is a transit copy that need not survive a crash of the host
  // (a frozen migration's spool), so it is not flushed to the disk.
  bool durable = true;
};

class StreamPacker {
 public:
  using FileId = std::uint32_t;

  // Checks the options and `output` as pack() does, creates the temporary sibling (after
  // calling opts.on_temp_path) and starts the workers. `source` is recorded as the manifest's
  // informational source path.
  StreamPacker(const std::filesystem::path& output, const PackOptions& opts,
               const std::filesystem::path& source, PackCopy copy = {});
  // Unfinished: stops the threads and removes the temporary checkpoint.
  ~StreamPacker();
  StreamPacker(const StreamPacker&) = delete;
  StreamPacker& operator=(const StreamPacker&) = delete;

  // The calls below come from one thread (the producer). A file name is one path component;
  // a name given twice is Error(kInvalidInput).
  FileId open(const std::string& name, std::uint32_t mode = 0600);
  // Room for the file's next bytes (never empty); commit(n) says how many were written there.
  // May wait for a chunk buffer while the workers and the writer catch up.
  std::span<std::byte> space(FileId f);
  void commit(FileId f, std::size_t n);
  void close(FileId f);
  // A whole local file (small: logs, CRIU's stats) added as `name`.
  void add_file(const std::string& name, const std::filesystem::path& path);
  // What `fd` (a pipe, a file) holds up to its end, added as `name`; the bytes read. Blocks on
  // `fd` and, as space() does, for chunk buffers.
  std::uint64_t add_fd(const std::string& name, int fd, std::uint32_t mode = 0600);
  std::size_t open_files() const { return open_; }
  // Raw bytes received so far (any thread).
  std::uint64_t raw_bytes() const { return raw_.load(std::memory_order_relaxed); }

  // Every file closed: waits for the last chunks, writes manifest.json and manifest.seal with
  // `extra` (as PackOptions::extra) and publishes the checkpoint. Rethrows the first
  // error of any thread.
  TransferResult finish(const nlohmann::json& extra);

  // When the first chunk arrived and when the last write completed (the compress_write
  // window), valid after finish().
  Timeline::Clock::time_point first_byte, last_write;
  // How long the producer (CRIU behind its pipes) waited for a chunk buffer in all: the time
  // compression and the writes held the dump back.
  Timeline::Clock::duration waited_for_room{};

 private:
  struct Job;
  struct OpenFile;
  class BufferPool;

  void submit_chunk(FileId f);
  void worker_loop();
  void writer_loop();
  void fail(std::exception_ptr e);
  void check_failed();
  void stop_threads();

  std::filesystem::path output_;
  PackOptions opts_;
  PackCopy copy_;
  Manifest m_;
  TempDir tmp_;
  std::unique_ptr<BufferPool> pool_;
  std::vector<OpenFile> files_;
  std::size_t open_ = 0;
  std::atomic<std::uint64_t> raw_{0};
  std::unique_ptr<trust::SigningKey> key_;
  bool digest_ = false;
  bool finished_ = false;
  unsigned threads_ = 0;
  Timeline::Clock::time_point created_ = Timeline::Clock::now(), last_progress_{};
  bool uring_ = false;
  bool direct_used_ = false;

  // Jobs go producer -> workers -> writer through two queues; `inflight_` bounds how many
  // chunks exist at once (the memory bound).
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> to_work_, to_write_;
  struct Written {
    FileId file;
    std::uint32_t index;
    ChunkRecord rec;
  };
  std::vector<Written> written_;     // the writer's records, placed in the manifest at the end
  std::vector<BlobRecord> m_blobs_;  // the writer's blobs
  std::uint64_t stored_ = 0;
  double busy_ = 0;
  unsigned inflight_ = 0, max_inflight_ = 0;
  bool adaptive_ = false;      // Compression::kAdaptive, resolved
  unsigned unwritten_ = 0;     // chunks the workers finished whose writes have not completed
  std::uint64_t skipped_ = 0;  // raw bytes stored without trying zstd
  bool closing_ = false;       // no more jobs will come
  bool workers_done_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
  std::thread writer_;
  unsigned working_ = 0;  // workers between taking a job and handing it to the writer
};

// What a CheckpointSource may use for its large files.
struct SourceLimits {
  unsigned threads = 0;  // decompression workers of each large file (0: resolve_threads' default)
  // Chunk buffers of all the large files being written at once (a tree's tasks read their pages
  // images in parallel). A file that finds the budget spent still gets the few it needs to move.
  std::uint64_t buffer_bytes = kAutoBufferBudget;
};

// Serves the files of one checkpoint. The manifest's seal (and a signature's integrity) is
// checked and the blobs are looked at up front; each chunk is checked against its xxh3 (and
// BLAKE2b when recorded) before it is decompressed, and each file against its whole-file xxh3.
// write_to() may be called from several threads at once.
class CheckpointSource {
 public:
  // `arrival`: the blobs are still being received (image/arrival.h); each chunk is read only
  // once its bytes are there. The blob files must already have their full sizes.
  explicit CheckpointSource(const std::filesystem::path& checkpoint,
                            const BlobArrival* arrival = nullptr, SourceLimits limits = {});
  const Manifest& manifest() const { return m_; }
  // The regular file `path`, or nullptr.
  const ManifestEntry* find(std::string_view path) const;
  // Writes the file to `fd` (a pipe, a file). Returns false if the reader closed its end
  // before the end of the file (EPIPE: it did not need the rest). Throws Error(kCorrupt) on a
  // damaged chunk, before any of its bytes are written, and on a whole-file mismatch.
  bool write_to(const ManifestEntry& e, int fd) const;
  // Writes bytes [offset, offset + length) of the file to `fd`, as write_to() writes the whole
  // file: for a reader that takes one file as several streams (CRIU's parallel copy,
  // docs/CRIU.md). Each chunk is checked as write_to() checks it; the whole-file xxh3 is not,
  // since it covers bytes this does not read. Error(kInvalidInput) if the range is empty or
  // not inside the file.
  bool write_range_to(const ManifestEntry& e, std::uint64_t offset, std::uint64_t length,
                      int fd) const;
  // How many files (or ranges of them) this can feed into pipes at once within its buffer budget:
  // each feed holds at least a few chunk slots whatever the budget (pipe_chunks), so more at once
  // would pass it.
  unsigned feeds_within_budget() const;
  // The reader will take `feeds` large files (or ranges of them) at once: each feed then holds
  // at most its share of the buffer budget (never less than it needs to move) and of the
  // decompression workers, so that together they keep to both. 0: no such promise (a feed takes
  // what the budget has left, with every worker). Before any feed starts.
  void share_feeds(unsigned feeds) { feeds_ = feeds; }
  // The raw bytes of chunk `k` of `e`, checked (zstd's sample for the path ceilings).
  std::vector<std::byte> raw_chunk(const ManifestEntry& e, std::size_t k) const;
  // Checks every file that write_to was never asked for (a restore reads only the images CRIU
  // needs, not the dump's logs), chunk by chunk and whole, writing it nowhere. Returns one
  // Error(kCorrupt) per damaged file; throws only what reading itself throws (kIo). Of a
  // checkpoint still arriving, it checks the files already in and never waits for the others:
  // their paths go to `not_arrived`.
  std::vector<Error> check_unread(std::vector<std::string>* not_arrived = nullptr) const;
  // Bytes read from the blobs and bytes written out, so far (any thread).
  std::uint64_t stored_read() const { return stored_read_.load(); }
  std::uint64_t raw_written() const { return raw_written_.load(); }
  // Time spent writing into the readers' descriptors, summed over the files: into CRIU's
  // pipes, a write waits while the pipe is full, so this is how long CRIU's reading held the
  // restore back.
  Timeline::Clock::duration waited_for_reader() const {
    return std::chrono::nanoseconds(fed_wait_ns_.load());
  }
  // Chunk buffer bytes the large files being written hold now, and the most they held at once.
  std::uint64_t buffer_bytes_held() const;
  std::uint64_t buffer_bytes_peak() const;

 private:
  const std::byte* decode(const ManifestEntry& e, std::size_t k, AlignedBuffer& in,
                          AlignedBuffer& out, Decompressor& dec) const;
  void mark_asked(const ManifestEntry& e) const;
  // Chunks [first, first + count) of `e` through the read-ahead pipeline into `fd`, the bytes
  // [skip, skip + length) of them. Returns the xxh3 of what it wrote, or nullopt if the reader
  // closed its end first.
  std::optional<std::uint64_t> pipe_chunks(const ManifestEntry& e, std::size_t first,
                                           std::size_t count, std::uint64_t skip,
                                           std::uint64_t length, int fd) const;
  // Decodes the chunks of `e` in order on this thread, each handed to `each` (false: stop).
  // Returns the whole file's xxh3, or nullopt if `each` stopped.
  std::optional<std::uint64_t> decode_serially(
      const ManifestEntry& e,
      const std::function<bool(const std::byte*, std::uint32_t)>& each) const;
  // Throws Error(kCorrupt) unless `digest` is the whole-file xxh3 of `e`.
  void check_whole(const ManifestEntry& e, std::uint64_t digest) const;
  // Error(kCorrupt) naming chunk `k` of `e`, its blob and offset.
  Error corrupt(const ManifestEntry& e, std::size_t k, const std::string& why) const;
  // Slots for one large file: as many as `wanted` that the budget still has, never fewer than
  // `least`; handed back when it is destroyed.
  class BufferGrant {
   public:
    BufferGrant(const CheckpointSource& src, std::size_t least, std::size_t wanted,
                std::size_t slot_bytes);
    ~BufferGrant();
    BufferGrant(const BufferGrant&) = delete;
    BufferGrant& operator=(const BufferGrant&) = delete;
    std::size_t slots() const { return slots_; }

   private:
    const CheckpointSource& src_;
    std::size_t slots_ = 0;
    std::uint64_t bytes_ = 0;
  };
  std::filesystem::path ckpt_;
  const BlobArrival* arrival_ = nullptr;
  unsigned threads_ = 1;  // decompression workers per large file
  std::uint64_t budget_ = kAutoBufferBudget;
  std::atomic<unsigned> feeds_{0};  // share_feeds
  mutable std::mutex budget_mu_;
  mutable std::uint64_t held_ = 0, peak_ = 0;
  Manifest m_;
  std::vector<UniqueFd> blobs_;
  mutable std::atomic<std::uint64_t> stored_read_{0}, raw_written_{0};
  mutable std::atomic<std::int64_t> fed_wait_ns_{0};
  mutable std::mutex asked_mu_;
  mutable std::vector<bool> asked_;  // per manifest entry: write_to was called for it
};

}  // namespace gpuckpt::image
