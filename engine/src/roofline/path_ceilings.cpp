// The checkpoint path's ceilings (gpuckpt/roofline.h, PathCeilings): the disk, zstd per core,
// memory fill and copy, measured here the way gpuckpt itself moves the bytes.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "gpuckpt/bench.h"
#include "gpuckpt/error.h"
#include "gpuckpt/roofline.h"
#include "gpuckpt/support.h"
#include "image/aligned_buffer.h"
#include "image/async_io.h"
#include "image/chunk_codec.h"
#include "image/stream_pack.h"
#include "remote/ssh.h"
#include "util/no_sigpipe.h"
#include "util/pipe.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;

namespace gpuckpt {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kBlock = 4u << 20;  // gpuckpt's chunk size, and its I/O size
constexpr unsigned kDepth = 8;            // requests in flight, as the pipeline keeps them

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A temporary file in the measured directory, removed however the measurement ends: it is
// unlinked as soon as it exists (an interrupt or a kill leaves nothing), and reopened through
// /proc/self/fd with the flags each measurement needs.
class ScratchFile {
 public:
  explicit ScratchFile(const fs::path& dir) {
    std::string tmpl = (dir / ".gpuckpt-floor-XXXXXX").string();
    fd_.reset(::mkostemp(tmpl.data(), O_CLOEXEC));
    if (!fd_) throw_errno(Errc::kIo, "create a scratch file in ", dir);
    if (::unlink(tmpl.c_str()) != 0) throw_errno(Errc::kIo, "unlink ", tmpl);
    name_ = std::move(tmpl);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  // Another open file of it, with `flags` (the file has no name left to open).
  UniqueFd reopen(int flags) const {
    return UniqueFd(::open(("/proc/self/fd/" + std::to_string(fd_.get())).c_str(), flags));
  }
  const std::string& name() const { return name_; }  // for messages: where it was made

 private:
  UniqueFd fd_;
  std::string name_;
};

// `bytes` through O_DIRECT in kBlock requests, kDepth in flight; returns the seconds taken.
double direct_io(const ScratchFile& file, bool write, std::uint64_t bytes,
                 std::vector<image::AlignedBuffer>& bufs) {
  const std::string& path = file.name();
  UniqueFd fd = file.reopen((write ? O_WRONLY : O_RDONLY) | O_DIRECT | O_CLOEXEC);
  if (!fd && errno == EINVAL)  // no O_DIRECT on this filesystem: what gpuckpt falls back to
    fd = file.reopen((write ? O_WRONLY : O_RDONLY) | O_CLOEXEC);
  if (!fd) throw_errno(Errc::kIo, "open ", path);
  if (!write) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  image::AsyncIo::Config cfg;
  cfg.depth = kDepth;
  image::AsyncIo io(cfg);
  std::vector<image::IoResult> done;
  const auto t0 = Clock::now();
  std::uint64_t off = 0;
  unsigned next_buf = 0;
  auto check = [&] {
    for (const auto& r : done)
      if (r.res < 0) throw_syserr(Errc::kIo, -r.res, write ? "write " : "read ", path);
    done.clear();
  };
  while (off < bytes) {
    while (io.full()) {
      io.reap(true, done);
      check();
    }
    image::IoRequest rq;
    rq.kind = write ? image::IoRequest::Kind::kWrite : image::IoRequest::Kind::kRead;
    rq.fd = fd.get();
    rq.buf = bufs[next_buf++ % bufs.size()].data();
    rq.len = static_cast<std::uint32_t>(std::min<std::uint64_t>(kBlock, bytes - off));
    rq.offset = off;
    io.submit(rq);
    io.flush();
    off += rq.len;
  }
  io.drain(done);
  check();
  // Durable is what a checkpoint has to be: a disk that caches writes pays here.
  if (write && ::fdatasync(fd.get()) != 0) throw_errno(Errc::kIo, "fdatasync ", path);
  return seconds_since(t0);
}

// The memory fill, `tries` tries of touch_fresh_memory. The first is what a restore meets:
// memory as the allocator hands it out, which on a VM with free page reporting has often gone
// back to the host, so that each first touch costs a host fault as well. The best of the tries is
// the same memory rewarmed (freed a moment before): what a restore right after another process's
// end may get, not a floor for one on an idle node.
struct Fill {
  double first = 0, best = 0;
};

Fill fill_gbps(std::size_t bytes, bool huge, unsigned threads, int tries) {
  Fill f;
  for (int rep = 0; rep < tries; ++rep) {
    const auto gbps = touch_fresh_memory(bytes, huge, threads);
    if (!gbps) return {};  // no THP on this kernel
    if (rep == 0) f.first = *gbps;
    f.best = std::max(f.best, *gbps);
  }
  return f;
}

double memcpy_gbps(std::size_t bytes) {
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes, std::byte{2});
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    // The copy's result is read, so it cannot be optimised away.
    const volatile std::byte last = b[bytes - 1];
    (void)last;
    best = std::max(best, static_cast<double>(bytes) / seconds_since(t0) / 1e9);
  }
  return best;
}

// Chunks to compress: of a checkpoint's largest file, of a file, or generated.
std::vector<std::vector<std::byte>> sample_chunks(const fs::path& sample, std::string& what) {
  constexpr std::size_t kChunks = 16;
  std::vector<std::vector<std::byte>> out;
  if (sample.empty()) {
    SampleContent content(7);
    for (std::size_t i = 0; i < kChunks; ++i) {
      std::vector<std::byte> c(kBlock);
      content.fill(c, i % 2 == 0);
      out.push_back(std::move(c));
    }
    what = "generated: half incompressible, half fp16-like";
    return out;
  }
  std::error_code ec;
  if (fs::exists(sample / image::kManifestName, ec)) {
    const image::CheckpointSource src(sample);
    const image::ManifestEntry* largest = nullptr;
    for (const auto& e : src.manifest().entries)
      if (e.type == EntryType::kFile && (!largest || e.size > largest->size)) largest = &e;
    if (!largest || largest->chunks.empty())
      throw Error(Errc::kInvalidInput, "checkpoint " + sample.string() + " holds no data");
    const std::size_t n = largest->chunks.size(), take = std::min(n, kChunks);
    for (std::size_t i = 0; i < take; ++i) out.push_back(src.raw_chunk(*largest, i * n / take));
    what = "checkpoint " + sample.string() + ", " + std::to_string(take) + " chunks of '" +
           largest->path + "'";
    return out;
  }
  UniqueFd fd(::open(sample.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw_errno(Errc::kInvalidInput, "open the zstd sample ", sample);
  const off_t size = ::lseek(fd.get(), 0, SEEK_END);
  if (size <= 0)
    throw Error(Errc::kInvalidInput, "the zstd sample " + sample.string() + " is empty");
  const std::size_t take =
      std::max<std::size_t>(1, std::min(kChunks, static_cast<std::size_t>(size) / kBlock));
  for (std::size_t i = 0; i < take; ++i) {
    std::vector<std::byte> c(std::min<std::size_t>(kBlock, static_cast<std::size_t>(size)));
    const off_t at = static_cast<off_t>(static_cast<std::uint64_t>(size - c.size()) * i / take);
    const ssize_t r = ::pread(fd.get(), c.data(), c.size(), at);
    if (r < 0) throw_errno(Errc::kIo, "read ", sample);
    c.resize(static_cast<std::size_t>(r));
    out.push_back(std::move(c));
  }
  what = "file " + sample.string() + ", " + std::to_string(take) + " chunks";
  return out;
}

void measure_zstd(PathCeilings& p, const fs::path& sample, int level) {
  const auto chunks = sample_chunks(sample, p.sample);
  image::Compressor comp(level);
  image::Decompressor dec;
  std::uint64_t raw = 0, stored = 0;
  // Buffers touched before the clock runs: a first touch is the fill's ceiling, not zstd's.
  std::vector<std::byte> out(kBlock + 4096, std::byte{1});
  std::vector<std::vector<std::byte>> frames;
  double tc = 0;
  for (const auto& c : chunks) {
    const auto t0 = Clock::now();
    const std::size_t n = comp.compress(c.data(), c.size(), out.data(), c.size());
    tc += seconds_since(t0);
    raw += c.size();
    stored += n ? n : c.size();  // 0: stored raw, as gpuckpt does
    frames.emplace_back(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
  }
  double td = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (frames[i].empty()) continue;  // raw chunks are not decompressed on restore
    const auto t0 = Clock::now();
    const std::string err =
        dec.decompress(frames[i].data(), frames[i].size(), out.data(), chunks[i].size());
    td += seconds_since(t0);
    if (!err.empty()) throw Error(Errc::kInternal, "zstd sample: " + err);
  }
  p.zstd_level = level;
  p.zstd_ratio = stored ? static_cast<double>(raw) / static_cast<double>(stored) : 1;
  p.zstd_compress_gbps = tc > 0 ? static_cast<double>(raw) / tc / 1e9 : 0;
  p.zstd_decompress_gbps = td > 0 ? static_cast<double>(raw) / td / 1e9 : 0;
}

// Bytes from memory through ssh into /dev/null on the target: the link's ceiling, encryption
// included, as a migration's checkpoint travels.
double network_gbps(const PathMeasureOptions& o) {
  auto argv = remote::ssh_command(remote::parse_ssh_url(o.network), o.ssh_config);
  argv.push_back("cat > /dev/null");
  auto [rd, wr] = make_pipe();
  SpawnOptions so;
  so.stdin_fd = rd.get();
  Child ssh = spawn(argv, so);
  rd.reset();
  std::vector<std::byte> buf(kBlock);
  SampleContent(13).fill(buf, true);
  const std::uint64_t bytes = std::min<std::uint64_t>(o.bytes, 512u << 20);
  NoSigpipe nosig;
  const auto t0 = Clock::now();
  for (std::uint64_t sent = 0; sent < bytes;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, bytes - sent));
    if (const int err = write_fully(wr.get(), buf.data(), n)) {
      wr.reset();
      const ExitStatus st = ssh.wait();
      throw_syserr(Errc::kIo, err, "send to ", o.network, " (ssh ", st.describe(), ")");
    }
    sent += n;
  }
  wr.reset();
  const ExitStatus st = ssh.wait();
  if (!st.ok()) throw Error(Errc::kIo, "ssh to " + o.network + " failed: " + st.describe());
  return static_cast<double>(bytes) / seconds_since(t0) / 1e9;
}

}  // namespace

PathCeilings measure_path_ceilings(const PathMeasureOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.dir, ec))
    throw Error(Errc::kInvalidInput, "directory " + o.dir.string() + " does not exist");
  if (o.bytes < kBlock) throw Error(Errc::kUsage, "the disk measurement needs at least 4 MiB");
  PathCeilings p;
  p.dir = fs::absolute(o.dir).lexically_normal().string();
  p.cores = usable_cpus();
  {
    std::vector<image::AlignedBuffer> bufs;
    SampleContent content(11);
    for (unsigned i = 0; i < kDepth; ++i) {
      bufs.emplace_back(kBlock);
      content.fill({bufs.back().data(), kBlock}, true);
    }
    const std::uint64_t bytes = o.bytes / kBlock * kBlock;
    ScratchFile f(o.dir);
    const double tw = direct_io(f, true, bytes, bufs);
    const double tr = direct_io(f, false, bytes, bufs);
    p.disk_write_gbps = static_cast<double>(bytes) / tw / 1e9;
    p.disk_read_gbps = static_cast<double>(bytes) / tr / 1e9;
  }
  const std::size_t fill = static_cast<std::size_t>(std::min<std::uint64_t>(o.bytes, 512u << 20));
  // Huge pages first, on memory as a restore on an idle node meets it; the 4 KiB fill then
  // reuses memory freed a moment before, so its figure is the kinder one. CRIU reads 4 KiB pages
  // on one thread; a huge-page fill has helper threads as well (scripts/criu-patches/0002: half
  // the CPUs, at most 4, beside the reading thread).
  if (const double s = o.settle_limit_s > 0 ? settle_free_memory(o.settle_limit_s) : 0; s > 0)
    spdlog::debug("waited {:.1f} s for free page reporting before the memory fill", s);
  p.fill_huge_threads = 1 + std::min(4u, p.cores / 2);
  const Fill huge = fill_gbps(fill, true, p.fill_huge_threads, 3);
  p.fill_huge_gbps = huge.first;
  p.fill_huge_warm_gbps = huge.best;
  p.fill_gbps = fill_gbps(fill, false, 1, 1).first;
  p.memcpy_gbps = memcpy_gbps(std::min<std::size_t>(fill, 256u << 20));
  measure_zstd(p, o.sample, o.zstd_level);
  if (!o.network.empty()) p.network_gbps = network_gbps(o);
  spdlog::debug(
      "path ceilings of {}: write {:.2f}, read {:.2f}, fill {:.2f} / {:.2f} huge ({:.2f} "
      "rewarmed), memcpy {:.2f}, zstd {:.2f} / {:.2f} GB/s per core, ratio {:.2f}",
      p.dir, p.disk_write_gbps, p.disk_read_gbps, p.fill_gbps, p.fill_huge_gbps,
      p.fill_huge_warm_gbps, p.memcpy_gbps, p.zstd_compress_gbps, p.zstd_decompress_gbps,
      p.zstd_ratio);
  return p;
}

void path_from_gpu_ceilings(const Ceilings& gpu, PathCeilings& p) {
  const auto& d = gpu.details;
  if (d.is_object() && d.contains("h2d_pinned_gbps") && d["h2d_pinned_gbps"].is_number())
    p.pcie_h2d_gbps = d["h2d_pinned_gbps"].get<double>();
  if (d.is_object() && d.contains("d2h_pinned_gbps") && d["d2h_pinned_gbps"].is_number())
    p.pcie_d2h_gbps = d["d2h_pinned_gbps"].get<double>();
}

}  // namespace gpuckpt
