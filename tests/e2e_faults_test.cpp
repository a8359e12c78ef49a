// Faults, with real CRIU: a signal (SIGINT, SIGTERM, SIGHUP or SIGKILL) at every phase of a dump,
// a restore and a migration must leave the service running, restored, or ended only once its
// checkpoint is durable; and nothing may be left behind (staging, temporary outputs, rollback
// links, a second copy). gpuckpt is stopped at each phase deterministically by its fault points
// (util/fault.h): $GPUCKPT_FAULT_PAUSE names the point, $GPUCKPT_FAULT_MARK is created there.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "criu/criu.h"
#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "probe/probe.h"
#include "process/proc_info.h"
#include "test_support.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// Processes whose command line mentions `needle` (a restored server keeps its command line).
std::vector<pid_t> serving(const std::string& needle) {
  return process::live_pids_where([&](const process::ProcInfo& p) {
    for (const auto& a : p.cmdline)
      if (a.find(needle) != std::string::npos) return true;
    return false;
  });
}

// Entries of `dir` whose names start with `prefix` (leftovers).
std::vector<std::string> entries(const fs::path& dir, const std::string& prefix = "") {
  std::vector<std::string> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && n.rfind(".gpuckpt-staging.lock", 0) != 0) v.push_back(n);
  }
  return v;
}

// This pid namespace's inode number, which names gpuckpt's lock files (process/support.h).
std::uint64_t this_pidns() {
  struct stat ns = {};
  return ::stat("/proc/self/ns/pid", &ns) == 0 ? ns.st_ino : 0;
}

// The name of gpuckpt's lock file for process `pid` started at `ticks`, in pid namespace `pidns`.
std::string lock_file(pid_t pid, std::uint64_t ticks, std::uint64_t pidns = this_pidns()) {
  return ".lock-" + std::to_string(pidns) + "-" + std::to_string(pid) + "-" + std::to_string(ticks);
}

class E2eFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::close_inherited_fds();
    weights_dir_ = new TempDir(test::scratch_dir("gpuckpt-faults-weights"));
    weights_ = weights_dir_->path() / "w.bin";
    auto r = run_capture({(test::bin_dir() / "gpuckpt-demo-server").string(), "--generate-weights",
                          weights_.string(), "--size", "16M"},
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
    dir_ = test::scratch_dir("gpuckpt-faults");
    staging_ = dir_.path() / "staging";
    out_ = dir_.path() / "out";
    fs::create_directories(staging_);
    fs::create_directories(out_);
  }

  // A demo server in its own session, answering on DIR/NAME.sock.
  Child server(const std::string& name) {
    SpawnOptions o;
    o.new_session = true;
    o.stdout_file = dir_.path() / (name + ".out");
    o.stderr_file = dir_.path() / (name + ".err");
    const fs::path sock = dir_.path() / (name + ".sock");
    Child c = spawn({(test::bin_dir() / "gpuckpt-demo-server").string(), "--socket", sock.string(),
                     "--weights", weights_.string(), "--init-seconds", "0"},
                    o);
    EXPECT_TRUE(test::wait_until([&] { return ask_unix_line(sock, "PING") == "PONG"; }));
    return c;
  }
  fs::path sock(const std::string& name) const { return dir_.path() / (name + ".sock"); }
  // Dumps `s` (which ends) to out_/NAME.ckpt and reaps it, so that its pids are free for a
  // restore; empty if the dump failed.
  fs::path dumped(Child& s, const std::string& name) {
    const fs::path ckpt = out_ / (name + ".ckpt");
    const auto r = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string(),
                                  "--staging", staging_.string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    s.wait_for(std::chrono::seconds(10));
    return r.exit_code == 0 ? ckpt : fs::path();
  }
  // The criu that gpuckpt `g` runs now (its child).
  static std::vector<pid_t> criu_of(const Child& g) {
    return process::live_pids_where(
        [&](const process::ProcInfo& p) { return p.ppid == g.pid() && p.comm == "criu"; });
  }

  // Starts gpuckpt ARGS paused at fault point `point`; returns once it is there.
  Child paused_cli(const std::vector<std::string>& args, const std::string& point,
                   bool resume_on_interrupt = false) {
    return test::paused_cli(
        args, point, dir_.path(),
        resume_on_interrupt ? test::Resume::kOnInterrupt : test::Resume::kNever);
  }

  // The guard of gpuckpt `g` (held at a fault point); 0 unless it has exactly one.
  static pid_t guard_of(const Child& g) {
    const auto guards = process::live_pids_where(
        [&](const process::ProcInfo& p) { return p.ppid == g.pid() && p.comm == "gpuckpt-guard"; });
    return guards.size() == 1 ? guards.front() : 0;
  }
  // Waits until `pid` is gone or a zombie.
  static bool wait_ended(pid_t pid) {
    return test::wait_until([&] {
      const auto p = process::read_proc(pid);
      return !p || p->state == 'Z';
    });
  }
  // SIGKILLs the guard of gpuckpt `g` (held at a fault point) and waits until it is dead.
  static bool kill_guard_of(const Child& g) {
    const pid_t guard = guard_of(g);
    if (guard == 0) return false;
    ::kill(guard, SIGKILL);
    return wait_ended(guard);
  }

  static inline TempDir* weights_dir_ = nullptr;
  static inline fs::path weights_;
  TempDir dir_;
  fs::path staging_, out_;
};

}  // namespace

TEST_F(E2eFaults, SignalAtAnyPhaseOfADumpLeavesTheServiceRunningAndNothingBehind) {
  for (const std::string point : {"criu_dump", "compress_write"}) {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGKILL}) {
      SCOPED_TRACE(point + " / " + strsignal(sig));
      Child s = server("d");
      ask_unix_line(sock("d"), "GEN before");
      const std::string state = ask_unix_line(sock("d"), "STATE");
      const fs::path ckpt = out_ / "d.ckpt";
      Child g = paused_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string(),
                            "--staging", staging_.string()},
                           point);
      g.kill(sig);
      const ExitStatus st = g.wait();
      EXPECT_FALSE(st.exited);
      EXPECT_EQ(st.code, sig);
      // The guard resumes it (after a SIGKILL of gpuckpt too), with its state.
      EXPECT_TRUE(test::runs_again(s.pid())) << "the service was left frozen";
      EXPECT_TRUE(test::wait_until([&] { return ask_unix_line(sock("d"), "STATE") == state; }));
      EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }))
          << "staging left behind: " << entries(staging_).front();
      EXPECT_TRUE(test::wait_until([&] { return entries(out_).empty(); }))
          << "output left behind: " << entries(out_).front();
      s.kill(SIGKILL);
      s.wait();
    }
  }
}

TEST_F(E2eFaults, SignalOnceTheCheckpointIsDurableEndsTheServiceAsPlanned) {
  for (const int sig : {SIGINT, SIGKILL}) {
    SCOPED_TRACE(strsignal(sig));
    Child s = server("e");
    const fs::path ckpt = out_ / ("e" + std::to_string(sig) + ".ckpt");
    Child g = paused_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string(),
                          "--staging", staging_.string()},
                         "durable");
    g.kill(sig);
    g.wait();
    // The checkpoint is complete, so the dump goes through: the process ends...
    auto st = s.wait_for(30s);
    EXPECT_TRUE(st.has_value()) << "the service outlived a durable dump";
    // ...and the checkpoint restores it.
    EXPECT_NO_THROW(verify(ckpt));
    EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }));
    auto r = test::run_cli({"restore", ckpt.string(), "--staging", staging_.string(), "--probe",
                            "unix:" + sock("e").string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (pid_t p : serving(sock("e").string())) {
      ::kill(p, SIGKILL);
      process::wait_ended(p, 10s);
    }
  }
}

TEST_F(E2eFaults, SignalAtAnyPhaseOfAMigrationRollsBackToOneRunningOriginal) {
  for (const std::string point :
       {"criu_dump", "compress_write", "criu_restore", "criu_restored", "first_answer"}) {
    for (const int sig : {SIGINT, SIGKILL}) {
      SCOPED_TRACE(point + " / " + strsignal(sig));
      Child s = server("m");
      ask_unix_line(sock("m"), "GEN m");
      const std::string state = ask_unix_line(sock("m"), "STATE");
      Child g = paused_cli(
          {"migrate", "--pid", std::to_string(s.pid()), "--to", (out_ / "target").string(),
           "--staging", staging_.string(), "--probe", "unix:" + sock("m").string()},
          point);
      g.kill(sig);
      g.wait();
      EXPECT_TRUE(test::runs_again(s.pid())) << "the original was left frozen";
      // One server, the original, answers on its own socket path with its state: the copy is
      // gone and the path was put back.
      EXPECT_TRUE(test::wait_until([&] {
        return serving(sock("m").string()) == std::vector<pid_t>{s.pid()};
      })) << "a second copy survived the rollback";
      EXPECT_EQ(ask_unix_line(sock("m"), "STATE"), state);
      EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }));
      EXPECT_TRUE(entries(dir_.path(), ".m.sock.gpuckpt-rollback").empty());
      s.kill(SIGKILL);
      s.wait();
      fs::remove_all(out_ / "target");
    }
  }
}

TEST_F(E2eFaults, AStopAfterAMigrationHandedOverLeavesTheCopyServing) {
  // The copy answered and was handed over; the original is not ended yet. gpuckpt stopped here
  // must leave the copy serving and the original ended (the checkpoint is durable): never
  // neither, as when the guard learnt of the handover only after the original had ended.
  for (const int sig : {SIGINT, SIGKILL}) {
    SCOPED_TRACE(strsignal(sig));
    Child s = server("h");
    ask_unix_line(sock("h"), "GEN h");
    const std::string state = ask_unix_line(sock("h"), "STATE");
    // Past the handover an interrupt undoes nothing: gpuckpt finishes (here, once let go from
    // its fault point) and reports its copy; a SIGKILL leaves the rest to the guard.
    Child g = test::paused_cli(
        {"migrate", "--pid", std::to_string(s.pid()), "--to", (out_ / "target").string(),
         "--staging", staging_.string(), "--probe", "unix:" + sock("h").string()},
        "end_original", dir_.path(),
        sig == SIGINT ? test::Resume::kWhenUnmarked : test::Resume::kNever);
    g.kill(sig);
    if (sig == SIGINT) {
      ASSERT_TRUE(test::wait_until([&] {
        return read_file(dir_.path() / "cli.err").find("committed") != std::string::npos;
      }));
      test::resume_paused(dir_.path(), "end_original");
    }
    const ExitStatus st = g.wait();
    if (sig == SIGINT) {
      EXPECT_TRUE(st.ok()) << st.describe();
    }
    EXPECT_TRUE(s.wait_for(60s).has_value()) << "the original was not ended";
    std::vector<pid_t> copy;
    EXPECT_TRUE(test::wait_until([&] {
      copy = serving(sock("h").string());
      return copy.size() == 1 && copy.front() != s.pid();
    })) << "no copy serves";
    EXPECT_EQ(ask_unix_line(sock("h"), "STATE"), state);
    EXPECT_TRUE(test::wait_until([&] {
      return entries(dir_.path(), ".h.sock.gpuckpt-rollback").empty();
    })) << "the original's socket entry, moved aside, was left behind";
    EXPECT_EQ(ask_unix_line(sock("h"), "QUIT"), "BYE");
    for (pid_t p : copy) process::wait_ended(p, 10s);
    fs::remove_all(out_ / "target");
  }
}

// The copy answers, the guard is dead: the migration commits all the same and says it
// succeeded (before, it said it failed, with the copy serving and the original ended).
TEST_F(E2eFaults, AMigrationWhoseGuardDiesOnceTheCopyAnswersCompletes) {
  Child s = server("ma");
  const std::string state = ask_unix_line(sock("ma"), "STATE");
  Child g = test::paused_cli(
      {"--json", "migrate", "--pid", std::to_string(s.pid()), "--to", (out_ / "t").string(),
       "--staging", staging_.string(), "--probe", "unix:" + sock("ma").string()},
      "first_answer", dir_.path(), test::Resume::kWhenUnmarked);
  ASSERT_TRUE(kill_guard_of(g));
  test::resume_paused(dir_.path(), "first_answer");
  const ExitStatus st = g.wait();
  EXPECT_TRUE(st.ok()) << st.describe() << "\n" << read_file(dir_.path() / "cli.err");
  EXPECT_TRUE(s.wait_for(30s).has_value()) << "the original still runs";
  const std::vector<pid_t> copy = serving(sock("ma").string());
  ASSERT_EQ(copy.size(), 1u);
  EXPECT_EQ(ask_unix_line(sock("ma"), "STATE"), state);
  EXPECT_EQ(ask_unix_line(sock("ma"), "QUIT"), "BYE");
  process::wait_ended(copy[0], 10s);
}

TEST_F(E2eFaults, AGuardThatDiesLeavesGpuckptToResumeTheServiceItself) {
  Child s = server("k");
  ask_unix_line(sock("k"), "GEN k");
  const std::string state = ask_unix_line(sock("k"), "STATE");
  const std::string pid = std::to_string(s.pid());
  Child g = test::paused_cli({"--json", "dump", "--pid", pid, "-o", (out_ / "k.ckpt").string(),
                              "--staging", staging_.string()},
                             "criu_dump", dir_.path(), test::Resume::kWhenUnmarked);
  ASSERT_TRUE(kill_guard_of(g));
  test::resume_paused(dir_.path(), "criu_dump");
  const ExitStatus st = g.wait();
  ASSERT_TRUE(st.exited) << "gpuckpt died of signal " << st.code << " (" << strsignal(st.code)
                         << ")";
  EXPECT_NE(st.code, 0);
  const std::string out = read_file(dir_.path() / "cli.out");
  const json j = json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["ok"], false);
  const std::string msg = j["error"].value("message", "");
  EXPECT_NE(msg.find("had died, so gpuckpt undid the operation itself"), std::string::npos) << msg;
  EXPECT_NE(msg.find("process " + pid + " was resumed"), std::string::npos) << msg;
  EXPECT_TRUE(test::runs_again(s.pid())) << "the service was left frozen";
  EXPECT_EQ(ask_unix_line(sock("k"), "STATE"), state);
  EXPECT_FALSE(fs::exists(out_ / "k.ckpt"));
  EXPECT_TRUE(entries(out_).empty());
  EXPECT_TRUE(entries(staging_).empty());
  s.kill(SIGKILL);
  s.wait();
}

// A guard that dies once the checkpoint is whole: the dump is complete, and says so. Before,
// telling the dead guard "durable" failed the dump, and the rollback then ended the process
// anyway: an error for a checkpoint that was there and a service that was gone.
TEST_F(E2eFaults, AGuardThatDiesAfterTheCheckpointIsWholeDoesNotFailTheDump) {
  Child s = server("p");
  const std::string pid = std::to_string(s.pid());
  Child g = test::paused_cli({"--json", "dump", "--pid", pid, "-o", (out_ / "p.ckpt").string(),
                              "--staging", staging_.string()},
                             "published", dir_.path(), test::Resume::kWhenUnmarked);
  ASSERT_TRUE(kill_guard_of(g));
  test::resume_paused(dir_.path(), "published");
  const ExitStatus st = g.wait();
  EXPECT_TRUE(st.ok()) << st.describe() << "\n" << read_file(dir_.path() / "cli.err");
  const json j = json::parse(read_file(dir_.path() / "cli.out"), nullptr, false);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["ok"], true);
  EXPECT_TRUE(s.wait_for(30s).has_value()) << "the dumped process did not end";
  EXPECT_EQ(test::run_cli({"verify", (out_ / "p.ckpt").string()}).exit_code, 0);
  EXPECT_TRUE(entries(staging_).empty());
}

// Started with its stdin closed (a cron job, `<&-`), gpuckpt's first pipe lands on fd 0: the
// guard was spawned with that pipe as its stdin, close-on-exec, so it read EOF at once, and
// gpuckpt died of SIGPIPE with no output at all.
TEST_F(E2eFaults, ASnapshotStartedWithStdinClosedStillWorks) {
  Child s = server("c");
  SpawnOptions o;
  o.stdout_file = dir_.path() / "c.cli.out";
  o.stderr_file = dir_.path() / "c.cli.err";
  Child g = spawn({"/bin/sh", "-c", "exec \"$0\" \"$@\" <&-", test::gpuckpt_binary().string(),
                   "--json", "dump", "--pid", std::to_string(s.pid()), "--leave-running", "-o",
                   (out_ / "c.ckpt").string(), "--staging", staging_.string()},
                  o);
  const ExitStatus st = g.wait();
  EXPECT_TRUE(st.ok()) << st.describe() << "\n" << read_file(dir_.path() / "c.cli.err");
  const json j = json::parse(read_file(dir_.path() / "c.cli.out"), nullptr, false);
  ASSERT_TRUE(j.is_object()) << read_file(dir_.path() / "c.cli.out");
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(ask_unix_line(sock("c"), "PING"), "PONG");
  EXPECT_EQ(test::run_cli({"verify", (out_ / "c.ckpt").string()}).exit_code, 0);
  s.kill(SIGKILL);
  s.wait();
}

// criu takes its log's and pidfile's paths relative to its images directory: a relative
// --staging made every dump fail after the tree had been frozen and dumped.
TEST_F(E2eFaults, ARelativeStagingDirectoryIsTakenFromTheWorkingDirectory) {
  Child s = server("r");
  SpawnOptions o;
  o.cwd = dir_.path();
  o.stdout_file = dir_.path() / "r.cli.out";
  o.stderr_file = dir_.path() / "r.cli.err";
  Child g =
      spawn({test::gpuckpt_binary().string(), "--json", "dump", "--pid", std::to_string(s.pid()),
             "--leave-running", "-o", "out/r.ckpt", "--staging", "staging"},
            o);
  const ExitStatus st = g.wait();
  EXPECT_TRUE(st.ok()) << st.describe() << "\n" << read_file(dir_.path() / "r.cli.err");
  EXPECT_EQ(test::run_cli({"verify", (out_ / "r.ckpt").string()}).exit_code, 0);
  EXPECT_TRUE(entries(staging_).empty());
  s.kill(SIGKILL);
  s.wait();
}

// Two dumps of one process at once fought inside criu ("was stopped by 5 unexpectedly") and
// both failed. The second is refused before it freezes anything; the first is unharmed.
TEST_F(E2eFaults, ASecondDumpOfAProcessBeingDumpedIsRefusedBeforeFreezing) {
  Child s = server("x");
  const std::string pid = std::to_string(s.pid());
  Child g = test::paused_cli({"dump", "--pid", pid, "--leave-running", "-o",
                              (out_ / "x1.ckpt").string(), "--staging", staging_.string()},
                             "criu_dump", dir_.path(), test::Resume::kWhenUnmarked);
  for (const auto& second :
       {std::vector<std::string>{"--json", "dump", "--pid", pid, "-o", (out_ / "x2.ckpt").string(),
                                 "--staging", staging_.string()},
        std::vector<std::string>{"--json", "migrate", "--pid", pid, "--to", (out_ / "t").string(),
                                 "--staging", staging_.string()}}) {
    SCOPED_TRACE(second[1]);
    const auto r = test::run_cli(second);
    EXPECT_EQ(r.exit_code, 10) << r.err;
    const json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_NE(j["error"].value("message", "").find("being dumped or migrated by another gpuckpt"),
              std::string::npos)
        << r.out;
  }
  EXPECT_FALSE(fs::exists(out_ / "x2.ckpt"));
  test::resume_paused(dir_.path(), "criu_dump");
  const ExitStatus st = g.wait();
  EXPECT_TRUE(st.ok()) << st.describe() << "\n" << read_file(dir_.path() / "cli.err");
  EXPECT_EQ(test::run_cli({"verify", (out_ / "x1.ckpt").string()}).exit_code, 0);
  EXPECT_EQ(ask_unix_line(sock("x"), "PING"), "PONG");
  // Released with the first: the next dump may go.
  const auto again = test::run_cli({"dump", "--pid", pid, "--leave-running", "-o",
                                    (out_ / "x3.ckpt").string(), "--staging", staging_.string()});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  s.kill(SIGKILL);
  s.wait();
}

// A SIGKILL of gpuckpt dropped its locks at once, while its guard had yet to resume the
// processes: another gpuckpt could then take up a stopped service that the guard was about to
// resume under it. The guard holds the locks as well now, until it has resumed them.
TEST_F(E2eFaults, AKilledDumpsProcessesStayLockedUntilItsGuardHasResumedThem) {
  Child s = server("lk");
  const std::string pid = std::to_string(s.pid());
  Child g = paused_cli(
      {"dump", "--pid", pid, "-o", (out_ / "lk.ckpt").string(), "--staging", staging_.string()},
      "compress_write");
  // The guard held still, so that gpuckpt's death is all that has happened.
  const pid_t guard = guard_of(g);
  ASSERT_NE(guard, 0);
  ASSERT_EQ(::kill(guard, SIGSTOP), 0);
  struct Cont {
    pid_t pid;
    ~Cont() {
      if (pid > 0) ::kill(pid, SIGCONT);  // whatever fails below, the guard recovers
    }
  } cont{guard};
  ASSERT_TRUE(test::wait_until([&] { return test::process_state(guard) == 'T'; }));
  g.kill(SIGKILL);
  g.wait();

  const auto second = test::run_cli({"--json", "dump", "--pid", pid, "-o",
                                     (out_ / "lk2.ckpt").string(), "--staging", staging_.string()});
  EXPECT_EQ(second.exit_code, 10) << second.err;
  EXPECT_NE(second.out.find("being dumped or migrated by another gpuckpt"), std::string::npos)
      << second.out;
  EXPECT_FALSE(fs::exists(out_ / "lk2.ckpt"));

  ASSERT_EQ(::kill(guard, SIGCONT), 0);
  cont.pid = 0;  // its pid may name another process once it has ended
  EXPECT_TRUE(test::runs_again(s.pid())) << "the service was left frozen";
  ASSERT_TRUE(wait_ended(guard));
  // Its guard done, the next dump goes (it takes over the lock file that the kill left).
  const auto third = test::run_cli({"dump", "--pid", pid, "--leave-running", "-o",
                                    (out_ / "lk3.ckpt").string(), "--staging", staging_.string()});
  EXPECT_EQ(third.exit_code, 0) << third.err;
  EXPECT_EQ(ask_unix_line(sock("lk"), "PING"), "PONG");
  s.kill(SIGKILL);
  s.wait();
}

// The lock that keeps a second gpuckpt off was an flock on /proc/PID, which any local user may
// take: `nobody` holding it refused every dump of a root service. It is now a file in the run
// directory (root's alone), removed with the lock.
TEST_F(E2eFaults, AnotherUsersLockOnProcHoldsOffNoDumpAndTheLockFileGoesWithTheDump) {
  const fs::path run = dir_.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());  // inherited by every gpuckpt
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to hold the lock as nobody";
  Child s = server("n");
  const std::string pid = std::to_string(s.pid());
  const std::string proc = "/proc/" + pid;
  // One process (flock(1) would leave its command behind when killed), as `nobody`: only
  // syscalls after the fork.
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(1);
    const int fd = ::open(proc.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(2);
    for (;;) ::pause();
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{holder};
  ASSERT_TRUE(test::wait_until([&] {
    int status = 0;
    if (::waitpid(holder, &status, WNOHANG) == holder) {
      ADD_FAILURE() << "the holder ended early (status " << status << ")";
      reap.pid = 0;
      return true;
    }
    UniqueFd fd(::open(proc.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    return fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  })) << "nobody never held "
      << proc;
  ASSERT_NE(reap.pid, 0);

  Child g = test::paused_cli({"dump", "--pid", pid, "--leave-running", "-o",
                              (out_ / "n.ckpt").string(), "--staging", staging_.string()},
                             "criu_dump", dir_.path(), test::Resume::kWhenUnmarked);
  // Held by this dump alone, named by the pid namespace, the pid and its start tick (a later
  // process with this pid is another file).
  const auto ticks = process::start_ticks(s.pid());
  ASSERT_TRUE(ticks.has_value());
  EXPECT_EQ(entries(run, ".lock-"), std::vector<std::string>{lock_file(s.pid(), *ticks)});
  const auto second = test::run_cli({"dump", "--pid", pid, "-o", (out_ / "n2.ckpt").string()}, 120);
  EXPECT_EQ(second.exit_code, 10) << second.err;
  EXPECT_NE(second.err.find("being dumped or migrated by another gpuckpt"), std::string::npos)
      << second.err;
  test::resume_paused(dir_.path(), "criu_dump");
  const ExitStatus st = g.wait();
  EXPECT_TRUE(st.ok()) << st.describe() << "\n" << read_file(dir_.path() / "cli.err");
  EXPECT_EQ(ask_unix_line(sock("n"), "PING"), "PONG");
  EXPECT_TRUE(entries(run, ".lock-").empty()) << "the lock file outlived its dump";
  s.kill(SIGKILL);
  s.wait();
}

TEST_F(E2eFaults, SignalDuringAReleaseMigrationRestoresTheOriginalFromTheCheckpointAndSaysSo) {
  // A TCP listener: the original ends once the checkpoint is durable, so after a SIGKILL of
  // gpuckpt once the copy runs (before gpuckpt read its pid, and in the probe phase) the guard
  // must end the unconfirmed copy and bring the service back from the checkpoint. After a
  // SIGINT, gpuckpt itself tells the operator what its guard did.
  struct Case {
    const char* point;
    int sig;
  };
  for (const Case k : {Case{"criu_restored", SIGKILL}, Case{"first_answer", SIGKILL},
                       Case{"first_answer", SIGINT}}) {
    const std::string point = k.point;
    SCOPED_TRACE(point + " / " + strsignal(k.sig));
    const int port = test::free_tcp_port();
    SpawnOptions o;
    o.new_session = true;
    o.stdout_file = dir_.path() / "http.out";
    o.stderr_file = dir_.path() / "http.err";
    o.cwd = dir_.path();
    Child s =
        spawn({"python3", "-m", "http.server", std::to_string(port), "--bind", "127.0.0.1"}, o);
    auto up = [&] {
      try {
        return test::http_request(port, "GET", "/", {}, 2s).status == 200;
      } catch (const Error&) {
        return false;
      }
    };
    ASSERT_TRUE(test::wait_until(up));
    const pid_t pid = s.pid();
    // The original ends for the release handoff; like a supervisor, reap it at once.
    std::thread reaper([&] { s.wait(); });
    const fs::path cli_err = dir_.path() / "cli.err";
    fs::remove(cli_err);  // appended to: this round's guard message only
    Child g = paused_cli(
        {"migrate", "--pid", std::to_string(pid), "--to", (out_ / "t").string(), "--staging",
         staging_.string(), "--probe", "tcp:127.0.0.1:" + std::to_string(port)},
        point);
    g.kill(k.sig);
    g.wait();
    reaper.join();
    // This port's servers only: other tests run http.server too (ctest -j2).
    const auto servers = [&] {
      return process::live_pids_where([&](const process::ProcInfo& p) {
        const auto& a = p.cmdline;
        return std::find(a.begin(), a.end(), "http.server") != a.end() &&
               std::find(a.begin(), a.end(), std::to_string(port)) != a.end();
      });
    };
    // The copy may still answer until the guard ends it, and none does until the original is
    // restored: count only once the guard says it is done. (It inherits the fault hooks'
    // settings, and must not pause in its own restore.)
    if (k.sig == SIGKILL) {
      EXPECT_TRUE(test::wait_until(
          [&] {
            return read_file(cli_err).find("gpuckpt-guard: gpuckpt ended in the middle") !=
                   std::string::npos;
          },
          60s))
          << read_file(cli_err);
    } else {
      // gpuckpt waited for its guard's summary before it died of the signal; the guard's own
      // log lines go to stderr, never into that summary.
      const std::string err = read_file(cli_err);
      const auto at = err.find("gpuckpt: interrupted by INT: ");
      ASSERT_NE(at, std::string::npos) << err;
      const std::string said = err.substr(at, err.find('\n', at) - at);
      EXPECT_NE(said.find("the original was restored from " + (out_ / "t").string()),
                std::string::npos)
          << said;
    }
    EXPECT_TRUE(test::wait_until(up, 60s)) << "the service did not come back";
    const auto procs = servers();
    EXPECT_EQ(procs.size(), 1u) << "not exactly one server";
    for (pid_t p : procs) {
      ::kill(p, SIGKILL);
      process::wait_ended(p, 10s);
    }
    fs::remove_all(out_ / "t");
  }
}

// A benchmark's processes are its own business: an interrupt ends them and says so, whichever
// phase it lands in. `bench restore` between a run's restore and its stop:
TEST_F(E2eFaults, AnInterruptedBenchRestoreEndsItsCopyAndSaysSo) {
  Child s = server("b");
  const pid_t pid = s.pid();  // the copies' too
  const fs::path ckpt = out_ / "b.ckpt";
  auto d = test::run_cli({"dump", "--pid", std::to_string(pid), "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  ASSERT_TRUE(s.wait_for(10s).has_value());
  Child g = paused_cli({"bench", "restore", ckpt.string(), "--runs", "2", "--staging",
                        staging_.string(), "--probe", "unix:" + sock("b").string()},
                       "bench_stop");
  ASSERT_EQ(ask_unix_line(sock("b"), "PING"), "PONG") << "no copy to stop";
  g.kill(SIGINT);
  const ExitStatus st = g.wait();
  EXPECT_FALSE(st.exited);
  EXPECT_EQ(st.code, SIGINT);
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_NE(err.find("the restored copy (pid " + std::to_string(pid) + ") was ended"),
            std::string::npos)
      << err;
  EXPECT_FALSE(process::alive(pid));
}

// ...and `bench dump` while one of its dumps runs: the dump rolls back (its guard resumes the
// demo server), then the server is ended and the benchmark's scratch files removed.
TEST_F(E2eFaults, AnInterruptedBenchDumpEndsItsServerAndRemovesItsFiles) {
  const fs::path bench = dir_.path() / "bench";
  fs::create_directories(bench);
  Child g = paused_cli({"bench", "dump", "--dir", bench.string(), "--size", "64M", "--runs", "1",
                        "--staging", staging_.string()},
                       "criu_dump");
  const std::vector<pid_t> servers = serving((bench / "bench.sock").string());
  ASSERT_EQ(servers.size(), 1u) << "no demo server";
  ASSERT_TRUE(fs::exists(bench / "bench-weights.bin"));
  g.kill(SIGINT);
  const ExitStatus st = g.wait();
  EXPECT_FALSE(st.exited);
  EXPECT_EQ(st.code, SIGINT);
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_NE(err.find("its demo server " + std::to_string(servers[0]) + " was ended"),
            std::string::npos)
      << err;
  EXPECT_FALSE(process::alive(servers[0]));
  EXPECT_FALSE(fs::exists(bench / "bench-weights.bin"));
  EXPECT_FALSE(fs::exists(bench / "bench-stream.ckpt"));
  EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }));
}

TEST_F(E2eFaults, InterruptedRestoreLeavesNoStaging) {
  Child s = server("r");
  const fs::path ckpt = out_ / "r.ckpt";
  auto d = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  s.wait_for(10s);
  Child g = paused_cli({"restore", ckpt.string(), "--staging", staging_.string()}, "criu_restore");
  g.kill(SIGINT);
  g.wait();
  EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }))
      << entries(staging_).front();
  for (pid_t p : serving(sock("r").string())) {
    ::kill(p, SIGKILL);
    process::wait_ended(p, 10s);
  }
}

TEST_F(E2eFaults, AnInterruptedRestoreLeavesItsCopyServingAndSaysSo) {
  // A restore without a commit to wait for keeps what it restored, as after a timeout: the
  // copy is the service now. The operator must learn that it runs, and as which pid.
  for (const std::string point : {"criu_restored", "first_answer"}) {
    SCOPED_TRACE(point);
    const std::string name = "i" + point;
    Child s = server(name);
    const fs::path ckpt = out_ / (name + ".ckpt");
    auto d = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string()});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    ASSERT_TRUE(s.wait_for(10s).has_value());
    Child g = paused_cli({"restore", ckpt.string(), "--staging", staging_.string(), "--probe",
                          "unix:" + sock(name).string()},
                         point);
    g.kill(SIGINT);
    const ExitStatus st = g.wait();
    EXPECT_FALSE(st.exited);
    EXPECT_EQ(st.code, SIGINT);
    const std::vector<pid_t> copy = serving(sock(name).string());
    ASSERT_EQ(copy.size(), 1u) << "the restored copy did not stay";
    EXPECT_EQ(ask_unix_line(sock(name), "PING"), "PONG");
    const std::string err = read_file(dir_.path() / "cli.err");
    EXPECT_NE(err.find("the restored process " + std::to_string(copy[0]) + " is left running"),
              std::string::npos)
        << err;
    EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }))
        << entries(staging_).front();
    ::kill(copy[0], SIGKILL);
    process::wait_ended(copy[0], 10s);
  }
}

// A plain restore's copy is the service once criu has restored it: a guard that dies then
// stops the restore, and the operator learns that the copy runs, and as which pid (before, the
// error promised an undo that did not happen, and named no copy).
TEST_F(E2eFaults, ARestoreWhoseGuardDiesSaysItsCopyIsLeftRunning) {
  Child s = server("gd");
  const fs::path ckpt = out_ / "gd.ckpt";
  auto d = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  ASSERT_TRUE(s.wait_for(10s).has_value());
  Child g = test::paused_cli({"--json", "restore", ckpt.string(), "--staging", staging_.string(),
                              "--probe", "unix:" + sock("gd").string()},
                             "criu_restored", dir_.path(), test::Resume::kWhenUnmarked);
  ASSERT_TRUE(kill_guard_of(g));
  test::resume_paused(dir_.path(), "criu_restored");
  const ExitStatus st = g.wait();
  ASSERT_TRUE(st.exited) << st.describe();
  EXPECT_NE(st.code, 0);
  const std::vector<pid_t> copy = serving(sock("gd").string());
  ASSERT_EQ(copy.size(), 1u) << "the restored copy did not stay";
  const json j = json::parse(read_file(dir_.path() / "cli.out"), nullptr, false);
  ASSERT_TRUE(j.is_object());
  const std::string msg = j["error"].value("message", "");
  EXPECT_NE(msg.find("had died, so gpuckpt undid the operation itself"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the restored process " + std::to_string(copy[0]) + " is left running"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(entries(staging_).empty());
  ::kill(copy[0], SIGKILL);
  process::wait_ended(copy[0], 10s);
}

TEST_F(E2eFaults, ARestoreInANewPidNamespaceCutShortLeavesNoNamespaceBehind) {
  // Interrupted while criu restores in its own pid namespace, the copy is not known to be
  // whole (criu may still run, or fail): the namespace goes, and the summary says so.
  Child s = server("n");
  const fs::path ckpt = out_ / "n.ckpt";
  auto d = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  ASSERT_TRUE(s.wait_for(10s).has_value());
  Child g = paused_cli({"restore", ckpt.string(), "--staging", staging_.string(), "--new-pidns"},
                       "criu_restore");
  g.kill(SIGINT);
  g.wait();
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_NE(err.find("was interrupted before criu finished in its pid namespace"),
            std::string::npos)
      << err;
  // (The namespace's init has no name of its own to look for: the copy's end is its end.)
  EXPECT_TRUE(test::wait_until([&] { return serving(sock("n").string()).empty(); }))
      << "the copy in its namespace was left behind";
  EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }))
      << entries(staging_).front();
}

TEST_F(E2eFaults, AnUnconfirmedCopyDiesWithItsGpuckptEvenBeforeItsPidIsKnown) {
  // The target side of a migration between hosts restores with the checkpoint's pids and keeps
  // the copy only on "commit". Killed or interrupted after criu restored the copy but before
  // gpuckpt read its pid, it must not leave a second instance of a service the controller is
  // resuming elsewhere. "racing": interrupted while criu runs, gpuckpt goes on as the guard
  // recovers, and its unwinding must not take criu's pidfile away from the guard.
  struct Case {
    const char* point;
    int sig;
    bool racing;
  };
  for (const Case& k : {Case{"criu_restored", SIGINT, false}, Case{"criu_restored", SIGKILL, false},
                        Case{"criu_restore", SIGINT, true}}) {
    SCOPED_TRACE(std::string(k.point) + " / " + strsignal(k.sig) + (k.racing ? " / racing" : ""));
    const std::string name = "u" + std::to_string(k.sig) + (k.racing ? "r" : "");
    Child s = server(name);
    const fs::path ckpt = out_ / (name + ".ckpt");
    auto d = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string()});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    ASSERT_TRUE(s.wait_for(10s).has_value());
    Child g =
        paused_cli({"restore", ckpt.string(), "--staging", staging_.string(), "--await-commit"},
                   k.point, k.racing);
    if (!k.racing) {
      EXPECT_EQ(serving(sock(name).string()).size(), 1u)
          << "criu had not restored the copy at " << k.point;
    }
    g.kill(k.sig);
    g.wait();
    EXPECT_TRUE(test::wait_until([&] { return serving(sock(name).string()).empty(); }))
        << "the unconfirmed copy outlived its restore: " << read_file(dir_.path() / "cli.err");
    EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }))
        << entries(staging_).front();
    for (pid_t p : serving(sock(name).string())) {
      ::kill(p, SIGKILL);
      process::wait_ended(p, 10s);
    }
  }
}

TEST_F(E2eFaults, StagingLeftByAKilledGpuckptAndGuardIsSweptByTheNextRun) {
  // What a SIGKILL of both would leave: a staging directory that nobody holds.
  const fs::path stale = staging_ / "gpuckpt-dump-STALE1";
  fs::create_directories(stale / "images");
  std::ofstream(stale / kTempMarker).put('\n');  // as every temporary of gpuckpt's is marked
  test::write_test_file(stale / "images" / "pages-1.img", 1 << 20, 1);
  // One that a live process (this test) holds stays.
  const TempDir held(staging_, "gpuckpt-dump");
  const fs::path live = held.path();

  Child s = server("w");
  auto d = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o",
                          (out_ / "w.ckpt").string(), "--staging", staging_.string()});
  EXPECT_EQ(d.exit_code, 0) << d.err;
  EXPECT_FALSE(fs::exists(stale)) << "the stale staging was not swept";
  EXPECT_TRUE(fs::exists(live)) << "a live operation's staging was swept";
  s.wait_for(10s);
}

// gpuckpt and its guard killed together (a cgroup's SIGKILL, the OOM killer) once the copy
// answers: the original is stopped, its socket entry is moved aside, and an unconfirmed copy
// serves the path. Before the journal nothing ever undid that. Now `gpuckpt recover`, or the
// next dump, restore or migrate on the host, does what the guard would have; and a guard that
// outlives its gpuckpt still does it alone, and leaves no journal behind.
TEST_F(E2eFaults, AMigrationKilledWithItsGuardIsUndoneByTheNextRun) {
  const fs::path run = dir_.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());  // inherited by every gpuckpt
  for (const std::string how : {"guard alone", "recover", "next dump"}) {
    SCOPED_TRACE(how);
    const std::string name = how == "guard alone" ? "ja" : how == "recover" ? "jr" : "jd";
    Child s = server(name);
    ask_unix_line(sock(name), "GEN j");
    const std::string state = ask_unix_line(sock(name), "STATE");
    Child g =
        paused_cli({"migrate", "--pid", std::to_string(s.pid()), "--to", (out_ / name).string(),
                    "--staging", staging_.string(), "--probe", "unix:" + sock(name).string()},
                   "first_answer");
    ASSERT_EQ(entries(run, ".migrate-").size(), 1u) << "no journal while the migration runs";
    if (how != "guard alone") {
      const pid_t killed = g.pid();
      ASSERT_TRUE(kill_guard_of(g));
      g.kill(SIGKILL);
      g.wait();
      // What the kill leaves, which nothing undid before: the original stopped beside the copy.
      EXPECT_EQ(test::process_state(s.pid()), 'T');
      EXPECT_EQ(serving(sock(name).string()).size(), 2u);
      EXPECT_EQ(entries(dir_.path(), "." + name + ".sock.gpuckpt-rollback").size(), 1u);
      EXPECT_EQ(entries(run, ".migrate-").size(), 1u);
      // And the lock of the killed gpuckpt's file, which nobody holds now.
      EXPECT_EQ(entries(run, ".lock-").size(), 1u);
      if (how == "recover") {
        const auto r = test::run_cli({"--json", "recover"});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const json j = json::parse(r.out);
        ASSERT_EQ(j["recovered"].size(), 1u) << r.out;
        EXPECT_EQ(j["recovered"][0]["operation"], "migrate");
        EXPECT_EQ(j["recovered"][0]["gpuckpt_pid"], killed);
        const std::string summary = j["recovered"][0]["summary"];
        EXPECT_NE(summary.find("was killed"), std::string::npos) << summary;
        EXPECT_NE(summary.find("process " + std::to_string(s.pid()) + " was resumed"),
                  std::string::npos)
            << summary;
      } else {
        Child other = server("jo");
        const auto d = test::run_cli(
            {"dump", "--pid", std::to_string(other.pid()), "-o", (out_ / "jo.ckpt").string()});
        EXPECT_EQ(d.exit_code, 0) << d.err;
        EXPECT_NE(d.err.find("was killed together with its guard"), std::string::npos) << d.err;
        other.wait_for(10s);
      }
    } else {
      g.kill(SIGKILL);
      g.wait();
    }
    EXPECT_TRUE(test::runs_again(s.pid())) << "the original was left frozen";
    EXPECT_TRUE(test::wait_until([&] {
      return serving(sock(name).string()) == std::vector<pid_t>{s.pid()};
    })) << "the unconfirmed copy survived";
    EXPECT_EQ(ask_unix_line(sock(name), "STATE"), state) << "the path was not given back";
    EXPECT_TRUE(entries(dir_.path(), "." + name + ".sock.gpuckpt-rollback").empty());
    EXPECT_TRUE(test::wait_until([&] { return entries(run, ".migrate-").empty(); }))
        << "a journal was left";
    EXPECT_TRUE(test::wait_until([&] { return entries(staging_).empty(); }));
    // The killed gpuckpt's lock file keeps no later dump off the original: the next takes it
    // over, and removes it with its own lock.
    const auto again = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "--leave-running",
                                      "-o", (out_ / (name + "-again.ckpt")).string()});
    EXPECT_EQ(again.exit_code, 0) << again.err;
    EXPECT_TRUE(entries(run, ".lock-").empty());
    for (pid_t p : serving(sock(name).string())) {
      if (p == s.pid()) continue;
      ::kill(p, SIGKILL);
      process::wait_ended(p, 10s);
    }
    s.kill(SIGKILL);
    s.wait();
  }
  const auto r = test::run_cli({"recover"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("nothing to recover"), std::string::npos) << r.out;
}

// A lock file whose gpuckpt was SIGKILLed and whose process has ended since is swept by the
// next run; one of a live process, or of another pid namespace's, is left (its next lock takes
// it over; the other namespace's pids are not ours to judge).
TEST_F(E2eFaults, TheNextRunSweepsOnlyTheLockFilesOfProcessesThatHaveEnded) {
  const fs::path run = dir_.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());  // inherited by every gpuckpt
  Child live = spawn({"sleep", "600"});
  Child gone = spawn({"sleep", "600"});
  const pid_t gone_pid = gone.pid();  // Child forgets it once waited for
  const auto live_ticks = process::start_ticks(live.pid());
  const auto gone_ticks = process::start_ticks(gone_pid);
  ASSERT_TRUE(live_ticks && gone_ticks);
  gone.kill(SIGKILL);
  gone.wait();
  const std::uint64_t pidns = this_pidns();
  ASSERT_NE(pidns, 0u);
  fs::create_directories(run);
  fs::permissions(run, fs::perms::owner_all);
  const std::string of_live = lock_file(live.pid(), *live_ticks);
  const std::string of_gone = lock_file(gone_pid, *gone_ticks);
  const std::string of_other_ns = lock_file(gone_pid, *gone_ticks, pidns + 1);
  for (const auto& n : {of_live, of_gone, of_other_ns}) std::ofstream(run / n).put('\n');
  const auto r = test::run_cli({"recover"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(run / of_live));
  EXPECT_FALSE(fs::exists(run / of_gone));
  EXPECT_TRUE(fs::exists(run / of_other_ns));
  live.kill(SIGKILL);
  live.wait();
}

TEST_F(E2eFaults, RolledBackMigrationLeavesTheSocketPathBoundToTheOriginal) {
  Child s = server("rb");
  ask_unix_line(sock("rb"), "GEN r");
  const std::string state = ask_unix_line(sock("rb"), "STATE");
  auto m = test::run_cli(
      {"migrate", "--pid", std::to_string(s.pid()), "--to", (out_ / "t").string(), "--probe",
       "unix:" + (dir_.path() / "nobody.sock").string(), "--probe-timeout", "2"});
  EXPECT_EQ(m.exit_code, 11) << m.err;
  EXPECT_EQ(ask_unix_line(sock("rb"), "STATE"), state);
  // Not a path left pointing at a deleted socket: the next dump and restore reach it again.
  auto d =
      test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", (out_ / "rb.ckpt").string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  s.wait_for(10s);
  auto r = test::run_cli({"restore", (out_ / "rb.ckpt").string(), "--probe",
                          "unix:" + sock("rb").string(), "--request", "STATE"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ask_unix_line(sock("rb"), "STATE"), state);
  for (pid_t p : serving(sock("rb").string())) {
    ::kill(p, SIGKILL);
    process::wait_ended(p, 10s);
  }
}

// The target side of a migration between hosts, where an instance already serves the
// checkpoint's socket path: the copy takes the path, and the instance gets it back unless the
// copy is committed (before, the rollback left the path bound to the dead copy's socket).
TEST_F(E2eFaults, AnUncommittedCopyGivesTheSocketPathBackToTheInstanceServingIt) {
  for (const bool commit : {false, true}) {
    SCOPED_TRACE(commit ? "committed" : "not committed");
    const std::string name = commit ? "kc" : "kn";
    Child s = server(name);
    ask_unix_line(sock(name), "GEN k");
    const std::string at_snapshot = ask_unix_line(sock(name), "STATE");
    const fs::path ckpt = out_ / (name + ".ckpt");
    auto d = test::run_cli(
        {"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string(), "--leave-running"});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    ask_unix_line(sock(name), "GEN later");
    const std::string later = ask_unix_line(sock(name), "STATE");
    ASSERT_NE(later, at_snapshot);

    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    UniqueFd in(p[0]);
    {
      const UniqueFd out(p[1]);
      const std::string line = commit ? "commit\n" : "abort\n";
      ASSERT_EQ(::write(out.get(), line.data(), line.size()), static_cast<ssize_t>(line.size()));
    }
    SpawnOptions o;
    o.stdin_fd = in.get();
    const RunResult r =
        run_capture({test::gpuckpt_binary().string(), "restore", ckpt.string(), "--staging",
                     staging_.string(), "--await-commit", "--new-pidns", "--take-endpoints",
                     "--probe", "unix:" + sock(name).string(), "--request", "STATE"},
                    120s, o);
    // The copy answered on the path with the snapshot's state, and said so.
    ASSERT_NE(r.output.find('{'), std::string::npos) << "no result";
    const json res = json::parse(r.output.substr(r.output.find('{')));
    EXPECT_EQ(res["first_answer"], at_snapshot) << r.output;
    EXPECT_TRUE(test::wait_until([&] { return entries(dir_.path(), "." + name).empty(); }))
        << "an entry moved aside was left behind: " << entries(dir_.path(), "." + name).front();
    if (commit) {
      EXPECT_TRUE(r.status.ok()) << r.output;
      EXPECT_EQ(ask_unix_line(sock(name), "STATE"), at_snapshot);
      EXPECT_EQ(ask_unix_line(sock(name), "QUIT"), "BYE");
      process::wait_ended(res["pid"].get<pid_t>(), 10s);
    } else {
      EXPECT_FALSE(r.status.ok()) << r.output;
      EXPECT_TRUE(test::wait_until([&] {
        return serving(sock(name).string()) == std::vector<pid_t>{s.pid()};
      })) << "the uncommitted copy outlived its restore";
      EXPECT_EQ(ask_unix_line(sock(name), "STATE"), later) << "the path was not given back";
    }
    s.kill(SIGKILL);
    s.wait();
  }
}

// The name an entry is moved aside to is taken already (a directory here, as a run killed
// with its guard could leave at gpuckpt's pid): the entry goes to another name and still comes
// back (before, the move was skipped with a warning, and the rollback left the path dead).
TEST_F(E2eFaults, AnEntryInTheWayOfTheRollbackNameDoesNotCostTheServiceItsPath) {
  for (const bool migrate : {true, false}) {
    SCOPED_TRACE(migrate ? "migrate" : "restore --await-commit");
    const std::string name = migrate ? "wm" : "wr";
    Child s = server(name);
    ask_unix_line(sock(name), "GEN w");
    const std::string state = ask_unix_line(sock(name), "STATE");
    std::vector<std::string> args;
    if (migrate) {
      args = {"migrate",
              "--pid",
              std::to_string(s.pid()),
              "--to",
              (out_ / "t").string(),
              "--force",
              "--probe",
              "unix:" + (dir_.path() / "nobody.sock").string(),
              "--probe-timeout",
              "1"};
    } else {
      const fs::path ckpt = out_ / (name + ".ckpt");
      auto d = test::run_cli(
          {"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string(), "--leave-running"});
      ASSERT_EQ(d.exit_code, 0) << d.err;
      args = {"restore",
              ckpt.string(),
              "--await-commit",
              "--new-pidns",
              "--take-endpoints",
              "--probe",
              "unix:" + sock(name).string()};  // stdin /dev/null: no commit
    }
    // gpuckpt runs as the shell's pid, which names the entry it moves aside.
    const std::string in_the_way =
        (dir_.path() / ("." + name + ".sock.gpuckpt-rollback-")).string();
    std::vector<std::string> argv{"sh", "-c", "mkdir \"$0$$\" && exec \"$@\"", in_the_way,
                                  test::gpuckpt_binary().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    const RunResult r = run_capture(argv, 120s);
    EXPECT_FALSE(r.status.ok()) << r.output;
    EXPECT_TRUE(test::wait_until([&] {
      return serving(sock(name).string()) == std::vector<pid_t>{s.pid()};
    })) << "the copy outlived the rollback";
    EXPECT_EQ(ask_unix_line(sock(name), "STATE"), state) << "the path was not given back";
    // What was in the way is as it was; nothing else is left.
    const auto left = entries(dir_.path(), "." + name);
    ASSERT_EQ(left.size(), 1u) << left.back();
    EXPECT_TRUE(fs::is_directory(dir_.path() / left.front()));
    s.kill(SIGKILL);
    s.wait();
  }
}

TEST_F(E2eFaults, ProcessInItsOwnPidNamespaceIsRefusedBeforeItIsFrozen) {
  Child s = server("ns");
  auto m = test::run_cli({"--json", "migrate", "--pid", std::to_string(s.pid()), "--to",
                          (out_ / "t").string(), "--probe", "unix:" + sock("ns").string()});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  const json mj = json::parse(m.out);
  EXPECT_EQ(mj["handoff"], "frozen");
  const pid_t moved = mj["pid"].get<pid_t>();
  s.wait_for(10s);
  auto d =
      test::run_cli({"dump", "--pid", std::to_string(moved), "-o", (out_ / "ns.ckpt").string()});
  EXPECT_EQ(d.exit_code, 10) << d.err;
  EXPECT_NE(d.err.find("lives in a pid namespace that gpuckpt made"), std::string::npos) << d.err;
  EXPECT_NE(test::process_state(moved), 'T');
  EXPECT_EQ(ask_unix_line(sock("ns"), "PING"), "PONG");
  // With the release handoff the copy lives in our pid namespace and can be moved again.
  auto m2 = test::run_cli({"--json", "migrate", "--pid", std::to_string(moved), "--to",
                           (out_ / "t2").string(), "--handoff", "release"});
  EXPECT_EQ(m2.exit_code, 10) << "the namespaced copy itself cannot be dumped: " << m2.err;
  for (pid_t p : serving(sock("ns").string())) {
    ::kill(p, SIGKILL);
    process::wait_ended(p, 10s);
  }
}

// What the guard would have to name, or what would fail only once the tree is frozen, is
// refused before: an output or staging path that is not UTF-8, and an output that is a
// symbolic link (even to a checkpoint, with --force).
TEST_F(E2eFaults, OutputsThatWouldFailAfterTheFreezeAreRefusedBeforeIt) {
  Child s = server("u");
  const std::string pid = std::to_string(s.pid());
  ASSERT_EQ(test::run_cli({"dump", "--pid", pid, "--leave-running", "-o",
                           (out_ / "real.ckpt").string(), "--staging", staging_.string()})
                .exit_code,
            0);
  fs::create_symlink(out_ / "real.ckpt", out_ / "link.ckpt");
  const fs::path bad_staging = dir_.path() / "st\xff";
  fs::create_directories(bad_staging);
  struct Case {
    std::vector<std::string> args;
    int code;
    const char* says;
  };
  for (const Case& k :
       {Case{{"-o", (out_ / "u\xff.ckpt").string(), "--staging", staging_.string()},
             2,
             "is not UTF-8"},
        Case{{"-o", (out_ / "u.ckpt").string(), "--staging", bad_staging.string()},
             2,
             "is not UTF-8"},
        Case{{"-o", (out_ / "link.ckpt").string(), "--force", "--staging", staging_.string()},
             12,
             "is a symbolic link"}}) {
    SCOPED_TRACE(k.says);
    std::vector<std::string> args{"--json", "dump", "--pid", pid};
    args.insert(args.end(), k.args.begin(), k.args.end());
    const auto r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, k.code) << r.err;
    const json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    const std::string msg = j["error"].value("message", "");
    EXPECT_NE(msg.find(k.says), std::string::npos) << msg;
    EXPECT_NE(msg.find("nothing was frozen"), std::string::npos) << msg;
    EXPECT_NE(test::process_state(s.pid()), 'T');
  }
  EXPECT_EQ(test::run_cli({"verify", (out_ / "link.ckpt").string()}).exit_code, 0);
  EXPECT_EQ(ask_unix_line(sock("u"), "PING"), "PONG");
  s.kill(SIGKILL);
  s.wait();
}

TEST_F(E2eFaults, ForceOntoSomethingThatIsNotACheckpointIsRefusedBeforeFreezing) {
  Child s = server("f");
  const fs::path precious = out_ / "precious";
  fs::create_directories(precious);
  std::ofstream(precious / "data.txt") << "not a checkpoint\n";
  auto d =
      test::run_cli({"dump", "--pid", std::to_string(s.pid()), "-o", precious.string(), "--force"});
  EXPECT_EQ(d.exit_code, 12) << d.err;  // exists
  EXPECT_NE(d.err.find("not a gpuckpt checkpoint"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("nothing was frozen"), std::string::npos) << d.err;
  EXPECT_TRUE(fs::exists(precious / "data.txt"));
  EXPECT_EQ(ask_unix_line(sock("f"), "PING"), "PONG");
  s.kill(SIGKILL);
  s.wait();
}

// Twenty dump/restore cycles of one service leave nothing behind: no staging, no fd or mapping
// that grows in the service, and the service's state carries through. (Each gpuckpt waits for its
// guard to exit before it does.)
TEST_F(E2eFaults, TwentyDumpRestoreCyclesLeakNothing) {
  Child s = server("c");
  ask_unix_line(sock("c"), "GEN cycle");
  const std::string state = ask_unix_line(sock("c"), "STATE");
  const pid_t pid = s.pid();
  auto count = [](const fs::path& p) {
    std::size_t n = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(p, ec); !ec && it != fs::directory_iterator(); ++it) ++n;
    return n;
  };
  auto lines = [](const fs::path& p) {
    const std::string s = read_file(p);  // an ifstream's iterator throws what ESRCH gives
    return std::count(s.begin(), s.end(), '\n');
  };
  const fs::path proc = "/proc/" + std::to_string(pid);
  // Idle: the server holds its listener and no client connection (the probe's, or the last
  // request's, closes a moment after its answer).
  auto idle = [&] {
    return test::wait_until([&] {
      int sockets = 0;
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(proc / "fd", ec)) {
        std::error_code ec2;
        sockets += fs::read_symlink(e.path(), ec2).string().rfind("socket:", 0) == 0;
      }
      return sockets == 1;
    });
  };
  // The baseline is taken after the first cycle, once the service is as CRIU restores it (the
  // original may still hold the fd of a client that has just hung up).
  std::size_t fds = 0;
  long maps = 0;
  bool reaped = false;
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE("cycle " + std::to_string(i));
    const fs::path ckpt = out_ / "c.ckpt";
    auto d = test::run_cli({"dump", "--pid", std::to_string(pid), "-o", ckpt.string(), "--force",
                            "--staging", staging_.string(), "--no-criu-check"});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    if (!reaped) {
      s.wait_for(10s);  // the first original is our child; restored ones are init's
      reaped = true;
    }
    auto r = test::run_cli({"restore", ckpt.string(), "--staging", staging_.string(),
                            "--no-criu-check", "--probe", "unix:" + sock("c").string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(entries(staging_).empty()) << entries(staging_).front();
    if (i == 0) {
      ASSERT_TRUE(idle());
      fds = count(proc / "fd");
      maps = lines(proc / "maps");
    }
  }
  EXPECT_EQ(ask_unix_line(sock("c"), "STATE"), state);
  ASSERT_TRUE(idle());
  EXPECT_EQ(count(proc / "fd"), fds) << "the service gained file descriptors";
  EXPECT_EQ(lines(proc / "maps"), maps) << "the service gained mappings";
  ::kill(pid, SIGKILL);
  process::wait_ended(pid, 10s);
}

// ---- Issue 40: the hostile pass's cases, each failing before its fix ----

// A criu option that picks the tree, where the images go, or how the tasks end contradicted the
// record: `-t B` checkpointed B under A's name and killed A; --leave-running let the service
// serve on after the freeze and then killed it. Only the allow-list passes, before any freeze.
TEST_F(E2eFaults, CriuOptionsThatContradictGpuckptAreRefusedBeforeAnythingIsFrozen) {
  Child s = server("co");
  Child other = server("cb");
  const std::string pid = std::to_string(s.pid());
  const fs::path ckpt = out_ / "co.ckpt";
  for (const std::vector<std::string>& opts : std::vector<std::vector<std::string>>{
           {"--criu-opt=-t", "--criu-opt=" + std::to_string(other.pid())},
           {"--criu-opt=--tree=" + std::to_string(other.pid())},
           {"--criu-opt=--leave-running"},
           {"--criu-opt=--leave-stopped"},
           {"--criu-opt=-D", "--criu-opt=/tmp"},
           {"--criu-opt=--images-dir=/tmp"},
           {"--criu-opt=--stream"},
           {"--criu-opt=--pidfile=/tmp/p"},
           {"--criu-opt=--tcp-established"},
           {"--criu-opt=--prev-images-dir=/tmp"},
           {"--criu-opt=--file-locks=yes"},
           {"--criu-opt=--ghost-limit"}}) {
    SCOPED_TRACE(opts.front());
    std::vector<std::string> args{"--json", "dump", "--pid", pid, "-o", ckpt.string()};
    args.insert(args.end(), opts.begin(), opts.end());
    const auto r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    const json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_NE(j["error"].value("message", "").find("--criu-opt"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(ckpt));
    EXPECT_EQ(ask_unix_line(sock("co"), "PING"), "PONG");
    EXPECT_EQ(ask_unix_line(sock("cb"), "PING"), "PONG");
  }
  const auto restore = test::run_cli({"restore", ckpt.string(), "--criu-opt=--skip-in-flight"});
  EXPECT_EQ(restore.exit_code, 2) << "a dump-only option is refused on restore: " << restore.err;
  // An allowed one goes through, its value as the next --criu-opt.
  const auto ok =
      test::run_cli({"dump", "--pid", pid, "-o", ckpt.string(), "--staging", staging_.string(),
                     "--criu-opt=--ghost-limit", "--criu-opt=64M", "--criu-opt=--file-locks"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(s.wait_for(30s).has_value());
  EXPECT_EQ(ask_unix_line(sock("cb"), "PING"), "PONG");
  ::kill(-other.pid(), SIGKILL);  // with its sleep
  other.wait();
}

// A migration passes its --criu-opt to both criu dump and criu restore. An option that only the
// dump takes was checked for the restore after the freeze (in a release, after the original had
// ended), so a typo cost the service a kill and a rollback.
TEST_F(E2eFaults, AMigrationChecksTheRestoresCriuOptionsBeforeFreezing) {
  Child s = server("mo");
  const auto started = process::start_ticks(s.pid());
  const fs::path to = out_ / "mo-to";
  const auto r = test::run_cli({"--json", "migrate", "--pid", std::to_string(s.pid()), "--to",
                                to.string(), "--handoff", "release", "--staging", staging_.string(),
                                "--criu-opt=--skip-in-flight"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  const std::string msg = j["error"].value("message", "");
  EXPECT_NE(msg.find("criu restore"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nothing was frozen"), std::string::npos) << msg;
  // The same process, never ended and restored by a rollback; and no checkpoint written.
  EXPECT_EQ(process::start_ticks(s.pid()), started);
  EXPECT_TRUE(!fs::exists(to) || fs::is_empty(to));
  EXPECT_EQ(ask_unix_line(sock("mo"), "PING"), "PONG");
}

// A restore beside a live original that takes its endpoints, from a checkpoint damaged late in
// its pages: criu had unlinked the original's socket path before it met the bad chunk, and the
// failed restore left the original serving a name nobody could reach.
TEST_F(E2eFaults, AFailedRestoreThatTookEndpointsGivesThemBackToTheOriginal) {
  Child s = server("te");
  ask_unix_line(sock("te"), "GEN t");
  const std::string state = ask_unix_line(sock("te"), "STATE");
  const fs::path ckpt = out_ / "te.ckpt";
  ASSERT_EQ(test::run_cli({"dump", "--pid", std::to_string(s.pid()), "--leave-running", "-o",
                           ckpt.string(), "--staging", staging_.string(), "--compress", "always"})
                .exit_code,
            0);
  // The pages' last chunk damaged, the blob's size unchanged: found only as criu reads it.
  ASSERT_TRUE(test::damage_last_pages_chunk(ckpt)) << "no pages in the checkpoint";
  const auto r = test::run_cli({"restore", ckpt.string(), "--new-pidns", "--take-endpoints",
                                "--staging", staging_.string(), "--staging-mode", "stream",
                                "--probe", "unix:" + sock("te").string()});
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("given back"), std::string::npos) << r.err;
  // The original answers on its own path, with its state, and is the only one that serves.
  EXPECT_EQ(ask_unix_line(sock("te"), "STATE"), state);
  EXPECT_TRUE(test::wait_until(
      [&] { return serving(sock("te").string()) == std::vector<pid_t>{s.pid()}; }));
  EXPECT_TRUE(entries(dir_.path(), ".te.sock.gpuckpt-rollback").empty());
  s.kill(SIGKILL);
  s.wait();
}

// A migration on this host removes its checkpoint once the copy serves. Killed in the middle of
// that, it left a manifest and a seal without their blob: a checkpoint that looked whole. An
// interrupt there said "interrupted: nothing was in flight" (exit 130) although the copy served.
TEST_F(E2eFaults, AMigrationStoppedWhileRemovingItsCheckpointLeavesNoneThatLooksWhole) {
  for (const int sig : {SIGKILL, SIGINT}) {
    SCOPED_TRACE(strsignal(sig));
    const std::string name = sig == SIGKILL ? "rk" : "ri";
    Child s = server(name);
    const std::string state = ask_unix_line(sock(name), "STATE");
    const fs::path to = out_ / name;
    Child g = test::paused_cli(
        {"--json", "migrate", "--pid", std::to_string(s.pid()), "--to", to.string(), "--staging",
         staging_.string(), "--probe", "unix:" + sock(name).string()},
        "unpublished", dir_.path(),
        sig == SIGINT ? test::Resume::kWhenUnmarked : test::Resume::kNever);
    g.kill(sig);
    if (sig == SIGINT) {
      // Past the handover the interrupt waits for the migration, which reports its copy.
      ASSERT_TRUE(test::wait_until([&] {
        return read_file(dir_.path() / "cli.err").find("committed") != std::string::npos;
      }));
      test::resume_paused(dir_.path(), "unpublished");
    }
    const ExitStatus st = g.wait();
    if (sig == SIGINT) {
      EXPECT_TRUE(st.ok()) << st.describe() << read_file(dir_.path() / "cli.err");
      const json j = json::parse(read_file(dir_.path() / "cli.out"), nullptr, false);
      ASSERT_TRUE(j.is_object()) << read_file(dir_.path() / "cli.out");
      EXPECT_EQ(j.value("ok", false), true) << j.dump();
      EXPECT_GT(j.value("pid", 0), 0) << j.dump();
    }
    EXPECT_TRUE(s.wait_for(30s).has_value()) << "the original still runs";
    EXPECT_EQ(ask_unix_line(sock(name), "STATE"), state) << "the copy does not serve";
    // Nothing under its published name: whatever is left is a hidden temporary.
    for (const auto& e : fs::directory_iterator(to))
      EXPECT_EQ(e.path().filename().string().front(), '.') << e.path();
    EXPECT_EQ(
        test::run_cli(
            {"verify", (to / ("gpuckpt-demo-se-" + std::to_string(s.pid()) + ".ckpt")).string()})
            .exit_code,
        3);
    EXPECT_EQ(ask_unix_line(sock(name), "QUIT"), "BYE");
    for (pid_t p : serving(sock(name).string())) process::wait_ended(p, 10s);
  }
}

// gpuckpt, its guard and criu killed together while criu dumps (a cgroup's SIGKILL): the tree
// runs again (the kernel resumed criu's tasks), and `gpuckpt recover` said "nothing was undone"
// while it left the dump's staging (tmpfs, up to the process's size) and its unpublished output.
TEST_F(E2eFaults, RecoverAfterAKillOfGpuckptGuardAndCriuLeavesNoStaging) {
  const fs::path run = dir_.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());
  Child s = server("cg");
  const std::string state = ask_unix_line(sock("cg"), "STATE");
  Child g = paused_cli({"dump", "--pid", std::to_string(s.pid()), "-o", (out_ / "cg.ckpt").string(),
                        "--staging", staging_.string()},
                       "criu_dump");
  const auto criu = criu_of(g);
  ASSERT_TRUE(kill_guard_of(g));
  for (pid_t c : criu) ::kill(c, SIGKILL);
  g.kill(SIGKILL);
  g.wait();
  ASSERT_FALSE(entries(staging_).empty()) << "nothing staged to leave behind";
  const auto r = test::run_cli({"--json", "recover"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(entries(staging_).empty()) << "staging left: " << entries(staging_).front();
  EXPECT_TRUE(entries(out_).empty()) << "output left: " << entries(out_).front();
  EXPECT_TRUE(test::runs_again(s.pid()));
  EXPECT_EQ(ask_unix_line(sock("cg"), "STATE"), state);
  s.kill(SIGKILL);
  s.wait();
}

// The sweep took any directory named like a temporary: a published checkpoint at
// `.NAME.tmp-<16 hex>`, and verified checkpoints called gpuckpt-dump-node17 or
// gpuckpt-restore-before in the staging directory. Only a marked, unpublished temporary goes.
TEST_F(E2eFaults, CheckpointsNamedLikeTemporariesAreNeverSwept) {
  Child s = server("sw");
  const std::string pid = std::to_string(s.pid());
  const fs::path hidden = out_ / ".hidden.tmp-0123456789abcdef";
  ASSERT_EQ(test::run_cli({"dump", "--pid", pid, "--leave-running", "-o", hidden.string(),
                           "--staging", staging_.string()})
                .exit_code,
            0);
  const fs::path src = dir_.path() / "src";
  fs::create_directories(src);
  test::write_test_file(src / "f", 1 << 20, 7);
  std::vector<fs::path> named;
  for (const char* n :
       {"gpuckpt-dump-node17", "gpuckpt-restore-before", "gpuckpt-dump-spool-Qq1Ww2"}) {
    named.push_back(staging_ / n);
    ASSERT_EQ(test::run_cli({"pack", src.string(), "-o", named.back().string()}).exit_code, 0);
  }
  // A killed run's temporary, marked as gpuckpt marks them, still goes.
  const fs::path stale = staging_ / "gpuckpt-dump-Zz9Yy8";
  fs::create_directories(stale);
  std::ofstream(stale / kTempMarker).put('\n');
  const auto d = test::run_cli(
      {"dump", "--pid", pid, "-o", (out_ / "hidden").string(), "--staging", staging_.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(test::run_cli({"verify", hidden.string()}).exit_code, 0) << "a published one went";
  EXPECT_FALSE(fs::exists(hidden / kTempMarker)) << "published with its temporary's marker";
  for (const auto& n : named) EXPECT_EQ(test::run_cli({"verify", n.string()}).exit_code, 0) << n;
  EXPECT_FALSE(fs::exists(stale));
  s.wait_for(10s);
}

// The OOM killer takes the largest process, criu restore, once it has forked the tree: gpuckpt
// said "criu restore failed", and the half-restored tree stayed, named as the service, holding
// its socket, blocked for good, with pid N taken so that the next restore failed too.
TEST_F(E2eFaults, AKilledCriuRestoreLeavesNoHalfRestoredTreeBehind) {
  Child s = server("hr");
  ask_unix_line(sock("hr"), "GEN h");
  const std::string state = ask_unix_line(sock("hr"), "STATE");
  const pid_t pid = s.pid();
  const fs::path ckpt = dumped(s, "hr");
  ASSERT_FALSE(ckpt.empty());
  Child g = test::paused_cli({"restore", ckpt.string(), "--staging", staging_.string(),
                              "--staging-mode", "stream", "--probe", "unix:" + sock("hr").string()},
                             "restore_pages", dir_.path(), test::Resume::kWhenUnmarked);
  const auto criu = criu_of(g);
  ASSERT_EQ(criu.size(), 1u);
  ASSERT_TRUE(test::wait_until([&] { return process::read_proc(pid).has_value(); }))
      << "criu never forked the tree";
  ::kill(criu.front(), SIGKILL);
  test::resume_paused(dir_.path(), "restore_pages");
  const ExitStatus st = g.wait();
  EXPECT_TRUE(st.exited && st.code == 9) << st.describe();
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_NE(err.find("half-restored"), std::string::npos) << err;
  EXPECT_TRUE(test::wait_until([&] {
    const auto p = process::read_proc(pid);
    return !p || p->state == 'Z';
  })) << "the half-restored tree stays";
  EXPECT_TRUE(entries(staging_).empty());
  // Nothing in the way of the next restore.
  const auto r = test::run_cli({"restore", ckpt.string(), "--staging", staging_.string(), "--probe",
                                "unix:" + sock("hr").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ask_unix_line(sock("hr"), "STATE"), state);
  EXPECT_EQ(ask_unix_line(sock("hr"), "QUIT"), "BYE");
  process::wait_ended(pid, 10s);
}

// A tree that holds a deleted file is restored with a ghost file, which criu makes before it
// forks the tree and removes when it is done. Killed in between, criu left it in place, and the
// next restore failed on it ("Can't create ghost regfile: File exists").
TEST_F(E2eFaults, AKilledCriuRestoreLeavesNoGhostFileBehind) {
  const std::string name = "gpuckpt-ghost-" + std::to_string(::getpid());
  const fs::path held = fs::path("/dev/shm") / name;
  SpawnOptions o;
  o.new_session = true;
  o.stdout_file = dir_.path() / "gh.out";
  o.stderr_file = dir_.path() / "gh.err";
  Child s = spawn(
      {"/bin/sh", "-c",
       "exec 3>" + held.string() + "; echo kept >&3; rm " + held.string() + "; exec sleep 1000"},
      o);
  ASSERT_TRUE(test::wait_until([&] {
    const auto p = process::read_proc(s.pid());
    return p && p->comm == "sleep" && !fs::exists(held);
  }));
  const pid_t pid = s.pid();
  const fs::path ckpt = dumped(s, "gh");
  ASSERT_FALSE(ckpt.empty());
  const auto ghosts = [&] {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator("/dev/shm"))
      if (e.path().filename().string().starts_with(name + ".cr.")) found.push_back(e.path());
    return found;
  };
  Child g = test::paused_cli(
      {"restore", ckpt.string(), "--staging", staging_.string(), "--staging-mode", "stream"},
      "restore_pages", dir_.path(), test::Resume::kWhenUnmarked);
  const auto criu = criu_of(g);
  ASSERT_EQ(criu.size(), 1u);
  ASSERT_FALSE(ghosts().empty()) << "criu made no ghost file before it asked for pages";
  // Another restore's criu that has only just started (it has not opened its log): it has
  // made no ghost file, and holds none of these.
  SpawnOptions fo;
  fo.new_session = true;
  Child other = spawn({"/bin/bash", "-c",
                       "exec -a /usr/sbin/criu /bin/bash -c 'sleep 1000 & wait' restore -o " +
                           (dir_.path() / "not-yet.log").string()},
                      fo);
  ASSERT_TRUE(test::wait_until([&] {
    const auto p = process::read_proc(other.pid());
    return p && !p->cmdline.empty() && p->cmdline[0] == "/usr/sbin/criu";
  }));
  ::kill(criu.front(), SIGKILL);
  test::resume_paused(dir_.path(), "restore_pages");
  const ExitStatus st = g.wait();
  ::kill(-other.pid(), SIGKILL);  // with its sleep
  other.wait();
  EXPECT_TRUE(st.exited && st.code == 9) << st.describe();
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_NE(err.find("removed the ghost files"), std::string::npos) << err;
  EXPECT_TRUE(ghosts().empty()) << ghosts().front();
  const auto r = test::run_cli({"restore", ckpt.string(), "--staging", staging_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file("/proc/" + std::to_string(pid) + "/fd/3"), "kept\n");
  ::kill(pid, SIGKILL);
  process::wait_ended(pid, 10s);
}

// A restore in place locks the checkpoint's pids (.restore-PIDNS-PID in the run directory).
// Killed with its guard and criu, it left the lock files for good: recover removes them, and ends
// the tree criu had half restored.
TEST_F(E2eFaults, ARestoreKilledWithItsGuardLeavesNoPidLocks) {
  const fs::path run = dir_.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());
  Child s = server("rl");
  const std::string state = ask_unix_line(sock("rl"), "STATE");
  const pid_t pid = s.pid();
  const fs::path ckpt = dumped(s, "rl");
  ASSERT_FALSE(ckpt.empty());
  // Held where criu waits for its pages: criu cannot finish the restore meanwhile.
  Child g = test::paused_cli(
      {"restore", ckpt.string(), "--staging", staging_.string(), "--staging-mode", "stream"},
      "restore_pages", dir_.path(), test::Resume::kWhenUnmarked);
  ASSERT_FALSE(entries(run, ".restore-").empty()) << "the restore locked none of its pids";
  const auto criu = criu_of(g);
  ASSERT_TRUE(kill_guard_of(g));
  for (pid_t c : criu) ::kill(c, SIGKILL);
  g.kill(SIGKILL);
  g.wait();
  const auto r = test::run_cli({"--json", "recover"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(entries(run, ".restore-").empty()) << entries(run, ".restore-").front();
  const auto again = test::run_cli({"restore", ckpt.string(), "--staging", staging_.string(),
                                    "--probe", "unix:" + sock("rl").string()});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(ask_unix_line(sock("rl"), "STATE"), state);
  EXPECT_EQ(ask_unix_line(sock("rl"), "QUIT"), "BYE");
  process::wait_ended(pid, 10s);
}

// SIGSTOP (or a Ctrl-Z) of gpuckpt in a dump left the service frozen for as long as gpuckpt stayed
// stopped (45 s tried). The guard bounds it: past $GPUCKPT_STOPPED_LIMIT it kills gpuckpt and
// undoes the dump.
TEST_F(E2eFaults, AStoppedGpuckptDoesNotKeepItsServiceFrozen) {
  Child s = server("sg");
  const fs::path ckpt = out_ / "sg.ckpt";
  const test::ScopedEnv env("GPUCKPT_STOPPED_LIMIT", "1");  // inherited by gpuckpt's guard
  Child g = paused_cli({"dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string(), "--staging",
                        staging_.string()},
                       "compress_write");
  const char state = test::process_state(s.pid());
  ASSERT_TRUE(state == 'T' || state == 't') << state;
  ::kill(g.pid(), SIGSTOP);
  const ExitStatus st = g.wait();
  EXPECT_TRUE(!st.exited && st.code == SIGKILL) << st.describe();
  EXPECT_TRUE(test::runs_again(s.pid())) << "the service was left frozen";
  EXPECT_EQ(ask_unix_line(sock("sg"), "PING"), "PONG");
  EXPECT_FALSE(fs::exists(ckpt));
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_NE(err.find("was stopped for 1 s while process " + std::to_string(s.pid())),
            std::string::npos)
      << err;
}

// Interrupted once its checkpoint was published (the guard not told yet), a dump resumed the
// service and said only that: the whole checkpoint stayed at -o, and a retry met "exists".
TEST_F(E2eFaults, ADumpInterruptedAfterPublishingSaysItsCheckpointStays) {
  Child s = server("pb");
  const fs::path ckpt = out_ / "pb.ckpt";
  Child g = paused_cli({"--json", "dump", "--pid", std::to_string(s.pid()), "-o", ckpt.string(),
                        "--staging", staging_.string()},
                       "published");
  g.kill(SIGINT);
  g.wait();
  const json j = json::parse(read_file(dir_.path() / "cli.out"), nullptr, false);
  ASSERT_TRUE(j.is_object()) << read_file(dir_.path() / "cli.out");
  const std::string msg = j["error"].value("message", "");
  EXPECT_NE(msg.find("resumed"), std::string::npos) << msg;
  EXPECT_NE(msg.find(ckpt.string() + " was complete and stays"), std::string::npos) << msg;
  EXPECT_EQ(test::run_cli({"verify", ckpt.string()}).exit_code, 0);
  EXPECT_TRUE(test::runs_again(s.pid()));
  s.kill(SIGKILL);
  s.wait();
}

// Misleading messages of the hostile pass, each now the refusal that says what is wrong.
TEST_F(E2eFaults, RefusalsSayWhatIsWrongAndFreezeNothing) {
  Child s = server("ms");
  const std::string pid = std::to_string(s.pid());
  const fs::path ckpt = out_ / "ms.ckpt";
  // A traced process is refused in the preflight (exit 10), not by criu (exit 9).
  {
    const pid_t target = s.pid();
    const pid_t tracer = ::fork();
    ASSERT_GE(tracer, 0);
    if (tracer == 0) {
      if (::ptrace(PTRACE_SEIZE, target, nullptr, nullptr) != 0) ::_exit(1);
      for (;;) ::pause();
    }
    ASSERT_TRUE(test::wait_until([&] {
      return read_file("/proc/" + pid + "/status").find("TracerPid:\t" + std::to_string(tracer)) !=
             std::string::npos;
    }));
    const auto r = test::run_cli({"dump", "--pid", pid, "-o", ckpt.string()});
    EXPECT_EQ(r.exit_code, 10) << r.err;
    EXPECT_NE(r.err.find("is traced by process " + std::to_string(tracer)), std::string::npos)
        << r.err;
    ::kill(tracer, SIGKILL);
    ::waitpid(tracer, nullptr, 0);
  }
  // A signing key readable by others is refused before the freeze, so nothing is "resumed".
  {
    const fs::path key = dir_.path() / "node.key";
    ASSERT_EQ(test::run_cli({"keygen", "-o", key.string()}).exit_code, 0);
    fs::permissions(key, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                             fs::perms::others_read);
    const auto r =
        test::run_cli({"dump", "--pid", pid, "-o", ckpt.string(), "--sign-key", key.string()});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("nothing was frozen"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("resumed"), std::string::npos) << r.err;
  }
  // A zombie is named as one, not as a missing process.
  {
    Child z = spawn({"true"});
    const pid_t zp = z.pid();
    ASSERT_TRUE(test::wait_until([&] { return test::process_state(zp) == 'Z'; }));
    const auto r = test::run_cli({"dump", "--pid", std::to_string(zp), "-o", ckpt.string()});
    EXPECT_EQ(r.exit_code, 10) << r.err;
    EXPECT_NE(r.err.find("zombie"), std::string::npos) << r.err;
    z.wait();
  }
  // An unknown command is named; --take-endpoints alone is refused.
  {
    const auto r = test::run_cli({"dumpp", "--pid", pid});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("unknown command 'dumpp'"), std::string::npos) << r.err;
    const auto t = test::run_cli({"restore", ckpt.string(), "--take-endpoints"});
    EXPECT_EQ(t.exit_code, 2);
    EXPECT_NE(t.err.find("needs --new-pidns"), std::string::npos) << t.err;
  }
  EXPECT_FALSE(fs::exists(ckpt));
  EXPECT_EQ(ask_unix_line(sock("ms"), "PING"), "PONG");
  s.kill(SIGKILL);
  s.wait();
}

// Two restores of one checkpoint at once: the loser failed inside criu ("Can't fork", exit 9).
// It is refused before criu runs, as for a pid in use (exit 10). And a copy that another
// gpuckpt dumped before it answered was said to be both gone and "left running".
TEST_F(E2eFaults, OneRestoreAtATimeGivesACheckpointItsPidsAndEachSaysWhatBecameOfIt) {
  Child s = server("tr");
  const pid_t pid = s.pid();
  const fs::path ckpt = out_ / "tr.ckpt";
  ASSERT_EQ(test::run_cli({"dump", "--pid", std::to_string(pid), "-o", ckpt.string()}).exit_code,
            0);
  s.wait_for(10s);
  Child first =
      test::paused_cli({"restore", ckpt.string(), "--probe", "unix:" + sock("tr").string()},
                       "first_answer", dir_.path(), test::Resume::kWhenUnmarked);
  const auto second = test::run_cli({"restore", ckpt.string()});
  EXPECT_EQ(second.exit_code, 10) << second.err;
  EXPECT_NE(second.err.find("is being restored by another gpuckpt"), std::string::npos)
      << second.err;
  // The first copy is dumped away by another gpuckpt before the first restore looks at it.
  const auto away =
      test::run_cli({"dump", "--pid", std::to_string(pid), "-o", (out_ / "away.ckpt").string()});
  ASSERT_EQ(away.exit_code, 0) << away.err;
  test::resume_paused(dir_.path(), "first_answer");
  const ExitStatus st = first.wait();
  EXPECT_TRUE(st.exited && st.code == 10) << st.describe();
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_NE(err.find("exited before answering"), std::string::npos) << err;
  EXPECT_EQ(err.find("left running"), std::string::npos) << err;
  EXPECT_FALSE(process::read_proc(pid).has_value() && test::process_state(pid) != 'Z');
  EXPECT_EQ(test::run_cli({"verify", (out_ / "away.ckpt").string()}).exit_code, 0);
}

// A service whose stdout is a file opened without O_APPEND (`> log`) was dumped and ended
// without a word, and the checkpoint then failed to restore once the log had grown ("bad
// size"): the dump says so.
TEST_F(E2eFaults, ADumpWarnsOfAnOutputFileThatCriuWillRequireUnchanged) {
  const fs::path log = dir_.path() / "truncated.log";
  SpawnOptions o;
  o.new_session = true;
  Child s = spawn(
      {"/bin/sh", "-c", "exec \"$0\" --socket \"$1\" --weights \"$2\" --init-seconds 0 > \"$3\"",
       (test::bin_dir() / "gpuckpt-demo-server").string(), sock("ap").string(), weights_.string(),
       log.string()},
      o);
  ASSERT_TRUE(test::wait_until([&] { return ask_unix_line(sock("ap"), "PING") == "PONG"; }));
  const auto d = test::run_cli({"dump", "--pid", std::to_string(s.pid()), "--leave-running", "-o",
                                (out_ / "ap.ckpt").string()});
  EXPECT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.err.find("writes its fd 1 to " + log.string() + " without O_APPEND"),
            std::string::npos)
      << d.err;
  s.kill(SIGKILL);
  s.wait();
}

// The same kill during a release migration left the service down: the half-restored copy held
// the pids and a ghost file, so the rollback's restore of the original failed ("pid N is in
// use"), and so did the hand restore it suggested. The rollback clears them first.
TEST_F(E2eFaults, AKilledCriuRestoreInAReleaseMigrationStillRollsBackToTheOriginal) {
  Child s = server("rm");
  ask_unix_line(sock("rm"), "GEN r");
  const std::string state = ask_unix_line(sock("rm"), "STATE");
  const pid_t pid = s.pid();
  // Reaped as the migration ends it: a zombie would keep its pid from the copy.
  std::optional<ExitStatus> ended;
  std::thread reaper([&] { ended = s.wait_for(60s); });
  Child g =
      test::paused_cli({"migrate", "--pid", std::to_string(pid), "--to", (out_ / "rm").string(),
                        "--handoff", "release", "--staging", staging_.string(), "--staging-mode",
                        "stream", "--probe", "unix:" + sock("rm").string()},
                       "restore_pages", dir_.path(), test::Resume::kWhenUnmarked);
  reaper.join();
  EXPECT_TRUE(ended.has_value()) << "a release hands over only an ended original";
  const auto criu = criu_of(g);
  ASSERT_EQ(criu.size(), 1u);
  ASSERT_TRUE(test::wait_until([&] { return process::read_proc(pid).has_value(); }));
  ::kill(criu.front(), SIGKILL);
  test::resume_paused(dir_.path(), "restore_pages");
  const ExitStatus st = g.wait();
  EXPECT_TRUE(st.exited && st.code == 9) << st.describe();
  const std::string err = read_file(dir_.path() / "cli.err");
  EXPECT_NE(err.find("half-restored"), std::string::npos) << err;
  EXPECT_NE(err.find("the original was restored from"), std::string::npos) << err;
  EXPECT_EQ(ask_unix_line(sock("rm"), "STATE"), state) << "the service is down";
  EXPECT_EQ(ask_unix_line(sock("rm"), "QUIT"), "BYE");
  process::wait_ended(pid, 10s);
}
