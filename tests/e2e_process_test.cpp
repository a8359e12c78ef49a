// End to end, through the CLI, with real CRIU and the real demo server: dump, restore, snapshot,
// migrate (and its rollback), a corrupted checkpoint, bad input. The server's answers depend on
// every earlier request and on its weights, so an exact match after restore proves its whole
// memory came back. These tests FAIL (not skip) when CRIU is not installed: CRIU must work here.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "image/manifest.h"
#include "probe/probe.h"
#include "process/proc_info.h"
#include "process/record.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using nlohmann::json;

namespace {

fs::path demo_binary() {
  return test::bin_dir() / "gpuckpt-demo-server";
}

// Number of sockets the process holds: 1 = only its listener (no client connection left, which
// CRIU could not dump: the peer would be outside the dumped tree).
int socket_count(pid_t pid) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    if (fs::read_symlink(e.path(), ec2).string().rfind("socket:", 0) == 0) ++n;
  }
  return n;
}

void wait_idle(pid_t pid) {
  for (int i = 0; i < 1000 && socket_count(pid) > 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// Processes (not zombies) whose command line mentions `needle`: a restored demo server has
// its original command line, which names the test's unique socket path.
std::vector<pid_t> pids_mentioning(const std::string& needle) {
  return process::live_pids_where([&](const process::ProcInfo& p) {
    for (const auto& arg : p.cmdline)
      if (arg.find(needle) != std::string::npos) return true;
    return false;
  });
}

// Test runners hand us open files (ctest: its LastTest.log, without O_CLOEXEC). A child that
// inherits such a file cannot be restored once the file has grown (CRIU checks the size of
// files open for writing), so nothing of ours is inherited by the processes we checkpoint.
void no_inherited_fds() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::stoi(e.path().filename().string());
    if (fd > 2) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
}

// A demo server in its own session (no terminal: CRIU dumps it without --shell-job), stdout in
// a file (CRIU reopens it on restore).
class DemoServer {
 public:
  DemoServer(const fs::path& dir, const std::string& name, const fs::path& weights)
      : socket_(dir / (name + ".sock")) {
    SpawnOptions o;
    o.stdout_file = dir / (name + ".out");
    o.stderr_file = dir / (name + ".err");
    o.new_session = true;
    child_ = spawn({demo_binary().string(), "--socket", socket_.string(), "--weights",
                    weights.string(), "--init-seconds", "0.2", "--kv-per-request", "256K"},
                   o);
    for (int i = 0; i < 3000; ++i) {
      std::ifstream in(o.stdout_file);
      std::string line;
      if (std::getline(in, line) && line.rfind("READY", 0) == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "demo server " << name << " did not get ready";
  }
  std::string ask(const std::string& line) {
    auto r = gpuckpt_ask(line);
    wait_idle(pid());
    return r;
  }
  pid_t pid() const { return child_.pid(); }
  const fs::path& socket() const { return socket_; }
  Child& child() { return child_; }

 private:
  std::string gpuckpt_ask(const std::string& line) { return ask_unix_line(socket_, line); }
  fs::path socket_;
  Child child_;
};

struct Cli {
  int code = -1;
  std::string out, err;
  json j;  // parsed stdout when --json was given and it parsed
};

Cli run(std::vector<std::string> args, const std::vector<std::string>& env = {},
        int timeout_s = 300) {
  args.insert(args.begin(), test::gpuckpt_binary().string());
  auto tmp = test::scratch_dir("gpuckpt-e2e-cli");
  SpawnOptions o;
  o.env = env;
  o.stderr_file = tmp.path() / "err";
  Cli c;
  try {
    auto r = run_capture(args, std::chrono::seconds(timeout_s), o);
    c.code = r.status.exited ? r.status.code : 128 + r.status.code;
    c.out = r.output;
  } catch (const Error& e) {
    c.err = e.what();
  }
  std::error_code ec;
  if (fs::exists(o.stderr_file, ec)) c.err += read_file(o.stderr_file);
  c.j = json::parse(c.out, nullptr, false);
  return c;
}

std::vector<std::string> stage_names(const json& timeline) {
  std::vector<std::string> v;
  for (const auto& s : timeline.at("stages")) v.push_back(s.at("name").get<std::string>());
  return v;
}

const json* stage(const json& timeline, const std::string& name) {
  for (const auto& s : timeline.at("stages"))
    if (s.at("name") == name) return &s;
  return nullptr;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

class E2eProcess : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    no_inherited_fds();
    weights_dir_ = new TempDir(test::scratch_dir("gpuckpt-e2e-weights"));
    weights_ = weights_dir_->path() / "weights.bin";
    auto r = run_capture(
        {demo_binary().string(), "--generate-weights", weights_.string(), "--size", "64M"},
        std::chrono::seconds(120));
    ASSERT_TRUE(r.status.ok()) << "cannot generate demo weights";
  }
  static void TearDownTestSuite() {
    delete weights_dir_;
    weights_dir_ = nullptr;
  }
  void SetUp() override {
    // CRIU is a hard requirement of this project: a missing installation is a failure.
    try {
      criu::locate();
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    dir_ = test::scratch_dir("gpuckpt-e2e");
  }

  // Reference: what an uninterrupted server answers to `requests`, in order.
  std::vector<std::string> reference(const std::vector<std::string>& requests) {
    DemoServer ref(dir_.path(), "ref", weights_);
    std::vector<std::string> out;
    for (const auto& r : requests) out.push_back(ref.ask(r));
    ref.ask("QUIT");
    ref.child().wait_for(std::chrono::seconds(10));
    return out;
  }

  static inline TempDir* weights_dir_ = nullptr;
  static inline fs::path weights_;
  TempDir dir_;
};

}  // namespace

TEST_F(E2eProcess, DumpThenRestoreContinuesExactlyWhereItStopped) {
  const std::vector<std::string> reqs{"GEN alpha", "GEN beta", "GEN gamma", "GEN delta"};
  const auto expected = reference(reqs);

  DemoServer s(dir_.path(), "srv", weights_);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(s.ask(reqs[i]), expected[i]);
  const std::string state = s.ask("STATE");
  ASSERT_EQ(state, expected[2]);
  const pid_t pid = s.pid();
  const fs::path ckpt = dir_.path() / "srv.ckpt";

  Cli d = run({"--json", "dump", "--pid", std::to_string(pid), "-o", ckpt.string()});
  ASSERT_EQ(d.code, 0) << d.err;
  ASSERT_TRUE(d.j.is_object()) << d.out;
  EXPECT_EQ(d.j["ok"], true);
  EXPECT_EQ(d.j["pid"], pid);
  EXPECT_EQ(d.j["gpu"], false);
  const auto dn = stage_names(d.j["timeline"]);
  for (const char* st :
       {"freeze", "device_lock", "device_checkpoint", "criu_dump", "compress_write"})
    EXPECT_TRUE(has(dn, st)) << "dump timeline lacks " << st << ": " << d.out;
  EXPECT_GT(stage(d.j["timeline"], "criu_dump")->at("bytes").get<std::uint64_t>(), 64u << 20);
  EXPECT_GT(stage(d.j["timeline"], "compress_write")->at("bytes").get<std::uint64_t>(), 64u << 20);
  // Who held the stream back: the waits for gpuckpt, within the window they fall in.
  const auto seconds = [](const json& tl, const char* name) {
    const auto* s = stage(tl, name);
    return s ? s->at("seconds").get<double>() : -1.0;
  };
  EXPECT_GE(seconds(d.j["timeline"], "capture_wait"), 0.0) << d.out;
  EXPECT_LE(seconds(d.j["timeline"], "capture_wait"), seconds(d.j["timeline"], "compress_write"));

  // The original has ended (killed once the checkpoint was durable); reap it so its pid is free.
  auto st = s.child().wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(st.has_value()) << "the dumped process still runs";
  EXPECT_FALSE(st->exited);
  EXPECT_EQ(st->code, SIGKILL);
  EXPECT_EQ(ask_unix_line(s.socket(), "PING"), "");

  // The checkpoint records the process and carries the plugin's report.
  const ImageInfo info = inspect(ckpt);
  const auto rec = process::from_extra(info.extra);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->pid, pid);
  EXPECT_EQ(rec->comm, "gpuckpt-demo-se");  // comm is truncated to 15 characters
  EXPECT_FALSE(rec->cuda);
  EXPECT_FALSE(rec->criu_version.empty());
  bool has_report = false;
  for (const auto& f : info.files) has_report |= f.path == criu::kDumpReportName;
  EXPECT_TRUE(has_report) << "the CRIU plugin's report is not in the checkpoint";

  Cli r = run({"--json", "restore", ckpt.string(), "--probe", "unix:" + s.socket().string(),
               "--request", "STATE"});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(r.j.is_object()) << r.out;
  EXPECT_EQ(r.j["pid"], pid);  // CRIU restores the checkpointed pid
  EXPECT_EQ(r.j["first_answer"], state);
  const auto rn = stage_names(r.j["timeline"]);
  for (const char* stn :
       {"read_decompress", "criu_restore", "device_restore", "unlock", "first_answer"})
    EXPECT_TRUE(has(rn, stn)) << "restore timeline lacks " << stn << ": " << r.out;
  // Every byte went into CRIU's pipes, which takes some time, and no more than the feed ran.
  EXPECT_GT(seconds(r.j["timeline"], "feed_wait"), 0.0) << r.out;
  EXPECT_LE(seconds(r.j["timeline"], "feed_wait"), seconds(r.j["timeline"], "read_decompress"));

  // Exactly the state it had, and the next answer is what the uninterrupted server gave.
  EXPECT_EQ(ask_unix_line(s.socket(), "STATE"), state);
  wait_idle(pid);
  EXPECT_EQ(ask_unix_line(s.socket(), reqs[3]), expected[3]);
  EXPECT_EQ(ask_unix_line(s.socket(), "QUIT"), "BYE");
  EXPECT_TRUE(process::wait_ended(pid, std::chrono::seconds(10)));
}

TEST_F(E2eProcess, LeaveRunningSnapshotKeepsTheServerAndRestoresTheSnapshotState) {
  DemoServer s(dir_.path(), "snap", weights_);
  s.ask("GEN one");
  s.ask("GEN two");
  const std::string at_snapshot = s.ask("STATE");
  const fs::path ckpt = dir_.path() / "snap.ckpt";

  Cli d = run(
      {"--json", "dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string(), "--leave-running"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.j["leave_running"], true);
  // The plugin undoes its device work when the task keeps running (timed even without CUDA).
  EXPECT_TRUE(has(stage_names(d.j["timeline"]), "device_resume")) << d.out;
  // Still serving, with its state intact; then it moves on.
  ASSERT_TRUE(process::alive(s.pid()));
  EXPECT_EQ(s.ask("STATE"), at_snapshot);
  const std::string later = s.ask("GEN three");
  EXPECT_NE(later, at_snapshot);

  // The original still holds the pid: a plain restore refuses clearly...
  Cli busy = run({"restore", ckpt.string()});
  EXPECT_EQ(busy.code, 10) << busy.err;
  EXPECT_NE(busy.err.find("in use"), std::string::npos) << busy.err;
  // ...a restore into a new pid namespace would take the live original's socket path: it is
  // refused rather than done silently...
  Cli taken = run({"restore", ckpt.string(), "--new-pidns"});
  EXPECT_EQ(taken.code, 10) << taken.err;
  EXPECT_NE(taken.err.find("--take-endpoints"), std::string::npos) << taken.err;
  EXPECT_EQ(s.ask("STATE"), later) << "the refused restore disturbed the original";
  // ...and, asked for explicitly, brings back the snapshot beside it.
  Cli r = run({"--json", "restore", ckpt.string(), "--new-pidns", "--take-endpoints", "--probe",
               "unix:" + s.socket().string(), "--request", "STATE"});
  ASSERT_EQ(r.code, 0) << r.err;
  const pid_t restored = r.j["pid"].get<pid_t>();
  EXPECT_NE(restored, s.pid());
  EXPECT_EQ(r.j["ns_pid"], s.pid());  // its old pid, inside its namespace
  EXPECT_EQ(r.j["first_answer"], at_snapshot);
  EXPECT_TRUE(process::alive(s.pid()));

  EXPECT_EQ(ask_unix_line(s.socket(), "QUIT"), "BYE");  // the restored copy owns the path now
  EXPECT_TRUE(process::wait_ended(restored, std::chrono::seconds(10)));
  s.child().kill(SIGKILL);
  s.child().wait();
}

TEST_F(E2eProcess, MigrateEndsTheOriginalOnlyAfterTheNewOneAnswers) {
  const std::vector<std::string> reqs{"GEN m1", "GEN m2", "GEN m3"};
  const auto expected = reference(reqs);
  DemoServer s(dir_.path(), "mig", weights_);
  s.ask(reqs[0]);
  s.ask(reqs[1]);
  const std::string state = s.ask("STATE");
  const pid_t old_pid = s.pid();

  // Held where the copy runs and is about to be probed: the original must be there and
  // frozen, and it must stay so until gpuckpt has seen the copy answer.
  Child g = test::paused_cli({"--json", "migrate", "--pid", std::to_string(old_pid), "--to",
                              (dir_.path() / "target").string(), "--probe",
                              "unix:" + s.socket().string(), "--request", "STATE"},
                             "first_answer", dir_.path(), test::Resume::kWhenUnmarked);
  const auto held = process::read_proc(old_pid);
  ASSERT_TRUE(held.has_value()) << "the original ended before the copy answered";
  EXPECT_EQ(held->state, 'T') << "the original is not frozen while the copy is probed";
  test::resume_paused(dir_.path(), "first_answer");
  const ExitStatus done = g.wait();
  Cli m;
  m.code = done.exited ? done.code : 128 + done.code;
  m.out = read_file(dir_.path() / "cli.out");
  m.err = read_file(dir_.path() / "cli.err");
  m.j = json::parse(m.out, nullptr, false);
  ASSERT_EQ(m.code, 0) << m.err;
  const pid_t new_pid = m.j["pid"].get<pid_t>();
  EXPECT_EQ(m.j["old_pid"], old_pid);
  EXPECT_NE(new_pid, old_pid);
  EXPECT_EQ(m.j["first_answer"], state);

  const json& tl = m.j["timeline"];
  const json* answer = stage(tl, "first_answer");
  const json* end = stage(tl, "end_original");
  ASSERT_NE(answer, nullptr) << m.out;
  ASSERT_NE(end, nullptr) << m.out;
  EXPECT_GE(end->at("start").get<double>(),
            answer->at("start").get<double>() + answer->at("seconds").get<double>());
  for (const char* st :
       {"freeze", "criu_dump", "compress_write", "read_decompress", "criu_restore"})
    EXPECT_TRUE(has(stage_names(tl), st)) << st;

  auto st = s.child().wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(st.has_value()) << "the original still runs after the migration";
  EXPECT_TRUE(fs::is_empty(dir_.path() / "target")) << "the checkpoint was not removed";
  EXPECT_EQ(ask_unix_line(s.socket(), "STATE"), state);
  EXPECT_EQ(ask_unix_line(s.socket(), reqs[2]), expected[2]);
  EXPECT_EQ(ask_unix_line(s.socket(), "QUIT"), "BYE");
  EXPECT_TRUE(process::wait_ended(new_pid, std::chrono::seconds(10)));
}

TEST_F(E2eProcess, FailedMigrationRollsBackToTheOriginal) {
  DemoServer s(dir_.path(), "rb", weights_);
  s.ask("GEN r1");
  const std::string state = s.ask("STATE");
  // The copy is restored, but the probe asks a socket nobody serves: the migration must fail
  // and put everything back.
  Cli m =
      run({"migrate", "--pid", std::to_string(s.pid()), "--to", (dir_.path() / "target").string(),
           "--probe", "unix:" + (dir_.path() / "nobody.sock").string(), "--probe-timeout", "2"});
  EXPECT_EQ(m.code, 11) << m.err;  // timeout
  EXPECT_NE(m.err.find("rollback"), std::string::npos) << m.err;
  EXPECT_NE(m.err.find("resumed"), std::string::npos) << m.err;
  // The original runs again, answers on its own socket path, with its state.
  auto p = process::read_proc(s.pid());
  ASSERT_TRUE(p.has_value());
  EXPECT_NE(p->state, 'T');
  EXPECT_EQ(s.ask("STATE"), state);
  EXPECT_EQ(pids_mentioning(s.socket().string()), std::vector<pid_t>{s.pid()})
      << "the restored copy was not killed";

  // The failed migration kept its checkpoint: a retry is refused until it says --force, and
  // then goes through.
  const std::vector<std::string> retry{"--json",    "migrate",
                                       "--pid",     std::to_string(s.pid()),
                                       "--to",      (dir_.path() / "target").string(),
                                       "--probe",   "unix:" + s.socket().string(),
                                       "--request", "STATE"};
  Cli again = run(retry);
  EXPECT_EQ(again.code, 12) << again.err;
  EXPECT_NE(again.out.find("--force"), std::string::npos) << again.out;
  std::vector<std::string> forced = retry;
  forced.push_back("--force");
  Cli done = run(forced);
  ASSERT_EQ(done.code, 0) << done.err;
  EXPECT_EQ(done.j["first_answer"], state);
  EXPECT_TRUE(s.child().wait_for(std::chrono::seconds(10)).has_value())
      << "the original still runs after the migration";
  EXPECT_EQ(ask_unix_line(s.socket(), "QUIT"), "BYE");
  EXPECT_TRUE(process::wait_ended(done.j["pid"].get<pid_t>(), std::chrono::seconds(10)));
}

TEST_F(E2eProcess, FailedWriteResumesTheProcessInsteadOfLosingIt) {
  DemoServer s(dir_.path(), "nowrite", weights_);
  s.ask("GEN w");
  const std::string state = s.ask("STATE");
  // CRIU's dump succeeds (the process is then stopped), but the checkpoint cannot be created
  // under /proc: the process must come back, not be killed.
  Cli d = run({"dump", "--pid", std::to_string(s.pid()), "-o", "/proc/gpuckpt-e2e.ckpt"});
  EXPECT_NE(d.code, 0);
  EXPECT_NE(
      d.err.find("no checkpoint was written; process " + std::to_string(s.pid()) + " was resumed"),
      std::string::npos)
      << d.err;
  auto p = process::read_proc(s.pid());
  ASSERT_TRUE(p.has_value());
  EXPECT_NE(p->state, 'T');
  EXPECT_EQ(s.ask("STATE"), state);
  s.ask("QUIT");
  s.child().wait_for(std::chrono::seconds(10));
}

TEST_F(E2eProcess, TooSmallStagingIsRefusedBeforeTheProcessIsFrozen) {
  DemoServer s(dir_.path(), "small", weights_);
  // A 1 MiB tmpfs, mounted in a private mount namespace that ends with the command.
  const fs::path small = dir_.path() / "small-staging";
  fs::create_directory(small);
  auto tmp = test::scratch_dir("gpuckpt-e2e-cli");
  SpawnOptions o;
  o.stderr_file = tmp.path() / "err";
  const std::string cmd = "mount -t tmpfs -o size=1m tmpfs " + small.string() + " && exec " +
                          test::gpuckpt_binary().string() + " dump --pid " +
                          std::to_string(s.pid()) + " -o " + (dir_.path() / "s.ckpt").string() +
                          " --staging " + small.string();
  auto r = run_capture({"unshare", "--mount", "--propagation", "private", "sh", "-c", cmd},
                       std::chrono::seconds(120), o);
  const std::string err = read_file(o.stderr_file);
  EXPECT_EQ(r.status.code, 6) << err;
  EXPECT_NE(err.find("MiB of memory to dump: use --staging DIR"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir_.path() / "s.ckpt"));
  EXPECT_NE(process::read_proc(s.pid())->state, 'T');
  EXPECT_EQ(s.ask("PING"), "PONG");
  s.ask("QUIT");
  s.child().wait_for(std::chrono::seconds(10));
}

TEST_F(E2eProcess, CorruptedCheckpointFailsBeforeAnyProcessStarts) {
  DemoServer s(dir_.path(), "bad", weights_);
  s.ask("GEN x");
  const fs::path ckpt = dir_.path() / "bad.ckpt";
  Cli d = run({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string()});
  ASSERT_EQ(d.code, 0) << d.err;
  s.child().wait_for(std::chrono::seconds(10));

  // Flip one byte in the middle of the largest data file of the checkpoint.
  fs::path biggest;
  std::uintmax_t size = 0;
  for (const auto& e : fs::recursive_directory_iterator(ckpt)) {
    if (e.is_regular_file() && e.file_size() > size) {
      size = e.file_size();
      biggest = e.path();
    }
  }
  ASSERT_GT(size, 1u << 20);
  {
    std::fstream f(biggest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size / 2));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.write(&c, 1);
  }

  Cli r = run({"restore", ckpt.string()});
  EXPECT_EQ(r.code, 4) << r.err;  // kCorrupt
  EXPECT_EQ(ask_unix_line(s.socket(), "PING"), "");
  EXPECT_TRUE(pids_mentioning(s.socket().string()).empty()) << "a process was started";
  EXPECT_FALSE(process::alive(s.pid()));
}

TEST_F(E2eProcess, ADamagedFileTheRestoreDoesNotNeedIsReportedButRestoresTheProcess) {
  DemoServer s(dir_.path(), "log", weights_);
  const std::string state = s.ask("GEN y");
  const fs::path ckpt = dir_.path() / "log.ckpt";
  Cli d = run({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string()});
  ASSERT_EQ(d.code, 0) << d.err;
  s.child().wait_for(std::chrono::seconds(10));

  // One byte of CRIU's dump log, which a restore never reads, flipped in its blob.
  const image::Manifest m = image::load_manifest(ckpt);
  const image::ManifestEntry* log = nullptr;
  for (const auto& e : m.entries)
    if (e.path == "dump.log" && !e.chunks.empty()) log = &e;
  ASSERT_NE(log, nullptr) << "the checkpoint holds no dump.log";
  const image::ChunkRecord& c = log->chunks.front();
  {
    std::fstream f(ckpt / m.blobs[c.blob].name, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(c.offset + c.stored / 2);
    f.seekg(at);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x5a);
    f.seekp(at);
    f.write(&b, 1);
  }

  Cli r = run({"--json", "restore", ckpt.string(), "--probe", "unix:" + s.socket().string()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ask_unix_line(s.socket(), "STATE"), state);
  ASSERT_TRUE(r.j.contains("damaged_unread")) << r.out;
  ASSERT_EQ(r.j["damaged_unread"].size(), 1u) << r.out;
  EXPECT_NE(r.j["damaged_unread"][0].get<std::string>().find("'dump.log'"), std::string::npos);
  EXPECT_NE(r.err.find("the restore did not need that file"), std::string::npos) << r.err;
  // The checkpoint is still reported as damaged by the full check.
  EXPECT_EQ(run({"verify", ckpt.string()}).code, 4);
  EXPECT_EQ(ask_unix_line(s.socket(), "QUIT"), "BYE");
  EXPECT_TRUE(process::wait_ended(r.j["pid"].get<pid_t>(), std::chrono::seconds(10)));
}

TEST_F(E2eProcess, BadInputIsAClearError) {
  Cli d = run({"dump", "--pid", "999999", "-o", (dir_.path() / "x.ckpt").string()});
  EXPECT_EQ(d.code, 10) << d.err;
  EXPECT_NE(d.err.find("no process with pid 999999"), std::string::npos) << d.err;
  EXPECT_FALSE(fs::exists(dir_.path() / "x.ckpt"));

  Cli r = run({"restore", (dir_.path() / "missing.ckpt").string()});
  EXPECT_EQ(r.code, 3) << r.err;

  Cli m = run({"migrate", "--pid", "999999", "--to", dir_.path().string()});
  EXPECT_EQ(m.code, 10) << m.err;

  // An existing output is not replaced without --force, and the process is left alone.
  DemoServer s(dir_.path(), "exists", weights_);
  fs::create_directory(dir_.path() / "taken.ckpt");
  Cli e =
      run({"dump", "--pid", std::to_string(s.pid()), "-o", (dir_.path() / "taken.ckpt").string()});
  EXPECT_EQ(e.code, 12) << e.err;
  EXPECT_EQ(s.ask("PING"), "PONG");
  s.ask("QUIT");
  s.child().wait_for(std::chrono::seconds(10));
}

TEST_F(E2eProcess, MissingCriuIsAClearError) {
  DemoServer s(dir_.path(), "nocriu", weights_);
  Cli d = run({"dump", "--pid", std::to_string(s.pid()), "-o", (dir_.path() / "n.ckpt").string()},
              {"GPUCKPT_CRIU=/nonexistent/criu"});
  EXPECT_EQ(d.code, 9) << d.err;
  EXPECT_NE(d.err.find("CRIU not found at /nonexistent/criu"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("install-criu.sh"), std::string::npos) << d.err;
  EXPECT_EQ(s.ask("PING"), "PONG");
  s.ask("QUIT");
  s.child().wait_for(std::chrono::seconds(10));
}
