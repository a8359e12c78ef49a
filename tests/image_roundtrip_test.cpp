// Pack -> unpack round trips through the real pipeline (real files, real io_uring, O_DIRECT
// where the filesystem allows it), over the shapes a CRIU image directory takes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include <xxhash.h>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "gpuckpt/support.h"
#include "image/chunk_codec.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

constexpr std::uint32_t kChunk = 64 << 10;

void write_bytes(const fs::path& p, const std::string& data, mode_t mode) {
  std::ofstream(p, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  ASSERT_EQ(::chmod(p.c_str(), mode), 0);
}

std::uint32_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// A small CRIU-like tree: many small files, a few multi-chunk ones, nested dirs, odd sizes.
void make_tree(const fs::path& root) {
  fs::create_directories(root / "nested/deeper/deepest");
  fs::create_directories(root / "empty_dir");
  write_bytes(root / "empty.img", "", 0644);
  write_bytes(root / "one_byte.img", "x", 0600);
  test::write_test_file(root / "chunk_minus_one.img", kChunk - 1, 1);
  test::write_test_file(root / "exact_chunk.img", kChunk, 2);
  test::write_test_file(root / "chunk_plus_one.img", kChunk + 1, 3);
  test::write_test_file(root / "pages-1.img", 3 * kChunk + 12345, 4);
  test::write_test_file(root / "random.img", 2 * kChunk, 5, 1.0);  // incompressible
  test::write_test_file(root / "nested/deeper/deepest/core-42.img", 7777, 6);
  test::write_test_file(root / "nested/mm-42.img", 5 * kChunk, 7, 0.0);  // very compressible
  ASSERT_EQ(::chmod((root / "pages-1.img").c_str(), 0640), 0);
  ASSERT_EQ(::chmod((root / "nested/mm-42.img").c_str(), 0444), 0);
  ASSERT_EQ(::chmod((root / "nested/deeper").c_str(), 0750), 0);
  for (int i = 0; i < 40; ++i)
    write_bytes(root / ("small-" + std::to_string(i) + ".img"),
                std::string(i * 37, char('a' + i % 26)), 0644);
  fs::create_symlink("pages-1.img", root / "link-to-pages");
}

// Every entry of `a` exists in `b` with the same type, mode, size and bytes (and vice versa).
void expect_same_tree(const fs::path& a, const fs::path& b) {
  std::size_t count_a = 0, count_b = 0;
  for (auto it = fs::recursive_directory_iterator(a); it != fs::end(it); ++it) {
    ++count_a;
    const fs::path rel = it->path().lexically_relative(a);
    const fs::path other = b / rel;
    ASSERT_TRUE(fs::exists(fs::symlink_status(other))) << rel;
    if (it->is_symlink()) {
      ASSERT_TRUE(fs::is_symlink(other)) << rel;
      EXPECT_EQ(fs::read_symlink(it->path()), fs::read_symlink(other)) << rel;
      continue;
    }
    EXPECT_EQ(mode_of(it->path()), mode_of(other)) << rel;
    if (it->is_directory()) {
      EXPECT_TRUE(fs::is_directory(other)) << rel;
    } else {
      ASSERT_TRUE(fs::is_regular_file(other)) << rel;
      EXPECT_EQ(fs::file_size(it->path()), fs::file_size(other)) << rel;
      EXPECT_TRUE(test::same_contents(it->path(), other)) << rel;
    }
  }
  for (auto it = fs::recursive_directory_iterator(b); it != fs::end(it); ++it) ++count_b;
  EXPECT_EQ(count_a, count_b);
}

// Bytes of regular files under `root`, not following symlinks.
std::uint64_t file_bytes(const fs::path& root) {
  std::uint64_t n = 0;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::end(it); ++it)
    if (!it->is_symlink() && it->is_regular_file()) n += it->file_size();
  return n;
}

nlohmann::json read_manifest(const fs::path& ckpt) {
  return nlohmann::json::parse(read_file(ckpt / "manifest.json"));
}

// Sets an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_.empty())
      ::unsetenv(name_);
    else
      ::setenv(name_, old_.c_str(), 1);
  }

 private:
  const char* name_;
  std::string old_;
};

struct Variant {
  bool direct;
  bool uring;
};

class RoundTrip : public ::testing::TestWithParam<Variant> {};

TEST_P(RoundTrip, ManyFilesOfVariedSizesComeBackIdentical) {
  ScopedEnv env("GPUCKPT_IO_URING", GetParam().uring ? nullptr : "0");
  auto dir = test::scratch_dir();
  const fs::path src = dir.path() / "src", ckpt = dir.path() / "ckpt", out = dir.path() / "out";
  make_tree(src);

  PackOptions po;
  po.chunk_bytes = kChunk;
  po.threads = 2;
  po.direct_io = GetParam().direct;
  po.queue_depth = 4;
  const TransferResult pr = pack(src, ckpt, po);
  EXPECT_EQ(pr.raw_bytes, file_bytes(src));
  EXPECT_LT(pr.compressed_bytes, pr.raw_bytes);
  EXPECT_EQ(pr.io_uring, GetParam().uring);
  if (!GetParam().direct) {
    EXPECT_FALSE(pr.direct_io);
  }
  EXPECT_EQ(pr.files, 54u);  // 49 files + 4 dirs + 1 symlink
  ASSERT_NE(pr.timeline.find("compress_write"), nullptr);
  EXPECT_EQ(pr.timeline.find("compress_write")->bytes, pr.raw_bytes);

  UnpackOptions uo;
  uo.threads = 2;
  uo.direct_io = GetParam().direct;
  uo.queue_depth = 4;
  const TransferResult ur = unpack(ckpt, out, uo);
  EXPECT_EQ(ur.raw_bytes, pr.raw_bytes);
  EXPECT_EQ(ur.compressed_bytes, pr.compressed_bytes);
  expect_same_tree(src, out);

  const TransferResult vr = verify(ckpt, uo);
  EXPECT_EQ(vr.chunks, pr.chunks);

  // Nothing but the outputs was left beside them (no temporary siblings).
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt", "out", "src"}));
}

INSTANTIATE_TEST_SUITE_P(Io, RoundTrip,
                         ::testing::Values(Variant{true, true}, Variant{false, true},
                                           Variant{true, false}),
                         [](const auto& info) {
                           return std::string(info.param.direct ? "Direct" : "Buffered") +
                                  (info.param.uring ? "IoUring" : "Pread");
                         });

TEST(Image, ManifestRecordsFilesChunksAndHashes) {
  auto dir = test::scratch_dir();
  const fs::path src = dir.path() / "src", ckpt = dir.path() / "ckpt";
  make_tree(src);
  PackOptions po;
  po.chunk_bytes = kChunk;
  pack(src, ckpt, po);

  const auto m = read_manifest(ckpt);
  EXPECT_EQ(m["format"], "gpuckpt-image");
  EXPECT_EQ(m["format_version"], kImageFormatMajor);
  EXPECT_EQ(m["chunk_bytes"], kChunk);
  bool saw_raw = false, saw_zstd = false;
  for (const auto& e : m["entries"]) {
    if (e["type"] != "file") continue;
    const fs::path p = src / e["path"].get<std::string>();
    // The whole-file hash is plain XXH3-64 of the content (what `xxhsum -H3` prints).
    const std::string content = read_file(p);
    EXPECT_EQ(e["xxh3"], format_hex64(image::xxh3(content.data(), content.size()))) << p;
    EXPECT_EQ(e["size"], content.size());
    EXPECT_EQ(e["chunks"].size(), (content.size() + kChunk - 1) / kChunk) << p;
    for (const auto& c : e["chunks"]) {
      EXPECT_EQ(c["offset"].get<std::uint64_t>() % 4096, 0u);
      saw_raw |= c["codec"] == "raw";
      saw_zstd |= c["codec"] == "zstd";
      if (c["codec"] == "raw") {
        EXPECT_EQ(c["stored"], c["raw"]);
      } else {
        EXPECT_LT(c["stored"], c["raw"]);
      }
    }
  }
  EXPECT_TRUE(saw_raw) << "random.img should be stored raw";
  EXPECT_TRUE(saw_zstd);

  const ImageInfo info = inspect(ckpt);
  EXPECT_EQ(info.format_version, kImageFormatMajor);
  EXPECT_EQ(info.input_kind, "directory");
  EXPECT_EQ(info.raw_bytes, file_bytes(src));
  EXPECT_EQ(info.files.size(), m["entries"].size());
  EXPECT_EQ(info.blob_count, 1u);
  EXPECT_TRUE(info.extra.is_null());
}

TEST(Image, ChecksumsAreXxh3WhicheverCodeThisCpuRuns) {
  // The engine may hash with the AVX2 or AVX-512 code chosen at run time; a checkpoint made on
  // one host is verified on another, so every length must give the portable XXH3 value, which
  // the library's plain entry point (its SSE2 build) computes.
  EXPECT_EQ(image::xxh3("", 0), 0x2D06800538D394C2ULL);  // XXH3's published value for ""
  std::vector<unsigned char> data(3 << 20);
  std::mt19937_64 rng(12);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (std::size_t len : {1ul, 16ul, 129ul, 240ul, 241ul, 1023ul, 4096ul, 65536ul + 7,
                          static_cast<unsigned long>(data.size())}) {
    SCOPED_TRACE(len);
    EXPECT_EQ(image::xxh3(data.data(), len), XXH3_64bits(data.data(), len));
    image::StreamHash h;
    for (std::size_t at = 0; at < len; at += 100003)
      h.update(&data[at], std::min<std::size_t>(100003, len - at));
    EXPECT_EQ(h.digest(), XXH3_64bits(data.data(), len));
  }
}

TEST(Image, SingleFileInputUnpacksIntoADirectory) {
  auto dir = test::scratch_dir();
  const fs::path file = dir.path() / "pages-7.img";
  test::write_test_file(file, 3 * kChunk + 99, 11);
  PackOptions po;
  po.chunk_bytes = kChunk;
  pack(file, dir.path() / "ckpt", po);
  const ImageInfo info = inspect(dir.path() / "ckpt");
  EXPECT_EQ(info.input_kind, "file");
  ASSERT_EQ(info.files.size(), 1u);
  EXPECT_EQ(info.files[0].path, "pages-7.img");
  EXPECT_EQ(info.files[0].chunks, 4u);

  unpack(dir.path() / "ckpt", dir.path() / "out");
  EXPECT_TRUE(test::same_contents(file, dir.path() / "out/pages-7.img"));
}

TEST(Image, OutputIsDeterministicWhateverTheThreading) {
  auto dir = test::scratch_dir();
  const fs::path src = dir.path() / "src";
  make_tree(src);
  PackOptions a;
  a.chunk_bytes = kChunk;
  a.threads = 1;
  a.inflight_chunks = 2;
  PackOptions b = a;
  b.threads = 4;
  b.inflight_chunks = 16;
  b.direct_io = false;
  pack(src, dir.path() / "a", a);
  pack(src, dir.path() / "b", b);
  EXPECT_TRUE(
      test::same_contents(dir.path() / "a/blob-000000.bin", dir.path() / "b/blob-000000.bin"));
  auto ma = read_manifest(dir.path() / "a"), mb = read_manifest(dir.path() / "b");
  EXPECT_EQ(ma["entries"], mb["entries"]);
  EXPECT_EQ(ma["blobs"], mb["blobs"]);
}

// pack() stores chunks uncompressed only when asked (--compress adaptive): by default its output
// is the same whatever the timing (above). One worker at zstd's slowest level falls behind the
// reader from the second chunk on.
TEST(Image, AdaptivePackStoresUncompressedOnlyWhatTheWorkersCannotAfford) {
  auto dir = test::scratch_dir();
  const fs::path src = dir.path() / "src";
  fs::create_directories(src);
  test::write_test_file(src / "pages-1.img", 8u << 20, 31, 0.0);  // fp16-like: shrinks
  PackOptions po;
  po.chunk_bytes = 1u << 20;
  po.threads = 1;
  po.zstd_level = 19;
  po.inflight_chunks = 8;
  po.compression = Compression::kAdaptive;
  const TransferResult r = pack(src, dir.path() / "ckpt", po);
  std::uint64_t raw = 0, zstd = 0;
  const nlohmann::json m = read_manifest(dir.path() / "ckpt");
  for (const auto& c : m["entries"][0]["chunks"])
    (c["codec"] == "raw" ? raw : zstd) += c["raw"].get<std::uint64_t>();
  EXPECT_GT(r.skipped_compression_bytes, 0u);
  EXPECT_EQ(raw, r.skipped_compression_bytes);  // every chunk zstd was tried on shrank
  EXPECT_GT(zstd, 0u);
  verify(dir.path() / "ckpt");
  unpack(dir.path() / "ckpt", dir.path() / "out");
  expect_same_tree(src, dir.path() / "out");

  po.compression = Compression::kAuto;
  const TransferResult all = pack(src, dir.path() / "ckpt2", po);
  EXPECT_EQ(all.skipped_compression_bytes, 0u);
  const nlohmann::json m2 = read_manifest(dir.path() / "ckpt2");
  for (const auto& c : m2["entries"][0]["chunks"]) EXPECT_EQ(c["codec"], "zstd");
}

TEST(Image, LargeCheckpointsRollOverIntoSeveralBlobs) {
  auto dir = test::scratch_dir();
  const fs::path src = dir.path() / "src";
  fs::create_directories(src);
  test::write_test_file(src / "pages-1.img", 20 * kChunk + 5, 21);
  test::write_test_file(src / "pages-2.img", 7 * kChunk, 22, 1.0);
  PackOptions po;
  po.chunk_bytes = kChunk;
  po.max_blob_bytes = 4 * kChunk;
  pack(src, dir.path() / "ckpt", po);
  const ImageInfo info = inspect(dir.path() / "ckpt");
  EXPECT_GT(info.blob_count, 2u);
  const auto m = read_manifest(dir.path() / "ckpt");
  for (const auto& b : m["blobs"]) {
    EXPECT_LE(b["size"].get<std::uint64_t>(), 4u * kChunk);
    EXPECT_EQ(fs::file_size(dir.path() / "ckpt" / b["name"].get<std::string>()), b["size"]);
  }
  verify(dir.path() / "ckpt");
  unpack(dir.path() / "ckpt", dir.path() / "out");
  expect_same_tree(src, dir.path() / "out");
}

TEST(Image, ExtraMetadataIsStoredAndReturned) {
  auto dir = test::scratch_dir();
  test::write_test_file(dir.path() / "f", 1000, 1);
  PackOptions po;
  po.extra = nlohmann::json::parse(R"({"process":{"pid":42,"cmd":"vllm"},"stages":[1,2]})");
  pack(dir.path() / "f", dir.path() / "ckpt", po);
  const ImageInfo info = inspect(dir.path() / "ckpt");
  const auto& extra = info.extra;
  EXPECT_EQ(extra["process"]["pid"], 42);
  EXPECT_EQ(read_manifest(dir.path() / "ckpt")["extra"]["process"]["cmd"], "vllm");

  po.extra = nlohmann::json::array({1, 2});
  try {
    pack(dir.path() / "f", dir.path() / "ckpt2", po);
    FAIL() << "a non-object extra must be rejected";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
  }
  EXPECT_FALSE(fs::exists(dir.path() / "ckpt2"));
}

TEST(Image, ForceReplacesACheckpointOnlyWhenComplete) {
  auto dir = test::scratch_dir();
  const fs::path ckpt = dir.path() / "ckpt";
  test::write_test_file(dir.path() / "v1", 5000, 1);
  test::write_test_file(dir.path() / "v2", 9000, 2);
  pack(dir.path() / "v1", ckpt);

  try {
    pack(dir.path() / "v2", ckpt);
    FAIL() << "existing output without force";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kExists);
    EXPECT_NE(std::string(e.what()).find("--force"), std::string::npos) << e.what();
  }
  EXPECT_EQ(inspect(ckpt).files.at(0).path, "v1");

  PackOptions po;
  po.force = true;
  pack(dir.path() / "v2", ckpt, po);
  EXPECT_EQ(inspect(ckpt).files.at(0).path, "v2");
  verify(ckpt);

  // --force never deletes something that is not a checkpoint.
  fs::create_directories(dir.path() / "precious");
  write_bytes(dir.path() / "precious/data", "keep me", 0644);
  try {
    pack(dir.path() / "v2", dir.path() / "precious", po);
    FAIL() << "replacing a non-checkpoint directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kExists);
  }
  EXPECT_EQ(read_file(dir.path() / "precious/data"), "keep me");
}

TEST(Image, UnpackIntoExistingDirectories) {
  auto dir = test::scratch_dir();
  test::write_test_file(dir.path() / "f", 5000, 1);
  pack(dir.path() / "f", dir.path() / "ckpt");

  fs::create_directories(dir.path() / "empty");
  unpack(dir.path() / "ckpt", dir.path() / "empty");  // an empty directory is fine
  EXPECT_TRUE(test::same_contents(dir.path() / "f", dir.path() / "empty/f"));

  fs::create_directories(dir.path() / "full");
  write_bytes(dir.path() / "full/old", "old", 0644);
  try {
    unpack(dir.path() / "ckpt", dir.path() / "full");
    FAIL() << "non-empty output without force";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kExists);
  }
  EXPECT_TRUE(fs::exists(dir.path() / "full/old"));
  UnpackOptions uo;
  uo.force = true;
  unpack(dir.path() / "ckpt", dir.path() / "full", uo);
  EXPECT_FALSE(fs::exists(dir.path() / "full/old"));
  EXPECT_TRUE(test::same_contents(dir.path() / "f", dir.path() / "full/f"));
}

TEST(Image, ProgressReachesTheTotal) {
  auto dir = test::scratch_dir();
  test::write_test_file(dir.path() / "f", 10 * kChunk, 1);
  std::mutex mu;
  std::vector<Progress> seen;
  PackOptions po;
  po.chunk_bytes = kChunk;
  po.progress = [&](const Progress& p) {
    std::lock_guard lock(mu);
    seen.push_back(p);
  };
  pack(dir.path() / "f", dir.path() / "ckpt", po);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().phase, "pack");
  EXPECT_EQ(seen.back().done_bytes, 10u * kChunk);
  EXPECT_EQ(seen.back().total_bytes, 10u * kChunk);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].done_bytes, seen[i - 1].done_bytes);

  seen.clear();
  UnpackOptions uo;
  uo.progress = po.progress;
  verify(dir.path() / "ckpt", uo);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().phase, "verify");
  EXPECT_EQ(seen.back().done_bytes, 10u * kChunk);
}

TEST(Image, AnEmptyDirectoryPacksToAnEmptyCheckpoint) {
  auto dir = test::scratch_dir();
  fs::create_directories(dir.path() / "src");
  const TransferResult r = pack(dir.path() / "src", dir.path() / "ckpt");
  EXPECT_EQ(r.raw_bytes, 0u);
  EXPECT_EQ(inspect(dir.path() / "ckpt").blob_count, 0u);
  verify(dir.path() / "ckpt");
  unpack(dir.path() / "ckpt", dir.path() / "out");
  EXPECT_TRUE(fs::is_empty(dir.path() / "out"));
}

}  // namespace
