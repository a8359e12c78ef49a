// The gpuckpt command line as scripts use it: usage errors under --json, global options after
// the subcommand, option values checked with messages that say what is wanted, exit codes of
// docs/CLI.md, and the trust and signature options of the image and process commands.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "gpuckpt/image.h"
#include "gpuckpt/support.h"
#include "image/chunk_codec.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using nlohmann::json;

namespace {

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

// stdout holds exactly one JSON document (json::parse refuses trailing text).
json one_json_document(const test::CliResult& r) {
  try {
    return json::parse(r.out);
  } catch (const json::exception& e) {
    ADD_FAILURE() << "stdout is not one JSON document (" << e.what() << "):\n"
                  << r.out << "\nstderr:\n"
                  << r.err;
    return json();
  }
}

using test::ScopedEnv;

class CliUsage : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = dir_.path() / "src";
    ckpt_ = dir_.path() / "ckpt";
    fs::create_directories(src_);
    test::write_test_file(src_ / "pages-1.img", 200000, 1);
  }
  test::CliResult pack(const fs::path& out, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"pack", src_.string(), "-o", out.string(), "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  }

  TempDir dir_ = test::scratch_dir();
  fs::path src_, ckpt_;
};

// ---- D12: usage errors under --json -----------------------------------------------------------

struct Args {
  const char* name;
  std::vector<std::string> argv;
};
void PrintTo(const Args& a, std::ostream* os) {
  *os << a.name;
}

class JsonUsageError : public CliUsage, public ::testing::WithParamInterface<Args> {};

TEST_P(JsonUsageError, IsOneJsonErrorObjectOnStdoutAndExitsTwo) {
  std::vector<std::string> args = GetParam().argv;
  for (auto& a : args)
    if (a == "CKPT") a = ckpt_.string();
  const auto r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const json j = one_json_document(r);
  EXPECT_EQ(j["ok"], false) << r.out;
  EXPECT_EQ(j["error"]["code"], "usage") << r.out;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty()) << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    CliUsage, JsonUsageError,
    ::testing::Values(
        Args{"PidZero", {"--json", "dump", "--pid", "0", "-o", "CKPT"}},
        Args{"UnknownGlobalOption", {"--json", "--bogus"}},
        Args{"UnknownCommandOption", {"--json", "pack", "CKPT", "-o", "x", "--bogus"}},
        Args{"LevelOutOfRange", {"--json", "dump", "--pid", "1", "-o", "CKPT", "--level", "99"}},
        Args{"UnknownCompression",
             {"--json", "dump", "--pid", "1", "-o", "CKPT", "--compress", "fast"}},
        Args{"UnknownHandoff",
             {"--json", "migrate", "--pid", "1", "--to", "CKPT", "--handoff", "sideways"}},
        Args{"UnknownStagingMode",
             {"--json", "dump", "--pid", "1", "-o", "CKPT", "--staging-mode", "tmpfs"}},
        Args{"UnknownBenchContent",
             {"--json", "bench", "dump", "--dir", "CKPT", "--content", "fp8"}},
        Args{"JoinNsOfAnUnmovableType",
             {"--json", "restore", "CKPT", "--container", "--join-ns", "pid=/proc/1/ns/pid"}},
        Args{"JoinNsWithoutAType", {"--json", "restore", "CKPT", "--container", "--join-ns", "/x"}},
        Args{"NetworkNamedTwice",
             {"--json", "migrate", "--container", "c", "--to", "CKPT", "--netns", "/a", "--join-ns",
              "net=/b"}},
        Args{"JoinNsForAProcess",
             {"--json", "migrate", "--pid", "1", "--to", "CKPT", "--join-ns", "uts=/a"}},
        Args{"NoSubcommand", {"--json"}},
        Args{"JsonAfterTheSubcommand", {"dump", "--json", "--pid", "abc", "-o", "CKPT"}}),
    [](const auto& info) { return std::string(info.param.name); });

// An option that takes one of the engine's names says which: the engine's own table, not a copy.
TEST_F(CliUsage, AnUnknownNameIsRefusedWithTheNamesTheEngineHas) {
  const auto r = test::run_cli(
      {"--json", "migrate", "--pid", "1", "--to", ckpt_.string(), "--handoff", "sideways"});
  EXPECT_EQ(r.exit_code, 2);
  const std::string message = one_json_document(r)["error"].value("message", "");
  for (const char* name : {"auto", "frozen", "release"})
    EXPECT_NE(message.find(name), std::string::npos) << message;
}

TEST_F(CliUsage, UsageErrorWithoutJsonPrintsNothingOnStdout) {
  const auto r = test::run_cli({"dump", "--pid", "0", "-o", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// ---- D17: what a value must be -------------------------------------------------------------

TEST_F(CliUsage, PidMustBeAPositiveIntegerPid) {
  for (const char* pid : {"abc", "0", "-3", "1.5"}) {
    const auto r = test::run_cli({"dump", "--pid", pid, "-o", ckpt_.string()});
    EXPECT_EQ(r.exit_code, 2) << pid;
    EXPECT_TRUE(contains(r.err, "--pid: must be a positive integer pid")) << r.err;
    EXPECT_FALSE(contains(r.err, "not in range")) << r.err;
  }
  const auto r = test::run_cli({"migrate", "--pid", "x", "--to", dir_.path().string()});
  EXPECT_TRUE(contains(r.err, "must be a positive integer pid")) << r.err;
}

// ---- D14: --probe-timeout -------------------------------------------------------------------

TEST_F(CliUsage, ProbeTimeoutIsRangeCheckedNotOverflowed) {
  pack(ckpt_);
  for (const char* t : {"1e300", "inf", "nan", "0", "-1", "86401"}) {
    const auto r = test::run_cli(
        {"restore", ckpt_.string(), "--probe", "unix:/nonexistent", "--probe-timeout", t});
    EXPECT_EQ(r.exit_code, 2) << t << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "--probe-timeout: must be a number of seconds")) << r.err;
    EXPECT_TRUE(contains(r.err, "at most 86400")) << r.err;
  }
}

// ---- D13: global options after the subcommand -------------------------------------------------

TEST_F(CliUsage, GlobalOptionsAreAcceptedAfterTheSubcommand) {
  pack(ckpt_, {"--json", "--log-level", "warn"});
  auto r = test::run_cli({"inspect", ckpt_.string(), "-q", "--json", "--log-level", "error"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(one_json_document(r)["command"], "inspect");

  // The process commands too: a failure, but reported as JSON, not as an unknown option.
  r = test::run_cli(
      {"dump", "--json", "-q", "--pid", "2147483600", "-o", (dir_.path() / "d").string()});
  EXPECT_NE(r.exit_code, 2) << r.err;
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_EQ(one_json_document(r)["ok"], false);

  r = test::run_cli({"restore", ckpt_.string(), "--json", "--log-level", "warn"});
  EXPECT_EQ(r.exit_code, 3) << r.err;  // not a process checkpoint
  EXPECT_EQ(one_json_document(r)["error"]["code"], "invalid_input");

  r = test::run_cli({"devices", "--json"});
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 7) << r.err;
  EXPECT_TRUE(one_json_document(r).contains("gpus"));
}

// ---- D17: exit codes and messages of damaged checkpoints -------------------------------------

TEST_F(CliUsage, DirectoryAsManifestExitsFourAsCorrupt) {
  pack(ckpt_);
  fs::remove(ckpt_ / "manifest.json");
  fs::create_directory(ckpt_ / "manifest.json");
  for (const char* cmd : {"inspect", "verify"}) {
    const auto r = test::run_cli({cmd, ckpt_.string()});
    EXPECT_EQ(r.exit_code, 4) << cmd << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "manifest.json is not a regular file")) << r.err;
  }
}

TEST_F(CliUsage, BlobThatIsADirectorySaysSoRatherThanTruncated) {
  pack(ckpt_);
  fs::remove(ckpt_ / "blob-000000.bin");
  fs::create_directory(ckpt_ / "blob-000000.bin");
  const auto r = test::run_cli({"verify", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_TRUE(contains(r.err, "blob-000000.bin is not a regular file")) << r.err;
  EXPECT_FALSE(contains(r.err, "truncated")) << r.err;
}

TEST_F(CliUsage, UnpackForceRefusesToReplaceAFile) {
  pack(ckpt_);
  const fs::path file = dir_.path() / "file";
  write_text(file, "keep me");
  const auto r = test::run_cli({"unpack", "--force", ckpt_.string(), "-o", file.string()});
  EXPECT_EQ(r.exit_code, 12) << r.err;
  EXPECT_EQ(read_file(file), "keep me");
}

// ---- D7 through the CLI: restore refuses untrusted checkpoints -------------------------------

TEST_F(CliUsage, RestoreRefusesAGroupWritableCheckpointUnlessAllowed) {
  pack(ckpt_);
  ASSERT_EQ(::chmod(ckpt_.c_str(), 0770), 0);
  auto r = test::run_cli({"--json", "restore", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(one_json_document(r)["error"]["message"].get<std::string>(),
                       "refusing to trust checkpoint"))
      << r.out;
  // Past the trust check, this plain pack is then refused for having no process record.
  r = test::run_cli({"restore", ckpt_.string(), "--allow-untrusted"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "not a process checkpoint")) << r.err;
}

// ---- Signatures through the CLI -------------------------------------------------------------

TEST_F(CliUsage, KeygenSignInspectVerifyAndRequireSignature) {
  const fs::path key = dir_.path() / "node.key", pub = dir_.path() / "node.key.pub";
  auto r = test::run_cli({"--json", "keygen", "-o", key.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string key_id = one_json_document(r)["key_id"];
  ASSERT_EQ(key_id.size(), 16u);

  pack(ckpt_, {"--sign-key", key.string()});
  r = test::run_cli({"--json", "inspect", ckpt_.string(), "--trusted-keys", pub.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json sig = one_json_document(r)["signature"];
  EXPECT_EQ(sig["state"], "valid");
  EXPECT_EQ(sig["key_id"], key_id);
  EXPECT_EQ(sig["trusted"], true);
  r = test::run_cli({"inspect", ckpt_.string(), "--trusted-keys", pub.string()});
  EXPECT_TRUE(contains(r.out, "signature    valid, by key " + key_id + " (trusted")) << r.out;

  r = test::run_cli(
      {"--json", "verify", ckpt_.string(), "--require-signature", "--trusted-keys", pub.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(one_json_document(r)["signature"]["state"], "valid");

  // Unsigned, with a signature required: refused, clearly.
  const fs::path plain = dir_.path() / "plain";
  pack(plain);
  r = test::run_cli(
      {"verify", plain.string(), "--require-signature", "--trusted-keys", pub.string()});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_TRUE(contains(r.err, "is not signed, and a signature is required")) << r.err;

  // Edited after signing, checksum recomputed: inspect says invalid, verify refuses.
  json m = json::parse(read_file(ckpt_ / "manifest.json"));
  m["host"] = "elsewhere";
  const std::string text = m.dump(1);
  json seal = json::parse(read_file(ckpt_ / "manifest.seal"));
  seal["manifest_bytes"] = text.size();
  seal["manifest_xxh3"] = format_hex64(image::xxh3(text.data(), text.size()));
  write_text(ckpt_ / "manifest.json", text);
  write_text(ckpt_ / "manifest.seal", seal.dump());
  r = test::run_cli({"--json", "inspect", ckpt_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(one_json_document(r)["signature"]["state"], "invalid");
  r = test::run_cli({"--json", "verify", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_TRUE(
      contains(one_json_document(r)["error"]["message"].get<std::string>(), "invalid signature"))
      << r.out;
  r = test::run_cli({"restore", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_TRUE(contains(r.err, "invalid signature")) << r.err;
}

TEST_F(CliUsage, ConfigFileMakesSignaturesRequiredForRestore) {
  const fs::path key = dir_.path() / "node.key", pub = dir_.path() / "node.key.pub";
  ASSERT_EQ(test::run_cli({"keygen", "-o", key.string()}).exit_code, 0);
  const fs::path plain = dir_.path() / "plain";
  pack(plain);  // before the config names a signing key
  const fs::path conf = dir_.path() / "config.json";
  write_text(conf, json({{"sign_key", "node.key"},
                         {"trusted_keys", "node.key.pub"},
                         {"require_signature", true}})
                       .dump());
  ScopedEnv env("GPUCKPT_CONFIG", conf.string());  // inherited by the CLI

  auto r = test::run_cli({"restore", plain.string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "is not signed, and a signature is required")) << r.err;

  pack(ckpt_);  // signed by the config's sign_key
  r = test::run_cli({"--json", "inspect", ckpt_.string()});
  EXPECT_EQ(one_json_document(r)["signature"]["trusted"], true) << r.out;
  r = test::run_cli({"restore", ckpt_.string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "not a process checkpoint")) << r.err;  // trust passed
}

}  // namespace
