// The image commands through the real gpuckpt binary: output formats, exit codes, and that
// every failure message names the problem.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "gpuckpt/image.h"
#include "image/manifest.h"
#include "test_support.h"
#include "util/fs.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using nlohmann::json;

namespace {

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

class ImageCli : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = dir_.path() / "src";
    ckpt_ = dir_.path() / "ckpt";
    fs::create_directories(src_ / "sub");
    test::write_test_file(src_ / "pages-1.img", 5 * 65536 + 17, 1);
    test::write_test_file(src_ / "sub/core-1.img", 2000, 2);
  }
  test::CliResult pack_ok(std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--json",       "pack",         src_.string(), "-o",
                                  ckpt_.string(), "--chunk-size", "64K"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  }
  // Writes the manifest and a seal that matches it (as a future writer would).
  void reseal(const std::string& text) {
    std::ofstream(ckpt_ / "manifest.json", std::ios::trunc) << text;
    std::ofstream(ckpt_ / "manifest.seal", std::ios::trunc) << image::make_seal(text);
  }
  void flip_byte_in_blob() {
    std::fstream f(ckpt_ / "blob-000000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 1);
    f.seekp(100);
    f.write(&c, 1);
  }

  TempDir dir_ = test::scratch_dir();
  fs::path src_, ckpt_;
};

TEST_F(ImageCli, PackInspectVerifyUnpackWithJson) {
  auto r = pack_ok({"--level", "3", "--threads", "2", "--queue-depth", "8"});
  const json p = json::parse(r.out);
  EXPECT_EQ(p["ok"], true);
  EXPECT_EQ(p["command"], "pack");
  EXPECT_EQ(p["raw_bytes"], 5 * 65536 + 17 + 2000);
  EXPECT_EQ(p["chunks"], 7);
  EXPECT_EQ(p["threads"], 2);
  bool has_bytes_stage = false;
  for (const auto& s : p["timeline"]["stages"])
    has_bytes_stage |= s["name"] == "compress_write" && s["bytes"] == p["raw_bytes"];
  EXPECT_TRUE(has_bytes_stage) << r.out;

  r = test::run_cli({"inspect", ckpt_.string(), "--json"});  // global flag after the command
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json i = json::parse(r.out);
  EXPECT_EQ(i["format_version"], kImageFormatMajor);
  EXPECT_EQ(i["zstd_level"], 3);
  EXPECT_EQ(i["chunk_bytes"], 65536);
  ASSERT_EQ(i["files"].size(), 3u);  // pages-1.img, sub, sub/core-1.img
  EXPECT_EQ(i["files"][0]["path"], "pages-1.img");
  EXPECT_EQ(i["files"][0]["chunks"], 6);
  EXPECT_EQ(i["files"][1]["type"], "dir");

  r = test::run_cli({"inspect", ckpt_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "format       1." + std::to_string(kImageFormatMinor))) << r.out;
  EXPECT_TRUE(contains(r.out, "sub/core-1.img")) << r.out;

  r = test::run_cli({"--json", "verify", ckpt_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["ok"], true);
  r = test::run_cli({"verify", ckpt_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "OK")) << r.out;

  const fs::path out = dir_.path() / "out";
  r = test::run_cli({"--json", "unpack", ckpt_.string(), "-o", out.string(), "--no-direct"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["direct_io"], false);
  EXPECT_TRUE(test::same_contents(src_ / "pages-1.img", out / "pages-1.img"));
  EXPECT_TRUE(test::same_contents(src_ / "sub/core-1.img", out / "sub/core-1.img"));
}

TEST_F(ImageCli, HumanOutputShowsThroughputAndStages) {
  auto r = test::run_cli({"pack", src_.string(), "-o", ckpt_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "GB/s")) << r.out;
  EXPECT_TRUE(contains(r.out, "compress_write")) << r.out;
}

TEST_F(ImageCli, CorruptBlobExitsFourAndUnpackLeavesNothing) {
  pack_ok();
  flip_byte_in_blob();
  auto r = test::run_cli({"verify", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_TRUE(contains(r.err, "fail their xxh3 checksum")) << r.err;
  EXPECT_TRUE(contains(r.err, "pages-1.img")) << r.err;

  const fs::path out = dir_.path() / "out";
  r = test::run_cli({"--json", "unpack", ckpt_.string(), "-o", out.string()});
  EXPECT_EQ(r.exit_code, 4);
  const json e = json::parse(r.out);
  EXPECT_EQ(e["ok"], false);
  EXPECT_EQ(e["error"]["code"], "corrupt");
  EXPECT_FALSE(fs::exists(out));
  for (auto& entry : fs::directory_iterator(dir_.path()))
    EXPECT_FALSE(contains(entry.path().filename().string(), ".tmp-")) << entry.path();
}

// An interrupted pack removes its unfinished output at once; a killed one leaves it hidden, and
// the next pack to that output removes it.
TEST_F(ImageCli, InterruptedOrKilledPackLeavesNoHiddenOutputForLong) {
  auto hidden = [&] {
    std::vector<std::string> found;
    for (auto& e : fs::directory_iterator(dir_.path()))
      if (e.path().filename().string().starts_with(".ckpt.")) found.push_back(e.path());
    return found;
  };
  const std::vector<std::string> pack{"pack", src_.string(), "-o", ckpt_.string()};
  Child c = test::paused_cli(pack, "pack_commit", dir_.path());
  ASSERT_EQ(hidden().size(), 1u) << "the unfinished output is not where it is expected";
  c.kill(SIGINT);
  ExitStatus st = c.wait();
  EXPECT_FALSE(st.exited);
  EXPECT_EQ(st.code, SIGINT);
  EXPECT_TRUE(hidden().empty()) << hidden().front();
  EXPECT_FALSE(fs::exists(ckpt_));
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_TRUE(contains(err, "removed the unfinished")) << err;

  c = test::paused_cli(pack, "pack_commit", dir_.path());
  c.kill(SIGKILL);
  st = c.wait();
  EXPECT_EQ(st.code, SIGKILL);
  ASSERT_EQ(hidden().size(), 1u);
  const std::string left = hidden().front();
  auto r = test::run_cli(pack);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "a gpuckpt that was killed")) << r.err;
  EXPECT_FALSE(fs::exists(left));
  EXPECT_TRUE(hidden().empty()) << hidden().front();
  EXPECT_EQ(test::run_cli({"verify", ckpt_.string()}).exit_code, 0);
}

// A replacement swaps the two names, then removes the old content. Killed in between, the old
// content stayed beside the output with its manifest and seal and no marker: a whole-looking
// checkpoint under a hidden name that no sweep would ever take.
TEST_F(ImageCli, AReplacedCheckpointLeftByAKillIsNoCheckpointAndIsSwept) {
  pack_ok();
  auto hidden = [&] {
    std::vector<fs::path> found;
    for (auto& e : fs::directory_iterator(dir_.path()))
      if (e.path().filename().string().starts_with(".ckpt.")) found.push_back(e.path());
    return found;
  };
  Child c = test::paused_cli({"pack", src_.string(), "-o", ckpt_.string(), "--force"}, "replaced",
                             dir_.path());
  c.kill(SIGKILL);
  c.wait();
  ASSERT_EQ(hidden().size(), 1u);
  const fs::path old = hidden().front();
  EXPECT_TRUE(fs::exists(old / "manifest.json"));
  EXPECT_FALSE(fs::exists(old / "manifest.seal"));
  EXPECT_TRUE(fs::exists(old / kTempMarker));
  EXPECT_EQ(test::run_cli({"verify", ckpt_.string()}).exit_code, 0);
  // The next write of that output sweeps it, as any temporary a killed gpuckpt left there.
  const auto r = test::run_cli({"pack", src_.string(), "-o", ckpt_.string(), "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(old)) << r.err;
  EXPECT_TRUE(hidden().empty());
}

// Unpacked, a top-level .gpuckpt-temp would mark the output as a temporary of a killed gpuckpt,
// which the next run's sweep removes.
TEST_F(ImageCli, TheTemporaryMarkerIsNeverPackedAtTheTop) {
  test::write_test_file(src_ / "sub" / kTempMarker, 10, 3);  // deeper down it is any file
  pack_ok();
  test::write_test_file(src_ / kTempMarker, 10, 3);
  const auto r = test::run_cli({"pack", src_.string(), "-o", (dir_.path() / "marked").string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, kTempMarker)) << r.err;
  EXPECT_FALSE(fs::exists(dir_.path() / "marked"));
  // Nor read from a manifest that lists it (a checkpoint not made by this gpuckpt).
  json m = json::parse(read_file(ckpt_ / "manifest.json"));
  for (auto& e : m["entries"])
    if (e["path"] == "sub/" + std::string(kTempMarker)) e["path"] = kTempMarker;
  reseal(m.dump());
  const auto v = test::run_cli({"verify", ckpt_.string()});
  EXPECT_EQ(v.exit_code, 4) << v.err;
  EXPECT_TRUE(contains(v.err, "the name of gpuckpt's temporary marker")) << v.err;
}

// Without --force, unpack may only take an empty directory's place: a directory made (and
// filled) while it ran was swapped out and deleted, its files with it.
TEST_F(ImageCli, UnpackNeverReplacesWhatAppearedWhileItRanWithoutForce) {
  ASSERT_EQ(test::run_cli({"pack", src_.string(), "-o", ckpt_.string()}).exit_code, 0);
  const fs::path out = dir_.path() / "un";
  Child c = test::paused_cli({"--json", "unpack", ckpt_.string(), "-o", out.string()},
                             "unpack_commit", dir_.path(), test::Resume::kWhenUnmarked);
  fs::create_directory(out);
  std::ofstream(out / "notes.txt") << "precious";
  test::resume_paused(dir_.path(), "unpack_commit");
  const ExitStatus st = c.wait();
  EXPECT_TRUE(st.exited);
  EXPECT_EQ(st.code, 12);
  EXPECT_EQ(read_file(out / "notes.txt"), "precious");
  const json e = json::parse(read_file(dir_.path() / "cli.out"), nullptr, false);
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(e["error"]["code"], "exists");
  for (auto& entry : fs::directory_iterator(dir_.path()))
    EXPECT_FALSE(contains(entry.path().filename().string(), ".tmp-")) << entry.path();

  // An empty directory that was there all along is still taken.
  fs::remove_all(out);
  fs::create_directory(out);
  const auto r = test::run_cli({"unpack", ckpt_.string(), "-o", out.string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::is_empty(out));
}

// Linux names are bytes; JSON holds UTF-8. A path that is not UTF-8 aborted gpuckpt (an
// uncaught json type_error, no output at all), and a file named so packed as "internal error".
TEST_F(ImageCli, NamesThatAreNotUtf8GetAClearErrorAndValidJson) {
  const std::string bad = (dir_.path() / "bad\xff.ckpt").string();
  for (const char* cmd : {"inspect", "verify"}) {
    SCOPED_TRACE(cmd);
    const auto r = test::run_cli({"--json", cmd, bad});
    EXPECT_EQ(r.exit_code, 3) << r.err;  // invalid_input: no such checkpoint
    const json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j["error"]["code"], "invalid_input");
  }
  // An existing checkpoint under such a name is read as any other.
  ASSERT_EQ(test::run_cli({"pack", src_.string(), "-o", ckpt_.string()}).exit_code, 0);
  fs::rename(ckpt_, bad);
  auto r = test::run_cli({"--json", "verify", bad});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(json::parse(r.out, nullptr, false).is_object()) << r.out;
  // A file so named cannot go into a manifest: refused, by name, before anything is written.
  std::ofstream(src_ / "f\xfe") << "x";
  const fs::path out = dir_.path() / "named.ckpt";
  r = test::run_cli({"--json", "pack", src_.string(), "-o", out.string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_NE(j["error"].value("message", "").find("is not UTF-8"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  fs::remove(src_ / "f\xfe");
}

// A signal may come before gpuckpt has parsed its command line: with --json, stdout must still
// carry the one JSON object that says it was interrupted (found by a hostile test: 7 of 40
// signals 8-25 ms after the start printed nothing).
TEST_F(ImageCli, AnInterruptBeforeTheCommandLineIsParsedStillPrintsItsJson) {
  for (const int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(strsignal(sig));
    fs::remove(dir_.path() / "cli.out");  // appended to
    Child c = test::paused_cli({"--json", "verify", ckpt_.string()}, "parse", dir_.path());
    c.kill(sig);
    const ExitStatus st = c.wait();
    EXPECT_FALSE(st.exited);
    EXPECT_EQ(st.code, sig);
    const std::string out = read_file(dir_.path() / "cli.out");
    const json j = json::parse(out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "stdout: '" << out << "'";
    EXPECT_EQ(j["ok"], false);
    EXPECT_EQ(j["error"]["code"], "interrupted");
  }
}

TEST_F(ImageCli, AnInterruptReadsTheJsonFlagAsTheParserDoesInEverySpelling) {
  struct Case {
    std::vector<std::string> args;
    bool json;
  };
  const std::string c = ckpt_.string();
  for (const Case& k : std::vector<Case>{{{"verify", "--json=true", c}, true},
                                         {{"--json=1", "verify", c}, true},
                                         {{"--json", "verify", "--json=false", c}, false},
                                         {{"--json=off", "verify", "--json", c}, true},
                                         {{"verify", c}, false}}) {
    std::string line;
    for (const auto& a : k.args) line += a + " ";
    SCOPED_TRACE(line);
    fs::remove(dir_.path() / "cli.out");  // appended to
    Child child = test::paused_cli(k.args, "parse", dir_.path());
    child.kill(SIGINT);
    const ExitStatus st = child.wait();
    EXPECT_FALSE(st.exited);
    EXPECT_EQ(st.code, SIGINT);
    const std::string out = read_file(dir_.path() / "cli.out");
    if (k.json) {
      const json j = json::parse(out, nullptr, false);
      ASSERT_TRUE(j.is_object()) << "stdout: '" << out << "'";
      EXPECT_EQ(j["error"]["code"], "interrupted");
    } else {
      EXPECT_EQ(out, "") << "no JSON was asked for";
    }
  }
}

TEST_F(ImageCli, TruncatedBlobExitsFour) {
  pack_ok();
  fs::resize_file(ckpt_ / "blob-000000.bin", 4096);
  auto r = test::run_cli({"unpack", ckpt_.string(), "-o", (dir_.path() / "out").string()});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_TRUE(contains(r.err, "truncated")) << r.err;
  EXPECT_FALSE(fs::exists(dir_.path() / "out"));
}

TEST_F(ImageCli, WrongFormatVersionExitsFive) {
  pack_ok();
  json m = json::parse(read_file(ckpt_ / "manifest.json"));
  m["format_version"] = 99;
  reseal(m.dump());
  for (const char* cmd : {"inspect", "verify"}) {
    auto r = test::run_cli({cmd, ckpt_.string()});
    EXPECT_EQ(r.exit_code, 5) << cmd;
    EXPECT_TRUE(contains(r.err, "format version 99 is not supported")) << r.err;
  }
}

TEST_F(ImageCli, UnparsableOrMissingManifestExitsFour) {
  pack_ok();
  reseal("{\"format\": ");
  auto r = test::run_cli({"inspect", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_TRUE(contains(r.err, "not valid JSON")) << r.err;
  fs::remove(ckpt_ / "manifest.json");
  r = test::run_cli({"verify", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_TRUE(contains(r.err, "manifest.json is missing")) << r.err;
}

TEST_F(ImageCli, MissingInputExitsThree) {
  auto r = test::run_cli({"pack", (dir_.path() / "nope").string(), "-o", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_TRUE(contains(r.err, "nope does not exist")) << r.err;
  r = test::run_cli(
      {"unpack", (dir_.path() / "nope").string(), "-o", (dir_.path() / "o").string()});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_FALSE(fs::exists(ckpt_));
}

TEST_F(ImageCli, ExistingOutputNeedsForce) {
  pack_ok();
  auto r = test::run_cli({"pack", src_.string(), "-o", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 12);
  EXPECT_TRUE(contains(r.err, "already exists (use --force")) << r.err;
  r = test::run_cli({"pack", src_.string(), "-o", ckpt_.string(), "--force"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(ImageCli, BadOptionsExitTwo) {
  auto r = test::run_cli({"pack", src_.string(), "-o", ckpt_.string(), "--chunk-size", "1000"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "chunk size")) << r.err;
  r = test::run_cli({"pack", src_.string(), "-o", ckpt_.string(), "--queue-depth", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(fs::exists(ckpt_));
}

TEST_F(ImageCli, FullDiskExitsSixAndLeavesNothing) {
  const fs::path small = dir_.path() / "small";
  bool empty = false;
  test::CliResult r;
  {
    test::TmpfsMount mnt(small, "size=8m");
    if (!mnt.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (" << mnt.why() << "); needs root";
    test::write_test_file(src_ / "big.img", 12 << 20, 3, 1.0);
    r = test::run_cli({"pack", src_.string(), "-o", (small / "ckpt").string()});
    empty = fs::is_empty(small);
  }
  EXPECT_EQ(r.exit_code, 6);
  EXPECT_TRUE(contains(r.err, "No space left on device")) << r.err;
  EXPECT_TRUE(empty) << "temporary files were left in the full filesystem";
}

}  // namespace
