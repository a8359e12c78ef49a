#include "image/transfer_common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/support.h"
#include "image/aligned_buffer.h"
#include "image/chunk_codec.h"
#include "image/publish.h"
#include "util/fs.h"
#include "util/unique_fd.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;

namespace gpuckpt {

const char* compression_name(Compression c) {
  return c == Compression::kAlways ? "always" : c == Compression::kAdaptive ? "adaptive" : "auto";
}

bool compression_adapts(Compression c, bool network_copy) {
  return c == Compression::kAdaptive || (c == Compression::kAuto && !network_copy);
}

}  // namespace gpuckpt

namespace gpuckpt::image {

unsigned resolve_threads(unsigned requested) {
  if (requested) return requested;
  return std::min(usable_cpus(), kMaxAutoThreads);
}

std::size_t slot_buffer_bytes(std::uint32_t chunk_bytes) {
  return static_cast<std::size_t>(align_up(chunk_bytes) + 2 * kIoAlign);
}

unsigned resolve_slots(unsigned requested, unsigned threads, std::size_t buffer_bytes,
                       std::uint64_t chunks) {
  std::uint64_t n = requested;
  if (n == 0) {
    // Every worker holding a chunk (twice over, so none waits on the reorder point) plus
    // enough reads and writes in flight to keep an NVMe queue busy.
    n = 2ull * threads + 8;
    n = std::min<std::uint64_t>(n,
                                std::max<std::uint64_t>(4, kAutoBufferBudget / (2 * buffer_bytes)));
  }
  n = std::min<std::uint64_t>(n, std::max<std::uint64_t>(chunks, 1));
  return static_cast<unsigned>(std::max<std::uint64_t>(n, 2));
}

void validate_io_options(unsigned threads, unsigned queue_depth, unsigned inflight) {
  if (threads > 1024) throw Error(Errc::kUsage, "threads must be at most 1024");
  if (queue_depth < 1 || queue_depth > 4096)
    throw Error(Errc::kUsage, "queue depth must be between 1 and 4096");
  if (inflight > 4096) throw Error(Errc::kUsage, "in-flight chunks must be at most 4096");
}

void add_pipeline_stages(Timeline& t, const PipelineStats& s, const std::string& overall,
                         const std::string& work, std::uint64_t raw, std::uint64_t stored,
                         bool has_write) {
  using TP = PipelineStats::Clock::time_point;
  auto window = [&](const std::string& name, TP a, TP b, std::uint64_t bytes) {
    if (a != TP{} && b >= a) t.add(name, a, b, bytes);
  };
  t.add(overall, s.start, s.end, raw);
  window(stage::kRead, s.read_first, s.read_last, s.bytes_read);
  window(work, s.work_first, s.work_last, raw);
  if (has_write) window(stage::kWrite, s.sink_first, s.sink_last, stored);
}

void fill_result(TransferResult& r, const PipelineStats& s, unsigned threads, unsigned slots,
                 std::size_t buffer_bytes) {
  r.threads = threads;
  r.buffer_bytes = 2ull * slots * align_up(buffer_bytes);
  r.worker_busy_seconds = s.worker_busy_seconds;
  r.io_uring = s.uring;
}

bool looks_cached(const std::filesystem::path& path, std::uint64_t size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;  // the reader reports the error
  char page[4096];
  for (const std::uint64_t off : {std::uint64_t{0}, align_down(size / 2), align_down(size - 1)}) {
    iovec iov{page, sizeof page};
    if (::preadv2(fd.get(), &iov, 1, static_cast<off_t>(off), RWF_NOWAIT) <= 0) return false;
  }
  return true;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void validate_pack_options(const PackOptions& o) {
  if (o.chunk_bytes % kIoAlign != 0 || o.chunk_bytes < (64u << 10) || o.chunk_bytes > (256u << 20))
    throw Error(Errc::kUsage, "chunk size must be a multiple of 4 KiB between 64 KiB and 256 MiB");
  if (o.zstd_level < min_zstd_level() || o.zstd_level > max_zstd_level())
    throw Error(Errc::kUsage, "zstd level must be between " + std::to_string(min_zstd_level()) +
                                  " and " + std::to_string(max_zstd_level()));
  if (o.max_blob_bytes < o.chunk_bytes)
    throw Error(Errc::kUsage, "maximum blob size must be at least the chunk size");
  validate_io_options(o.threads, o.queue_depth, o.inflight_chunks);
}

const nlohmann::json& checked_extra(const nlohmann::json& extra) {
  if (!extra.is_null() && !extra.is_object())
    throw Error(Errc::kUsage, "extra metadata must be a JSON object");
  return extra;
}

bool is_within(const fs::path& inner, const fs::path& outer) {
  const fs::path a = fs::weakly_canonical(inner), b = fs::weakly_canonical(outer);
  auto [ib, ob] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return ob == b.end();
}

// Checkpoints hold a process's memory (keys, tokens, user data): readable by the owner only,
// whatever the umask. `dir` is private (0700), so the fixed temporary name cannot clash.
void write_private_file(const fs::path& dir, const char* name, const std::string& data) {
  const fs::path path = dir / name, tmp = dir / (std::string(".") + name + ".tmp");
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) throw_errno(Errc::kIo, "create ", tmp);
  if (::fchmod(fd.get(), 0600) != 0) throw_errno(Errc::kIo, "chmod ", tmp);
  if (const int err = write_fully(fd.get(), data.data(), data.size()))
    throw_syserr(Errc::kIo, err, "write ", tmp);
  if (::fsync(fd.get()) != 0) throw_errno(Errc::kIo, "fsync ", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw_errno(Errc::kIo, "rename to ", path);
}

// --force may replace a previous checkpoint or an empty directory, never arbitrary data.
void check_pack_output(const fs::path& output, bool force) {
  std::error_code ec;
  const auto st = fs::symlink_status(output, ec);
  if (fs::exists(st)) {
    if (!force)
      throw Error(Errc::kExists,
                  "output " + output.string() + " already exists (use --force to replace it)");
    if (!(fs::is_directory(st) && (fs::exists(output / kManifestName, ec) || is_empty_dir(output))))
      throw Error(Errc::kExists,
                  "output " + output.string() +
                      " exists and is not a gpuckpt checkpoint; refusing to replace it");
  }
  const fs::path parent = output.parent_path().empty() ? fs::path(".") : output.parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error(Errc::kInvalidInput, "output directory " + parent.string() + " does not exist");
}

// Missing or truncated blobs are reported up front, by name, before any work starts.
void check_blobs(const Manifest& m, const fs::path& ckpt) {
  for (const auto& b : m.blobs) {
    const fs::path p = ckpt / b.name;
    struct stat st {};
    // lstat: a symlink may lead anywhere (/dev/zero); a blob is a plain file.
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT)
        throw Error(Errc::kCorrupt,
                    "checkpoint " + ckpt.string() + " is damaged: blob " + b.name + " is missing");
      throw_errno(Errc::kIo, "stat ", p);
    }
    if (!S_ISREG(st.st_mode))
      throw Error(Errc::kCorrupt, "checkpoint " + ckpt.string() + " is damaged: blob " + b.name +
                                      " is not a regular file" +
                                      (S_ISLNK(st.st_mode) ? " (a symbolic link)" : ""));
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size < b.size)
      throw Error(Errc::kCorrupt, "checkpoint " + ckpt.string() + " is damaged: blob " + b.name +
                                      " is truncated (" + std::to_string(size) + " of " +
                                      std::to_string(b.size) + " bytes)");
    if (size > b.size)
      throw Error(Errc::kCorrupt, "checkpoint " + ckpt.string() + " is damaged: blob " + b.name +
                                      " is larger than recorded (" + std::to_string(size) +
                                      " bytes, manifest says " + std::to_string(b.size) + ")");
  }
}

const std::byte* check_and_decode(const ChunkRecord& rec, const std::byte* stored, std::byte* out,
                                  Decompressor& dec,
                                  const std::function<void(const std::string&)>& corrupt) {
  auto fail = [&](const std::string& why) {
    corrupt(why);
    throw Error(Errc::kCorrupt, why);  // corrupt() is meant to throw its own, naming the chunk
  };
  if (xxh3(stored, rec.stored) != rec.xxh3) fail("stored bytes fail their xxh3 checksum");
  if (rec.has_blake2b && blake2b(stored, rec.stored) != rec.blake2b)
    fail("stored bytes fail their blake2b digest");
  if (rec.codec != Codec::kZstd) return stored;
  const std::string err = dec.decompress(stored, rec.stored, out, rec.raw);
  if (!err.empty()) fail(err);
  return out;
}

}  // namespace gpuckpt::image
