// The CRIU driver against the real CRIU: locating it, its preflight, a dump and restore of a
// real process with gpuckpt's plugin loaded, CRIU's stats decoded, failures reported with the
// log. CRIU must work on this machine: when it is missing these tests fail, they do not skip.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <regex>
#include <thread>

#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "criu/stats.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "test_support.h"
#include "util/fs.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

criu::Installation installed() {
  try {
    return criu::locate();
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
    throw;
  }
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

// A process CRIU can dump on its own: own session, no terminal, stdout to a file.
Child start_sleeper(const fs::path& dir) {
  no_inherited_fds();
  SpawnOptions o;
  o.new_session = true;
  o.stdout_file = dir / "sleeper.out";
  o.stderr_file = dir / "sleeper.err";
  return spawn({"sleep", "600"}, o);
}

std::string u32le(std::uint32_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 4);
}
std::string varint(std::uint64_t v) {
  std::string s;
  do {
    std::uint8_t b = v & 0x7f;
    v >>= 7;
    if (v) b |= 0x80;
    s += static_cast<char>(b);
  } while (v);
  return s;
}

}  // namespace

TEST(CriuLocate, MissingBinaryNamesTheInstallScript) {
  try {
    criu::locate("/nonexistent/criu");
    FAIL() << "locate should throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kCriu);
    EXPECT_NE(std::string(e.what()).find("CRIU not found at /nonexistent/criu"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("scripts/install-criu.sh"), std::string::npos);
  }
}

TEST(CriuLocate, InstalledCriuRunsAndPassesItsCheck) {
  const auto inst = installed();
  EXPECT_TRUE(std::regex_match(criu::version(inst), std::regex(R"(\d+\.\d+(\.\d+)?.*)")));
  EXPECT_NO_THROW(criu::check(inst));
  EXPECT_FALSE(inst.plugin_dir.empty()) << "gpuckpt's CRIU plugin was not built/found";
  EXPECT_TRUE(fs::exists(inst.plugin_dir / criu::kPluginFile));
}

// The patches come from the build record that scripts/install-criu.sh writes into the prefix; a
// CRIU without one (built some other way) has none, and a container restore then unpacks.
TEST(CriuLocate, ThePatchesOfACriuBuildAreReadFromItsPrefixsBuildRecord) {
  TempDir prefix("/tmp", "gpuckpt-criu-prefix");
  fs::create_directories(prefix.path() / "bin");
  const fs::path bin = prefix.path() / "bin" / "criu";
  std::ofstream(bin) << "#!/bin/sh\n";
  fs::permissions(bin, fs::perms::owner_all);
  EXPECT_TRUE(criu::locate(bin).patches.empty());

  fs::create_directories(prefix.path() / "share" / "gpuckpt-criu");
  std::ofstream(prefix.path() / "share" / "gpuckpt-criu" / "build.txt")
      << "source 4.2.1-1\npatches 0d65 0001-restore-huge-page-fill.patch " << criu::kRpcStreamPatch
      << "\ncompiler cc\n";
  const auto inst = criu::locate(bin);
  EXPECT_EQ(inst.patches,
            (std::vector<std::string>{"0001-restore-huge-page-fill.patch", criu::kRpcStreamPatch}));
  EXPECT_TRUE(inst.has_patch(criu::kRpcStreamPatch));
  EXPECT_FALSE(inst.has_patch("0002-restore-parallel-fill.patch"));
}

// What setup.sh installs is the build this tree's patches make: every one of them applied.
TEST(CriuLocate, TheInstalledCriuCarriesEveryPatchOfThisTree) {
  const auto inst = installed();
  std::vector<std::string> ours;
  for (const auto& e :
       fs::directory_iterator(fs::path(GPUCKPT_SOURCE_DIR) / "scripts" / "criu-patches"))
    if (e.path().extension() == ".patch") ours.push_back(e.path().filename().string());
  ASSERT_FALSE(ours.empty());
  for (const auto& p : ours)
    EXPECT_TRUE(inst.has_patch(p)) << p
                                   << " is not in the installed CRIU's build record: run "
                                      "scripts/install-criu.sh";
}

TEST(CriuStats, DecodesDumpAndRestoreEntries) {
  // stats_entry{dump{1:12 2:345 3:67 4:89 5:1000 6:0 7:900 9:0}}
  std::string dump_msg = varint(1 << 3) + varint(12) + varint(2 << 3) + varint(345) +
                         varint(3 << 3) + varint(67) + varint(4 << 3) + varint(89) +
                         varint(5 << 3) + varint(1000) + varint(6 << 3) + varint(0) +
                         varint(7 << 3) + varint(900) + varint(9 << 3) + varint(0);
  std::string entry = varint((1 << 3) | 2) + varint(dump_msg.size()) + dump_msg;
  std::string image = u32le(0x55105940) + u32le(0x57093306) + u32le(entry.size()) + entry;
  const auto d = criu::decode_dump_stats(image);
  EXPECT_EQ(d.freezing_us, 12u);
  EXPECT_EQ(d.frozen_us, 345u);
  EXPECT_EQ(d.memdump_us, 67u);
  EXPECT_EQ(d.memwrite_us, 89u);
  EXPECT_EQ(d.pages_scanned, 1000u);
  EXPECT_EQ(d.pages_written, 900u);

  std::string rmsg = varint(1 << 3) + varint(5) + varint(2 << 3) + varint(0) + varint(3 << 3) +
                     varint(4321) + varint(4 << 3) + varint(98765) + varint(5 << 3) + varint(77);
  std::string rentry = varint((2 << 3) | 2) + varint(rmsg.size()) + rmsg;
  const auto r = criu::decode_restore_stats(u32le(0x55105940) + u32le(0x57093306) +
                                            u32le(rentry.size()) + rentry);
  EXPECT_EQ(r.forking_us, 4321u);
  EXPECT_EQ(r.restore_us, 98765u);
  EXPECT_EQ(r.pages_restored, 77u);

  // Truncations and wrong magics are errors, not garbage numbers.
  EXPECT_THROW(criu::decode_dump_stats(image.substr(0, image.size() - 3)), Error);
  EXPECT_THROW(criu::decode_dump_stats(u32le(0x54564319) + image.substr(4)), Error);
  EXPECT_THROW(criu::decode_restore_stats(image), Error);  // has no restore entry
}

TEST(CriuStats, TheFillOfEveryRestoredProcessIsReadFromTheLogAndACutLineIsNoFigure) {
  // Two processes of a tree, each with its populate threads (scripts/criu-patches/0002).
  // Each line of a process says when its fill started; its last line comes once its read is
  // done, which may be well after the fill ended: the fill is start + its own seconds.
  const std::string log =
      "(00.090000)  22326: thp-fill: 1 populate threads over 512 chunks\n"
      "(00.300000)  22327: thp-fill: 1 populate threads over 1 chunks\n"
      "(02.500000)  22327: thp-fill: populate threads faulted in 1048576 bytes in 0.100 s\n"
      "(00.100000) noise\n"
      "(09.900000)  22326: thp-fill: populate threads faulted in 4294967296 bytes in 8.000 s\n";
  const auto f = criu::parse_fill_stats(log);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->bytes, 4294967296u + 1048576u);
  EXPECT_NEAR(f->start_s, 0.09, 1e-9);
  EXPECT_NEAR(f->end_s, 8.09, 1e-9);
  EXPECT_FALSE(criu::parse_fill_stats("(00.1) restore without the fill\n"));
  // A line the log cut short (CRIU killed mid-write), one without its start, or a garbled
  // clock gives no figure rather than a wrong one.
  EXPECT_FALSE(
      criu::parse_fill_stats("(00.1)  1: thp-fill: 1 populate threads over 2 chunks\n"
                             "(08.5)  1: thp-fill: populate threads faulted in 42"));
  EXPECT_FALSE(criu::parse_fill_stats(
      "(08.5)  1: thp-fill: populate threads faulted in 42 bytes in 1.000 s\n"));
  EXPECT_FALSE(
      criu::parse_fill_stats("(inf)  1: thp-fill: 1 populate threads over 2 chunks\n"
                             "(inf)  1: thp-fill: populate threads faulted in 42 bytes "
                             "in 1.000 s\n"));
  // A negative or oversized byte count, text after the seconds, or one process of the tree
  // whose fill never ended: the total would be wrong, so there is none.
  const std::string start = "(00.1)  1: thp-fill: 1 populate threads over 2 chunks\n";
  for (const char* done : {"faulted in -1 bytes in 1.000 s",
                           "faulted in 99999999999999999999 "
                           "bytes in 1.000 s",
                           "faulted in 42 bytes in 1.000 s and more"})
    EXPECT_FALSE(criu::parse_fill_stats(start + "(08.5)  1: thp-fill: populate threads " + done))
        << done;
  EXPECT_FALSE(criu::parse_fill_stats(
      start + "(00.2)  2: thp-fill: 1 populate threads over 2 chunks\n" +
      "(08.5)  1: thp-fill: populate threads faulted in 42 bytes in 1.000 s\n"));
  // Helpers that did not start ("0 populate threads") log no end, and the others still count.
  const auto one = criu::parse_fill_stats(
      start + "(00.2)  2: thp-fill: 0 populate threads over 2 chunks\n" +
      "(08.5)  1: thp-fill: populate threads faulted in 42 bytes in 1.000 s\n");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->bytes, 42u);
  const auto none = criu::read_restore_log_spans("/nonexistent/restore.log");
  EXPECT_FALSE(none.fill);
  EXPECT_FALSE(none.copy);
}

TEST(CriuStats, ThePagesCopiedBySeveralStreamsAreReadFromTheLogBesideTheFill) {
  // scripts/criu-patches/0004: a task whose image came as several streams logs its start and,
  // once every stream is in, its bytes and seconds; a task read serially logs neither.
  const std::string log =
      "(00.100000)  7: thp-fill: 1 populate threads over 4 chunks\n"
      "(00.200000)  9: copy: 4 streams over 1073741824 bytes of pages-1.img, 3 helper threads\n"
      "(00.300000)  7: thp-fill: populate threads faulted in 8388608 bytes in 0.050 s\n"
      "(00.250000)  10: copy: 2 streams over 134217728 bytes of pages-2.img, 1 helper threads\n"
      "(00.450000)  10: copy: streams moved 134217728 bytes in 0.150 s\n"
      "(00.700000)  9: copy: streams moved 1073741824 bytes in 0.400 s\n"
      "(00.800000)  9: Error (criu/files.c:1): cannot copy: something\n";
  const auto c = criu::parse_copy_stats(log);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->bytes, 1073741824u + 134217728u);
  EXPECT_NEAR(c->start_s, 0.2, 1e-9);
  EXPECT_NEAR(c->end_s, 0.6, 1e-9);
  const auto f = criu::parse_fill_stats(log);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->bytes, 8388608u);
  // A stream that failed: its task logs no end, and there is no figure.
  EXPECT_FALSE(criu::parse_copy_stats(
      "(00.2)  9: copy: 2 streams over 42 bytes of pages-1.img, 1 helper threads\n"));
  EXPECT_FALSE(criu::parse_copy_stats("(00.1) restore read serially\n"));
}

TEST(CriuRun, DumpAndRestoreARealProcessWithThePluginLoaded) {
  const auto inst = installed();
  auto dir = test::scratch_dir("gpuckpt-criu");
  Child sleeper = start_sleeper(dir.path());
  const pid_t pid = sleeper.pid();
  ASSERT_TRUE(test::wait_until([&] { return process::read_proc(pid)->comm == "sleep"; }));
  EXPECT_FALSE(process::needs_shell_job(*process::read_proc(pid)));

  const fs::path images = dir.path() / "images";
  fs::create_directory(images);
  criu::DumpArgs a;
  a.pid = pid;
  a.images_dir = images;
  a.final_state = criu::FinalState::kKilled;
  a.timeout = std::chrono::seconds(120);
  const criu::Run run = criu::dump(inst, a);
  EXPECT_GT(run.seconds(), 0);
  EXPECT_TRUE(fs::exists(images / "dump.log"));
  auto st = sleeper.wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(st.has_value()) << "criu dump did not end the process";

  // CRIU's stats, decoded.
  const auto stats = criu::read_dump_stats(images);
  ASSERT_TRUE(stats.has_value());
  EXPECT_GT(stats->frozen_us, 0u);
  EXPECT_GT(stats->pages_written, 0u);
  EXPECT_GE(stats->pages_scanned, stats->pages_written);

  // The plugin ran inside criu: its report is in the images dir, every dump hook timed.
  const auto rep = criu::read_plugin_report(images / criu::kDumpReportName);
  ASSERT_TRUE(rep.has_value()) << "the CRIU plugin was not called";
  EXPECT_EQ(rep->stage, "dump");
  EXPECT_TRUE(rep->finished);
  EXPECT_EQ(rep->criu_result, 0);
  EXPECT_FALSE(rep->cuda);  // sleep has no CUDA state
  for (const char* h : {"device_lock", "device_checkpoint"}) {
    const auto* hook = rep->find(h);
    ASSERT_NE(hook, nullptr) << h;
    EXPECT_EQ(hook->pid, pid);
    EXPECT_TRUE(hook->ok);
    EXPECT_TRUE(hook->skipped);
    EXPECT_GE(hook->end_ns, hook->start_ns);
    EXPECT_GE(
        hook->start_ns,
        std::chrono::duration_cast<std::chrono::nanoseconds>(run.start.time_since_epoch()).count());
  }
  EXPECT_LT(rep->find("device_lock")->start_ns, rep->find("device_checkpoint")->start_ns);

  // Restore: same pid, running again.
  const fs::path report = dir.path() / "restore-report.json";
  criu::RestoreArgs r;
  r.images_dir = images;
  r.pidfile = dir.path() / "restore.pid";
  r.env = {std::string(criu::kEnvReport) + "=" + report.string()};
  r.timeout = std::chrono::seconds(120);
  criu::restore(inst, r);
  std::ifstream pf(r.pidfile);
  pid_t restored = 0;
  pf >> restored;
  EXPECT_EQ(restored, pid);
  EXPECT_TRUE(process::alive(pid));
  const auto rs = criu::read_restore_stats(images);
  ASSERT_TRUE(rs.has_value());
  EXPECT_GT(rs->restore_us, 0u);
  const auto rrep = criu::read_plugin_report(report);
  ASSERT_TRUE(rrep.has_value());
  EXPECT_EQ(rrep->stage, "restore");
  EXPECT_NE(rrep->find("device_restore"), nullptr);
  EXPECT_NE(rrep->find("unlock"), nullptr);
  ::kill(pid, SIGKILL);
  EXPECT_TRUE(process::wait_ended(pid, std::chrono::seconds(10)));
}

TEST(CriuRun, FailureQuotesTheLogAndKeepsIt) {
  const auto inst = installed();
  auto dir = test::scratch_dir("gpuckpt-criu");
  criu::DumpArgs a;
  a.pid = 999999;  // no such process
  a.images_dir = dir.path();
  a.timeout = std::chrono::seconds(60);
  try {
    criu::dump(inst, a);
    FAIL() << "dump of a missing pid should fail";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), Errc::kCriu);
    EXPECT_NE(msg.find("criu dump failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Error"), std::string::npos) << msg;
    const auto at = msg.find("full log: ");
    ASSERT_NE(at, std::string::npos) << msg;
    const fs::path kept = msg.substr(at + 10);
    EXPECT_TRUE(fs::exists(kept)) << kept;  // survives the staging directory
    EXPECT_NE(kept.parent_path(), dir.path());
    fs::remove(kept);
  }
}

TEST(CriuRun, TimeoutKillsCriuAndSaysSo) {
  const auto inst = installed();
  auto dir = test::scratch_dir("gpuckpt-criu");
  // A "criu" that cannot finish in time.
  const fs::path slow = dir.path() / "slow-criu";
  {
    std::ofstream f(slow);
    f << "#!/bin/sh\nexec sleep 30\n";
  }
  fs::permissions(slow, fs::perms::owner_all);
  auto slow_inst = inst;
  slow_inst.binary = slow;
  criu::DumpArgs a;
  a.pid = ::getpid();
  a.images_dir = dir.path();
  a.timeout = std::chrono::seconds(1);
  try {
    criu::dump(slow_inst, a);
    FAIL() << "should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
    EXPECT_NE(std::string(e.what()).find("did not finish within 1 s"), std::string::npos);
  }
}

TEST(CriuArgs, DumpAndRestoreOptions) {
  criu::Installation inst{"/opt/criu/bin/criu", "/lib/gpuckpt/criu"};
  criu::DumpArgs a;
  a.pid = 42;
  a.images_dir = "/dev/shm/x";
  a.final_state = criu::FinalState::kStopped;
  a.shell_job = true;
  a.extra_args = {"--tcp-established"};
  const auto v = criu::dump_argv(inst, a, "/dev/shm/x/dump.log");
  auto has = [&](const std::vector<std::string>& args, const std::string& s) {
    return std::find(args.begin(), args.end(), s) != args.end();
  };
  EXPECT_EQ(v[0], "/opt/criu/bin/criu");
  EXPECT_EQ(v[1], "dump");
  for (const char* s :
       {"-t", "42", "-D", "/dev/shm/x", "-v4", "-o", "/dev/shm/x/dump.log", "--leave-stopped",
        "--shell-job", "--libdir", "/lib/gpuckpt/criu", "--tcp-established", "--timeout"})
    EXPECT_TRUE(has(v, s)) << s;
  EXPECT_FALSE(has(v, "--leave-running"));
  a.final_state = criu::FinalState::kKilled;
  a.shell_job = false;
  const auto k = criu::dump_argv(inst, a, "l");
  EXPECT_FALSE(has(k, "--leave-stopped"));
  EXPECT_FALSE(has(k, "--shell-job"));

  criu::RestoreArgs r;
  r.images_dir = "/dev/shm/y";
  r.pidfile = "/dev/shm/p";
  const auto rv = criu::restore_argv(inst, r, "/dev/shm/restore.log");
  EXPECT_EQ(rv[1], "restore");
  for (const char* s : {"-D", "/dev/shm/y", "-d", "--pidfile", "/dev/shm/p", "--libdir"})
    EXPECT_TRUE(has(rv, s)) << s;
}

// Only options that cannot change which tasks are dumped, where images go or how tasks end
// pass; a refusal names gpuckpt's own flag where it has one.
TEST(CriuArgs, OnlyTheAllowListPassesThroughToCriu) {
  using criu::Op;
  auto refusal = [](Op op, std::vector<std::string> args) {
    try {
      criu::check_extra_args(op, args);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kUsage);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal(Op::kDump, {}), "");
  EXPECT_EQ(refusal(Op::kDump, {"--file-locks", "--ext-unix-sk", "--ghost-limit=64M"}), "");
  EXPECT_EQ(refusal(Op::kDump, {"--ghost-limit", "64M", "--manage-cgroups=ignore"}), "");
  EXPECT_EQ(refusal(Op::kRestore, {"--weak-sysctls", "--inherit-fd", "fd[3]:pipe:[1]"}), "");
  EXPECT_NE(refusal(Op::kDump, {"-t", "1"}).find("use --pid"), std::string::npos);
  EXPECT_NE(refusal(Op::kDump, {"--leave-running"}).find("gpuckpt's --leave-running"),
            std::string::npos);
  EXPECT_NE(refusal(Op::kDump, {"--tcp-established"}).find("gpuckpt's --tcp-established"),
            std::string::npos);
  for (const char* bad : {"--leave-stopped", "-D", "--images-dir=/x", "--stream", "--pidfile=/x",
                          "-o", "--log-file=/x", "-v0", "--shell-job", "--prev-images-dir=/x",
                          "--restore-detached", "--root=/x", "--libdir=/x", "--timeout=1"})
    EXPECT_NE(refusal(Op::kDump, {bad}), "") << bad;
  // The wrong command, a value where none goes, a value missing.
  EXPECT_NE(refusal(Op::kRestore, {"--skip-in-flight"}).find("not an option of criu restore"),
            std::string::npos);
  EXPECT_NE(refusal(Op::kDump, {"--weak-sysctls"}), "");
  EXPECT_NE(refusal(Op::kDump, {"--file-locks=1"}).find("takes no value"), std::string::npos);
  EXPECT_NE(refusal(Op::kDump, {"--ghost-limit"}).find("needs a value"), std::string::npos);
  // A value is consumed, not read as an option; an option after it is checked.
  EXPECT_EQ(refusal(Op::kDump, {"--enable-fs", "--leave-running"}), "");
  EXPECT_NE(refusal(Op::kDump, {"--enable-fs", "nfs", "--leave-running"}), "");
}

TEST(CriuArgs, ShellJobDetection) {
  auto dir = test::scratch_dir("gpuckpt-criu");
  Child leader = start_sleeper(dir.path());
  ASSERT_TRUE(test::wait_until([&] { return process::read_proc(leader.pid())->comm == "sleep"; }));
  EXPECT_FALSE(process::needs_shell_job(
      *process::read_proc(leader.pid())));  // session leader without a terminal
  SpawnOptions o;                           // same session and process group as this test
  Child member = spawn({"sleep", "600"}, o);
  EXPECT_TRUE(process::needs_shell_job(*process::read_proc(member.pid())));
}

// D6: a failed run's log is copied into a private directory, never through a link someone
// planted in a shared /tmp, and never over an existing file.
TEST(CriuLogs, KeptLogGoesToAPrivateDirectoryNeverThroughAPlantedLink) {
  auto dir = test::scratch_dir("gpuckpt-logs");
  const fs::path log = dir.path() / "dump.log";
  std::ofstream(log) << "(00.1) Error (criu/x.c:1): boom\n";
  const fs::path tmp = dir.path() / "tmp";
  const fs::path victim = dir.path() / "victim";
  fs::create_directories(tmp);
  fs::create_directories(victim);
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const fs::path priv = tmp / ("gpuckpt-logs-" + std::to_string(::geteuid()));
  // A planted symlink where the private directory would be: not followed.
  fs::create_directory_symlink(victim, priv);
  EXPECT_EQ(criu::preserve_log(log, "criu-dump"), log);
  EXPECT_TRUE(fs::is_empty(victim)) << "the log was written through the planted link";
  // A directory others can write: not used either.
  fs::remove(priv);
  fs::create_directory(priv);
  fs::permissions(priv, fs::perms::all);
  EXPECT_EQ(criu::preserve_log(log, "criu-dump"), log);
  // The real thing: 0700, ours, a fresh name each time.
  fs::remove(priv);
  const fs::path a = criu::preserve_log(log, "criu-dump");
  const fs::path b = criu::preserve_log(log, "criu-dump");
  ::unsetenv("TMPDIR");
  EXPECT_EQ(a.parent_path(), priv);
  EXPECT_NE(a, b);
  EXPECT_EQ(fs::status(priv).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(read_file(a), read_file(log));
}
