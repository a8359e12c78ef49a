// Checkpoints as something another party may have written or may read: private modes, the
// whole-manifest seal, a reader that only reads regular files and bounded work, unpack outputs
// it must not destroy, the ownership (StrictModes) check before a restore, and signatures.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "gpuckpt/support.h"
#include "image/chunk_codec.h"
#include "image/manifest.h"
#include "test_support.h"
#include "trust/keys.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using nlohmann::json;

namespace {

constexpr std::uint32_t kChunk = 64 << 10;

void expect_error(const std::function<void()>& f, Errc code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected Error(" << errc_name(code) << ") with \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << needle << "\"";
  }
}

std::string octal(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m));
  return buf;
}

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t m) : old_(::umask(m)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

// A checkpoint of a small tree (two files, a symlink) with a process record in `extra`.
class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = dir_.path() / "src";
    ckpt_ = dir_.path() / "ckpt";
    out_ = dir_.path() / "out";
    fs::create_directories(src_);
    test::write_test_file(src_ / "pages-1.img", 6 * kChunk + 100, 1);
    test::write_test_file(src_ / "core.img", 3000, 2);
    fs::create_symlink("core.img", src_ / "link");
    pack_into(ckpt_);
  }
  void pack_into(const fs::path& out, const fs::path& key = {}) {
    PackOptions po;
    po.chunk_bytes = kChunk;
    po.extra = nlohmann::json::parse(R"({"process":{"pid":1234,"comm":"srv"}})");
    po.sign_key = key;
    pack(src_, out, po);
  }
  std::string manifest_text() { return read_file(ckpt_ / "manifest.json"); }
  json manifest() { return json::parse(manifest_text()); }
  // A manifest whose seal was recomputed: what a writer (or an attacker) who knows the
  // non-secret checksum produces.
  void write_sealed(const std::string& text) {
    write_text(ckpt_ / "manifest.json", text);
    write_text(ckpt_ / "manifest.seal", image::make_seal(text));
  }
  // Every reader fails with `code` and `needle`; unpack leaves nothing.
  void expect_unreadable(Errc code, const std::string& needle) {
    expect_error([&] { inspect(ckpt_); }, code, needle);
    expect_error([&] { verify(ckpt_); }, code, needle);
    expect_error([&] { unpack(ckpt_, out_); }, code, needle);
    EXPECT_FALSE(fs::exists(fs::symlink_status(out_)));
  }

  TempDir dir_ = test::scratch_dir();
  fs::path src_, ckpt_, out_;
};

// ---- D5: private modes -----------------------------------------------------------------------

class PrivateModes : public Checkpoint, public ::testing::WithParamInterface<mode_t> {};

TEST_P(PrivateModes, PackWritesDirectory0700AndFiles0600WhateverTheUmask) {
  const fs::path ckpt = dir_.path() / "private";
  {
    ScopedUmask um(GetParam());
    PackOptions po;
    po.chunk_bytes = kChunk;
    po.max_blob_bytes = 2 * kChunk;  // several blobs: each must be private
    pack(src_, ckpt, po);
  }
  EXPECT_EQ(mode_of(ckpt), 0700u);
  std::size_t blobs = 0;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    EXPECT_EQ(mode_of(e.path()), 0600u) << e.path();
    blobs += e.path().extension() == ".bin";
  }
  EXPECT_GT(blobs, 1u);
  EXPECT_EQ(mode_of(ckpt / "manifest.json"), 0600u);
  EXPECT_EQ(mode_of(ckpt / "manifest.seal"), 0600u);
}

TEST_P(PrivateModes, UnpackOutputRootIs0700AndEntriesKeepTheirRecordedModes) {
  {
    ScopedUmask um(GetParam());
    unpack(ckpt_, out_);
  }
  EXPECT_EQ(mode_of(out_), 0700u);
  EXPECT_EQ(mode_of(out_ / "pages-1.img"), mode_of(src_ / "pages-1.img"));
  EXPECT_EQ(mode_of(out_ / "core.img"), mode_of(src_ / "core.img"));
}

INSTANTIATE_TEST_SUITE_P(Umask, PrivateModes, ::testing::Values(0000, 0022, 0777),
                         [](const auto& info) { return "Umask" + octal(info.param); });

// ---- D8: one checksum over the whole manifest -------------------------------------------------

struct Edit {
  const char* name;
  std::function<void(json&)> apply;
};
void PrintTo(const Edit& e, std::ostream* os) {
  *os << e.name;
}

class EditedManifest : public Checkpoint, public ::testing::WithParamInterface<Edit> {};

TEST_P(EditedManifest, FailsInspectVerifyAndUnpackWithCorrupt) {
  json m = manifest();
  GetParam().apply(m);
  // Same layout as the writer's, so only the edited field differs.
  write_text(ckpt_ / "manifest.json", m.dump(1) + "\n");
  expect_unreadable(Errc::kCorrupt, "does not match its checksum in manifest.seal");
}

json& entry(json& m, const std::string& path) {
  for (auto& e : m["entries"])
    if (e["path"] == path) return e;
  throw std::runtime_error("no entry " + path);
}

INSTANTIATE_TEST_SUITE_P(
    Field, EditedManifest,
    ::testing::Values(Edit{"Mode", [](json& m) { entry(m, "core.img")["mode"] = "4755"; }},
                      Edit{"SymlinkTarget",
                           [](json& m) { entry(m, "link")["target"] = "/etc/shadow"; }},
                      Edit{"ExtraProcessPid", [](json& m) { m["extra"]["process"]["pid"] = 1; }},
                      Edit{"FormatMinor", [](json& m) { m["format_minor"] = 0; }}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(Checkpoint, SealIsTheXxh3OfTheManifestFileAsXxhsumPrintsIt) {
  const std::string text = manifest_text();
  const json seal = json::parse(read_file(ckpt_ / "manifest.seal"));
  EXPECT_EQ(seal["format"], "gpuckpt-seal");
  EXPECT_EQ(seal["manifest_bytes"], text.size());
  EXPECT_EQ(seal["manifest_xxh3"], format_hex64(image::xxh3(text.data(), text.size())));
  EXPECT_FALSE(seal.contains("signature"));
  const ImageInfo info = inspect(ckpt_);
  EXPECT_TRUE(info.sealed);
  EXPECT_EQ(info.format_minor, kImageFormatMinor);
  EXPECT_EQ(info.signature.state, SignatureState::kUnsigned);
}

TEST_F(Checkpoint, MissingSealOfASealedFormatIsCorrupt) {
  fs::remove(ckpt_ / "manifest.seal");
  expect_unreadable(Errc::kCorrupt, "manifest.seal is missing");
}

TEST_F(Checkpoint, Format10ManifestWithoutSealIsStillRead) {
  json m = manifest();
  m["format_minor"] = 0;
  write_text(ckpt_ / "manifest.json", m.dump(1));
  fs::remove(ckpt_ / "manifest.seal");
  EXPECT_FALSE(inspect(ckpt_).sealed);
  verify(ckpt_);
}

TEST_F(Checkpoint, DamagedSealIsCorrupt) {
  write_text(ckpt_ / "manifest.seal", "{\"format\": \"something else\"}");
  expect_unreadable(Errc::kCorrupt, "manifest.seal is not a gpuckpt seal");
}

// ---- D9: only regular files, bounded work ---------------------------------------------------

TEST_F(Checkpoint, ManifestSymlinkIsRefusedNotFollowed) {
  fs::remove(ckpt_ / "manifest.json");
  fs::create_symlink("/dev/zero", ckpt_ / "manifest.json");
  expect_unreadable(Errc::kCorrupt, "manifest.json is a symbolic link");
  // Even to a good manifest: what a link leads to is not part of the checkpoint.
  write_text(dir_.path() / "good.json", read_file(src_ / "core.img"));
  fs::remove(ckpt_ / "manifest.json");
  fs::create_symlink(dir_.path() / "good.json", ckpt_ / "manifest.json");
  expect_unreadable(Errc::kCorrupt, "manifest.json is a symbolic link");
}

TEST_F(Checkpoint, FifoAsManifestIsRefusedWithoutWaitingForAWriter) {
  fs::remove(ckpt_ / "manifest.json");
  ASSERT_EQ(::mkfifo((ckpt_ / "manifest.json").c_str(), 0600), 0);
  // Through the CLI, so that a reader that blocks is killed by the timeout and fails here.
  const auto r = test::run_cli({"inspect", ckpt_.string()}, 30);
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("manifest.json is not a regular file"), std::string::npos) << r.err;
}

TEST_F(Checkpoint, DirectoryAsManifestIsCorruptNotAnIoError) {
  fs::remove(ckpt_ / "manifest.json");
  fs::create_directory(ckpt_ / "manifest.json");
  expect_unreadable(Errc::kCorrupt, "manifest.json is not a regular file");
}

TEST_F(Checkpoint, ManifestLargerThanTheCapIsRefusedBeforeItIsRead) {
  // Sparse: 257 MiB that would take seconds and gigabytes to parse.
  fs::resize_file(ckpt_ / "manifest.json", image::kMaxManifestBytes + 1);
  expect_unreadable(Errc::kCorrupt, "manifest.json is larger than");
}

TEST_F(Checkpoint, BlobThatIsADirectoryIsReportedAsNotARegularFile) {
  fs::remove(ckpt_ / "blob-000000.bin");
  fs::create_directory(ckpt_ / "blob-000000.bin");
  expect_error([&] { verify(ckpt_); }, Errc::kCorrupt, "blob-000000.bin is not a regular file");
  expect_error([&] { unpack(ckpt_, out_); }, Errc::kCorrupt, "is not a regular file");
}

TEST_F(Checkpoint, BlobSymlinkIsRefused) {
  const fs::path real = dir_.path() / "blob-copy.bin";
  fs::copy_file(ckpt_ / "blob-000000.bin", real);
  fs::remove(ckpt_ / "blob-000000.bin");
  fs::create_symlink(real, ckpt_ / "blob-000000.bin");
  expect_error([&] { verify(ckpt_); }, Errc::kCorrupt, "not a regular file (a symbolic link)");
}

TEST_F(Checkpoint, OverlappingChunksAreRefused) {
  json m = manifest();
  auto& chunks = entry(m, "pages-1.img")["chunks"];
  chunks[1]["offset"] = chunks[0]["offset"];  // both read the first chunk's bytes
  write_sealed(m.dump(1));
  expect_unreadable(Errc::kCorrupt, "overlaps chunk");
}

// Chunk records are read without a JSON tree; what is wrong with one is still named exactly.
TEST_F(Checkpoint, MalformedChunkRecordsAreNamedExactly) {
  const json original = manifest();
  const std::string where = "entries[2].chunks[2].";  // pages-1.img
  ASSERT_EQ(original["entries"][2]["path"], "pages-1.img");
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases{
      {[](json& c) { c["blob"] = "0"; }, "field '" + where + "blob' is not an unsigned integer"},
      {[](json& c) {
         c["offset"] = json::object({{"x", 1}});
       },
       "field '" + where + "offset' is not an unsigned integer"},
      {[](json& c) { c["raw"] = -1; }, "field '" + where + "raw' is not an unsigned integer"},
      {[](json& c) { c["stored"] = 1ull << 40; }, "field '" + where + "stored' is out of range"},
      {[](json& c) { c.erase("xxh3"); }, "lacks '" + where + "xxh3'"},
      {[](json& c) { c["xxh3"] = "xyz"; }, "is not a 16-digit hex xxh3"},
      {[](json& c) { c["codec"] = "lz4"; }, "field '" + where + "codec' names an unknown codec"},
      {[](json& c) { c["codec"] = json::array({"zstd"}); }, "codec' is not a string"},
      {[](json& c) { c = 7; }, "field '" + where + "' is not an object"},
      {[](json& c) {
         c = json::array({1, 2});
       },
       "field '" + where + "' is not an object"},
  };
  for (const auto& [mutate, needle] : cases) {
    json m = original;
    mutate(m["entries"][2]["chunks"][2]);
    write_sealed(m.dump(1));
    expect_error([&] { inspect(ckpt_); }, Errc::kCorrupt, needle);
  }
  // A repeated key counts once, the last time, as in a JSON tree.
  json m = original;
  const std::string chunks = m["entries"][2]["chunks"].dump();
  m["entries"][2].erase("chunks");
  std::string text = m.dump();
  const std::string anchor = "\"path\":\"pages-1.img\"";
  ASSERT_NE(text.find(anchor), std::string::npos);
  text.insert(text.find(anchor), "\"chunks\":[{\"bogus\":1}],\"chunks\":" + chunks + ",");
  write_sealed(text);
  EXPECT_EQ(inspect(ckpt_).files.at(2).chunks, original["entries"][2]["chunks"].size());
  verify(ckpt_);
}

// Two million records of the same 64 KiB, each with the right checksum: without the overlap
// rule verify would read and hash 128 GiB; it must refuse after reading the manifest.
TEST_F(Checkpoint, TwoMillionChunkRecordsOfOneRangeAreRefusedFast) {
  constexpr std::uint64_t kRecords = 2'000'000;
  ASSERT_GE(fs::file_size(ckpt_ / "blob-000000.bin"), kChunk);
  const std::string blob = read_file(ckpt_ / "blob-000000.bin");
  const std::string hash = format_hex64(image::xxh3(blob.data(), kChunk));

  json m = manifest();
  json& e = entry(m, "pages-1.img");
  const std::uint64_t other_raw =
      m["raw_bytes"].get<std::uint64_t>() - e["size"].get<std::uint64_t>();
  std::uint64_t other_stored = m["stored_bytes"].get<std::uint64_t>(), other_chunks = 0;
  for (const auto& c : e["chunks"]) other_stored -= c["stored"].get<std::uint64_t>();
  other_chunks = m["chunk_count"].get<std::uint64_t>() - e["chunks"].size();
  e["chunks"] = json::array();
  e["size"] = kRecords * kChunk;
  m["raw_bytes"] = other_raw + kRecords * kChunk;
  m["stored_bytes"] = other_stored + kRecords * kChunk;
  m["chunk_count"] = other_chunks + kRecords;
  std::string text = m.dump();
  const std::string placeholder = "\"chunks\":[]";
  ASSERT_EQ(text.find(placeholder), text.rfind(placeholder));
  const std::string record = json({{"blob", 0},
                                   {"offset", 0},
                                   {"stored", kChunk},
                                   {"raw", kChunk},
                                   {"codec", "raw"},
                                   {"xxh3", hash}})
                                 .dump();
  std::string records = "\"chunks\":[";
  records.reserve(kRecords * (record.size() + 1) + 16);
  for (std::uint64_t i = 0; i < kRecords; ++i) {
    if (i) records += ',';
    records += record;
  }
  records += ']';
  text.replace(text.find(placeholder), placeholder.size(), records);
  records.clear();
  records.shrink_to_fit();
  ASSERT_LT(text.size(), image::kMaxManifestBytes);
  write_sealed(text);
  text.clear();
  text.shrink_to_fit();

  // Refused from the manifest alone: the records carry valid checksums, so a reader that did not
  // check overlaps would read the same range two million times before noticing anything.
  expect_error([&] { verify(ckpt_); }, Errc::kCorrupt, "overlaps chunk");
}

// ---- D15: what unpack may replace --------------------------------------------------------------

TEST_F(Checkpoint, UnpackForceNeverReplacesARegularFile) {
  write_text(out_, "precious");
  UnpackOptions uo;
  uo.force = true;
  expect_error([&] { unpack(ckpt_, out_, uo); }, Errc::kExists, "is not a directory");
  EXPECT_EQ(read_file(out_), "precious");
}

TEST_F(Checkpoint, UnpackNeverReplacesASymlinkEvenToAnEmptyDirectory) {
  const fs::path target = dir_.path() / "empty";
  fs::create_directory(target);
  fs::create_directory_symlink(target, out_);
  for (bool force : {false, true}) {
    UnpackOptions uo;
    uo.force = force;
    expect_error([&] { unpack(ckpt_, out_, uo); }, Errc::kExists, "is a symbolic link");
    EXPECT_TRUE(fs::is_symlink(out_));
    EXPECT_TRUE(fs::is_empty(target));
  }
}

TEST_F(Checkpoint, UnpackForceReplacesAnEarlierUnpackOutput) {
  unpack(ckpt_, out_);
  write_text(out_ / "stale", "x");
  UnpackOptions uo;
  uo.force = true;
  unpack(ckpt_, out_, uo);
  EXPECT_FALSE(fs::exists(out_ / "stale"));
  EXPECT_TRUE(test::same_contents(src_ / "core.img", out_ / "core.img"));
}

// ---- D7: ownership and modes before a restore -----------------------------------------------

TEST_F(Checkpoint, FreshCheckpointOfRootIsTrusted) {
  check_trust(ckpt_, {});
}

TEST_F(Checkpoint, CheckpointWritableByGroupOrOthersIsUntrusted) {
  for (const auto& [name, mode] :
       std::vector<std::pair<std::string, mode_t>>{{"", 0770},
                                                   {"manifest.json", 0660},
                                                   {"manifest.seal", 0602},
                                                   {"blob-000000.bin", 0620}}) {
    const fs::path p = name.empty() ? ckpt_ : ckpt_ / name;
    const mode_t before = mode_of(p);
    ASSERT_EQ(::chmod(p.c_str(), mode), 0);
    expect_error([&] { check_trust(ckpt_, {}); }, Errc::kInvalidInput,
                 p.string() + " is writable by group or others");
    TrustOptions allow;
    allow.allow_untrusted = true;
    check_trust(ckpt_, allow);
    ASSERT_EQ(::chmod(p.c_str(), before), 0);
  }
  check_trust(ckpt_, {});
}

TEST_F(Checkpoint, CheckpointFileOwnedByAnotherUserIsUntrusted) {
  ASSERT_EQ(::chown((ckpt_ / "blob-000000.bin").c_str(), 65534, 65534), 0);
  expect_error([&] { check_trust(ckpt_, {}); }, Errc::kInvalidInput, "is owned by uid 65534");
}

TEST_F(Checkpoint, WritableDirectoryAboveIsUntrustedUnlessSticky) {
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0777), 0);
  expect_error([&] { check_trust(ckpt_, {}); }, Errc::kInvalidInput,
               dir_.path().string() + " is writable by group or others");
  ASSERT_EQ(::chmod(dir_.path().c_str(), 01777), 0);  // like /tmp: others cannot rename it
  check_trust(ckpt_, {});
}

TEST_F(Checkpoint, SymlinkInAnUntrustedDirectoryIsUntrusted) {
  const fs::path open_dir = dir_.path() / "open";
  fs::create_directory(open_dir);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  fs::create_directory_symlink(ckpt_, open_dir / "latest");  // anyone could repoint it
  expect_error([&] { check_trust(open_dir / "latest", {}); }, Errc::kInvalidInput,
               open_dir.string() + " is writable by group or others");
}

TEST_F(Checkpoint, AnotherUserTrustsItsOwnCheckpointWhichRootDoesNot) {
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);  // reachable by uid 65534
  for (const auto& e : fs::recursive_directory_iterator(ckpt_))
    ASSERT_EQ(::lchown(e.path().c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chown(ckpt_.c_str(), 65534, 65534), 0);
  expect_error([&] { check_trust(ckpt_, {}); }, Errc::kInvalidInput, "is owned by uid 65534");

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 3;
    if (::setgid(65534) == 0 && ::setuid(65534) == 0) {
      try {
        check_trust(ckpt_, {});
        rc = 0;
      } catch (const std::exception&) {
        rc = 1;
      }
    }
    ::_exit(rc);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "uid 65534 should trust a checkpoint it owns";
}

// ---- Signatures ------------------------------------------------------------------------------

class Signed : public Checkpoint {
 protected:
  void SetUp() override {
    Checkpoint::SetUp();
    key_ = generate_signing_key(dir_.path() / "node.key", "test@node");
    other_ = generate_signing_key(dir_.path() / "other.key", "other");
    fs::remove_all(ckpt_);
    pack_into(ckpt_, key_.secret_key);
  }
  TrustOptions require(const fs::path& keys) {
    TrustOptions t;
    t.require_signature = true;
    t.trusted_keys = keys;
    return t;
  }
  KeyPairInfo key_, other_;
};

TEST_F(Signed, KeygenWritesAPrivateSecretKeyWhateverTheUmask) {
  const fs::path k = dir_.path() / "k";
  {
    ScopedUmask um(0);
    generate_signing_key(k, "x");
  }
  EXPECT_EQ(mode_of(k), 0600u);
  EXPECT_EQ(mode_of(k.string() + ".pub"), 0644u);
  expect_error([&] { generate_signing_key(k, "x"); }, Errc::kExists, "already exists");
  generate_signing_key(k, "x", true);
}

TEST_F(Signed, SignatureIsValidAndTrustedByItsPublicKey) {
  const ImageInfo info = inspect(ckpt_);
  EXPECT_EQ(info.signature.state, SignatureState::kValid);
  EXPECT_EQ(info.signature.key_id, key_.key_id);
  const SignatureInfo s = signature_status(ckpt_, key_.public_key);
  EXPECT_TRUE(s.trusted());
  EXPECT_EQ(s.trusted_by, key_.public_key);
  EXPECT_FALSE(signature_status(ckpt_, other_.public_key).trusted());
  check_trust(ckpt_, require(key_.public_key));
  // A directory of keys, as /etc/gpuckpt/trusted-keys is.
  const fs::path keys = dir_.path() / "trusted";
  fs::create_directory(keys);
  fs::copy_file(key_.public_key, keys / "node.pub");
  fs::copy_file(other_.public_key, keys / "other.pub");
  check_trust(ckpt_, require(keys));
}

// XXH3 can be matched by crafted data; a signature must rest on digests that cannot.
TEST_F(Signed, SignedManifestRecordsTheBlake2bOfEveryChunk) {
  const json m = manifest();
  const std::string blob = read_file(ckpt_ / "blob-000000.bin");
  std::size_t n = 0;
  for (const auto& e : m["entries"]) {
    for (const auto& c : e.value("chunks", json::array())) {
      const auto off = c["offset"].get<std::size_t>(), len = c["stored"].get<std::size_t>();
      EXPECT_EQ(c["blake2b"], image::hex(image::blake2b(blob.data() + off, len)));
      ++n;
    }
  }
  EXPECT_GT(n, 1u);
  verify(ckpt_);
}

TEST_F(Signed, ChunkThatFailsItsBlake2bIsCorrupt) {
  json m = manifest();
  entry(m, "pages-1.img")["chunks"][1]["blake2b"] = std::string(64, '0');
  write_sealed(m.dump(1));  // unsigned now: the reader's own check must catch it
  expect_error([&] { verify(ckpt_); }, Errc::kCorrupt, "chunk 1 of 'pages-1.img' (blob-000000.bin");
  expect_error([&] { unpack(ckpt_, out_); }, Errc::kCorrupt, "fail their blake2b digest");
}

TEST_F(Signed, SignedManifestWithoutChunkDigestsIsInvalid) {
  json m = manifest();
  for (auto& e : m["entries"])
    if (e.contains("chunks"))
      for (auto& c : e["chunks"]) c.erase("blake2b");
  const std::string text = m.dump(1);
  const auto key = trust::SigningKey::load(key_.secret_key);  // the real key, re-signing
  write_text(ckpt_ / "manifest.json", text);
  write_text(ckpt_ / "manifest.seal", image::make_seal(text, &key));
  const SignatureInfo s = inspect(ckpt_).signature;
  EXPECT_EQ(s.state, SignatureState::kInvalid);
  EXPECT_NE(s.problem.find("lacks the blake2b digest"), std::string::npos) << s.problem;
  expect_error([&] { check_trust(ckpt_, require(key_.public_key)); }, Errc::kCorrupt,
               "does not cover its data");
}

TEST_F(Signed, ManifestChangedAfterSigningIsInvalidEvenWithAFreshChecksum) {
  json m = manifest();
  m["extra"]["process"]["pid"] = 1;
  const std::string text = m.dump(1);
  // The attacker recomputes the (public) checksum but cannot sign.
  json seal = json::parse(read_file(ckpt_ / "manifest.seal"));
  seal["manifest_bytes"] = text.size();
  seal["manifest_xxh3"] = format_hex64(image::xxh3(text.data(), text.size()));
  write_text(ckpt_ / "manifest.json", text);
  write_text(ckpt_ / "manifest.seal", seal.dump());

  const ImageInfo info = inspect(ckpt_);  // inspect shows it, and says so
  EXPECT_EQ(info.signature.state, SignatureState::kInvalid);
  EXPECT_EQ(info.signature.key_id, key_.key_id);
  expect_error([&] { verify(ckpt_); }, Errc::kCorrupt, "invalid signature");
  expect_error([&] { unpack(ckpt_, out_); }, Errc::kCorrupt, "invalid signature");
  expect_error([&] { check_trust(ckpt_, {}); }, Errc::kCorrupt, "does not match the manifest");
}

TEST_F(Signed, ResigningWithAnotherKeyIsNotTrusted) {
  fs::remove_all(ckpt_);
  pack_into(ckpt_, other_.secret_key);
  EXPECT_EQ(inspect(ckpt_).signature.state, SignatureState::kValid);
  expect_error([&] { check_trust(ckpt_, require(key_.public_key)); }, Errc::kInvalidInput,
               "signed by key " + other_.key_id + ", which is not among the trusted keys");
  check_trust(ckpt_, {});  // not required: accepted
}

TEST_F(Signed, RequiredSignatureRefusesAnUnsignedCheckpoint) {
  fs::remove_all(ckpt_);
  pack_into(ckpt_);
  expect_error([&] { check_trust(ckpt_, require(key_.public_key)); }, Errc::kInvalidInput,
               "is not signed, and a signature is required");
  expect_error([&] { check_trust(ckpt_, require({})); }, Errc::kInvalidInput,
               "no trusted keys are configured");
}

TEST_F(Signed, SecretKeyReadableByOthersIsRefused) {
  ASSERT_EQ(::chmod(key_.secret_key.c_str(), 0640), 0);
  PackOptions po;
  po.sign_key = key_.secret_key;
  expect_error([&] { pack(src_, dir_.path() / "c2", po); }, Errc::kInvalidInput, "chmod 600");
  EXPECT_FALSE(fs::exists(dir_.path() / "c2"));
}

TEST_F(Signed, TrustedKeysWritableByOthersAreRefused) {
  ASSERT_EQ(::chmod(key_.public_key.c_str(), 0666), 0);
  expect_error([&] { check_trust(ckpt_, require(key_.public_key)); }, Errc::kInvalidInput,
               "is writable by group or others");
}

// ---- Site configuration ---------------------------------------------------------------------

TEST_F(Checkpoint, SecurityConfigFileSetsTheDefaults) {
  const fs::path conf = dir_.path() / "config.json";
  write_text(conf, R"({"sign_key": "node.key", "trusted_keys": "/etc/keys",
                       "require_signature": true})");
  test::ScopedEnv env("GPUCKPT_CONFIG", conf.string());
  const SecurityConfig c = load_security_config();
  EXPECT_EQ(c.file, conf);
  EXPECT_EQ(c.sign_key, dir_.path() / "node.key");  // relative to the config's directory
  EXPECT_EQ(c.trusted_keys, "/etc/keys");
  EXPECT_TRUE(c.require_signature);

  write_text(conf, R"({"require_signatures": true})");
  expect_error([] { load_security_config(); }, Errc::kInvalidInput,
               "unknown setting 'require_signatures'");
  write_text(conf, "{}");
  ASSERT_EQ(::chmod(conf.c_str(), 0666), 0);
  expect_error([] { load_security_config(); }, Errc::kInvalidInput,
               "is writable by group or others");
  fs::remove(conf);
  expect_error([] { load_security_config(); }, Errc::kInvalidInput, "does not exist");
}

}  // namespace
