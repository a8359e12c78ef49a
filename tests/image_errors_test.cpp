// Bad input through the engine API: damaged checkpoints, wrong versions, missing inputs,
// existing outputs, a full disk. Each must fail with the documented error code, a message
// that names the problem, and no output left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "image/manifest.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

constexpr std::uint32_t kChunk = 64 << 10;

// Runs `f`, expects Error with `code` and a message containing `needle`.
void expect_error(const std::function<void()>& f, Errc code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected Error(" << errc_name(code) << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << needle << "\"";
  }
}

std::vector<std::string> list(const fs::path& dir) {
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

class ImageErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = dir_.path() / "src";
    ckpt_ = dir_.path() / "ckpt";
    out_ = dir_.path() / "out";
    fs::create_directories(src_);
    test::write_test_file(src_ / "pages-1.img", 6 * kChunk + 100, 1);
    test::write_test_file(src_ / "core.img", 3000, 2);
    PackOptions po;
    po.chunk_bytes = kChunk;
    pack(src_, ckpt_, po);
  }

  nlohmann::json manifest() { return nlohmann::json::parse(read_file(ckpt_ / "manifest.json")); }
  // Rewrites the seal too: these tests exercise the checks behind the whole-manifest
  // checksum, which anyone who can recompute it (it is not a secret) must still pass.
  void write_manifest(const std::string& text) {
    std::ofstream(ckpt_ / "manifest.json", std::ios::trunc) << text;
    std::ofstream(ckpt_ / "manifest.seal", std::ios::trunc) << image::make_seal(text);
  }
  void flip_byte(std::uint64_t offset) {
    std::fstream f(ckpt_ / "blob-000000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x20);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }
  // Unpack and verify both fail with `code`/`needle`; unpack leaves nothing behind.
  void expect_unreadable(Errc code, const std::string& needle) {
    expect_error([&] { unpack(ckpt_, out_); }, code, needle);
    EXPECT_FALSE(fs::exists(out_));
    EXPECT_EQ(list(dir_.path()), (std::vector<std::string>{"ckpt", "src"}));
    expect_error([&] { verify(ckpt_); }, code, needle);
  }

  TempDir dir_ = test::scratch_dir();
  fs::path src_, ckpt_, out_;
};

TEST_F(ImageErrors, TruncatedBlob) {
  const auto size = fs::file_size(ckpt_ / "blob-000000.bin");
  fs::resize_file(ckpt_ / "blob-000000.bin", size - 10);
  expect_unreadable(Errc::kCorrupt, "blob-000000.bin is truncated");
}

TEST_F(ImageErrors, FlippedByteInACompressedChunk) {
  const auto m = manifest();
  const auto& c = m["entries"][1]["chunks"][2];  // pages-1.img, third chunk
  ASSERT_EQ(m["entries"][1]["path"], "pages-1.img");
  flip_byte(c["offset"].get<std::uint64_t>() + c["stored"].get<std::uint64_t>() / 2);
  expect_unreadable(Errc::kCorrupt, "chunk 2 of 'pages-1.img'");
  expect_error([&] { verify(ckpt_); }, Errc::kCorrupt, "xxh3 checksum");
}

TEST_F(ImageErrors, FlippedByteInTheLastChunkOfABlob) {
  flip_byte(fs::file_size(ckpt_ / "blob-000000.bin") - 1);
  expect_unreadable(Errc::kCorrupt, "checksum");
}

TEST_F(ImageErrors, WholeFileHashMismatch) {
  // Chunks intact, file hash wrong: caught after decompression.
  auto m = manifest();
  m["entries"][0]["xxh3"] = "0123456789abcdef";
  write_manifest(m.dump());
  expect_unreadable(Errc::kCorrupt, "content of 'core.img' does not match its xxh3");
}

TEST_F(ImageErrors, MissingManifest) {
  fs::remove(ckpt_ / "manifest.json");
  expect_unreadable(Errc::kCorrupt, "manifest.json is missing");
  expect_error([&] { inspect(ckpt_); }, Errc::kCorrupt, "manifest.json is missing");
  // A directory that never was a checkpoint is bad input rather than corruption.
  expect_error([&] { inspect(src_); }, Errc::kInvalidInput, "not a gpuckpt checkpoint");
}

TEST_F(ImageErrors, MissingBlob) {
  fs::remove(ckpt_ / "blob-000000.bin");
  expect_unreadable(Errc::kCorrupt, "blob-000000.bin is missing");
}

TEST_F(ImageErrors, UnparsableManifest) {
  const std::string text = read_file(ckpt_ / "manifest.json");
  write_manifest(text.substr(0, text.size() / 2));
  expect_unreadable(Errc::kCorrupt, "not valid JSON");
  expect_error([&] { inspect(ckpt_); }, Errc::kCorrupt, "not valid JSON");
}

TEST_F(ImageErrors, WrongFormatVersion) {
  auto m = manifest();
  m["format_version"] = kImageFormatMajor + 1;
  write_manifest(m.dump());
  expect_unreadable(Errc::kVersion, "format version 2 is not supported");
  expect_error([&] { inspect(ckpt_); }, Errc::kVersion, "format version");
}

TEST_F(ImageErrors, NewerMinorVersionWithUnknownFieldsIsAccepted) {
  auto m = manifest();
  m["format_minor"] = 7;
  m["some_future_field"] = {{"x", 1}};
  write_manifest(m.dump());
  EXPECT_EQ(inspect(ckpt_).format_minor, 7u);
  verify(ckpt_);
}

TEST_F(ImageErrors, ManifestPathsCannotEscapeTheOutput) {
  auto m = manifest();
  m["entries"][0]["path"] = "../escaped.img";
  write_manifest(m.dump());
  expect_unreadable(Errc::kCorrupt, "not a safe relative path");
  EXPECT_FALSE(fs::exists(dir_.path() / "escaped.img"));
}

TEST_F(ImageErrors, InconsistentChunkTable) {
  const auto original = manifest();
  auto m = original;
  m["entries"][1]["chunks"][0]["offset"] = 1ull << 40;
  write_manifest(m.dump());
  expect_unreadable(Errc::kCorrupt, "lies outside its blob");

  m = original;
  m["entries"][1]["chunks"][1]["raw"] = 1000;  // a short chunk in the middle of a file
  write_manifest(m.dump());
  expect_unreadable(Errc::kCorrupt, "inconsistent");
}

TEST_F(ImageErrors, InputPathMissing) {
  expect_error([&] { pack(dir_.path() / "nope", dir_.path() / "c2"); }, Errc::kInvalidInput,
               "does not exist");
  EXPECT_FALSE(fs::exists(dir_.path() / "c2"));
  expect_error([&] { unpack(dir_.path() / "nope", out_); }, Errc::kInvalidInput, "does not exist");
  expect_error([&] { verify(dir_.path() / "nope"); }, Errc::kInvalidInput, "does not exist");
}

TEST_F(ImageErrors, OutputExistsWithoutForce) {
  const std::string before = read_file(ckpt_ / "manifest.json");
  expect_error([&] { pack(src_, ckpt_); }, Errc::kExists, "already exists");
  EXPECT_EQ(read_file(ckpt_ / "manifest.json"), before);
  fs::create_directories(out_);
  std::ofstream(out_ / "x") << "x";
  expect_error([&] { unpack(ckpt_, out_); }, Errc::kExists, "already exists");
  EXPECT_EQ(list(out_), std::vector<std::string>{"x"});
}

TEST_F(ImageErrors, BadOptions) {
  PackOptions po;
  po.chunk_bytes = 1000;
  expect_error([&] { pack(src_, dir_.path() / "c2", po); }, Errc::kUsage, "chunk size");
  po = {};
  po.zstd_level = 99;
  expect_error([&] { pack(src_, dir_.path() / "c2", po); }, Errc::kUsage, "zstd level");
  po = {};
  po.queue_depth = 0;
  expect_error([&] { pack(src_, dir_.path() / "c2", po); }, Errc::kUsage, "queue depth");
  EXPECT_FALSE(fs::exists(dir_.path() / "c2"));
}

TEST_F(ImageErrors, OutputInsideInputIsRefused) {
  expect_error([&] { pack(src_, src_ / "ckpt"); }, Errc::kInvalidInput, "inside the input");
  EXPECT_FALSE(fs::exists(src_ / "ckpt"));
}

TEST_F(ImageErrors, UnsupportedFileTypeInInput) {
  ASSERT_EQ(::mkfifo((src_ / "fifo").c_str(), 0644), 0);
  expect_error([&] { pack(src_, dir_.path() / "c2"); }, Errc::kInvalidInput, "fifo");
  EXPECT_FALSE(fs::exists(dir_.path() / "c2"));
}

class FullDisk : public ::testing::TestWithParam<bool> {};

TEST_P(FullDisk, PackFailsWithIoAndLeavesNothing) {
  auto dir = test::scratch_dir();
  test::TmpfsMount mnt(dir.path() / "small", "size=8m");
  if (!mnt.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (" << mnt.why() << "); needs root";
  test::write_test_file(dir.path() / "big.img", 16 << 20, 1, 1.0);  // incompressible
  PackOptions po;
  po.direct_io = GetParam();
  expect_error([&] { pack(dir.path() / "big.img", dir.path() / "small/ckpt", po); }, Errc::kIo,
               "No space left on device");
  EXPECT_TRUE(fs::is_empty(dir.path() / "small")) << "temporary files were left behind";
}

INSTANTIATE_TEST_SUITE_P(Io, FullDisk, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Direct" : "Buffered"; });

TEST(FullDiskUnpack, UnpackFailsWithIoAndLeavesNothing) {
  auto dir = test::scratch_dir();
  test::TmpfsMount mnt(dir.path() / "small", "size=8m");
  if (!mnt.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (" << mnt.why() << "); needs root";
  test::write_test_file(dir.path() / "big.img", 16 << 20, 1, 0.0);  // compresses well
  pack(dir.path() / "big.img", dir.path() / "ckpt");
  expect_error([&] { unpack(dir.path() / "ckpt", dir.path() / "small/out"); }, Errc::kIo,
               "No space left on device");
  EXPECT_TRUE(fs::is_empty(dir.path() / "small"));
}

}  // namespace
