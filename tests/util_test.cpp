#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
#include <thread>

#include "gpuckpt/error.h"
#include "gpuckpt/timing.h"
#include "test_support.h"
#include "util/fd_passing.h"
#include "util/mountinfo.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"
#include "util/utf8.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

// A migration reads its target's error back by name: every code's name must lead back to it,
// whichever code is the last (the reader used to stop at kExists).
TEST(Errc, EveryNameLeadsBackToItsCodeAndNoOtherWordDoes) {
  int named = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<Errc>(c);
    const std::string_view name = errc_name(code);
    if (name == "unknown") continue;
    ++named;
    EXPECT_EQ(errc_from_name(name), code) << name;
  }
  EXPECT_EQ(named, 13);
  EXPECT_EQ(errc_name(Errc::kExists), "exists");
  EXPECT_EQ(errc_from_name("unknown"), std::nullopt);
  EXPECT_EQ(errc_from_name("interrupted"), std::nullopt);
  EXPECT_EQ(errc_from_name(""), std::nullopt);
}

TEST(Timeline, ScopesRecordDurationOrderAndBytes) {
  Timeline t;
  {
    auto s = t.scope("first");
    s.set_bytes(42);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  { auto s = t.scope("second"); }
  ASSERT_EQ(t.stages().size(), 2u);
  EXPECT_EQ(t.stages()[0].name, "first");
  EXPECT_EQ(t.stages()[0].bytes, 42u);
  EXPECT_GE(t.stages()[0].seconds, 0.015);
  EXPECT_GE(t.stages()[1].start_offset, t.stages()[0].start_offset + t.stages()[0].seconds);
  EXPECT_NE(t.find("second"), nullptr);
  EXPECT_EQ(t.find("third"), nullptr);
  EXPECT_GE(t.total_seconds(), t.stages()[0].seconds);
}

TEST(Timeline, ScopeRecordsEvenWhenAnExceptionUnwinds) {
  Timeline t;
  try {
    auto s = t.scope("failing");
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  ASSERT_EQ(t.stages().size(), 1u);
  EXPECT_EQ(t.stages()[0].name, "failing");
}

// The core's one reader of the timeline shape gives back what the writer wrote, and refuses
// what a sloppy reader would turn into a stage named "?" or a negative duration.
TEST(Timeline, TheReaderGivesBackWhatTheWriterWroteAndRefusesTheRest) {
  Timeline t;
  const auto o = t.origin();
  t.add("criu_dump", o + std::chrono::milliseconds(10), o + std::chrono::milliseconds(30), 4096);
  t.add("compress_write", o + std::chrono::milliseconds(20), o + std::chrono::milliseconds(50));
  const Timeline back = timeline_from_json(timeline_json(t), "test");
  ASSERT_EQ(back.stages().size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.stages()[i].name, t.stages()[i].name);
    EXPECT_NEAR(back.stages()[i].seconds, t.stages()[i].seconds, 1e-6);
    EXPECT_NEAR(back.stages()[i].start_offset, t.stages()[i].start_offset, 1e-6);
    EXPECT_EQ(back.stages()[i].bytes, t.stages()[i].bytes);
  }
  const nlohmann::json bad[] = {
      {{"stages", {{{"seconds", 1}}}}},
      {{"stages", {{{"name", "x"}, {"seconds", -1}}}}},
      {{"stages", {{{"name", "x"}, {"seconds", 1}, {"bytes", -5}}}}},
      {{"stages", {{{"name", "x"}, {"seconds", "1"}}}}},
      {{"total_seconds", 1}},
  };
  for (const auto& j : bad) {
    SCOPED_TRACE(j.dump());
    const Error e = test::error_from([&] { (void)timeline_from_json(j, "the answer"); });
    EXPECT_EQ(e.code(), Errc::kInvalidInput);
    EXPECT_EQ(std::string(e.what()).rfind("the answer", 0), 0u) << e.what();
  }
}

TEST(Fs, WriteFileAtomicLeavesNoTemporaries) {
  auto dir = test::scratch_dir();
  write_file_atomic(dir.path() / "a.json", "{\"x\":1}");
  write_file_atomic(dir.path() / "a.json", "{\"x\":2}");
  EXPECT_EQ(read_file(dir.path() / "a.json"), "{\"x\":2}");
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(Fs, TempDirIsRemovedUnlessReleased) {
  auto parent = test::scratch_dir();
  fs::path gone, kept;
  {
    TempDir a(parent.path(), "a");
    TempDir b(parent.path(), "b");
    gone = a.path();
    kept = b.release();
    EXPECT_TRUE(fs::is_directory(gone));
  }
  EXPECT_FALSE(fs::exists(gone));
  EXPECT_TRUE(fs::is_directory(kept));
}

// A later run removes what a killed gpuckpt left, and nothing that is in use: a TempDir holds
// its directory (an flock) for as long as its process lives.
TEST(Fs, OnlyADirectoryThatNobodyHoldsIsRemovedAsAbandoned) {
  auto parent = test::scratch_dir();
  TempDir live(parent.path(), "gpuckpt-x");
  const fs::path dead = parent.path() / "gpuckpt-x-dead01";
  fs::create_directories(dead / "images");
  test::write_test_file(dead / "images" / "pages-1.img", 1 << 20, 1);
  const fs::path half_gone = parent.path() / "gpuckpt-x-dead02.gone";  // an interrupt's rest
  fs::create_directories(half_gone);
  for (const auto& d : {dead, half_gone}) std::ofstream(d / kTempMarker).put('\n');
  // Named like ours but not marked as a temporary, or a published checkpoint: never ours to take.
  const fs::path unmarked = parent.path() / "gpuckpt-x-node17";
  fs::create_directories(unmarked);
  const fs::path published = parent.path() / "gpuckpt-x-ckpt01";
  fs::create_directories(published);
  for (const char* f : {kTempMarker, "manifest.json", "manifest.seal"})
    std::ofstream(published / f).put('\n');
  // Held by another process after this one's TempDir is gone (a guard that still needs it).
  const fs::path held = parent.path() / "gpuckpt-x-held01";
  fs::create_directories(held);
  const UniqueFd hold = hold_dir(held);
  const fs::path elsewhere = parent.path() / "elsewhere";
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(elsewhere, parent.path() / "gpuckpt-x-link01");
  // A user's directories that only share the prefix, or look nothing like ours.
  const fs::path users = parent.path() / "gpuckpt-x-user-data";
  fs::create_directories(users);
  const fs::path other = parent.path() / "other-dead01";
  fs::create_directories(other);

  auto removed = remove_abandoned(parent.path(), {"gpuckpt-x-"});
  std::sort(removed.begin(), removed.end(),
            [](const RemovedDir& a, const RemovedDir& b) { return a.path < b.path; });
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(removed[0].path, dead);
  EXPECT_GE(removed[0].bytes, 1u << 20);
  EXPECT_EQ(removed[1].path, half_gone);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::is_directory(live.path())) << "a directory in use was removed";
  EXPECT_TRUE(fs::is_directory(held)) << "a held directory was removed";
  EXPECT_TRUE(fs::is_symlink(parent.path() / "gpuckpt-x-link01"));
  EXPECT_TRUE(fs::is_directory(elsewhere));
  EXPECT_TRUE(fs::is_directory(users));
  EXPECT_TRUE(fs::is_directory(other));
  EXPECT_TRUE(fs::is_directory(unmarked)) << "an unmarked directory was removed";
  EXPECT_TRUE(fs::is_directory(published)) << "a published checkpoint was removed";
}

TEST(Fs, ASiblingLeftByAKilledRunIsRemovedBeforeTheNextOutputIsBuilt) {
  auto parent = test::scratch_dir();
  const fs::path out = parent.path() / "ckpt";
  const fs::path left = parent.path() / ".ckpt.tmp-0123456789abcdef";
  fs::create_directories(left);
  std::ofstream(left / kTempMarker).put('\n');
  const fs::path old = parent.path() / ".ckpt.old-0123456789abcdef";  // maybe the only copy
  fs::create_directories(old);
  fs::path announced;
  TempDir t = TempDir::beside(out, [&](const fs::path& p) { announced = p; });
  EXPECT_EQ(announced, t.path());
  EXPECT_FALSE(fs::exists(left));
  EXPECT_TRUE(fs::is_directory(old));
  EXPECT_EQ(fs::status(t.path()).permissions() & fs::perms::all, fs::perms::owner_all);
  // Another run beside the same output leaves this one, which is in use, alone.
  TempDir second = TempDir::beside(out);
  EXPECT_TRUE(fs::is_directory(t.path()));
}

TEST(Fs, AnInterruptRemovesTheLiveTempDirsButNotAReleasedOrHandedOverOne) {
  // Not a TempDir itself: remove_live_temp_dirs() takes every one of this process.
  const fs::path parent = test::scratch_dir().release();
  fs::path gone, kept;
  {
    TempDir a(parent, "a");
    test::write_test_file(a.path() / "blob", 1 << 20, 1);
    TempDir b(parent, "b");
    TempDir guards(parent, "c");  // a guard removes it, after it has done with it
    hand_over_temp_dir(guards.path());
    gone = a.path();
    kept = b.release();
    const auto removed = remove_live_temp_dirs();
    ASSERT_EQ(removed.size(), 1u);
    EXPECT_EQ(removed[0].path, gone);
    EXPECT_GE(removed[0].bytes, 1u << 20);
    EXPECT_FALSE(fs::exists(gone));
    EXPECT_FALSE(fs::exists(gone.string() + ".gone"));
    EXPECT_TRUE(fs::is_directory(kept));
    EXPECT_TRUE(fs::is_directory(guards.path()));
    take_back_temp_dir(guards.path());
  }
  EXPECT_TRUE(fs::is_directory(kept));
  fs::remove_all(parent);
}

// The kernel escapes a space, tab, newline or backslash in a path as \ooo; optional fields
// (none, one, several) come before the " - " that the file system's type follows.
TEST(Mountinfo, EachFieldComesBackInItsPlaceAndPathsUnescaped) {
  TempDir d = test::scratch_dir("gpuckpt-mountinfo");
  const fs::path file = d.path() / "mountinfo";
  std::ofstream(file)
      << "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro\n"
      << "31 22 0:27 /a\\040dir /mnt/with\\040space\\011tab rw - tmpfs tmpfs rw,size=1024k\n"
      << "35 22 0:30 /kubepods/x /sys/fs/cgroup/freezer rw master:2 shared:9 - cgroup cgroup "
         "rw,freezer\n"
      << "36 22 0:31 /back\\134slash /b rw - overlay overlay rw,upperdir=/u\n"
      << "not a mountinfo line\n";
  const auto m = read_mountinfo(file);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].id, 22);
  EXPECT_EQ(m[0].mount_point, "/");
  EXPECT_EQ(m[0].fstype, "ext4");
  EXPECT_EQ(m[0].options, "rw,errors=remount-ro");
  EXPECT_EQ(m[0].dev, "0:21");
  EXPECT_EQ(m[1].root, "/a dir");
  EXPECT_EQ(m[1].mount_point, "/mnt/with space\ttab");
  EXPECT_EQ(m[2].fstype, "cgroup");
  EXPECT_EQ(m[2].root, "/kubepods/x");
  EXPECT_EQ(m[2].options, "rw,freezer");
  EXPECT_EQ(m[3].root, "/back\\slash");
  EXPECT_TRUE(read_mountinfo(d.path() / "gone").empty());
  // This process's own table has its root.
  const auto self = read_mountinfo("/proc/self/mountinfo");
  EXPECT_TRUE(std::any_of(self.begin(), self.end(),
                          [](const MountInfo& i) { return i.mount_point == "/"; }));
}

TEST(Mountinfo, APathIsAtOrUnderARootOnlyAtAComponentBoundary) {
  EXPECT_TRUE(at_or_under("/a/b", "/"));
  EXPECT_TRUE(at_or_under("/a", "/a"));
  EXPECT_TRUE(at_or_under("/a/b", "/a"));
  EXPECT_FALSE(at_or_under("/ab", "/a"));
  EXPECT_FALSE(at_or_under("/a", "/a/b"));
}

TEST(Mountinfo, APathShowsThroughAMountOfItsFileSystemBelowTheRootItShows) {
  EXPECT_EQ(shown_at("/sys/fs/cgroup", "/", "/kubepods/x"), fs::path("/sys/fs/cgroup/kubepods/x"));
  EXPECT_EQ(shown_at("/sys/fs/cgroup", "/kubepods", "/kubepods/x"), fs::path("/sys/fs/cgroup/x"));
  EXPECT_EQ(shown_at("/mnt", "/a", "/ab"), std::nullopt);
  EXPECT_EQ(device_number("0:21"), makedev(0, 21));
  EXPECT_EQ(device_number("259:3"), makedev(259, 3));
  EXPECT_EQ(device_number("vda1"), std::nullopt);
  struct stat st {};
  ASSERT_EQ(::stat("/proc/self", &st), 0);
  const auto self = read_mountinfo("/proc/self/mountinfo");
  EXPECT_TRUE(std::any_of(self.begin(), self.end(), [&](const MountInfo& m) {
    return m.mount_point == "/proc" && device_number(m.dev) == st.st_dev;
  })) << "/proc's mount is not on the device that stat gives for /proc/self";
}

// What the guard relies on: a lock passed to it is the sender's very lock, which lives on in
// the receiver once the sender has closed its own descriptor (or died).
TEST(FdPassing, APassedLockStaysHeldByTheReceiverAfterTheSenderLetsGo) {
  const auto dir = test::scratch_dir("gpuckpt-fdpass");
  const std::string path = (dir.path() / "lock").string();
  UniqueFd held(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(held);
  ASSERT_EQ(::flock(held.get(), LOCK_EX | LOCK_NB), 0);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const std::vector<int> fds{held.get(), held.get()};
  const std::string line = "{\"op\":\"locks\"}\n";
  ASSERT_EQ(send_with_fds(a.get(), line, fds), 0);
  EXPECT_EQ(send_with_fds(a.get(), "", fds), EINVAL);  // descriptors travel with data only
  held.reset();
  a.reset();

  std::vector<UniqueFd> got;
  std::string text;
  char buf[7];  // smaller than the line: the descriptors come with its first read
  for (;;) {
    const ssize_t n = recv_with_fds(b.get(), buf, sizeof buf, got);
    ASSERT_GE(n, 0) << std::strerror(errno);
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  EXPECT_EQ(text, line);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(::fcntl(got[0].get(), F_GETFD) & FD_CLOEXEC, 0);
  const UniqueFd other(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(other);
  EXPECT_NE(::flock(other.get(), LOCK_EX | LOCK_NB), 0) << "the passed lock was lost";
  got.clear();
  EXPECT_EQ(::flock(other.get(), LOCK_EX | LOCK_NB), 0);
}

// A pipe (gpuckpt-guard run by hand) is read as before.
TEST(FdPassing, APipeIsReadAsByRead) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  ASSERT_EQ(::write(w.get(), "abc", 3), 3);
  std::vector<UniqueFd> got;
  char buf[8];
  EXPECT_EQ(recv_with_fds(r.get(), buf, sizeof buf, got), 3);
  EXPECT_EQ(std::string(buf, 3), "abc");
  EXPECT_TRUE(got.empty());
}

TEST(Utf8, AcceptsWellFormedTextAndRefusesWhatJsonCannotHold) {
  using gpuckpt::is_utf8;
  for (const char* ok : {"", "plain/ascii.ckpt", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                         "\xed\x9f\xbf", "\xf4\x8f\xbf\xbf"})
    EXPECT_TRUE(is_utf8(ok)) << ok;
  for (const char* bad :
       {"u\xffx.sock", "\xfe", "\xc3", "\xe2\x82", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80",
        "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80", "a\xc3(b"})
    EXPECT_FALSE(is_utf8(bad)) << bad;
}

TEST(Subprocess, CapturesOutputAndExitCode) {
  auto r = run_capture({"sh", "-c", "echo hello; exit 3"}, std::chrono::seconds(10));
  EXPECT_EQ(r.output, "hello\n");
  EXPECT_TRUE(r.status.exited);
  EXPECT_EQ(r.status.code, 3);
}

// CRIU dumps a pod's container from inside the pod's ipc and uts namespaces: the child joins
// them before it runs anything, and a namespace it cannot join runs nothing.
TEST(Subprocess, AChildJoinsTheNamespacesItIsGivenBeforeItRuns) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to make a uts namespace";
  SpawnOptions held;
  held.capture_stdout = true;
  Child holder =
      spawn({"unshare", "--uts", "--", "sh", "-c", "hostname gk-held && echo up && exec sleep 600"},
            held);
  char up[8] = {};
  ASSERT_EQ(::read(holder.stdout_fd(), up, sizeof up - 1), 3);  // its hostname is set
  const UniqueFd uts(
      ::open(("/proc/" + std::to_string(holder.pid()) + "/ns/uts").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(uts);
  SpawnOptions so;
  so.namespace_fds = {uts.get()};
  EXPECT_EQ(run_capture({"hostname"}, std::chrono::seconds(10), so).output, "gk-held\n");
  EXPECT_NE(run_capture({"hostname"}, std::chrono::seconds(10)).output, "gk-held\n");

  const UniqueFd file(::open("/proc/self/stat", O_RDONLY | O_CLOEXEC));
  so.namespace_fds = {file.get()};
  const Error e =
      test::error_from([&] { run_capture({"hostname"}, std::chrono::seconds(10), so); });
  EXPECT_EQ(e.code(), Errc::kInvalidInput) << e.what();
  EXPECT_NE(std::string(e.what()).find("cannot join the namespace /proc/"), std::string::npos)
      << e.what();
}

TEST(Subprocess, AChildsEnvironmentTakesEachOverrideInPlaceOfItsKeyAndKeepsTheRest) {
  test::ScopedEnv a("GPUCKPT_TEST_ENV_A", "from-parent");
  test::ScopedEnv b("GPUCKPT_TEST_ENV_AB", "kept");
  SpawnOptions so;
  so.env = {"GPUCKPT_TEST_ENV_A=x=y", "GPUCKPT_TEST_ENV_NEW=", "GPUCKPT_TEST_ENV_AB"};
  const auto r = run_capture({"sh", "-c", "env | grep '^GPUCKPT_TEST_ENV_' | LC_ALL=C sort"},
                             std::chrono::seconds(10), so);
  EXPECT_TRUE(r.status.ok());
  // One A, the override's (a prefix of AB's name did not take AB away); the empty one is set;
  // an entry without '=' takes nothing away.
  EXPECT_EQ(r.output, "GPUCKPT_TEST_ENV_A=x=y\nGPUCKPT_TEST_ENV_AB=kept\nGPUCKPT_TEST_ENV_NEW=\n");
  EXPECT_EQ(split_env_entry("K=v=w"), (std::pair<std::string, std::string>{"K", "v=w"}));
  EXPECT_EQ(split_env_entry("K="), (std::pair<std::string, std::string>{"K", ""}));
  EXPECT_FALSE(split_env_entry("K").has_value());
}

TEST(Subprocess, MissingProgramIsAClearError) {
  try {
    spawn({"/nonexistent/program"});
    FAIL() << "spawn should throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/program"), std::string::npos);
  }
}

TEST(Subprocess, TimeoutKillsTheChild) {
  auto start = std::chrono::steady_clock::now();
  try {
    run_capture({"sleep", "30"}, std::chrono::milliseconds(200));
    FAIL() << "should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Subprocess, WaitForSaysStillRunningUntilTheChildEndsThenHowItEnded) {
  Child c = spawn({"sleep", "30"});
  EXPECT_FALSE(c.wait_for(std::chrono::milliseconds(20)).has_value());
  EXPECT_TRUE(c.running());
  c.kill(SIGTERM);
  const auto st = c.wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(st.has_value()) << "not woken by the child's end";
  EXPECT_FALSE(st->exited);
  EXPECT_EQ(st->code, SIGTERM);
  EXPECT_FALSE(c.running());
  // A child that ends on its own, while its parent waits on it.
  Child d = spawn({"sh", "-c", "exit 4"});
  const auto st2 = d.wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(st2.has_value());
  EXPECT_TRUE(st2->exited);
  EXPECT_EQ(st2->code, 4);
}

TEST(Subprocess, WaitingAgainIsAnErrorAndTakesNoOtherChildsStatus) {
  Child a = spawn({"sh", "-c", "exit 1"});
  ASSERT_EQ(a.wait().code, 1);
  Child b = spawn({"sh", "-c", "exit 7"});
  // b has ended and is left unreaped: a second wait on a must not reap it instead.
  ASSERT_TRUE(test::wait_until([&] { return test::process_state(b.pid()) == 'Z'; }));
  EXPECT_EQ(test::error_from([&] { a.wait_for(std::chrono::milliseconds(200)); }).code(),
            Errc::kInternal);
  EXPECT_EQ(test::error_from([&] { a.wait(); }).code(), Errc::kInternal);
  const auto st = b.wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->exited);
  EXPECT_EQ(st->code, 7);
}

TEST(Cli, VersionAndUsageErrors) {
  auto v = test::run_cli({"--version"});
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_NE(v.out.find("gpuckpt"), std::string::npos);
  auto bad = test::run_cli({"no-such-command"});
  EXPECT_EQ(bad.exit_code, 2);
}
