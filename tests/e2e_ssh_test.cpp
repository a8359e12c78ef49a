// Migration to another host over SSH, with real CRIU and Debian's OpenSSH. The other host is a
// network namespace this test makes (sshd runs inside it, started per connection by ssh's
// ProxyCommand, and listens nowhere), so its loopback and ports are its own: the copy of the
// vLLM-shaped HTTP demo serves there on the same port as the frozen original here.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "criu/criu.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::vector<std::string> kDemoArgs = {"--workers", "1", "--weights-mib", "24"};

class E2eSsh : public ::testing::Test {
 protected:
  void SetUp() override {
    test::close_inherited_fds();
    try {
      criu::locate();
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    dir_ = test::scratch_dir("gpuckpt-e2e-ssh");
    host_.emplace("hostb");
    ssh_.emplace(*host_, dir_.path() / "ssh", "spare");
    remote_spool_ = dir_.path() / "remote-spool";
    fs::create_directories(remote_spool_);
  }
  void TearDown() override {
    host_.reset();  // kills what runs on the other host
  }

  test::CliResult migrate(pid_t pid, int port, const test::SshHost& to,
                          const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{"migrate",
                                  "--pid",
                                  std::to_string(pid),
                                  "--to",
                                  to.url(),
                                  "--ssh-config",
                                  to.config().string(),
                                  "--remote-gpuckpt",
                                  test::gpuckpt_binary().string(),
                                  "--remote-spool",
                                  remote_spool_.string(),
                                  "--spool",
                                  (dir_.path()).string(),
                                  "--probe",
                                  "http://127.0.0.1:" + std::to_string(port) + "/health",
                                  "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_cli(args);
  }
  std::string there(int port, const std::string& session, const std::string& prompt) const {
    return host_->within([&] { return test::vllm_complete(port, session, prompt); });
  }
  bool spool_empty(const fs::path& d) const {
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("gpuckpt-", 0) == 0) return false;
    }
    return true;
  }
  static bool stopped(pid_t pid) {
    const char c = test::process_state(pid);
    return c == 'T' || c == 't';
  }

  TempDir dir_;
  std::optional<test::NetNs> host_;
  std::optional<test::SshHost> ssh_;
  fs::path remote_spool_;
};

}  // namespace

TEST_F(E2eSsh, MigratingTheHttpDemoToAnotherHostContinuesTheConversationThere) {
  // The reference: the same demo, never interrupted.
  const TempDir ref_dir = test::scratch_dir("gpuckpt-ssh-ref");
  auto ref = test::start_vllm_demo(ref_dir.path(), kDemoArgs);
  auto demo = test::start_vllm_demo(dir_.path(), kDemoArgs);
  const pid_t pid = demo.front.pid();
  EXPECT_EQ(test::vllm_complete(demo.port, "s", "the first question"),
            test::vllm_complete(ref.port, "s", "the first question"));

  const auto r = migrate(pid, demo.port, *ssh_);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j.at("target"), "ssh://spare");
  EXPECT_EQ(j.at("handoff"), "frozen");
  bool transfer = false, received = false;
  for (const auto& s : j.at("timeline").at("stages")) {
    if (s.at("name") == "transfer") transfer = s.at("bytes").get<std::uint64_t>() > 0;
    if (s.at("name") == "target:receive") received = true;
  }
  EXPECT_TRUE(transfer && received) << r.out;

  // The original has ended here; the copy answers on the other host, where it left off.
  const auto ended = demo.front.wait_for(30s);
  ASSERT_TRUE(ended.has_value()) << "the original must end once the copy answers";
  EXPECT_THROW(test::vllm_complete(demo.port, "s", "anyone here?"), Error);
  EXPECT_EQ(there(demo.port, "s", "the second question"),
            test::vllm_complete(ref.port, "s", "the second question"));
  EXPECT_FALSE(host_->processes().empty());
  EXPECT_TRUE(spool_empty(remote_spool_));
  EXPECT_TRUE(spool_empty(dir_.path()));
}

TEST_F(E2eSsh, TheCheckpointGoesOutWhileTheDumpRunsAndTheTargetReceivesItMeanwhile) {
  // More memory than the dump holds in flight (at most ~256 MiB of chunk buffers): CRIU cannot
  // finish before chunks have been written here, and each is sent as it is written.
  auto demo = test::start_vllm_demo(dir_.path(), {"--workers", "1", "--weights-mib", "320"});
  const std::string before = test::vllm_complete(demo.port, "s", "what is in memory?");
  const auto r = migrate(demo.front.pid(), demo.port, *ssh_);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json j = json::parse(r.out);
  std::map<std::string, std::pair<double, double>> at;  // stage: start, end
  for (const auto& s : j.at("timeline").at("stages"))
    at[s.at("name").get<std::string>()] = {
        s.at("start").get<double>(), s.at("start").get<double>() + s.at("seconds").get<double>()};
  ASSERT_TRUE(at.count("criu_dump") && at.count("transfer") && at.count("target:receive")) << r.out;
  EXPECT_LT(at["transfer"].first, at["criu_dump"].second) << r.out;
  EXPECT_LT(at["target:receive"].first, at["criu_dump"].second) << r.out;
  EXPECT_TRUE(demo.front.wait_for(30s).has_value());
  EXPECT_FALSE(there(demo.port, "s", "and now?").empty());
}

TEST_F(E2eSsh, AConnectionDroppedMidStreamResumesTheOriginalAndLeavesNothingOnTheTarget) {
  // This host's connections are cut after 4 MB from us to it: inside the checkpoint's stream,
  // which flows while the dump runs, so the dump itself fails.
  const test::SshHost cut(*host_, dir_.path() / "ssh-cut", "spare-cut",
                          "dd bs=65536 count=4000000 iflag=count_bytes status=none |");
  auto demo = test::start_vllm_demo(dir_.path(), kDemoArgs);
  const pid_t pid = demo.front.pid();
  const std::string before = test::vllm_complete(demo.port, "s", "hello");
  const auto r = migrate(pid, demo.port, cut);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("migration to ssh://spare-cut failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resumed"), std::string::npos) << r.err;
  EXPECT_TRUE(test::wait_until([&] { return !stopped(pid); })) << "left frozen";
  // The original serves on, with its state.
  EXPECT_FALSE(test::vllm_complete(demo.port, "s", "still there?").empty());
  EXPECT_TRUE(test::wait_until([&] { return host_->processes().empty(); }))
      << "a process is left on the target";
  EXPECT_TRUE(test::wait_until([&] { return spool_empty(remote_spool_); }))
      << "the target's spool is left behind";
  EXPECT_TRUE(test::wait_until([&] { return spool_empty(dir_.path()); }));
  ::kill(pid, SIGKILL);
}

TEST_F(E2eSsh, ATargetThatRefusesTheCheckpointStopsTheStreamAndTheOriginalResumes) {
  // The target requires a signature this checkpoint does not have: its restore fails as soon
  // as the manifest is in, and it stops reading instead of taking the rest first.
  const fs::path keys = dir_.path() / "keys";
  ASSERT_EQ(test::run_cli({"keygen", "-o", (dir_.path() / "k").string()}).exit_code, 0);
  fs::create_directories(keys);
  fs::copy_file(dir_.path() / "k.pub", keys / "k.pub");
  auto demo = test::start_vllm_demo(dir_.path(), {"--workers", "1", "--weights-mib", "320"});
  const pid_t pid = demo.front.pid();
  const auto r =
      migrate(pid, demo.port, *ssh_, {"--require-signature", "--trusted-keys", keys.string()});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("the restore on ssh://spare failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sign"), std::string::npos) << r.err;
  EXPECT_TRUE(test::wait_until([&] { return !stopped(pid); })) << "left frozen";
  EXPECT_FALSE(test::vllm_complete(demo.port, "s", "still here?").empty());
  EXPECT_TRUE(test::wait_until([&] { return host_->processes().empty(); }));
  EXPECT_TRUE(test::wait_until([&] { return spool_empty(remote_spool_); }));
}

TEST_F(E2eSsh, ATargetThatStopsReadingFailsTheMigrationAfterTheStallTimeoutAndTheOriginalResumes) {
  // The target answers that it receives, then reads nothing (a hung disk or restore there): once
  // ssh's buffers are full nothing moves, and the frozen original must not wait for good.
  const fs::path stall = dir_.path() / "stalling-gpuckpt";
  std::ofstream(stall) << "#!/bin/sh\necho '{\"receiving\":true,\"devices\":{}}'\nexec sleep 300\n";
  fs::permissions(stall, fs::perms::owner_all);
  auto demo = test::start_vllm_demo(dir_.path(), {"--workers", "1", "--weights-mib", "96"});
  const pid_t pid = demo.front.pid();
  const std::string before = test::vllm_complete(demo.port, "s", "hello");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = test::run_cli({"migrate", "--pid", std::to_string(pid), "--to", ssh_->url(),
                          "--ssh-config", ssh_->config().string(), "--remote-gpuckpt",
                          stall.string(), "--spool", dir_.path().string(), "--stall-timeout", "2"});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("took none of the checkpoint for 2 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resumed"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 120s);
  EXPECT_TRUE(test::wait_until([&] { return !stopped(pid); })) << "left frozen";
  EXPECT_FALSE(test::vllm_complete(demo.port, "s", "still there?").empty());
  EXPECT_TRUE(test::wait_until([&] { return spool_empty(dir_.path()); }));
  ::kill(pid, SIGKILL);
}

TEST_F(E2eSsh, AConnectionLostWhileTheTargetProbesEndsItsCopyThereAtOnce) {
  // The copy there never answers this probe (no such page), so the target probes until its
  // timeout. Interrupting the controller meanwhile closes the connection: the uncommitted copy
  // must go at once, not serve beside the resumed original until the probe gives up.
  auto demo = test::start_vllm_demo(dir_.path(), kDemoArgs);
  const pid_t pid = demo.front.pid();
  const std::string before = test::vllm_complete(demo.port, "s", "hello");
  SpawnOptions o;
  o.stdout_file = dir_.path() / "migrate.out";
  o.stderr_file = dir_.path() / "migrate.err";
  Child g = spawn(
      {test::gpuckpt_binary().string(), "migrate", "--pid", std::to_string(pid), "--to",
       ssh_->url(), "--ssh-config", ssh_->config().string(), "--remote-gpuckpt",
       test::gpuckpt_binary().string(), "--remote-spool", remote_spool_.string(), "--spool",
       dir_.path().string(), "--probe",
       "http://127.0.0.1:" + std::to_string(demo.port) + "/no-such-page", "--probe-timeout", "300"},
      o);
  const auto copies = [&] {
    std::vector<pid_t> out;
    for (pid_t p : host_->processes()) {
      const auto info = process::read_proc(p);
      if (info && !info->cmdline.empty() &&
          info->cmdline.front().find("vllm-demo") != std::string::npos)
        out.push_back(p);
    }
    return out;
  };
  ASSERT_TRUE(test::wait_until([&] { return !copies().empty(); }, 120s))
      << read_file(dir_.path() / "migrate.err");
  g.kill(SIGINT);
  g.wait();
  EXPECT_TRUE(test::wait_until([&] { return !stopped(pid); })) << "left frozen";
  EXPECT_FALSE(test::vllm_complete(demo.port, "s", "still there?").empty());
  EXPECT_TRUE(test::wait_until([&] { return copies().empty(); }, 60s))
      << "the target's copy outlived the connection (its probe allows 300 s)";
  EXPECT_TRUE(test::wait_until([&] { return spool_empty(remote_spool_); }));
  ::kill(pid, SIGKILL);
}

TEST_F(E2eSsh, TwoMigrationsAtOnceBothServeOnTheTarget) {
  const TempDir d1 = test::scratch_dir("gpuckpt-ssh-a"), d2 = test::scratch_dir("gpuckpt-ssh-b");
  auto a = test::start_vllm_demo(d1.path(), kDemoArgs);
  auto b = test::start_vllm_demo(d2.path(), kDemoArgs);
  const std::string a1 = test::vllm_complete(a.port, "x", "alpha");
  const std::string b1 = test::vllm_complete(b.port, "y", "beta");
  test::CliResult ra, rb;
  std::thread ta([&] { ra = migrate(a.front.pid(), a.port, *ssh_, {"--keep-checkpoint"}); });
  // A staged dump sends its checkpoint once packed: the stream's other way of filling in.
  std::thread tb([&] { rb = migrate(b.front.pid(), b.port, *ssh_, {"--staging-mode", "staged"}); });
  ta.join();
  tb.join();
  ASSERT_EQ(ra.exit_code, 0) << ra.err;
  ASSERT_EQ(rb.exit_code, 0) << rb.err;
  EXPECT_TRUE(a.front.wait_for(30s).has_value());
  EXPECT_TRUE(b.front.wait_for(30s).has_value());
  EXPECT_FALSE(there(a.port, "x", "alpha again").empty());
  // --keep-checkpoint: the checkpoint that was sent stays here, whole.
  const std::string kept = json::parse(ra.out).at("checkpoint");
  EXPECT_EQ(test::run_cli({"verify", kept}).exit_code, 0) << kept;
  EXPECT_FALSE(there(b.port, "y", "beta again").empty());
}

TEST_F(E2eSsh, ATargetWithoutGpuckptIsRefusedBeforeAnythingIsFrozen) {
  auto demo = test::start_vllm_demo(dir_.path(), kDemoArgs);
  const auto r = test::run_cli({"migrate", "--pid", std::to_string(demo.front.pid()), "--to",
                                ssh_->url(), "--ssh-config", ssh_->config().string(),
                                "--remote-gpuckpt", "/nonexistent/gpuckpt"});
  EXPECT_EQ(r.exit_code, 6) << r.err;  // io
  EXPECT_NE(r.err.find("nothing was frozen"), std::string::npos) << r.err;
  EXPECT_FALSE(stopped(demo.front.pid()));
  EXPECT_FALSE(test::vllm_complete(demo.port, "s", "fine?").empty());
  // The target's sshd session ends after the controller has read its error, as in the tests
  // above: awaited, not sampled once.
  EXPECT_TRUE(test::wait_until([&] { return host_->processes().empty(); }))
      << "a process is left on the target";
}

// The target's gpuckpt fails before it receives (its spool cannot be made): its own message
// reaches the operator, not the first line of its JSON error ("it answered: {").
TEST_F(E2eSsh, ATargetThatCannotReceiveSaysWhyBeforeAnythingIsFrozen) {
  auto demo = test::start_vllm_demo(dir_.path(), kDemoArgs);
  const fs::path not_a_dir = dir_.path() / "not-a-dir";
  test::write_test_file(not_a_dir, 16, 1);
  const auto r =
      test::run_cli({"migrate", "--pid", std::to_string(demo.front.pid()), "--to", ssh_->url(),
                     "--ssh-config", ssh_->config().string(), "--remote-gpuckpt",
                     test::gpuckpt_binary().string(), "--remote-spool", not_a_dir.string()});
  EXPECT_EQ(r.exit_code, 6) << r.err;  // io
  EXPECT_NE(r.err.find("Not a directory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing was frozen"), std::string::npos) << r.err;
  EXPECT_FALSE(stopped(demo.front.pid()));
  EXPECT_FALSE(test::vllm_complete(demo.port, "s", "fine?").empty());
  // The target's sshd session ends after the controller has read its error, as in the tests
  // above: awaited, not sampled once.
  EXPECT_TRUE(test::wait_until([&] { return host_->processes().empty(); }))
      << "a process is left on the target";
}

TEST_F(E2eSsh, AfterTheHostIsGoneTheSpareRestoresTheCheckpointFromObjectStorage) {
  // Three hosts: A serves, S stores (s3rver), the spare B (host_) takes over; A reaches S on
  // one link and B on another, with addresses that exist only inside these namespaces.
  std::optional<test::NetNs> a;
  a.emplace("hosta");
  const test::NetNs store("store");
  a->link(store, "10.201.1.1/24", "10.201.1.2/24");
  host_->link(store, "10.201.2.1/24", "10.201.2.2/24");
  test::S3Server s3("ckpts", store);
  s3.export_environment();  // the credentials; each host has its own way to the store

  const TempDir ref_dir = test::scratch_dir("gpuckpt-ssh-ref");
  auto ref = test::start_vllm_demo(ref_dir.path(), kDemoArgs);
  const fs::path port_file = dir_.path() / "a.port";
  SpawnOptions so;
  so.new_session = true;
  so.stdout_file = dir_.path() / "a.log";
  so.stderr_file = dir_.path() / "a.log";
  std::vector<std::string> demo_argv{(test::bin_dir() / "gpuckpt-vllm-demo").string(), "--port",
                                     "0", "--port-file", port_file.string()};
  demo_argv.insert(demo_argv.end(), kDemoArgs.begin(), kDemoArgs.end());
  Child demo = spawn(a->wrap(demo_argv), so);
  int port = 0;
  ASSERT_TRUE(test::wait_until([&] {
    std::error_code ec;
    if (fs::file_size(port_file, ec) == 0 || ec) return false;
    port = std::stoi(read_file(port_file));
    try {
      return a->within([&] { return test::http_request(port, "GET", "/health").status == 200; });
    } catch (const Error&) {
      return false;
    }
  })) << read_file(dir_.path() / "a.log");
  EXPECT_EQ(a->within([&] { return test::vllm_complete(port, "s", "before the outage"); }),
            test::vllm_complete(ref.port, "s", "before the outage"));

  // A's periodic dump to the store (the process ends once its checkpoint is there).
  SpawnOptions env;
  env.env = {"AWS_ENDPOINT_URL=" + s3.endpoint("10.201.1.2")};
  const RunResult dumped = run_capture(
      a->wrap({test::gpuckpt_binary().string(), "--json", "dump", "--pid",
               std::to_string(demo.pid()), "-o", "s3://ckpts/llm/a", "--spool", dir_.path()}),
      300s, env);
  ASSERT_TRUE(dumped.status.ok()) << dumped.output;
  ASSERT_TRUE(demo.wait_for(30s).has_value());
  a.reset();  // host A is gone: its namespace and everything in it

  // The failover script, on the spare: restore from the store and wait until it answers.
  const std::string cmd = "env AWS_ENDPOINT_URL=" + s3.endpoint("10.201.2.2") +
                          " AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER " +
                          test::gpuckpt_binary().string() +
                          " --json restore s3://ckpts/llm/a --spool " + remote_spool_.string() +
                          " --probe http://127.0.0.1:" + std::to_string(port) + "/health";
  const RunResult restored = run_capture(
      {"ssh", "-F", ssh_->config().string(), "-o", "BatchMode=yes", "spare", cmd}, 300s);
  ASSERT_TRUE(restored.status.ok()) << restored.output;
  const json j = json::parse(restored.output);
  EXPECT_EQ(j.at("timeline").at("stages").at(0).at("name"), "download");
  EXPECT_EQ(there(port, "s", "after the outage"),
            test::vllm_complete(ref.port, "s", "after the outage"));
  EXPECT_TRUE(spool_empty(remote_spool_));
}

// The link's ceiling for the report's migration floor: bytes through one ssh connection into
// /dev/null on the other host.
TEST_F(E2eSsh, RooflineTransientMeasuresTheNetworkToTheTarget) {
  const auto r = test::run_cli({"--json", "roofline", "--target", "cpu", "--quick", "--transient",
                                "--dir", dir_.path().string(), "--bytes", "32M", "--settle", "0",
                                "--network", ssh_->url(), "--ssh-config", ssh_->config().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_TRUE(j.at("path").at("network_gbps").is_number()) << r.out;
  EXPECT_GT(j.at("path").at("network_gbps").get<double>(), 0);

  const auto bad = test::run_cli({"roofline", "--target", "cpu", "--quick", "--transient", "--dir",
                                  dir_.path().string(), "--bytes", "8M", "--network",
                                  "ssh://nohost.invalid", "--ssh-config", ssh_->config().string()});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("nohost.invalid"), std::string::npos) << bad.err;
}
