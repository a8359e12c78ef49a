// gpuckpt::pack: input tree -> chunks -> zstd workers -> blobs + manifest, built in a
// temporary sibling of the output and published by rename.
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>

#include "gpuckpt/error.h"
#include "gpuckpt/gpuckpt.h"
#include "gpuckpt/image.h"
#include "gpuckpt/names.h"
#include "gpuckpt/support.h"
#include "image/aligned_buffer.h"
#include "image/blob_files.h"
#include "image/chunk_codec.h"
#include "image/input_tree.h"
#include "image/manifest.h"
#include "image/pipeline.h"
#include "image/publish.h"
#include "image/transfer_common.h"
#include "trust/keys.h"
#include "util/fault.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt {

using namespace image;

namespace {

// Input files at least this large are read with O_DIRECT when direct I/O is enabled and they
// are not in the page cache (docs/PERFORMANCE.md); small ones always use the page cache.
constexpr std::uint64_t kDirectReadMinBytes = 1ull << 20;

struct PackChunk {
  std::uint32_t entry;  // index into Manifest::entries
  bool first, last;
};

class PackWorker : public ChunkWorker {
 public:
  // `skipped` (shared by the workers, or nullptr: always compress) adds up the raw bytes of the
  // chunks stored without trying zstd.
  PackWorker(int level, bool digest, std::atomic<std::uint64_t>* skipped)
      : comp_(level), digest_(digest), skipped_(skipped) {}
  void process(Slot& s) override {
    const bool skip = skipped_ && s.workers_behind;
    if (skip) skipped_->fetch_add(s.in_len, std::memory_order_relaxed);
    const std::size_t n = skip ? 0 : comp_.compress(s.chunk(), s.in_len, s.out, s.capacity);
    if (n > 0) {
      s.data = s.out;
      s.data_len = static_cast<std::uint32_t>(n);
      s.data_index = s.out_index();
      s.codec = Codec::kZstd;
    } else {  // incompressible: store as is
      s.data = s.chunk();
      s.data_len = s.in_len;
      s.data_index = s.in_index();
      s.codec = Codec::kRaw;
    }
    s.hash = xxh3(s.data, s.data_len);
    if (digest_) s.digest = blake2b(s.data, s.data_len);
  }

 private:
  Compressor comp_;
  bool digest_;
  std::atomic<std::uint64_t>* skipped_;
};

// Appends chunks to the checkpoint's blobs (BlobFiles) in sequence order, records them in the
// manifest, and finalizes each blob (truncate, fsync through the queue) once it is full and
// its writes have completed, while the next one is already being written.
class BlobWriter : public ChunkSink {
 public:
  BlobWriter(const fs::path& dir, const std::vector<PackChunk>& chunks, Manifest& m, bool direct,
             std::uint64_t max_blob, bool digest)
      : files_(dir, direct, max_blob), chunks_(chunks), m_(m), digest_(digest) {}

  std::uint64_t consume(Slot& s, SinkIo& io) override {
    const PackChunk& c = chunks_[s.seq];
    ManifestEntry& e = m_.entries[c.entry];
    if (c.first) hash_.reset();
    hash_.update(s.chunk(), s.in_len);
    if (c.last) e.xxh3 = hash_.digest();

    if (files_.count() > 0 && files_.starts_new(s.data_len)) close_current(io);
    std::byte* data = s.data;
    int index = s.data_index;
    if (reinterpret_cast<std::uintptr_t>(data) % kIoAlign != 0) {  // O_DIRECT needs alignment
      std::memmove(s.out, data, s.data_len);
      data = s.out;
      index = s.out_index();
    }
    const BlobFiles::Place at = files_.append(data, s.data_len);
    if (at.blob == pending_.size()) pending_.push_back(0);
    IoRequest w;
    w.kind = IoRequest::Kind::kWrite;
    w.fd = at.fd;
    w.buf = data;
    w.len = at.padded;
    w.offset = at.offset;
    w.buf_index = index;
    w.slot = static_cast<int>(s.id);
    w.tag = at.blob;
    ++pending_[at.blob];
    io.submit(w);
    e.chunks.push_back(
        {at.blob, at.offset, s.data_len, s.in_len, s.hash, s.codec, digest_, s.digest});
    stored_ += s.data_len;
    return s.in_len;
  }

  void on_complete(const IoResult& r, SinkIo& io) override {
    const auto index = static_cast<std::uint32_t>(r.req.tag);
    if (r.req.kind == IoRequest::Kind::kFsync) {
      if (r.res < 0) throw_syserr(Errc::kIo, -r.res, "fsync ", files_.path(index));
      files_.close(index);
      return;
    }
    if (r.res < 0) throw_syserr(Errc::kIo, -r.res, "write ", files_.path(index));
    if (--pending_[index] == 0 && index < closed_) finalize(index, io);
  }

  void finish(SinkIo& io) override {
    sync_start = Timeline::Clock::now();
    if (closed_ < files_.count()) close_current(io);
    io.drain();  // the last writes, then every blob's fsync
    sync_end = Timeline::Clock::now();
    m_.blobs = files_.records();
  }

  std::uint64_t stored() const { return stored_; }
  bool direct_used() const { return files_.direct_used(); }
  bool digests() const { return digest_; }
  // The wait for durability after the last chunk was handed to the kernel.
  Timeline::Clock::time_point sync_start, sync_end;

 private:
  // No more chunks for the current blob; it is finalized once its writes have completed.
  void close_current(SinkIo& io) {
    const std::uint32_t index = files_.current();
    closed_ = index + 1;
    if (pending_[index] == 0) finalize(index, io);
  }

  void finalize(std::uint32_t index, SinkIo& io) {
    files_.truncate(index);
    IoRequest sync;
    sync.kind = IoRequest::Kind::kFsync;
    sync.fd = files_.fd(index);
    sync.tag = index;
    io.submit(sync);
  }

  BlobFiles files_;
  const std::vector<PackChunk>& chunks_;
  Manifest& m_;
  bool digest_;
  StreamHash hash_;
  std::vector<unsigned> pending_;  // writes in flight, by blob
  std::uint32_t closed_ = 0;       // blobs [0, closed_) take no more chunks
  std::uint64_t stored_ = 0;
};

// Everything a request can be refused for before any work is done.
void validate_request(const fs::path& input, const fs::path& output, const PackOptions& opts) {
  validate_pack_options(opts);
  if (output.empty()) throw Error(Errc::kUsage, "no output path given");
  checked_extra(opts.extra);
  std::error_code ec;
  if (!fs::exists(input, ec))
    throw Error(Errc::kInvalidInput, "input " + input.string() + " does not exist");
  if (fs::is_directory(input, ec) && is_within(output, input))
    throw Error(Errc::kInvalidInput,
                "output " + output.string() + " lies inside the input " + input.string());
  check_pack_output(output, opts.force);
}

std::optional<trust::SigningKey> load_signing_key(const fs::path& path) {
  std::optional<trust::SigningKey> key;
  if (!path.empty()) key.emplace(trust::SigningKey::load(path));
  return key;
}

// A manifest with its header filled in and no entries yet.
Manifest new_manifest(const fs::path& input, bool single_file, const PackOptions& opts) {
  Manifest m;
  m.extra = opts.extra;
  m.major = kImageFormatMajor;
  m.minor = kImageFormatMinor;
  m.created_by = std::string("gpuckpt ") + version();
  m.created_at = utc_now_iso8601();
  m.host = host_name();
  m.source = fs::absolute(input).lexically_normal().string();
  m.input_kind = single_file ? "file" : "directory";
  m.chunk_bytes = opts.chunk_bytes;
  m.zstd_level = opts.zstd_level;
  return m;
}

// What the pipeline reads (input files, in chunk-sized ranges) and where each chunk belongs.
struct PackPlan {
  std::vector<ReadSource> sources;
  std::vector<ReadRange> ranges;
  std::vector<PackChunk> chunks;
  std::uint64_t raw_total = 0;
};

ManifestEntry to_manifest_entry(const InputEntry& ie) {
  ManifestEntry e;
  e.path = ie.rel;
  e.type = ie.type;
  e.mode = ie.mode;
  e.target = ie.target;
  e.size = ie.size;
  return e;
}

// Adds the reads of non-empty file `ie`, manifest entry `entry`, to `p`.
void plan_file(const InputEntry& ie, std::uint32_t entry, std::uint32_t chunk_bytes, bool direct_io,
               PackPlan& p) {
  const auto src = static_cast<std::uint32_t>(p.sources.size());
  const bool direct = direct_io && ie.size >= kDirectReadMinBytes && !looks_cached(ie.abs, ie.size);
  p.sources.push_back({ie.abs, "input file " + ie.abs.string(), direct});
  for (std::uint64_t off = 0; off < ie.size; off += chunk_bytes) {
    const auto len =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk_bytes, ie.size - off));
    p.ranges.push_back({src, off, len});
    p.chunks.push_back({entry, off == 0, off + len == ie.size});
  }
}

// Lists the tree's entries in `m` and plans the reads of their data.
PackPlan plan_entries(const InputTree& tree, const PackOptions& opts, Manifest& m) {
  PackPlan p;
  for (const auto& ie : tree.entries) {
    ManifestEntry e = to_manifest_entry(ie);
    if (ie.type == EntryType::kFile) {
      e.xxh3 = xxh3(nullptr, 0);  // replaced by the sink for non-empty files
      if (ie.size > 0) {
        const auto idx = static_cast<std::uint32_t>(m.entries.size());
        plan_file(ie, idx, opts.chunk_bytes, opts.direct_io, p);
      }
      p.raw_total += ie.size;
    }
    m.entries.push_back(std::move(e));
  }
  return p;
}

std::uint32_t largest_range(const std::vector<ReadRange>& ranges) {
  std::uint32_t largest = 0;
  for (const auto& r : ranges) largest = std::max(largest, r.length);
  return largest;
}

// The checkpoint is built in a temporary sibling of `output`, private to us until published.
TempDir make_temp_checkpoint(const fs::path& output, const PackOptions& opts) {
  return TempDir::beside(output, opts.on_temp_path);
}

PipelineConfig make_config(const PackOptions& opts, unsigned threads, unsigned slots,
                           std::size_t buf_bytes, std::uint64_t raw_total) {
  PipelineConfig cfg;
  cfg.phase = "pack";
  cfg.workers = threads;
  cfg.slots = slots;
  cfg.buffer_bytes = buf_bytes;
  cfg.queue_depth = opts.queue_depth;
  cfg.total_bytes = raw_total;
  cfg.progress = opts.progress;
  cfg.short_read_errc = Errc::kIo;  // an input file shrank while we read it
  return cfg;
}

// Compresses the planned chunks into `sink`'s blobs, with digests when the sink records them.
// `skipped`: as PackWorker's.
PipelineStats compress_into(const PackPlan& plan, const PipelineConfig& cfg, int level,
                            BlobWriter& sink, std::atomic<std::uint64_t>* skipped) {
  const bool digest = sink.digests();
  return run_pipeline(
      cfg, plan.sources, plan.ranges,
      [level, digest, skipped] { return std::make_unique<PackWorker>(level, digest, skipped); },
      sink);
}

// Readers refuse larger manifests, so one is never written.
std::string serialize_checked(const Manifest& m) {
  std::string text = serialize(m);
  if (text.size() > kMaxManifestBytes)
    throw Error(Errc::kUsage, "the manifest would be " + std::to_string(text.size() >> 20) +
                                  " MiB, more than readers accept (" +
                                  std::to_string(kMaxManifestBytes >> 20) +
                                  " MiB): use a larger chunk size");
  return text;
}

// Writes the seal and the manifest next to the blobs in `tmp` and publishes it as `output`.
void commit(const Manifest& m, const trust::SigningKey* key, TempDir& tmp, const fs::path& output,
            bool force) {
  const std::string text = serialize_checked(m);
  write_private_file(tmp.path(), kSealName, make_seal(text, key));
  write_private_file(tmp.path(), kManifestName, text);
  fsync_dir(tmp.path());
  publish(tmp, output, force);
}

}  // namespace

TransferResult pack(const fs::path& input, const fs::path& output, const PackOptions& opts) {
  validate_request(input, output, opts);
  // Before any work: a key we cannot use should not cost a whole dump.
  const std::optional<trust::SigningKey> key = load_signing_key(opts.sign_key);

  TransferResult res;
  Timeline& tl = res.timeline;
  InputTree tree;
  {
    auto s = tl.scope(stage::kScan);
    tree = scan_input(input);
  }
  Manifest m = new_manifest(input, tree.single_file, opts);
  const PackPlan plan = plan_entries(tree, opts, m);
  const unsigned threads = resolve_threads(opts.threads);
  const std::size_t buf_bytes = slot_buffer_bytes(largest_range(plan.ranges));
  const unsigned slots =
      resolve_slots(opts.inflight_chunks, threads, buf_bytes, plan.ranges.size());

  TempDir tmp = make_temp_checkpoint(output, opts);
  // A signature covers the data only through digests it can rely on: BLAKE2b per chunk.
  const bool digest = key.has_value();
  BlobWriter sink(tmp.path(), plan.chunks, m, opts.direct_io, opts.max_blob_bytes, digest);
  // Only when asked for: by default the output does not depend on the threads' timing.
  std::atomic<std::uint64_t> skipped{0};
  const PipelineStats ps = compress_into(
      plan, make_config(opts, threads, slots, buf_bytes, plan.raw_total), opts.zstd_level, sink,
      opts.compression == Compression::kAdaptive ? &skipped : nullptr);
  add_pipeline_stages(tl, ps, stage::kCompressWrite, stage::kCompress, plan.raw_total,
                      sink.stored(), true);
  tl.add(stage::kSync, sink.sync_start, sink.sync_end);
  fault_point(fault::kPackCommit);  // every blob written, nothing published
  {
    auto s = tl.scope(stage::kCommit);
    commit(m, key ? &*key : nullptr, tmp, output, opts.force);
  }
  res.raw_bytes = plan.raw_total;
  res.compressed_bytes = sink.stored();
  res.skipped_compression_bytes = skipped.load();
  res.chunks = plan.chunks.size();
  res.files = m.entries.size();
  res.direct_io = sink.direct_used();
  fill_result(res, ps, threads, slots, buf_bytes);
  spdlog::debug("pack: {} chunks, {} slots, io_uring={}, fixed buffers={}, direct reads={}",
                plan.chunks.size(), slots, ps.uring, ps.fixed_buffers, ps.direct_reads);
  return res;
}

}  // namespace gpuckpt
