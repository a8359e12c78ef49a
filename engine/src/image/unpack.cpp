// gpuckpt::unpack / verify / inspect: blobs -> checksum + zstd workers -> files (or nothing,
// for verify), every chunk and every file checked against the manifest.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "gpuckpt/names.h"
#include "image/aligned_buffer.h"
#include "image/chunk_codec.h"
#include "image/manifest.h"
#include "image/pipeline.h"
#include "image/publish.h"
#include "image/transfer_common.h"
#include "remote/remote_checkpoint.h"
#include "util/fault.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt {

using namespace image;

namespace {

struct UnpackChunk {
  std::uint32_t entry;
  std::uint32_t index;  // within its file
  std::uint64_t file_offset;
  const ChunkRecord* rec;
  bool first, last;
};

struct Plan {
  std::vector<ReadSource> sources;  // the blobs
  std::vector<ReadRange> ranges;
  std::vector<UnpackChunk> chunks;
};

Plan make_plan(const Manifest& m, const fs::path& ckpt, bool direct) {
  Plan p;
  for (const auto& b : m.blobs) {
    const fs::path path = ckpt / b.name;
    p.sources.push_back(
        {path, "blob " + path.string(), direct && b.size > 0 && !looks_cached(path, b.size)});
  }
  for (std::uint32_t i = 0; i < m.entries.size(); ++i) {
    const auto& e = m.entries[i];
    std::uint64_t off = 0;
    for (std::uint32_t k = 0; k < e.chunks.size(); ++k) {
      const ChunkRecord& c = e.chunks[k];
      p.ranges.push_back({c.blob, c.offset, c.stored});
      p.chunks.push_back({i, k, off, &c, k == 0, k + 1 == e.chunks.size()});
      off += c.raw;
    }
  }
  return p;
}

// Buffers must hold the largest chunk in either form (stored <= raw, checked on load).
std::uint32_t largest_chunk(const Manifest& m) {
  std::uint32_t n = 0;
  for (const auto& e : m.entries)
    for (const auto& c : e.chunks) n = std::max(n, c.raw);
  return n;
}

[[noreturn]] void chunk_corrupt(const fs::path& ckpt, const Manifest& m, const UnpackChunk& c,
                                const std::string& why) {
  const auto& e = m.entries[c.entry];
  throw Error(Errc::kCorrupt, "checkpoint " + ckpt.string() + " is corrupt: chunk " +
                                  std::to_string(c.index) + " of '" + e.path + "' (" +
                                  m.blobs[c.rec->blob].name + " at offset " +
                                  std::to_string(c.rec->offset) + "): " + why);
}

class UnpackWorker : public ChunkWorker {
 public:
  UnpackWorker(const Plan& p, const Manifest& m, const fs::path& ckpt)
      : plan_(p), m_(m), ckpt_(ckpt) {}
  void process(Slot& s) override {
    const UnpackChunk& c = plan_.chunks[s.seq];
    const ChunkRecord& r = *c.rec;
    const std::byte* d = check_and_decode(r, s.chunk(), s.out, dec_, [&](const std::string& why) {
      chunk_corrupt(ckpt_, m_, c, why);
    });
    s.data = d == s.out ? s.out : s.chunk();
    s.data_index = d == s.out ? s.out_index() : s.in_index();
    s.data_len = r.raw;
    s.codec = r.codec;
  }

 private:
  const Plan& plan_;
  const Manifest& m_;
  const fs::path& ckpt_;
  Decompressor dec_;
};

// Hashes every file in order and compares with the manifest; the base of both sinks.
class HashingSink : public ChunkSink {
 public:
  HashingSink(const Plan& p, const Manifest& m, const fs::path& ckpt)
      : plan_(p), m_(m), ckpt_(ckpt) {}

 protected:
  void hash_chunk(const Slot& s, const UnpackChunk& c) {
    if (c.first) hash_.reset();
    hash_.update(s.data, s.data_len);
    if (c.last && hash_.digest() != m_.entries[c.entry].xxh3) {
      throw Error(Errc::kCorrupt, "checkpoint " + ckpt_.string() + " is corrupt: content of '" +
                                      m_.entries[c.entry].path +
                                      "' does not match its xxh3 in the manifest");
    }
  }
  const Plan& plan_;
  const Manifest& m_;
  const fs::path& ckpt_;
  StreamHash hash_;
};

class VerifySink : public HashingSink {
 public:
  using HashingSink::HashingSink;
  std::uint64_t consume(Slot& s, SinkIo&) override {
    hash_chunk(s, plan_.chunks[s.seq]);
    return s.data_len;
  }
  void on_complete(const IoResult&, SinkIo&) override {}
};

// Writes files under `root` (the temporary output tree): O_DIRECT where the chunk layout
// allows it, padded last block cut back by ftruncate, fsync per file once its data is in.
class TreeSink : public HashingSink {
 public:
  TreeSink(const Plan& p, const Manifest& m, const fs::path& ckpt, const fs::path& root,
           bool direct)
      : HashingSink(p, m, ckpt), root_(root), files_(m.entries.size()) {
    direct_ = direct && m.chunk_bytes % kIoAlign == 0;
  }

  std::uint64_t consume(Slot& s, SinkIo& io) override {
    const UnpackChunk& c = plan_.chunks[s.seq];
    FileState& f = files_[c.entry];
    const ManifestEntry& e = m_.entries[c.entry];
    if (c.first) open_file(f, e);
    hash_chunk(s, c);
    std::byte* data = s.data;
    int index = s.data_index;
    std::uint64_t len = s.data_len;
    if (f.direct) {
      if (reinterpret_cast<std::uintptr_t>(data) % kIoAlign != 0) {
        std::memmove(s.out, data, s.data_len);  // a raw chunk at an unaligned blob offset
        data = s.out;
        index = s.out_index();
      }
      len = align_up(len);  // the tail past the file's end is cut by ftruncate
    }
    IoRequest w;
    w.kind = IoRequest::Kind::kWrite;
    w.fd = f.fd.get();
    w.buf = data;
    w.len = static_cast<std::uint32_t>(len);
    w.offset = c.file_offset;
    w.buf_index = index;
    w.slot = static_cast<int>(s.id);
    w.tag = c.entry;
    ++f.pending;
    io.submit(w);
    if (c.last) f.all_submitted = true;
    return s.data_len;
  }

  void on_complete(const IoResult& r, SinkIo& io) override {
    FileState& f = files_[r.req.tag];
    const fs::path p = root_ / m_.entries[r.req.tag].path;
    if (r.req.kind == IoRequest::Kind::kFsync) {
      if (r.res < 0) throw_syserr(Errc::kIo, -r.res, "fsync ", p);
      f.fd.reset();
      return;
    }
    if (r.res < 0) throw_syserr(Errc::kIo, -r.res, "write ", p);
    if (--f.pending == 0 && f.all_submitted) {
      const auto& e = m_.entries[r.req.tag];
      if (f.direct && ::ftruncate(f.fd.get(), static_cast<off_t>(e.size)) != 0)
        throw_errno(Errc::kIo, "truncate ", p);
      IoRequest sync;
      sync.kind = IoRequest::Kind::kFsync;
      sync.fd = f.fd.get();
      sync.tag = r.req.tag;
      io.submit(sync);
    }
  }

  bool direct_used() const { return direct_used_; }

 private:
  struct FileState {
    UniqueFd fd;
    bool direct = false;
    bool all_submitted = false;
    unsigned pending = 0;
  };

  void open_file(FileState& f, const ManifestEntry& e) {
    const fs::path p = root_ / e.path;
    bool direct = false;
    f.fd.reset(open_maybe_direct(p, O_WRONLY | O_CREAT | O_EXCL, 0600, direct_, &direct));
    if (!f.fd) throw_errno(Errc::kIo, "create ", p);
    f.direct = direct;
    direct_used_ = direct_used_ || direct;
    if (::fchmod(f.fd.get(), e.mode) != 0) throw_errno(Errc::kIo, "chmod ", p);
  }

  fs::path root_;
  bool direct_ = false;
  bool direct_used_ = false;
  std::vector<FileState> files_;
};

void validate(const UnpackOptions& o) {
  validate_io_options(o.threads, o.queue_depth, o.inflight_chunks);
}

// A signature that fails is a manifest changed after signing (or a damaged seal): like a
// failed checksum, nothing is read from such a checkpoint. inspect() still shows it.
void check_signature_intact(const Manifest& m, const fs::path& ckpt) {
  enforce_signature(m.signature, TrustOptions{}, ckpt);
}

// The output is created, or replaces an empty directory, or with `force` any directory (an
// earlier unpack); never a file or whatever a symlink points at.
void check_output(const fs::path& output, bool force) {
  std::error_code ec;
  const auto st = fs::symlink_status(output, ec);
  if (fs::is_symlink(st))
    throw Error(Errc::kExists, "output " + output.string() +
                                   " is a symbolic link; refusing to replace it (name the "
                                   "directory itself)");
  if (fs::exists(st) && !fs::is_directory(st))
    throw Error(Errc::kExists, "output " + output.string() +
                                   " exists and is not a directory; refusing to replace it "
                                   "(--force only replaces a directory, such as an earlier "
                                   "unpack output)");
  if (fs::exists(st) && !force && !is_empty_dir(output))
    throw Error(Errc::kExists, "output " + output.string() +
                                   " already exists and is not empty (use --force to replace it)");
  const fs::path parent = output.parent_path().empty() ? fs::path(".") : output.parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error(Errc::kInvalidInput, "output directory " + parent.string() + " does not exist");
}

// Without --force, an empty directory may stand where the output goes (check_output). It is
// removed only while it is still empty: whatever was put there during the unpack (another
// unpack's output, a user's files) is never replaced without --force.
void take_empty_output(const fs::path& output) {
  if (::rmdir(output.c_str()) == 0 || errno == ENOENT) return;
  const int err = errno;
  if (err == ENOTEMPTY || err == EEXIST || err == ENOTDIR)
    throw Error(Errc::kExists, "output " + output.string() +
                                   " was created or filled while unpacking; nothing was "
                                   "replaced (use --force to replace it)");
  throw_syserr(Errc::kIo, err, "remove the empty directory ", output);
}

// A checkpoint ready to be streamed: manifest, seal and blobs checked, reads planned. The plan
// points into the manifest, so the two live and move together.
struct OpenCheckpoint {
  fs::path path;
  Manifest m;
  Plan plan;
  unsigned threads = 0;
  std::size_t buf_bytes = 0;
  unsigned slots = 0;
};

// The opening shared by unpack and verify; the "manifest" stage covers the checks.
OpenCheckpoint open_checkpoint(const fs::path& checkpoint, const UnpackOptions& opts,
                               Timeline& tl) {
  OpenCheckpoint ck;
  ck.path = checkpoint;
  {
    auto s = tl.scope(stage::kManifest);
    ck.m = load_manifest(checkpoint);
    check_signature_intact(ck.m, checkpoint);
    check_blobs(ck.m, checkpoint);
  }
  ck.plan = make_plan(ck.m, checkpoint, opts.direct_io);
  ck.threads = resolve_threads(opts.threads);
  ck.buf_bytes = slot_buffer_bytes(largest_chunk(ck.m));
  ck.slots = resolve_slots(opts.inflight_chunks, ck.threads, ck.buf_bytes, ck.plan.ranges.size());
  return ck;
}

PipelineConfig make_config(const std::string& phase, const UnpackOptions& o,
                           const OpenCheckpoint& ck) {
  PipelineConfig cfg;
  cfg.phase = phase;
  cfg.workers = ck.threads;
  cfg.slots = ck.slots;
  cfg.buffer_bytes = ck.buf_bytes;
  cfg.queue_depth = o.queue_depth;
  cfg.total_bytes = ck.m.raw_bytes();
  cfg.progress = o.progress;
  cfg.short_read_errc = Errc::kCorrupt;  // a blob shorter than the manifest says
  return cfg;
}

// Reads, checks and decompresses every chunk of `ck` into `sink`.
PipelineStats stream_chunks(const OpenCheckpoint& ck, const std::string& phase,
                            const UnpackOptions& opts, ChunkSink& sink) {
  return run_pipeline(
      make_config(phase, opts, ck), ck.plan.sources, ck.plan.ranges,
      [&] { return std::make_unique<UnpackWorker>(ck.plan, ck.m, ck.path); }, sink);
}

void fill_totals(TransferResult& res, const OpenCheckpoint& ck, const PipelineStats& ps) {
  res.raw_bytes = ck.m.raw_bytes();
  res.compressed_bytes = ck.m.stored_bytes();
  res.chunks = ck.m.chunk_count();
  res.files = ck.m.entries.size();
  res.direct_io = ps.direct_reads;
  fill_result(res, ps, ck.threads, ck.slots, ck.buf_bytes);
}

// The tree is built in a temporary sibling of `output` and published by rename.
TempDir make_temp_tree(const fs::path& output) {
  // The tree's root is ours alone whatever the umask (beside() makes it 0700): entries keep
  // their recorded modes, but nobody else reaches them through it.
  return TempDir::beside(output);
}

// An empty file has no chunk whose checks would catch a wrong hash.
void check_empty_file(const ManifestEntry& e, const fs::path& ckpt) {
  if (e.xxh3 != xxh3(nullptr, 0))
    throw Error(Errc::kCorrupt, "checkpoint " + ckpt.string() + " is corrupt: empty file '" +
                                    e.path + "' has the xxh3 of non-empty content");
}

void create_empty_file(const ManifestEntry& e, const fs::path& p) {
  UniqueFd fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) throw_errno(Errc::kIo, "create ", p);
  if (::fchmod(fd.get(), e.mode) != 0) throw_errno(Errc::kIo, "chmod ", p);
}

// Directories, symlinks and empty files; files with data are created by the sink.
void create_skeleton(const Manifest& m, const fs::path& root, const fs::path& ckpt) {
  for (const auto& e : m.entries) {
    const fs::path p = root / e.path;
    switch (e.type) {
      case EntryType::kDir:
        // Owner-writable until the end so that a read-only directory can still be filled.
        if (::mkdir(p.c_str(), 0700) != 0) throw_errno(Errc::kIo, "mkdir ", p);
        break;
      case EntryType::kSymlink:
        if (::symlink(e.target.c_str(), p.c_str()) != 0) throw_errno(Errc::kIo, "symlink ", p);
        break;
      case EntryType::kFile:
        if (e.chunks.empty()) {
          check_empty_file(e, ckpt);
          create_empty_file(e, p);
        }
        break;
    }
  }
}

// Makes the tree's entries durable and applies directory modes, deepest first.
void finish_dirs(const Manifest& m, const fs::path& root) {
  for (auto it = m.entries.rbegin(); it != m.entries.rend(); ++it) {
    if (it->type != EntryType::kDir) continue;
    const fs::path p = root / it->path;
    fsync_dir(p);
    if (::chmod(p.c_str(), it->mode) != 0) throw_errno(Errc::kIo, "chmod ", p);
  }
  fsync_dir(root);
}

}  // namespace

namespace {

// An s3:// checkpoint, fetched whole into a spool, then read by `fn` like a local one; the
// download is the first stage of the result's timeline.
template <class F>
TransferResult from_remote(const fs::path& checkpoint, const UnpackOptions& opts, F&& fn) {
  remote::TransferOptions to;
  to.progress = opts.progress;
  Timeline tl;
  const auto t0 = Timeline::Clock::now();
  const remote::LocalView view(checkpoint.string(), remote::LocalView::Fetch::kEverything, {}, to);
  tl.add(stage::kDownload, t0, Timeline::Clock::now(), view.stats().bytes);
  TransferResult r = fn(view.path());
  tl.append(r.timeline);
  r.timeline = std::move(tl);
  return r;
}

}  // namespace

TransferResult unpack(const fs::path& checkpoint, const fs::path& output,
                      const UnpackOptions& opts) {
  if (remote::is_s3_url(checkpoint.string())) {
    validate(opts);
    return from_remote(checkpoint, opts,
                       [&](const fs::path& local) { return unpack(local, output, opts); });
  }
  validate(opts);
  if (output.empty()) throw Error(Errc::kUsage, "no output path given");
  TransferResult res;
  Timeline& tl = res.timeline;
  const OpenCheckpoint ck = open_checkpoint(checkpoint, opts, tl);
  check_output(output, opts.force);
  TempDir tmp = make_temp_tree(output);
  {
    auto s = tl.scope(stage::kCreateTree);
    create_skeleton(ck.m, tmp.path(), checkpoint);
  }
  TreeSink sink(ck.plan, ck.m, checkpoint, tmp.path(), opts.direct_io);
  const PipelineStats ps = stream_chunks(ck, "unpack", opts, sink);
  const std::uint64_t raw = ck.m.raw_bytes();
  add_pipeline_stages(tl, ps, stage::kReadDecompress, stage::kDecompress, raw, raw, true);
  fault_point(fault::kUnpackCommit);  // every file written, nothing published
  {
    auto s = tl.scope(stage::kCommit);
    finish_dirs(ck.m, tmp.path());
    if (!opts.force) take_empty_output(output);
    publish(tmp, output, opts.force);
  }
  fill_totals(res, ck, ps);
  return res;
}

TransferResult verify(const fs::path& checkpoint, const UnpackOptions& opts) {
  validate(opts);
  if (remote::is_s3_url(checkpoint.string()))
    return from_remote(checkpoint, opts,
                       [&](const fs::path& local) { return verify(local, opts); });
  TransferResult res;
  const OpenCheckpoint ck = open_checkpoint(checkpoint, opts, res.timeline);
  for (const auto& e : ck.m.entries)
    if (e.type == EntryType::kFile && e.chunks.empty()) check_empty_file(e, checkpoint);
  VerifySink sink(ck.plan, ck.m, checkpoint);
  const PipelineStats ps = stream_chunks(ck, "verify", opts, sink);
  add_pipeline_stages(res.timeline, ps, "verify", "decompress", ck.m.raw_bytes(), 0, false);
  fill_totals(res, ck, ps);
  return res;
}

ImageInfo inspect(const fs::path& checkpoint) {
  if (remote::is_s3_url(checkpoint.string())) {
    const remote::LocalView view(checkpoint.string(), remote::LocalView::Fetch::kManifest);
    return inspect(view.path());
  }
  const Manifest m = load_manifest(checkpoint);
  ImageInfo info;
  info.format_version = m.major;
  info.format_minor = m.minor;
  info.created_by = m.created_by;
  info.created_at = m.created_at;
  info.host = m.host;
  info.source = m.source;
  info.input_kind = m.input_kind;
  info.chunk_bytes = m.chunk_bytes;
  info.zstd_level = m.zstd_level;
  info.raw_bytes = m.raw_bytes();
  info.compressed_bytes = m.stored_bytes();
  info.chunk_count = m.chunk_count();
  info.blob_count = m.blobs.size();
  for (const auto& e : m.entries) {
    FileEntry f;
    f.path = e.path;
    f.type = e.type;
    f.size = e.size;
    f.mode = e.mode;
    f.compressed_size = e.stored_bytes();
    f.chunks = e.chunks.size();
    f.xxh3 = e.xxh3;
    f.target = e.target;
    info.files.push_back(std::move(f));
  }
  info.extra = m.extra;
  info.sealed = m.sealed;
  info.signature = m.signature;
  return info;
}

}  // namespace gpuckpt
