// The streaming writer and reader (image/stream_pack.h) without CRIU: files written
// interleaved, in pieces of any size, make a checkpoint that verify() and unpack() accept
// byte for byte; CheckpointSource serves any file, and refuses a damaged chunk before writing
// any of its bytes.
#include "image/stream_pack.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "image/arrival.h"
#include "image/manifest.h"
#include "remote/ssh.h"
#include "test_support.h"
#include "util/fs.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

std::string random_bytes(std::size_t n, std::uint64_t seed, bool compressible) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(compressible ? (rng() % 4) : rng());
  return s;
}

std::string fd_contents(int fd) {
  std::string out;
  ::lseek(fd, 0, SEEK_SET);
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

struct Pipe {
  UniqueFd rd, wr;
};
Pipe make_pipe() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  return {UniqueFd(p[0]), UniqueFd(p[1])};
}

// `n` feeds into `n` pipes of 64 KiB at once, each `feed(i, fd)` on a thread of its own whose
// write end closes however it ends. Should a test stop early, the read ends close first: a feed
// blocked on its pipe then ends (EPIPE) instead of holding the futures' destructors forever.
class FedAtOnce {
 public:
  FedAtOnce(int n, const std::function<bool(int, int)>& feed) : pipes_(static_cast<size_t>(n)) {
    for (auto& p : pipes_) {
      p = make_pipe();
      if (::fcntl(p.wr.get(), F_SETPIPE_SZ, 65536) != 65536)
        throw std::runtime_error("F_SETPIPE_SZ failed");
    }
    for (int i = 0; i < n; ++i)
      writers_.push_back(std::async(std::launch::async, [this, i, feed] {
        struct Close {
          UniqueFd& fd;
          ~Close() { fd.reset(); }
        } close{pipes_[static_cast<size_t>(i)].wr};
        return feed(i, pipes_[static_cast<size_t>(i)].wr.get());
      }));
  }
  ~FedAtOnce() {
    for (auto& p : pipes_) p.rd.reset();
  }
  // Bytes in the pipe: that feed holds its slots (a file of 40 chunks cannot finish into a
  // 64 KiB pipe before it is read).
  bool readable(int i) const {
    pollfd p{pipes_[static_cast<size_t>(i)].rd.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
  bool all_readable() const {
    for (int i = 0; i < static_cast<int>(pipes_.size()); ++i)
      if (!readable(i)) return false;
    return true;
  }
  // Reads every pipe to its end, side by side; then each feed's result.
  std::vector<std::string> read_all(std::vector<bool>& results) {
    std::vector<std::string> got(pipes_.size());
    std::vector<std::thread> readers;
    for (size_t i = 0; i < pipes_.size(); ++i)
      readers.emplace_back([&, i] {
        char buf[65536];
        for (ssize_t n; (n = ::read(pipes_[i].rd.get(), buf, sizeof buf)) > 0;)
          got[i].append(buf, static_cast<std::size_t>(n));
      });
    for (auto& r : readers) r.join();  // each ends at its write end's close
    for (auto& w : writers_) results.push_back(w.get());
    return got;
  }

 private:
  std::vector<Pipe> pipes_;
  std::vector<std::future<bool>> writers_;
};

class StreamPack : public ::testing::Test {
 protected:
  void SetUp() override {
    files_ = {{"pages-1.img", random_bytes(700 * 1024 + 123, 1, false)},
              {"pagemap-1.img", random_bytes(5000, 2, true)},
              {"core-1.img", random_bytes(64 * 1024, 3, true)},  // exactly one chunk
              {"empty.img", ""}};
    opts_.chunk_bytes = 64u << 10;
    opts_.threads = 2;
    opts_.inflight_chunks = 3;          // the producer must wait for the writer
    opts_.max_blob_bytes = 256u << 10;  // several blobs
  }
  // Writes every file through a StreamPacker, interleaved, in uneven pieces.
  TransferResult write(const fs::path& out, image::PackCopy copy = {}) {
    image::StreamPacker p(out, opts_, dir_.path(), copy);
    std::vector<image::StreamPacker::FileId> ids;
    std::vector<std::size_t> done(files_.size(), 0);
    for (const auto& [name, data] : files_) ids.push_back(p.open(name));
    std::mt19937 rng(7);
    for (bool more = true; more;) {
      more = false;
      for (std::size_t i = 0; i < files_.size(); ++i) {
        const std::string& data = files_[i].second;
        if (done[i] == data.size()) continue;
        more = true;
        auto room = p.space(ids[i]);
        const std::size_t n =
            std::min({room.size(), data.size() - done[i], std::size_t(1 + rng() % 40000)});
        std::memcpy(room.data(), data.data() + done[i], n);
        p.commit(ids[i], n);
        done[i] += n;
      }
    }
    for (auto id : ids) p.close(id);
    EXPECT_EQ(p.open_files(), 0u);
    return p.finish(nlohmann::json::parse(R"({"process":{"pid":1}})"));
  }
  TempDir dir_ = test::scratch_dir("gpuckpt-streampack");
  std::vector<std::pair<std::string, std::string>> files_;
  PackOptions opts_;
};

TEST_F(StreamPack, InterleavedFilesMakeACheckpointThatVerifiesAndUnpacksExactly) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  const TransferResult w = write(ckpt);
  std::uint64_t raw = 0;
  for (const auto& f : files_) raw += f.second.size();
  EXPECT_EQ(w.raw_bytes, raw);
  const ImageInfo info = inspect(ckpt);
  EXPECT_TRUE(info.sealed);
  EXPECT_GT(info.blob_count, 1u);
  EXPECT_EQ(info.extra, nlohmann::json::parse(R"({"process":{"pid":1}})"));
  ASSERT_EQ(info.files.size(), files_.size());
  for (std::size_t i = 1; i < info.files.size(); ++i)  // sorted, as pack writes them
    EXPECT_LT(info.files[i - 1].path, info.files[i].path);
  EXPECT_NO_THROW(verify(ckpt));
  const fs::path out = dir_.path() / "out";
  unpack(ckpt, out);
  for (const auto& [name, data] : files_) EXPECT_EQ(read_file(out / name), data) << name;

  image::CheckpointSource src(ckpt);
  EXPECT_EQ(src.find("missing.img"), nullptr);
  for (const auto& [name, data] : files_) {
    const image::ManifestEntry* e = src.find(name);
    ASSERT_NE(e, nullptr) << name;
    UniqueFd fd(::memfd_create("stream-pack-test", MFD_CLOEXEC));
    EXPECT_TRUE(src.write_to(*e, fd.get()));
    EXPECT_EQ(fd_contents(fd.get()), data) << name;
  }
}

TEST_F(StreamPack, DamagedChunkIsRefusedBeforeAnyOfItsBytesAreWritten) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  image::CheckpointSource probe(ckpt);
  const image::ManifestEntry* e = probe.find("pages-1.img");
  ASSERT_NE(e, nullptr);
  ASSERT_GT(e->chunks.size(), 3u);
  const image::ChunkRecord& c = e->chunks[3];
  {
    std::fstream f(ckpt / probe.manifest().blobs[c.blob].name,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(c.offset + c.stored / 2));
    f.put('\x5a');
  }
  image::CheckpointSource src(ckpt);
  UniqueFd fd(::memfd_create("stream-pack-test", MFD_CLOEXEC));
  try {
    src.write_to(*src.find("pages-1.img"), fd.get());
    FAIL() << "a damaged chunk was served";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::kCorrupt);
    EXPECT_NE(std::string(err.what()).find("chunk 3 of 'pages-1.img'"), std::string::npos)
        << err.what();
  }
  // Only the chunks before the damaged one reached the reader.
  EXPECT_LE(fd_contents(fd.get()).size(), 3u * opts_.chunk_bytes);
}

// A restore from a checkpoint still arriving checks the files it did not read once the restore
// is done; it must say which are damaged among those in, and never wait for the others (a
// migration's downtime would include that wait).
TEST_F(StreamPack, AnArrivingCheckpointChecksTheUnreadFilesThatAreInAndNeverWaitsForTheRest) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  const image::CheckpointSource probe(ckpt);
  const image::Manifest& m = probe.manifest();
  const image::ChunkRecord damaged = probe.find("core-1.img")->chunks.at(0);
  {
    std::fstream f(ckpt / m.blobs[damaged.blob].name,
                   std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(damaged.offset + damaged.stored / 2);
    f.seekg(at);
    const char was = static_cast<char>(f.get());
    f.seekp(at);
    f.put(static_cast<char>(was ^ 0x5a));  // changed, whatever the byte was
  }
  image::BlobArrival arrival(m.blobs.size());
  for (const auto& e : m.entries)
    if (e.path != "pagemap-1.img")
      for (const auto& c : e.chunks) arrival.add(c.blob, c.offset, c.offset + c.stored);
  image::CheckpointSource src(ckpt, &arrival);
  UniqueFd fd(::memfd_create("stream-pack-test", MFD_CLOEXEC));
  ASSERT_TRUE(src.write_to(*src.find("pages-1.img"), fd.get()));

  std::vector<std::string> not_arrived;
  // A check that waited for pagemap-1.img would wait for good: give it a bound, and fail.
  auto checked = std::async(std::launch::async, [&] { return src.check_unread(&not_arrived); });
  if (checked.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    arrival.fail("the test gave up waiting");  // lets the check return, so the test can end
    FAIL() << "check_unread waited for a file that had not arrived";
  }
  const std::vector<Error> bad = checked.get();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].code(), Errc::kCorrupt);
  EXPECT_NE(std::string(bad[0].what()).find("core-1.img"), std::string::npos) << bad[0].what();
  EXPECT_EQ(not_arrived, std::vector<std::string>{"pagemap-1.img"});

  // Once it is in, it is checked like the rest.
  for (const auto& c : probe.find("pagemap-1.img")->chunks)
    arrival.add(c.blob, c.offset, c.offset + c.stored);
  not_arrived.clear();
  EXPECT_EQ(src.check_unread(&not_arrived).size(), 1u);
  EXPECT_TRUE(not_arrived.empty());
}

// Into a pipe the chunks are spliced by reference: a chunk's buffer may be reused only once the
// reader has taken its bytes. A small pipe and a reader taking little at a time make the
// pipeline wait on that; any buffer reused early would show as different bytes.
TEST_F(StreamPack, PagesSplicedIntoAPipeArriveExactlyThoughTheReaderLags) {
  files_ = {{"pages-1.img", random_bytes(3 * 1024 * 1024 + 4321, 9, false)}};
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  image::CheckpointSource src(ckpt);
  Pipe pipe = make_pipe();
  UniqueFd &rd = pipe.rd, &wr = pipe.wr;
  ASSERT_GT(::fcntl(wr.get(), F_SETPIPE_SZ, 4096), 0);
  std::string got;
  std::thread reader([&] {
    char buf[1000];
    for (ssize_t n; (n = ::read(rd.get(), buf, sizeof buf)) > 0;)
      got.append(buf, static_cast<std::size_t>(n));
  });
  const bool whole = src.write_to(*src.find("pages-1.img"), wr.get());
  wr.reset();
  reader.join();
  EXPECT_TRUE(whole);
  EXPECT_EQ(got.size(), files_[0].second.size());
  EXPECT_TRUE(got == files_[0].second) << "the bytes read from the pipe differ";
}

// CRIU's parallel copy (docs/CRIU.md) takes a pages image as several ranges, each through its
// own pipe at once: every range comes exactly, whether it starts and ends inside a chunk or on
// a chunk's edge, into a file or spliced into a pipe; a range not inside the file is refused.
TEST_F(StreamPack, RangesOfAFileServedAtOnceEachArriveExactly) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  image::CheckpointSource src(ckpt);
  const image::ManifestEntry* e = src.find("pages-1.img");
  ASSERT_NE(e, nullptr);
  const std::string& data = files_[0].second;
  const std::uint64_t c = opts_.chunk_bytes, size = data.size();
  ASSERT_GT(e->chunks.size(), 5u);
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges = {
      {0, 1},        {c - 1, 2}, {c, c},       {3 * c + 17, 2 * c - 100},
      {size - 1, 1}, {0, size},  {5, size - 5}};
  for (const auto& [off, len] : ranges) {
    UniqueFd fd(::memfd_create("stream-pack-test", MFD_CLOEXEC));
    EXPECT_TRUE(src.write_range_to(*e, off, len, fd.get()));
    EXPECT_TRUE(fd_contents(fd.get()) == data.substr(off, len)) << off << "+" << len;
  }
  // The feeds a budget holds at once, each with its least slots: one at the very least.
  EXPECT_GT(src.feeds_within_budget(), 2u);
  image::SourceLimits tight;
  tight.buffer_bytes = 1;
  EXPECT_EQ(image::CheckpointSource(ckpt, nullptr, tight).feeds_within_budget(), 1u);
  // Three ranges that make the whole file, spliced into three pipes read at once.
  const std::uint64_t a = 2 * c + 4096, b = 7 * c;
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> parts = {
      {0, a}, {a, b - a}, {b, size - b}};
  std::vector<std::string> got(parts.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < parts.size(); ++i)
    threads.emplace_back([&, i] {
      Pipe p = make_pipe();
      std::thread reader([&] {
        char buf[3000];
        for (ssize_t n; (n = ::read(p.rd.get(), buf, sizeof buf)) > 0;)
          got[i].append(buf, static_cast<std::size_t>(n));
      });
      EXPECT_TRUE(src.write_range_to(*e, parts[i].first, parts[i].second, p.wr.get()));
      p.wr.reset();
      reader.join();
    });
  for (auto& t : threads) t.join();
  EXPECT_TRUE(got[0] + got[1] + got[2] == data) << "the ranges do not make the file";
  for (const auto& [off, len] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {0, 0}, {size, 1}, {1, size}, {~0ull, 2}}) {
    UniqueFd fd(::memfd_create("stream-pack-test", MFD_CLOEXEC));
    try {
      src.write_range_to(*e, off, len, fd.get());
      ADD_FAILURE() << off << "+" << len << " was served";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Errc::kInvalidInput) << err.what();
    }
  }
}

// A damaged chunk inside a range is refused as write_to refuses it; one outside the range is
// never read.
TEST_F(StreamPack, ARangeServesNoDamagedChunkAndReadsNoneOutsideIt) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  image::CheckpointSource probe(ckpt);
  const image::ChunkRecord& c = probe.find("pages-1.img")->chunks[3];
  {
    std::fstream f(ckpt / probe.manifest().blobs[c.blob].name,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(c.offset + c.stored / 2));
    f.put('\x5a');
  }
  image::CheckpointSource src(ckpt);
  const image::ManifestEntry* e = src.find("pages-1.img");
  const std::uint64_t k = opts_.chunk_bytes;
  UniqueFd before(::memfd_create("stream-pack-test", MFD_CLOEXEC));
  EXPECT_TRUE(src.write_range_to(*e, k, 2 * k, before.get()));
  EXPECT_TRUE(fd_contents(before.get()) == files_[0].second.substr(k, 2 * k));
  UniqueFd after(::memfd_create("stream-pack-test", MFD_CLOEXEC));
  EXPECT_TRUE(src.write_range_to(*e, 4 * k + 1, k, after.get()));
  EXPECT_TRUE(fd_contents(after.get()) == files_[0].second.substr(4 * k + 1, k));
  UniqueFd over(::memfd_create("stream-pack-test", MFD_CLOEXEC));
  try {
    src.write_range_to(*e, 3 * k - 1, 2, over.get());
    ADD_FAILURE() << "a damaged chunk was served";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::kCorrupt);
    EXPECT_NE(std::string(err.what()).find("chunk 3 of 'pages-1.img'"), std::string::npos)
        << err.what();
  }
  EXPECT_LE(fd_contents(over.get()).size(), 1u);
}

// A tree's tasks read their pages images at once: together, not each, they keep to the buffer
// budget. A file that finds it spent still gets the few slots it needs to move, without waiting
// for another file, whose reader may be waiting for this one.
TEST_F(StreamPack, FilesStreamedAtOnceShareOneBufferBudget) {
  constexpr std::size_t kChunks = 40;
  files_.clear();
  for (int i = 0; i < 3; ++i)
    files_.push_back({"pages-" + std::to_string(i + 1) + ".img",
                      random_bytes(kChunks * opts_.chunk_bytes, 20 + i, true)});
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  image::SourceLimits limits;
  limits.threads = 8;
  // One file's share: 8 workers + 4 in flight + the pipe's 2, two buffers of a chunk each.
  const std::uint64_t slot = 2 * image::slot_buffer_bytes(opts_.chunk_bytes);
  limits.buffer_bytes = 14 * slot;
  const image::CheckpointSource src(ckpt, nullptr, limits);
  FedAtOnce feeds(3, [&](int i, int fd) { return src.write_to(*src.find(files_[i].first), fd); });
  // All three hold their slots now.
  ASSERT_TRUE(test::wait_until([&] { return feeds.all_readable(); })) << "a file never started";
  const std::uint64_t held = src.buffer_bytes_held();
  // The first file takes its 14 slots; each of the others what it needs to move: the pipe's
  // 2 chunks and 2 more. Each on its own would have taken 14.
  EXPECT_LE(held, limits.buffer_bytes + 2 * 4 * slot) << held / slot << " slots";
  EXPECT_GE(held, 3 * 4 * slot);
  std::vector<bool> whole;
  const std::vector<std::string> got = feeds.read_all(whole);
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(whole[i] && got[i] == files_[i].second) << files_[i].first;
  EXPECT_EQ(src.buffer_bytes_held(), 0u);
  EXPECT_LE(src.buffer_bytes_peak(), limits.buffer_bytes + 2 * 4 * slot);
}

// Feeds told how many run at once (a restore's copy streams, share_feeds) take a share each,
// so that together they stay within the budget, and a share of the workers.
TEST_F(StreamPack, FeedsThatShareTheBudgetStayWithinItTogether) {
  constexpr std::size_t kChunks = 40;
  files_ = {{"pages-1.img", random_bytes(kChunks * opts_.chunk_bytes, 31, true)}};
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  image::SourceLimits limits;
  limits.threads = 8;
  const std::uint64_t slot = 2 * image::slot_buffer_bytes(opts_.chunk_bytes);
  limits.buffer_bytes = 14 * slot;  // one feed's whole want, as above
  image::CheckpointSource src(ckpt, nullptr, limits);
  src.share_feeds(3);
  const image::ManifestEntry* e = src.find("pages-1.img");
  const std::uint64_t third = kChunks / 3 * opts_.chunk_bytes;
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> parts = {
      {0, third}, {third, third}, {2 * third, e->size - 2 * third}};
  FedAtOnce feeds(3, [&](int i, int fd) {
    return src.write_range_to(*e, parts[i].first, parts[i].second, fd);
  });
  ASSERT_TRUE(test::wait_until([&] { return feeds.all_readable(); }));
  // Unshared, the first would take all 14 slots and the others 4 each (22).
  EXPECT_LE(src.buffer_bytes_held(), limits.buffer_bytes) << src.buffer_bytes_held() / slot;
  std::vector<bool> whole;
  const std::vector<std::string> got = feeds.read_all(whole);
  EXPECT_EQ(whole, std::vector<bool>(3, true));
  EXPECT_TRUE(got[0] + got[1] + got[2] == files_[0].second);
  EXPECT_LE(src.buffer_bytes_peak(), limits.buffer_bytes);
}

// CRIU may close an image before its end (it needed no more of it): not an error.
TEST_F(StreamPack, AReaderClosingThePipeEarlyEndsTheFileWithoutAnError) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  image::CheckpointSource src(ckpt);
  Pipe pipe = make_pipe();
  UniqueFd &rd = pipe.rd, &wr = pipe.wr;
  std::thread reader([&] {
    char buf[4096];
    for (std::size_t total = 0; total < 100000;) {
      const ssize_t n = ::read(rd.get(), buf, sizeof buf);
      if (n <= 0) break;
      total += static_cast<std::size_t>(n);
    }
    rd.reset();
  });
  bool whole = true;
  EXPECT_NO_THROW(whole = src.write_to(*src.find("pages-1.img"), wr.get()));
  reader.join();
  EXPECT_FALSE(whole);
}

// --compress adaptive (docs/PERFORMANCE.md, "Compressing what the CPUs can afford").
TEST(AdaptiveCompression, SkipsOnlyWhenTheWorkersAreBehindAndTheWriterWouldRunDry) {
  // (chunks waiting, this one included; workers; other workers busy; chunks left to write)
  // Behind: every other worker busy and more chunks waiting than workers; the writer with at
  // most one chunk per worker, plus one, left, and never more than three.
  EXPECT_TRUE(image::skip_compression(3, 2, 1, 0));
  EXPECT_TRUE(image::skip_compression(3, 2, 1, 3));
  EXPECT_TRUE(image::skip_compression(2, 1, 0, 2));
  EXPECT_TRUE(image::skip_compression(18, 16, 15, 3));
  // A worker that waits for its input finds one or two chunks: not behind.
  EXPECT_FALSE(image::skip_compression(1, 1, 0, 0));
  EXPECT_FALSE(image::skip_compression(2, 2, 1, 0));
  // A burst of chunks that finds another worker idle: it takes one next.
  EXPECT_FALSE(image::skip_compression(8, 4, 2, 0));
  // The writer has work queued: a raw chunk would only wait there.
  EXPECT_FALSE(image::skip_compression(10, 2, 1, 4));
  EXPECT_FALSE(image::skip_compression(2, 1, 0, 3));
  // 16 workers with 40 chunks in flight: 17 waiting and 15 at work leave 8 for the writer, which
  // a limit of one per worker would always allow.
  EXPECT_FALSE(image::skip_compression(17, 16, 15, 4));
  EXPECT_FALSE(image::skip_compression(17, 16, 15, 8));
  // No workers counts as one.
  EXPECT_TRUE(image::skip_compression(2, 0, 0, 0));
}

// The CLI takes a mode by these names (CliUsage, UnknownCompression: any other is refused).
TEST(AdaptiveCompression, ModesHaveNamesOfTheirOwn) {
  EXPECT_STREQ(compression_name(Compression::kAlways), "always");
  EXPECT_STREQ(compression_name(Compression::kAdaptive), "adaptive");
  EXPECT_STREQ(compression_name(Compression::kAuto), "auto");
  EXPECT_TRUE(compression_adapts(Compression::kAuto, false));
  EXPECT_FALSE(compression_adapts(Compression::kAuto, true));
  EXPECT_TRUE(compression_adapts(Compression::kAdaptive, true));
  EXPECT_FALSE(compression_adapts(Compression::kAlways, false));
}

// A copy that only watches the blobs fill, as a network transfer beside the dump does.
struct WatchingTap : image::BlobTap {
  void blob_created(std::uint32_t, const fs::path&) override {}
  void blob_written(std::uint32_t, std::uint64_t) override {}
};

// One worker at zstd's slowest level against a producer that hands over chunks at memcpy speed:
// the workers are the bound from the second chunk on, and the writer waits for them.
class SlowWorker : public StreamPack {
 protected:
  void SetUp() override {
    files_ = {{"pages-1.img", random_bytes(8u << 20, 4, true)},  // 2 bits of entropy a byte
              {"core-1.img", random_bytes(5000, 5, true)}};
    opts_.chunk_bytes = 1u << 20;
    opts_.threads = 1;
    opts_.zstd_level = 19;
    opts_.inflight_chunks = 8;
  }
  // Raw bytes of the chunks stored uncompressed, and of those compressed.
  std::pair<std::uint64_t, std::uint64_t> raw_and_zstd(const fs::path& ckpt) {
    image::CheckpointSource src(ckpt);
    std::uint64_t raw = 0, zstd = 0;
    for (const auto& e : src.manifest().entries)
      for (const auto& c : e.chunks) (c.codec == image::Codec::kRaw ? raw : zstd) += c.raw;
    return {raw, zstd};
  }
  void expect_exact(const fs::path& ckpt) {
    EXPECT_NO_THROW(verify(ckpt));
    const fs::path out = dir_.path() / "out";
    unpack(ckpt, out);
    for (const auto& [name, data] : files_) EXPECT_TRUE(read_file(out / name) == data) << name;
  }
};

TEST_F(SlowWorker, AdaptiveStoresWhatTheWorkerCannotAffordUncompressedAndReadsBackExactly) {
  opts_.compression = Compression::kAdaptive;
  const fs::path ckpt = dir_.path() / "c.ckpt";
  const TransferResult w = write(ckpt);
  // Every byte of this content shrinks under zstd, so a raw chunk is one that was skipped.
  const auto [raw, zstd] = raw_and_zstd(ckpt);
  EXPECT_GT(w.skipped_compression_bytes, 0u);
  EXPECT_EQ(raw, w.skipped_compression_bytes);
  EXPECT_EQ(raw + zstd, w.raw_bytes);
  EXPECT_GT(zstd, 0u) << "the last chunk finds no other waiting and is compressed";
  expect_exact(ckpt);
}

TEST_F(SlowWorker, AlwaysCompressesEveryChunkWhateverTheWorkerKeepsUpWith) {
  opts_.compression = Compression::kAlways;
  const fs::path ckpt = dir_.path() / "c.ckpt";
  const TransferResult w = write(ckpt);
  EXPECT_EQ(w.skipped_compression_bytes, 0u);
  EXPECT_EQ(raw_and_zstd(ckpt).first, 0u);
  EXPECT_LT(w.compressed_bytes, w.raw_bytes / 3);
  expect_exact(ckpt);
}

TEST_F(SlowWorker, AutoCompressesEveryChunkOfACheckpointCopiedOverANetworkAsItIsWritten) {
  opts_.compression = Compression::kAuto;
  const fs::path ckpt = dir_.path() / "c.ckpt";
  WatchingTap tap;
  const TransferResult w = write(ckpt, {&tap, true});
  EXPECT_EQ(w.skipped_compression_bytes, 0u);
  EXPECT_EQ(raw_and_zstd(ckpt).first, 0u);
  expect_exact(ckpt);
}

TEST_F(StreamPack, AbandonedCheckpointLeavesNothing) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  {
    image::StreamPacker p(ckpt, opts_, dir_.path());
    auto id = p.open("pages-1.img");
    auto room = p.space(id);
    std::memset(room.data(), 1, room.size());
    p.commit(id, room.size());
    EXPECT_THROW(p.open("pages-1.img"), Error);  // a name sent twice
    EXPECT_THROW(p.open("../x"), Error);
  }
  for (const auto& e : fs::directory_iterator(dir_.path()))
    ADD_FAILURE() << "left behind: " << e.path();
}

// The stream of `migrate --to ssh://` (remote/ssh.h), through a real pipe: the sender follows
// the packer's writes, the receiver restores from what has arrived.
TEST_F(StreamPack, ACheckpointSentWhileItIsWrittenIsReadAsItArrivesAndExactly) {
  const fs::path ckpt = dir_.path() / "c.ckpt", there = dir_.path() / "there";
  fs::create_directory(there);
  Pipe p = make_pipe();
  std::map<std::string, std::string> got;
  std::uint64_t received = 0;
  std::exception_ptr failed;
  std::thread target([&] {
    try {
      remote::StreamReceiver rx(p.rd.get(), there);
      rx.start();
      image::CheckpointSource src(there, &rx.arrival());
      for (const auto& [name, data] : files_) {
        UniqueFd out(::memfd_create(name.c_str(), MFD_CLOEXEC));
        EXPECT_TRUE(src.write_to(*src.find(name), out.get()));
        got[name] = fd_contents(out.get());
      }
      received = rx.join();
    } catch (...) {
      failed = std::current_exception();
    }
  });
  std::uint64_t sent = 0;
  {
    remote::StreamSender sender(p.wr.get());
    write(ckpt, {&sender, true});
    sent = sender.finish(ckpt);
  }
  target.join();
  if (failed) std::rethrow_exception(failed);
  for (const auto& [name, data] : files_) EXPECT_TRUE(got[name] == data) << name;
  EXPECT_EQ(sent, received);
  EXPECT_EQ(test::run_cli({"verify", there.string()}).exit_code, 0);
}

TEST_F(StreamPack, ATargetThatReadsNothingFailsTheSendAfterTheStallTimeoutInsteadOfWaitingForGood) {
  // More than the pipe holds (the sender widens it to 1 MiB): the rest can only go if read.
  files_.emplace_back("pages-2.img", random_bytes(3u << 20, 9, false));
  const fs::path ckpt = dir_.path() / "c.ckpt";
  Pipe p = make_pipe();
  remote::StreamSender sender(p.wr.get());
  write(ckpt, {&sender, true});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    sender.finish(ckpt, {}, std::chrono::seconds(1));
    ADD_FAILURE() << "a stream nobody reads was finished";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("took none of the checkpoint for 1 s"), std::string::npos)
        << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_FALSE(sender.failed());  // stalled, not broken
  // The caller ends the connection; the thread blocked in its write then fails and ends.
  p.rd.reset();
  EXPECT_TRUE(test::wait_until([&] { return sender.failed(); }));
}

// Writes a stream by hand into a file and returns a descriptor reading it from the start.
class HandStream {
 public:
  explicit HandStream(const fs::path& file) : path_(file) { text_ = "GPUCKPT-STREAM 2\n"; }
  HandStream& piece(const std::string& blob, std::uint64_t off, const std::string& bytes) {
    text_ += nlohmann::json{{"blob", blob}, {"offset", off}, {"size", bytes.size()}}.dump() + "\n";
    text_ += bytes;
    return *this;
  }
  HandStream& file(const std::string& name, const std::string& bytes) {
    text_ += nlohmann::json{{"name", name}, {"size", bytes.size()}}.dump() + "\n" + bytes;
    return *this;
  }
  HandStream& end() {
    text_ += "{\"end\":true}\n";
    return *this;
  }
  UniqueFd open() {
    std::ofstream(path_, std::ios::binary) << text_;
    return UniqueFd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  }

 private:
  fs::path path_;
  std::string text_;
};

TEST_F(StreamPack, AStreamCutShortOrOutOfPlaceIsRefused) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  const std::string seal = read_file(ckpt / "manifest.seal");
  const std::string manifest = read_file(ckpt / "manifest.json");
  const std::string blob = read_file(ckpt / "blob-000000.bin");
  auto expect = [&](HandStream& h, Errc code, const std::string& what) {
    const fs::path there = dir_.path() / ("there-" + std::to_string(static_cast<int>(code)) + "-" +
                                          std::to_string(what.size()));
    fs::create_directory(there);
    UniqueFd fd = h.open();
    try {
      remote::StreamReceiver rx(fd.get(), there);
      rx.start();
      rx.join();
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << what << ": " << e.what();
    }
  };
  {  // the connection lost after the manifest: the blobs never complete
    HandStream h(dir_.path() / "cut");
    h.piece("blob-000000.bin", 0, blob.substr(0, 4096)).file("manifest.seal", seal);
    h.file("manifest.json", manifest);
    expect(h, Errc::kIo, "cut short");
  }
  {  // a piece that does not follow the last one
    HandStream h(dir_.path() / "gap");
    h.piece("blob-000000.bin", 4096, blob.substr(4096, 4096));
    expect(h, Errc::kCorrupt, "a gap");
  }
  {  // a blob its manifest does not list
    HandStream h(dir_.path() / "stray");
    h.piece("blob-999999.bin", 0, "x").file("manifest.seal", seal).file("manifest.json", manifest);
    expect(h, Errc::kCorrupt, "a stray blob");
  }
  {  // a manifest that is not the one its seal was made for
    std::string other = manifest;
    other[other.size() / 2] ^= 1;
    HandStream h(dir_.path() / "forged");
    h.file("manifest.seal", seal).file("manifest.json", other);
    expect(h, Errc::kCorrupt, "a changed manifest");
  }
  {  // after the manifest, pieces in any order are fine; the same bytes twice are not
    HandStream h(dir_.path() / "any-order");
    h.file("manifest.seal", seal).file("manifest.json", manifest);
    std::size_t blobs = 0;
    for (; fs::exists(ckpt / image::blob_name(blobs)); ++blobs) {
      const std::string b = read_file(ckpt / image::blob_name(blobs));
      const std::size_t half = b.size() / 2;
      h.piece(image::blob_name(blobs), half, b.substr(half))
          .piece(image::blob_name(blobs), 0, b.substr(0, half));
    }
    ASSERT_GE(blobs, 2u);
    h.end();
    const fs::path there = dir_.path() / "there-any-order";
    fs::create_directory(there);
    UniqueFd fd = h.open();
    remote::StreamReceiver rx(fd.get(), there);
    rx.start();
    EXPECT_NO_THROW(rx.join());
    EXPECT_EQ(test::run_cli({"verify", there.string()}).exit_code, 0);
    HandStream twice(dir_.path() / "twice");
    twice.file("manifest.seal", seal).file("manifest.json", manifest);
    twice.piece("blob-000000.bin", 0, blob.substr(0, 8192))
        .piece("blob-000000.bin", 4096, blob.substr(4096, 8192));
    expect(twice, Errc::kCorrupt, "the same bytes twice");
  }
  {  // a path for a name
    HandStream h(dir_.path() / "escape");
    h.piece("../blob-000000.bin", 0, "x");
    expect(h, Errc::kCorrupt, "a path");
  }
}

TEST_F(StreamPack, AStreamThatWouldFillTheTargetsDiskStopsBeforeItDoes) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);  // blobs of at most 256 KiB, mostly incompressible pages
  std::vector<std::string> blobs;
  std::size_t total = 0;
  for (std::size_t b = 0; fs::exists(ckpt / image::blob_name(b)); ++b)
    total += blobs.emplace_back(read_file(ckpt / image::blob_name(b))).size();
  ASSERT_GT(total, 600u << 10);
  // A 512 KiB filesystem: gpuckpt leaves 2% of it free for the rest of the host.
  auto receive = [&](const std::string& name, HandStream& h) -> std::string {
    const fs::path there = dir_.path() / name;
    test::TmpfsMount mnt(there, "size=512k");
    if (!mnt.ok()) return "skip: cannot mount a tmpfs here: " + mnt.why();
    std::string what = "accepted";
    {
      UniqueFd fd = h.open();
      try {
        remote::StreamReceiver rx(fd.get(), there);
        rx.start();
        rx.join();
      } catch (const Error& e) {
        what = e.code() == Errc::kIo ? e.what() : "wrong code: " + std::string(e.what());
      }
    }
    EXPECT_GT(fs::space(there).available, 8u << 10) << name << ": the filesystem was filled";
    return what;
  };
  {  // before the manifest: a piece would leave less than the reserve
    HandStream h(dir_.path() / "before.stream");
    for (std::size_t b = 0; b < blobs.size(); ++b) h.piece(image::blob_name(b), 0, blobs[b]);
    const std::string what = receive("before", h);
    if (what.starts_with("skip")) GTEST_SKIP() << what;
    EXPECT_NE(what.find("free for the rest of the host"), std::string::npos) << what;
  }
  {  // after it: the whole checkpoint is known, and refused before any of its blob bytes
    HandStream h(dir_.path() / "after.stream");
    h.file("manifest.seal", read_file(ckpt / "manifest.seal"))
        .file("manifest.json", read_file(ckpt / "manifest.json"));
    const std::string what = receive("after", h);
    EXPECT_NE(what.find("free for the rest of the host"), std::string::npos) << what;
  }
}

TEST_F(StreamPack, TwoStreamsIntoOneSpoolCannotBothCountOnItsLastSpace) {
  const fs::path ckpt = dir_.path() / "c.ckpt";
  write(ckpt);
  std::uintmax_t total = 0;
  for (std::size_t b = 0; fs::exists(ckpt / image::blob_name(b)); ++b)
    total += fs::file_size(ckpt / image::blob_name(b));
  // Room for one checkpoint and the reserve, not for two.
  const fs::path spool = dir_.path() / "spool";
  test::TmpfsMount mnt(spool, "size=" + std::to_string((total + total / 2) >> 10) + "k");
  if (!mnt.ok()) GTEST_SKIP() << "cannot mount a tmpfs here: " << mnt.why();
  auto manifest_only = [&](const std::string& name) {
    HandStream h(dir_.path() / (name + ".stream"));
    h.file("manifest.seal", read_file(ckpt / "manifest.seal"))
        .file("manifest.json", read_file(ckpt / "manifest.json"));
    fs::create_directory(spool / name);
    return h;
  };
  // The first migration has its manifest in and its blobs still to come.
  HandStream first = manifest_only("first");
  UniqueFd first_fd = first.open();
  remote::StreamReceiver rx(first_fd.get(), spool / "first");
  EXPECT_GE(fs::space(spool).capacity - fs::space(spool).available, total)
      << "the first stream's blobs are not yet written, but their space must be taken";
  HandStream second = manifest_only("second");
  UniqueFd second_fd = second.open();
  try {
    remote::StreamReceiver rx2(second_fd.get(), spool / "second");
    ADD_FAILURE() << "the second stream was accepted into the space the first one needs";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find("free for the rest of the host"), std::string::npos)
        << e.what();
  }
}

}  // namespace
