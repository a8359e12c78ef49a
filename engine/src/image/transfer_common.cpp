#include "image/transfer_common.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <thread>

#include "gpuckpt/error.h"
#include "image/aligned_buffer.h"
#include "util/unique_fd.h"

namespace gpuckpt::image {

unsigned resolve_threads(unsigned requested) {
  if (requested) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
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
  window("read", s.read_first, s.read_last, s.bytes_read);
  window(work, s.work_first, s.work_last, raw);
  if (has_write) window("write", s.sink_first, s.sink_last, stored);
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

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

}  // namespace gpuckpt::image
