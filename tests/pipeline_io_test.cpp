// The streaming machinery on its own: the io_uring layer (and its pread/pwrite fallback),
// in-order delivery to the sink whatever order workers finish in, and failure propagation.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "image/aligned_buffer.h"
#include "image/async_io.h"
#include "image/pipeline.h"
#include "image/transfer_common.h"
#include "test_support.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace gpuckpt::image;

namespace {

class AsyncIoTest : public ::testing::TestWithParam<bool> {
 protected:
  AsyncIo::Config config(std::span<const iovec> bufs = {}) {
    AsyncIo::Config c;
    c.depth = 4;
    c.buffers = bufs;
    c.allow_uring = GetParam();
    return c;
  }
  std::vector<IoResult> drain(AsyncIo& io) {
    std::vector<IoResult> out;
    io.drain(out);
    return out;
  }
};

TEST_P(AsyncIoTest, WritesOutOfOrderThenReadsBackWithRegisteredBuffers) {
  auto dir = test::scratch_dir();
  const fs::path p = dir.path() / "f";
  bool direct = false;
  UniqueFd fd(open_maybe_direct(p, O_RDWR | O_CREAT, 0644, true, &direct));
  ASSERT_TRUE(fd);
  constexpr std::size_t kBlock = 64 << 10;
  AlignedBuffer a(4 * kBlock), b(4 * kBlock);
  std::mt19937 rng(1);
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = static_cast<std::byte>(rng());
  const iovec iov[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  AsyncIo io(config(iov));
  EXPECT_EQ(io.uring(), GetParam());
  if (GetParam()) {
    EXPECT_TRUE(io.fixed_buffers()) << "registration failed (running as root?)";
  }
  for (int blk : {3, 1, 0, 2}) {  // four writes in flight, out of order
    IoRequest w;
    w.kind = IoRequest::Kind::kWrite;
    w.fd = fd.get();
    w.buf = a.data() + blk * kBlock;
    w.len = kBlock;
    w.offset = blk * kBlock;
    w.buf_index = 0;
    w.tag = static_cast<std::uint64_t>(blk);
    io.submit(w);
  }
  if (GetParam()) {
    EXPECT_TRUE(io.full());  // the fallback completes inside submit()
  }
  auto done = drain(io);
  ASSERT_EQ(done.size(), 4u);
  for (const auto& r : done) EXPECT_EQ(r.res, static_cast<std::int64_t>(kBlock)) << r.req.tag;

  IoRequest s;
  s.kind = IoRequest::Kind::kFsync;
  s.fd = fd.get();
  io.submit(s);
  done = drain(io);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].res, 0);

  IoRequest r;
  r.kind = IoRequest::Kind::kRead;
  r.fd = fd.get();
  r.buf = b.data();
  r.len = static_cast<std::uint32_t>(b.size());
  r.buf_index = 1;
  io.submit(r);
  done = drain(io);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].res, static_cast<std::int64_t>(b.size()));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
}

TEST_P(AsyncIoTest, DirectReadOfAnUnalignedTailEndsAtEof) {
  auto dir = test::scratch_dir();
  const fs::path p = dir.path() / "f";
  test::write_test_file(p, 10000, 3);
  bool direct = false;
  UniqueFd fd(open_maybe_direct(p, O_RDONLY, 0, true, &direct));
  ASSERT_TRUE(fd);
  AlignedBuffer buf(16384);
  AsyncIo io(config());
  IoRequest r;
  r.fd = fd.get();
  r.buf = buf.data();
  r.len = 12288;      // aligned request past the end
  r.min_len = 10000;  // what must arrive
  io.submit(r);
  auto done = drain(io);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].res, 10000);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf.data()), 10000), read_file(p));
}

TEST_P(AsyncIoTest, FailuresComeBackAsNegativeErrno) {
  auto dir = test::scratch_dir();
  test::write_test_file(dir.path() / "f", 4096, 1);
  UniqueFd fd(::open((dir.path() / "f").c_str(), O_RDONLY | O_CLOEXEC));
  AlignedBuffer buf(4096);
  AsyncIo io(config());
  IoRequest w;
  w.kind = IoRequest::Kind::kWrite;
  w.fd = fd.get();  // read-only
  w.buf = buf.data();
  w.len = 4096;
  io.submit(w);
  auto done = drain(io);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].res, -EBADF);
}

INSTANTIATE_TEST_SUITE_P(Engine, AsyncIoTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "IoUring" : "Pread"; });

// --- the pipeline ---------------------------------------------------------------------------

constexpr std::uint32_t kRange = 8192;

// Copies the chunk to the output buffer, finishing in a scrambled order.
class SlowWorker : public ChunkWorker {
 public:
  explicit SlowWorker(int fail_at = -1) : fail_at_(fail_at) {}
  void process(Slot& s) override {
    if (static_cast<int>(s.seq) == fail_at_) throw Error(Errc::kCorrupt, "worker saw bad chunk");
    std::this_thread::sleep_for(std::chrono::microseconds((s.seq * 7919) % 5 * 300));
    std::memcpy(s.out, s.chunk(), s.in_len);
    s.data = s.out;
    s.data_len = s.in_len;
    s.data_index = s.out_index();
  }

 private:
  int fail_at_;
};

// Records the order and content it is given.
class RecordingSink : public ChunkSink {
 public:
  explicit RecordingSink(int fail_at = -1) : fail_at_(fail_at) {}
  std::uint64_t consume(Slot& s, SinkIo&) override {
    if (static_cast<int>(s.seq) == fail_at_) throw Error(Errc::kIo, "sink cannot write");
    order.push_back(s.seq);
    content.append(reinterpret_cast<const char*>(s.data), s.data_len);
    return s.data_len;
  }
  void on_complete(const IoResult&, SinkIo&) override {}
  std::vector<std::uint64_t> order;
  std::string content;

 private:
  int fail_at_;
};

struct PipelineFixture {
  TempDir dir = test::scratch_dir();
  std::vector<ReadSource> sources;
  std::vector<ReadRange> ranges;
  PipelineConfig cfg;
  PipelineFixture(std::uint64_t size, bool direct) {
    const fs::path p = dir.path() / "in";
    test::write_test_file(p, size, 5);
    sources.push_back({p, "input " + p.string(), direct});
    for (std::uint64_t off = 0; off < size; off += kRange)
      ranges.push_back(
          {0, off, static_cast<std::uint32_t>(std::min<std::uint64_t>(kRange, size - off))});
    cfg.workers = 3;
    cfg.slots = 5;
    cfg.buffer_bytes = 4 * kRange;
    cfg.queue_depth = 2;
  }
};

TEST(Pipeline, SinkSeesChunksInSequenceOrder) {
  PipelineFixture st(100 * kRange + 123, true);
  RecordingSink sink;
  const auto stats = run_pipeline(
      st.cfg, st.sources, st.ranges, [] { return std::make_unique<SlowWorker>(); }, sink);
  ASSERT_EQ(sink.order.size(), st.ranges.size());
  for (std::size_t i = 0; i < sink.order.size(); ++i) ASSERT_EQ(sink.order[i], i);
  EXPECT_EQ(sink.content, read_file(st.sources[0].path));
  EXPECT_EQ(stats.bytes_read, 100 * kRange + 123);
  EXPECT_GT(stats.worker_busy_seconds, 0);
}

TEST(Pipeline, AWorkerErrorStopsEverythingAndSurfaces) {
  PipelineFixture st(200 * kRange, false);
  RecordingSink sink;
  try {
    run_pipeline(
        st.cfg, st.sources, st.ranges, [] { return std::make_unique<SlowWorker>(50); }, sink);
    FAIL() << "the worker's error must propagate";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kCorrupt);
    EXPECT_STREQ(e.what(), "worker saw bad chunk");
  }
  EXPECT_LT(sink.order.size(), 50u + st.cfg.slots);
}

TEST(Pipeline, ASinkErrorStopsEverythingAndSurfaces) {
  PipelineFixture st(200 * kRange, true);
  RecordingSink sink(20);
  try {
    run_pipeline(
        st.cfg, st.sources, st.ranges, [] { return std::make_unique<SlowWorker>(); }, sink);
    FAIL() << "the sink's error must propagate";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kIo);
  }
  EXPECT_EQ(sink.order.size(), 20u);
}

TEST(Pipeline, ASourceShorterThanItsRangesIsAnError) {
  PipelineFixture st(10 * kRange, true);
  st.ranges.push_back({0, 10 * kRange, kRange});  // past the end
  st.cfg.short_read_errc = Errc::kCorrupt;
  RecordingSink sink;
  try {
    run_pipeline(
        st.cfg, st.sources, st.ranges, [] { return std::make_unique<SlowWorker>(); }, sink);
    FAIL() << "a short source must be reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("ends early"), std::string::npos) << e.what();
  }
}

// The pipeline's buffers are most of what a dump adds to the host's memory, which must stay
// under 512 MiB on a node with many CPUs as on this machine's two. The rest was
// 74 MiB on 16 CPUs (394 MiB in all, docs/PERFORMANCE.md); 96 MiB leaves room for more workers'
// zstd contexts.
TEST(Pipeline, AutoSizedBuffersStayInsideTheirBudgetWhateverTheCpuCount) {
  static_assert(kAutoBufferBudget + (96ull << 20) <= (512ull << 20),
                "the buffers' budget leaves no room for the rest of a dump's memory");
  const std::size_t buf = slot_buffer_bytes(4u << 20);
  for (unsigned threads : {1u, 2u, 16u, 32u, 64u, 1024u}) {
    const unsigned slots = resolve_slots(0, threads, buf, ~0ull);
    EXPECT_LE(2ull * slots * buf, kAutoBufferBudget) << threads << " threads";
    // 16 workers (the most measured, docs/PERFORMANCE.md) keep all the slots they had.
    EXPECT_GE(slots, std::min(2u * threads + 8, 40u)) << "too few slots to keep the workers busy";
  }
  // A small job never holds more slots than it has chunks.
  EXPECT_EQ(resolve_slots(0, 32, buf, 3), 3u);
  EXPECT_EQ(resolve_slots(7, 32, buf, ~0ull), 7u);  // asked for: as asked
}

// A container's cpuset, not the host's CPU count: one allowed CPU means one worker.
TEST(Pipeline, DefaultWorkersFollowTheCpusThisProcessMayUse) {
  EXPECT_LE(resolve_threads(0), kMaxAutoThreads);
  EXPECT_EQ(resolve_threads(0), std::min(usable_cpus(), kMaxAutoThreads));
  EXPECT_EQ(resolve_threads(5), 5u);
  unsigned narrowed = 0;
  int err = 0;
  // The affinity mask is per thread: narrowing this one leaves the test's others alone.
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    if (::sched_setaffinity(0, sizeof one, &one) != 0) err = errno;
    narrowed = resolve_threads(0);
  }).join();
  ASSERT_EQ(err, 0) << std::strerror(err);
  EXPECT_EQ(narrowed, 1u);
}

}  // namespace
