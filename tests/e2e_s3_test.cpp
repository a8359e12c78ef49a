// Dump to and restore from object storage with real CRIU and a real S3-compatible server
// (s3rver) on loopback: the conversation continues on the restored copy, a process to end stays
// stopped until its upload is complete, and a SIGKILL of gpuckpt mid-upload resumes the service
// and publishes nothing.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include "criu/criu.h"
#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "probe/probe.h"
#include "process/proc_info.h"
#include "remote/s3.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;

namespace {

class E2eS3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::close_inherited_fds();
    weights_dir_ = new TempDir(test::scratch_dir("gpuckpt-s3-weights"));
    weights_ = weights_dir_->path() / "w.bin";
    auto r = run_capture({(test::bin_dir() / "gpuckpt-demo-server").string(), "--generate-weights",
                          weights_.string(), "--size", "64M"},
                         120s);
    ASSERT_TRUE(r.status.ok());
  }
  static void TearDownTestSuite() {
    delete weights_dir_;
    weights_dir_ = nullptr;
  }
  void SetUp() override {
    try {
      criu::locate();
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    server_.emplace("ckpts");
    server_->export_environment();
    dir_ = test::scratch_dir("gpuckpt-e2e-s3");
    spool_ = dir_.path() / "spool";
    fs::create_directories(spool_);
  }

  Child demo() {
    SpawnOptions o;
    o.new_session = true;
    o.stdout_file = dir_.path() / "demo.out";
    o.stderr_file = dir_.path() / "demo.err";
    Child c =
        spawn({(test::bin_dir() / "gpuckpt-demo-server").string(), "--socket", sock().string(),
               "--weights", weights_.string(), "--init-seconds", "0", "--kv-per-request", "1M"},
              o);
    EXPECT_TRUE(test::wait_until([&] { return ask_unix_line(sock(), "PING") == "PONG"; }));
    return c;
  }
  fs::path sock() const { return dir_.path() / "demo.sock"; }
  bool stopped(pid_t pid) const {
    const char c = test::process_state(pid);
    return c == 'T' || c == 't';
  }
  bool spool_empty() const {
    for (const auto& e : fs::directory_iterator(spool_))
      if (e.path().filename().string().rfind(".gpuckpt-staging.lock", 0) != 0) return false;
    return true;
  }
  remote::S3Client client() const { return remote::S3Client(remote::S3Config::from_environment()); }

  static inline TempDir* weights_dir_ = nullptr;
  static inline fs::path weights_;
  std::optional<test::S3Server> server_;
  TempDir dir_;
  fs::path spool_;
};

}  // namespace

TEST_F(E2eS3, DumpToTheStoreThenRestoreFromItContinuesTheConversation) {
  Child s = demo();
  const pid_t pid = s.pid();
  ask_unix_line(sock(), "GEN first");
  const std::string state = ask_unix_line(sock(), "STATE");
  auto r = test::run_cli({"dump", "--pid", std::to_string(pid), "-o", "s3://ckpts/fleet/demo",
                          "--spool", spool_.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto dumped = nlohmann::json::parse(r.out);
  bool upload = false;
  for (const auto& st : dumped.at("timeline").at("stages"))
    if (st.at("name") == "upload") upload = st.at("bytes").get<std::uint64_t>() > 0;
  EXPECT_TRUE(upload) << r.out;
  const auto ended = s.wait_for(30s);
  ASSERT_TRUE(ended.has_value()) << "the dumped process must end once its checkpoint is stored";
  EXPECT_FALSE(ended->exited);
  EXPECT_EQ(ended->code, SIGKILL);
  EXPECT_TRUE(spool_empty());
  EXPECT_TRUE(client().head("ckpts", "fleet/demo/manifest.json").has_value());

  r = test::run_cli({"restore", "s3://ckpts/fleet/demo", "--spool", spool_.string(), "--probe",
                     "unix:" + sock().string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto restored = nlohmann::json::parse(r.out);
  EXPECT_EQ(restored.at("timeline").at("stages").at(0).at("name"), "download");
  EXPECT_EQ(restored.at("pid"), pid);
  EXPECT_EQ(ask_unix_line(sock(), "STATE"), state) << "the KV state came back";
  EXPECT_EQ(ask_unix_line(sock(), "GEN second").substr(0, 4), "OK 2");
  EXPECT_TRUE(spool_empty());
  ::kill(pid, SIGKILL);
  EXPECT_TRUE(test::wait_until([&] { return !process::alive(pid); }));
}

TEST_F(E2eS3, SigkillDuringTheUploadResumesTheServiceAndPublishesNothing) {
  Child s = demo();
  ask_unix_line(sock(), "GEN before");
  const std::string state = ask_unix_line(sock(), "STATE");
  const fs::path mark = dir_.path() / "mark";
  SpawnOptions o;
  o.env = {"GPUCKPT_FAULT_PAUSE=upload_manifest", "GPUCKPT_FAULT_MARK=" + mark.string()};
  o.stderr_file = dir_.path() / "cli.err";
  o.stdout_file = dir_.path() / "cli.out";
  Child g = spawn({test::gpuckpt_binary().string(), "dump", "--pid", std::to_string(s.pid()), "-o",
                   "s3://ckpts/cut", "--spool", spool_.string()},
                  o);
  ASSERT_TRUE(test::wait_until([&] { return fs::exists(mark); }, 120s))
      << read_file(dir_.path() / "cli.err");
  // Every blob is in the store, the manifest is not: the process is still stopped.
  EXPECT_TRUE(stopped(s.pid()));
  EXPECT_TRUE(client().head("ckpts", "cut/blob-000000.bin").has_value());
  g.kill(SIGKILL);
  g.wait();
  EXPECT_TRUE(test::wait_until([&] { return !stopped(s.pid()); })) << "left frozen";
  EXPECT_TRUE(test::wait_until([&] { return ask_unix_line(sock(), "STATE") == state; }));
  EXPECT_FALSE(client().head("ckpts", "cut/manifest.json").has_value());
  EXPECT_EQ(test::run_cli({"inspect", "s3://ckpts/cut"}).exit_code, 3);
  EXPECT_TRUE(test::wait_until([&] { return spool_empty(); })) << "the spool is left behind";
}

// A snapshot's process runs again before its upload ends, and its guard is gone by then: an
// interrupt of that upload left the whole spool (the checkpoint's size) behind.
TEST_F(E2eS3, AnInterruptedSnapshotUploadLeavesNoSpoolBehind) {
  Child s = demo();
  Child g = test::paused_cli({"--json", "dump", "--pid", std::to_string(s.pid()), "-o",
                              "s3://ckpts/snapcut", "--spool", spool_.string(), "--leave-running"},
                             "upload_manifest", dir_.path());
  EXPECT_FALSE(stopped(s.pid()));
  EXPECT_FALSE(spool_empty());
  g.kill(SIGINT);
  const ExitStatus st = g.wait();
  EXPECT_FALSE(st.exited);
  EXPECT_EQ(st.code, SIGINT);
  EXPECT_TRUE(spool_empty()) << "the spool is left behind";
  const auto j = nlohmann::json::parse(read_file(dir_.path() / "cli.out"), nullptr, false);
  ASSERT_TRUE(j.is_object()) << read_file(dir_.path() / "cli.out");
  EXPECT_EQ(j["error"]["code"], "interrupted");
  EXPECT_NE(j["error"].value("message", "").find("removed the unfinished"), std::string::npos)
      << j.dump();
  EXPECT_FALSE(client().head("ckpts", "snapcut/manifest.json").has_value());
  EXPECT_EQ(ask_unix_line(sock(), "PING"), "PONG");
  s.kill(SIGKILL);
  s.wait();
}

TEST_F(E2eS3, AnExistingCheckpointOrAnUnreachableStoreIsRefusedBeforeAnythingIsFrozen) {
  Child s = demo();
  auto r = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", "s3://ckpts/snap",
                          "--spool", spool_.string(), "--leave-running"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ask_unix_line(sock(), "PING"), "PONG") << "a snapshot leaves the service running";
  r = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", "s3://ckpts/snap", "--spool",
                     spool_.string()});
  EXPECT_EQ(r.exit_code, 12) << r.err;  // exists
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(ask_unix_line(sock(), "PING"), "PONG");

  // A bucket that does not exist: found out before the freeze, not by the upload after it.
  r = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", "s3://nobucket/x", "--spool",
                     spool_.string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;  // invalid_input
  EXPECT_NE(r.err.find("the bucket nobucket does not exist"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("resumed"), std::string::npos) << "it was frozen first: " << r.err;
  EXPECT_EQ(ask_unix_line(sock(), "PING"), "PONG");

  server_->stop();
  r = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", "s3://ckpts/other", "--spool",
                     spool_.string()});
  EXPECT_EQ(r.exit_code, 6) << r.err;  // io: the store cannot be reached
  EXPECT_FALSE(stopped(s.pid()));
  EXPECT_EQ(ask_unix_line(sock(), "PING"), "PONG");
  EXPECT_TRUE(spool_empty());
}

// Two dumps to one prefix at once both said they had written it, and both processes ended: the
// store kept one checkpoint, the other service's state was gone. The first claims the prefix
// before anything is frozen; the second is refused while it holds it, and its service runs on.
// A claim left by a gpuckpt killed on this host is taken over by the next dump.
TEST_F(E2eS3, TwoDumpsToOnePrefixAtOnceNeverBothReportSuccess) {
  Child a = demo();
  ask_unix_line(sock(), "GEN a");
  const std::string state_a = ask_unix_line(sock(), "STATE");
  const fs::path sock_b = dir_.path() / "b.sock";
  SpawnOptions o;
  o.new_session = true;
  o.stdout_file = dir_.path() / "b.out";
  Child b = spawn({(test::bin_dir() / "gpuckpt-demo-server").string(), "--socket", sock_b.string(),
                   "--weights", weights_.string(), "--init-seconds", "0"},
                  o);
  ASSERT_TRUE(test::wait_until([&] { return ask_unix_line(sock_b, "PING") == "PONG"; }));
  Child first = test::paused_cli({"dump", "--pid", std::to_string(a.pid()), "-o",
                                  "s3://ckpts/shared", "--spool", spool_.string()},
                                 "upload_manifest", dir_.path(), test::Resume::kWhenUnmarked);
  const auto second = test::run_cli({"--json", "dump", "--pid", std::to_string(b.pid()), "-o",
                                     "s3://ckpts/shared", "--spool", spool_.string()});
  EXPECT_EQ(second.exit_code, 12) << second.err;
  EXPECT_NE(second.err.find("is being written by gpuckpt pid " + std::to_string(first.pid())),
            std::string::npos)
      << second.err;
  EXPECT_FALSE(stopped(b.pid()));
  EXPECT_EQ(ask_unix_line(sock_b, "PING"), "PONG");
  test::resume_paused(dir_.path(), "upload_manifest");
  const ExitStatus st = first.wait();
  EXPECT_TRUE(st.ok()) << st.describe() << read_file(dir_.path() / "cli.err");
  EXPECT_TRUE(a.wait_for(30s).has_value());
  // The store holds the first dump's checkpoint, and no claim any more.
  EXPECT_TRUE(client().list("ckpts", "shared/.gpuckpt-writers/").empty());
  const auto r = test::run_cli({"restore", "s3://ckpts/shared", "--spool", spool_.string(),
                                "--probe", "unix:" + sock().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ask_unix_line(sock(), "STATE"), state_a);

  // A claim whose gpuckpt was killed (SIGKILL at the same point) does not block the next dump.
  Child killed = test::paused_cli({"dump", "--pid", std::to_string(b.pid()), "-o",
                                   "s3://ckpts/other", "--spool", spool_.string()},
                                  "upload_manifest", dir_.path());
  killed.kill(SIGKILL);
  killed.wait();
  EXPECT_TRUE(test::wait_until([&] { return !stopped(b.pid()); }));
  // Its claim: its own object and the lock.
  EXPECT_EQ(client().list("ckpts", "other/.gpuckpt-writers/").size(), 2u);
  const auto again = test::run_cli({"dump", "--pid", std::to_string(b.pid()), "-o",
                                    "s3://ckpts/other", "--spool", spool_.string()});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(client().list("ckpts", "other/.gpuckpt-writers/").empty());
  b.wait_for(30s);
  for (pid_t p : process::live_pids_where([&](const process::ProcInfo& p) {
         for (const auto& arg : p.cmdline)
           if (arg.find(sock().string()) != std::string::npos) return true;
         return false;
       })) {
    ::kill(p, SIGKILL);
    process::wait_ended(p, 10s);
  }
}

// gpuckpt dies of an interrupt without unwinding: a claim released only by ~Upload stayed, and
// every later dump to that prefix was refused in the name of a gpuckpt that no longer ran.
TEST_F(E2eS3, AnInterruptedDumpLeavesNoClaimOnItsPrefix) {
  Child s = demo();
  Child dump = test::paused_cli({"dump", "--pid", std::to_string(s.pid()), "-o",
                                 "s3://ckpts/interrupted", "--spool", spool_.string()},
                                "upload_manifest", dir_.path());
  EXPECT_FALSE(client().list("ckpts", "interrupted/.gpuckpt-writers/").empty());
  dump.kill(SIGINT);
  const ExitStatus st = dump.wait();
  EXPECT_FALSE(st.ok()) << st.describe();
  EXPECT_TRUE(client().list("ckpts", "interrupted/.gpuckpt-writers/").empty());
  EXPECT_TRUE(test::wait_until([&] { return !stopped(s.pid()); }));
  EXPECT_EQ(ask_unix_line(sock(), "PING"), "PONG");
  const auto again = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o",
                                    "s3://ckpts/interrupted", "--spool", spool_.string()});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  s.wait_for(30s);
}

// A pid names a process only in its own pid namespace: a claim made by a gpuckpt in another
// one (a container) whose pid is free here is no sign that the writer is gone.
TEST_F(E2eS3, AClaimFromAnotherPidNamespaceIsNotTakenOver) {
  Child s = demo();
  const auto ns = process::pid_namespace_inode(::getpid());
  ASSERT_TRUE(ns.has_value());
  const nlohmann::json claim{{"host", host_name()},
                             {"boot_id", boot_id()},
                             {"pidns", *ns + 1},
                             {"pid", 4194000},
                             {"start", 1},
                             {"nonce", "0123456789abcdef"},
                             {"started", "2026-12-05T00:00:00Z"}};
  client().put("ckpts", "contained/.gpuckpt-writers/0123456789abcdef", claim.dump());
  const auto r = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o",
                                "s3://ckpts/contained", "--spool", spool_.string()});
  EXPECT_EQ(r.exit_code, 12) << r.err;
  EXPECT_NE(r.err.find("is being written by gpuckpt pid 4194000"), std::string::npos) << r.err;
  EXPECT_EQ(client().list("ckpts", "contained/.gpuckpt-writers/"),
            std::vector<std::string>{"contained/.gpuckpt-writers/0123456789abcdef"});
  EXPECT_FALSE(stopped(s.pid()));
  EXPECT_EQ(ask_unix_line(sock(), "PING"), "PONG");
  // The same claim from this namespace, its pid gone: taken over.
  nlohmann::json here = claim;
  here["pidns"] = *ns;
  client().put("ckpts", "contained/.gpuckpt-writers/0123456789abcdef", here.dump());
  const auto ok = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o",
                                 "s3://ckpts/contained", "--spool", spool_.string()});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(client().list("ckpts", "contained/.gpuckpt-writers/").empty());
  s.wait_for(30s);
}

// A damaged checkpoint in the store was reported under the restore's private spool path, which
// is gone by the time the operator reads it: the error names the s3:// URL.
TEST_F(E2eS3, ADamagedCheckpointInTheStoreIsNamedByItsUrl) {
  Child s = demo();
  ASSERT_EQ(test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", "s3://ckpts/damaged",
                           "--spool", spool_.string()})
                .exit_code,
            0);
  s.wait_for(30s);
  const auto c = client();
  std::string blob = c.get("ckpts", "damaged/blob-000000.bin", 1ull << 30);
  ASSERT_GT(blob.size(), 8192u);
  for (std::size_t i = blob.size() / 2; i < blob.size() / 2 + 64; ++i) blob[i] ^= 0x5a;
  c.put("ckpts", "damaged/blob-000000.bin", blob);
  const auto r = test::run_cli({"--json", "restore", "s3://ckpts/damaged", "--spool",
                                spool_.string(), "--probe", "unix:" + sock().string()});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  const std::string msg = j["error"].value("message", "");
  EXPECT_NE(msg.find("s3://ckpts/damaged"), std::string::npos) << msg;
  EXPECT_EQ(msg.find(spool_.string()), std::string::npos) << msg;
  EXPECT_TRUE(spool_empty());
}
