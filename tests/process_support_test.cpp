// The pieces under dump/restore/migrate, on real processes: /proc parsing, the pid-namespace
// launcher used for restores beside a live original, the manifest's process record, and how
// CRIU's and the plugin's measurements become timeline stages.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <tuple>

#include "container/record.h"
#include "container/runtime.h"
#include "criu/plugin_report.h"
#include "criu/stats.h"
#include "device/cuda_checkpoint.h"
#include "gpuckpt/error.h"
#include "gpuckpt/process.h"
#include "process/guard.h"
#include "process/journal.h"
#include "process/pidns.h"
#include "process/proc_info.h"
#include "process/record.h"
#include "process/stages.h"
#include "process/support.h"
#include "test_support.h"
#include "util/fd_passing.h"
#include "util/fs.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

TEST(ProcInfo, ReadsIdentityAndLiveness) {
  const auto self = process::read_proc(::getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->pid, ::getpid());
  EXPECT_EQ(self->ppid, ::getppid());
  EXPECT_FALSE(self->cmdline.empty());
  EXPECT_EQ(fs::path(self->exe).filename(), fs::path(self->cmdline[0]).filename());
  EXPECT_FALSE(process::read_proc(999999).has_value());
  EXPECT_FALSE(process::read_proc(0).has_value());

  Child c = spawn({"sleep", "600"});
  ASSERT_TRUE(test::wait_until([&] { return process::read_proc(c.pid())->comm == "sleep"; }));
  EXPECT_TRUE(process::alive(c.pid()));
  EXPECT_EQ(process::read_proc(c.pid())->comm, "sleep");
  EXPECT_FALSE(process::wait_ended(c.pid(), std::chrono::milliseconds(50)));
  ::kill(c.pid(), SIGKILL);
  // A zombie (not yet reaped by us, its parent) counts as ended.
  EXPECT_TRUE(process::wait_ended(c.pid(), std::chrono::seconds(10)));
  EXPECT_EQ(process::read_proc(c.pid())->state, 'Z');
  c.wait();
}

TEST(ProcInfo, LiveProcessesComeWithWhatWasReadAndZombiesAreLeftOut) {
  Child live = spawn({"sleep", "600"}), dead = spawn({"sleep", "600"});
  ASSERT_TRUE(test::wait_until([&] {
    return process::read_proc(live.pid())->comm == "sleep" &&
           process::read_proc(dead.pid())->comm == "sleep";
  }));
  ::kill(dead.pid(), SIGKILL);
  ASSERT_TRUE(process::wait_ended(dead.pid(), std::chrono::seconds(10)));  // a zombie now
  const auto mine = [&](const process::ProcInfo& i) {
    return i.pid == live.pid() || i.pid == dead.pid();
  };
  const auto found = process::live_procs_where(mine);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].pid, live.pid());
  EXPECT_EQ(found[0].cmdline, (std::vector<std::string>{"sleep", "600"}));
  EXPECT_EQ(process::live_pids_where(mine), std::vector<pid_t>{live.pid()});
  ::kill(live.pid(), SIGKILL);
  live.wait();
  dead.wait();
}

TEST(ProcInfo, ACommandLineOptionIsFoundInEveryFormGoAndGnuTakeIt) {
  const std::vector<std::string> argv{"runc",    "-root=/a",    "--log",  "/l",
                                      "restore", "--namespace", "k8s.io", "--exec-root=/run/x",
                                      "id"};
  EXPECT_EQ(process::cmdline_option(argv, "root"), "/a");
  EXPECT_EQ(process::cmdline_option(argv, "log"), "/l");
  EXPECT_EQ(process::cmdline_option(argv, "namespace"), "k8s.io");
  EXPECT_EQ(process::cmdline_option(argv, "exec-root"), "/run/x");
  EXPECT_EQ(process::cmdline_option(argv, "bundle"), "");
  EXPECT_EQ(process::cmdline_option({"runc", "--root"}, "root"), "") << "a flag with no value";
  EXPECT_EQ(process::cmdline_option({"x", "--rootless", "true"}, "root"), "")
      << "a longer flag that begins with the name";
}

TEST(ProcInfo, StartTicksTellAProcessStartedAfterANoteFromOneStartedBefore) {
  // What the guard relies on to tell a restored copy from a process that reused its pid.
  const auto self = process::start_ticks(::getpid());
  ASSERT_TRUE(self.has_value());
  const std::uint64_t note = process::boot_ticks_now();
  EXPECT_LE(*self, note);
  // A command whose name has the separators of /proc/PID/stat in it (the kernel names a
  // process after the path it was started by, here a link).
  const TempDir dir = test::scratch_dir("gpuckpt-ticks");
  const fs::path odd = dir.path() / "s) 1 2 (3";
  fs::create_symlink("/bin/sleep", odd);
  Child c = spawn({odd.string(), "600"});
  ASSERT_TRUE(test::wait_until([&] {
    const auto p = process::read_proc(c.pid());
    return p && p->comm == "s) 1 2 (3";
  }));
  const auto child = process::start_ticks(c.pid());
  ASSERT_TRUE(child.has_value());
  EXPECT_GE(*child, note);
  EXPECT_LE(*child, process::boot_ticks_now());
  c.kill(SIGKILL);
  c.wait();
  EXPECT_FALSE(process::start_ticks(c.pid()).has_value());
  EXPECT_FALSE(process::start_ticks(0).has_value());
}

// CRIU dumps a SysV segment's mapping only with the ipc namespace it belongs to: a pod's
// container with one of the pod's attached is refused before anything is frozen.
TEST(ProcInfo, ASysvSegmentAttachedIsSeenUntilItIsDetached) {
  EXPECT_FALSE(process::maps_sysv_shm(::getpid()));
  const int id = ::shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
  ASSERT_GE(id, 0) << std::strerror(errno);
  void* at = ::shmat(id, nullptr, 0);
  ::shmctl(id, IPC_RMID, nullptr);  // gone once detached
  ASSERT_NE(at, reinterpret_cast<void*>(-1)) << std::strerror(errno);
  EXPECT_TRUE(process::maps_sysv_shm(::getpid()));
  ASSERT_EQ(::shmdt(at), 0);
  EXPECT_FALSE(process::maps_sysv_shm(::getpid()));
}

TEST(ProcInfo, FindsListeningSockets) {
  EXPECT_FALSE(process::has_tcp_listener(::getpid()));
  UniqueFd tcp(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(tcp.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(tcp.get(), 1), 0);
  EXPECT_TRUE(process::has_tcp_listener(::getpid()));

  auto dir = test::scratch_dir("gpuckpt-proc");
  const fs::path path = dir.path() / "l.sock";
  UniqueFd unx(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un u{};
  u.sun_family = AF_UNIX;
  std::strcpy(u.sun_path, path.c_str());
  ASSERT_EQ(::bind(unx.get(), reinterpret_cast<sockaddr*>(&u), sizeof u), 0);
  auto listeners = process::unix_listeners(::getpid());
  EXPECT_TRUE(std::none_of(listeners.begin(), listeners.end(), [&](const auto& l) {
    return l.path == path.string();
  })) << "bound but not listening yet";
  ASSERT_EQ(::listen(unx.get(), 1), 0);
  listeners = process::unix_listeners(::getpid());
  EXPECT_TRUE(std::any_of(listeners.begin(), listeners.end(),
                          [&](const auto& l) { return l.path == path.string() && !l.abstract; }));

  UniqueFd abs(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un b{};
  b.sun_family = AF_UNIX;
  // Abstract names are per network namespace, not per directory: the pid keeps two runs of
  // this test (a CI checkout beside a developer's) apart.
  const std::string name = "gpuckpt-test-abstract-" + std::to_string(::getpid());
  std::memcpy(b.sun_path + 1, name.data(), name.size());
  ASSERT_EQ(::bind(abs.get(), reinterpret_cast<sockaddr*>(&b),
                   static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())),
            0);
  ASSERT_EQ(::listen(abs.get(), 1), 0);
  listeners = process::unix_listeners(::getpid());
  EXPECT_TRUE(std::any_of(listeners.begin(), listeners.end(), [&](const auto& l) {
    return l.abstract && l.path == std::string("@") + name;
  }));
}

TEST(ProcInfo, NoNvidiaDevicesOpenMeansNoGpus) {
  EXPECT_TRUE(process::nvidia_gpu_uuids(::getpid()).empty());
}

// cuda-checkpoint moves VRAM into the process's host memory while the tree is locked: a dump
// whose GPU memory exceeds what the host has available is refused before the freeze.
TEST(ProcessSupport, GpuMemoryBeyondTheHostsAvailableMemoryIsRefusedBeforeFreezing) {
  EXPECT_NO_THROW(process::require_host_room_for_vram(0, 1ull << 30));
  EXPECT_NO_THROW(process::require_host_room_for_vram(1ull << 30, 1ull << 30));
  EXPECT_NO_THROW(process::require_host_room_for_vram(8ull << 30, 0));  // unknown: no refusal
  const Error e =
      test::error_from([] { process::require_host_room_for_vram(80ull << 30, 16ull << 30); });
  EXPECT_EQ(e.code(), Errc::kDevice);
  EXPECT_NE(std::string(e.what()).find("81920 MiB of GPU memory"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("16384 MiB available: nothing was frozen"),
            std::string::npos)
      << e.what();
}

// A process frozen by someone else's cgroup freezer: CRIU's own freeze waited for its timeout,
// failed, and gpuckpt then said the process "was resumed" while it stayed frozen.
TEST(ProcInfo, AProcessInAFrozenCgroupIsUndumpable) {
  // The v1 freezer where it is mounted (hybrid hosts), else cgroup v2.
  struct Freezer {
    fs::path dir, freeze;
    std::string on, off;
    ~Freezer() {
      if (dir.empty()) return;
      std::ofstream(freeze) << off << std::endl;  // a failed assertion leaves nothing frozen
      std::error_code ec;
      fs::remove(dir, ec);
    }
  } fz;
  const std::string name = "gpuckpt-test-" + std::to_string(::getpid());
  for (const auto& [root, file, on, off] :
       {std::tuple<const char*, const char*, const char*, const char*>{
            "/sys/fs/cgroup/freezer", "freezer.state", "FROZEN", "THAWED"},
        {"/sys/fs/cgroup/unified", "cgroup.freeze", "1", "0"},
        {"/sys/fs/cgroup", "cgroup.freeze", "1", "0"}}) {
    const fs::path d = fs::path(root) / name;
    std::error_code ec;
    if (!fs::create_directory(d, ec)) continue;
    if (!fs::exists(d / file)) {
      fs::remove(d, ec);
      continue;
    }
    fz.dir = d;
    fz.freeze = d / file;
    fz.on = on;
    fz.off = off;
    break;
  }
  if (fz.dir.empty()) GTEST_SKIP() << "no cgroup freezer (v1 or v2) can be created here";
  Child c = spawn({"sleep", "60"}, {});
  std::ofstream(fz.dir / "cgroup.procs") << c.pid() << std::endl;
  if (read_file("/proc/" + std::to_string(c.pid()) + "/cgroup").find(name) == std::string::npos) {
    c.kill(SIGKILL);
    c.wait();
    GTEST_SKIP() << "cannot move a process into " << fz.dir;
  }
  auto info = process::read_proc(c.pid());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(process::frozen_cgroup(c.pid()), "");
  EXPECT_EQ(process::undumpable_reason(*info), "");
  std::ofstream(fz.freeze) << fz.on << std::endl;
  std::string cg;
  EXPECT_TRUE(test::wait_until([&] { return !(cg = process::frozen_cgroup(c.pid())).empty(); }));
  EXPECT_NE(cg.find(name), std::string::npos) << cg;
  EXPECT_NE(process::undumpable_reason(*info).find("is in the frozen cgroup"), std::string::npos);
  std::ofstream(fz.freeze) << fz.off << std::endl;
  EXPECT_TRUE(test::wait_until([&] { return process::frozen_cgroup(c.pid()).empty(); }));
  c.kill(SIGKILL);
  c.wait();
}

TEST(Pidns, RunsACommandInANewPidNamespaceWhoseInitOutlivesIt) {
  auto dir = test::scratch_dir("gpuckpt-pidns");
  const fs::path pidfile = dir.path() / "pid";
  // Like `criu restore -d`: start a long-lived child, report its pid, exit.
  const auto run = process::run_in_new_pidns(
      {"/bin/sh", "-c", "sleep 600 </dev/null >/dev/null 2>&1 & echo $! > " + pidfile.string()}, {},
      dir.path() / "out", std::chrono::seconds(30));
  EXPECT_TRUE(run.criu.ok()) << run.criu.describe();
  ASSERT_GT(run.init_pid, 0);
  EXPECT_EQ(process::read_proc(run.init_pid)->comm, "gpuckpt-pidns");
  EXPECT_EQ(process::innermost_pid(run.init_pid), 1);
  // Its ps title is not the test binary's command line.
  EXPECT_EQ(process::read_proc(run.init_pid)->cmdline.at(0).rfind("gpuckpt-pidns", 0), 0u);

  std::ifstream in(pidfile);
  pid_t ns_pid = 0;
  ASSERT_TRUE(in >> ns_pid);
  const pid_t host = process::host_pid_in_ns(run.init_pid, ns_pid);
  EXPECT_NE(host, ns_pid);
  EXPECT_EQ(process::innermost_pid(host), ns_pid);
  EXPECT_TRUE(test::wait_until([&] {  // the fork has yet to exec
    const auto p = process::read_proc(host);
    return p && p->comm == "sleep";
  }));
  EXPECT_THROW(process::host_pid_in_ns(run.init_pid, 4242), Error);

  // The init leaves once the namespace is empty.
  ::kill(host, SIGKILL);
  EXPECT_TRUE(process::wait_ended(run.init_pid, std::chrono::seconds(10)));
}

TEST(Pidns, ReportsAFailingCommandAndATimeout) {
  auto dir = test::scratch_dir("gpuckpt-pidns");
  const auto run = process::run_in_new_pidns({"/bin/sh", "-c", "echo oops; exit 3"}, {},
                                             dir.path() / "out", std::chrono::seconds(30));
  EXPECT_TRUE(run.criu.exited);
  EXPECT_EQ(run.criu.code, 3);
  EXPECT_EQ(read_file(dir.path() / "out"), "oops\n");
  EXPECT_TRUE(process::wait_ended(run.init_pid, std::chrono::seconds(10)));

  try {
    process::run_in_new_pidns({"/bin/sleep", "600"}, {}, dir.path() / "out2",
                              std::chrono::seconds(1));
    FAIL() << "should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
  }
}

TEST(ProcessRecord, RoundTripsThroughTheManifestJson) {
  process::ProcessRecord r;
  r.pid = 1234;
  r.comm = "vllm";
  r.cmdline = {"python", "-m", "vllm"};
  r.shell_job = true;
  r.criu_version = "4.1.1";
  r.criu_args = {"dump", "-t", "1234"};
  r.cuda = true;
  r.gpu_uuids = {"GPU-1", "GPU-2"};
  r.timeline.add_measured("criu_dump", 1.5, 100);
  const auto back = process::from_extra(process::to_extra(r));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->pid, 1234);
  EXPECT_EQ(back->comm, "vllm");
  EXPECT_EQ(back->cmdline, r.cmdline);
  EXPECT_TRUE(back->shell_job);
  EXPECT_EQ(back->criu_version, "4.1.1");
  EXPECT_EQ(back->criu_args, r.criu_args);
  EXPECT_TRUE(back->cuda);
  EXPECT_EQ(back->gpu_uuids, r.gpu_uuids);
  EXPECT_FALSE(process::from_extra(nullptr).has_value());
  EXPECT_FALSE(process::from_extra({{"other", 1}}).has_value());
  try {
    process::from_extra({{"process", {{"pid", "x"}}}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kCorrupt);
  }
}

TEST(Stages, PluginHooksLandExactlyAndCriuStatsInsideTheCriuRun) {
  using Clock = Timeline::Clock;
  Timeline tl;
  criu::Run run;
  run.start = tl.origin() + std::chrono::milliseconds(100);
  run.end = run.start + std::chrono::seconds(2);
  auto ns = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  criu::PluginReport rep;
  rep.hooks.push_back({"device_lock", 1, ns(run.start + std::chrono::milliseconds(10)),
                       ns(run.start + std::chrono::milliseconds(30)), true, true, ""});
  rep.hooks.push_back({"device_checkpoint", 1, ns(run.start + std::chrono::milliseconds(50)),
                       ns(run.start + std::chrono::milliseconds(80)), true, true, ""});
  criu::DumpStats st;
  st.freezing_us = 40000;
  st.frozen_us = 1500000;
  st.memdump_us = 300000;
  st.memwrite_us = 200000;
  st.pages_written = 1000;
  process::add_dump_stages(tl, run, 5000, st, rep);

  const Stage* lock = tl.find("device_lock");
  ASSERT_NE(lock, nullptr);
  EXPECT_NEAR(lock->start_offset, 0.110, 1e-6);
  EXPECT_NEAR(lock->seconds, 0.020, 1e-6);
  const Stage* freeze = tl.find("freeze");
  ASSERT_NE(freeze, nullptr);
  EXPECT_NEAR(freeze->start_offset, lock->start_offset, 1e-6);  // PAUSE_DEVICES opens it
  EXPECT_NEAR(freeze->seconds, 0.040, 1e-6);
  EXPECT_NEAR(tl.find("frozen")->start_offset, 0.150, 1e-6);
  EXPECT_NEAR(tl.find("frozen")->seconds, 1.5, 1e-6);
  const Stage* memdump = tl.find("criu_memdump");
  EXPECT_GE(memdump->start_offset, tl.find("device_checkpoint")->start_offset + 0.030 - 1e-6);
  EXPECT_EQ(memdump->bytes, 1000u * 4096);
  // memwrite is timed inside memdump: it ends with it.
  EXPECT_NEAR(tl.find("criu_memwrite")->start_offset + 0.2, memdump->start_offset + 0.3, 1e-6);
  EXPECT_EQ(tl.find("criu_dump")->bytes, 5000u);
  EXPECT_NEAR(tl.find("criu_dump")->seconds, 2.0, 1e-6);

  // Without plugin or stats: the criu run alone.
  Timeline bare;
  process::add_dump_stages(bare, run, 1, std::nullopt, std::nullopt);
  ASSERT_EQ(bare.stages().size(), 1u);
  EXPECT_EQ(bare.stages()[0].name, "criu_dump");
}

// As measured on an H200: a front without CUDA and two CUDA workers. The front's hooks had
// nothing to do; only where cuInit was paid is kept of them.
TEST(Stages, ATreesTimelineNamesTheDeviceStagesOfOnlyItsCudaProcesses) {
  Timeline tl;
  criu::Run run;
  run.start = tl.origin();
  run.end = run.start + std::chrono::seconds(1);
  const auto t0 =
      std::chrono::duration_cast<std::chrono::nanoseconds>(run.start.time_since_epoch()).count();
  auto hook = [&](const char* name, pid_t pid, int ms, bool skipped) {
    return criu::PluginHook{name,    pid, t0 + ms * 1000000LL, t0 + (ms + 1) * 1000000LL, true,
                            skipped, ""};
  };
  criu::PluginReport gpu;
  gpu.hooks = {hook("cuda_init", 10, 1, false),         hook("device_lock", 10, 1, true),
               hook("device_lock", 11, 3, false),       hook("device_lock", 12, 5, false),
               hook("device_checkpoint", 10, 7, true),  hook("device_checkpoint", 11, 9, false),
               hook("device_checkpoint", 12, 11, false)};
  gpu.cuda = true;
  gpu.cuda_pids = {11, 12};
  process::add_dump_stages(tl, run, 1, std::nullopt, gpu);
  EXPECT_NE(tl.find("cuda_init@10"), nullptr);
  for (const char* s :
       {"device_lock@11", "device_lock@12", "device_checkpoint@11", "device_checkpoint@12"})
    EXPECT_NE(tl.find(s), nullptr) << s;
  EXPECT_EQ(tl.find("device_lock@10"), nullptr);
  EXPECT_EQ(tl.find("device_checkpoint@10"), nullptr);

  // Without CUDA anywhere, every process's (skipped) hooks stay: the table still shows that
  // the device steps cost nothing.
  Timeline cpu;
  criu::PluginReport none;
  none.hooks = {hook("device_lock", 10, 1, true), hook("device_lock", 11, 3, true)};
  process::add_dump_stages(cpu, run, 1, std::nullopt, none);
  EXPECT_NE(cpu.find("device_lock@10"), nullptr);
  EXPECT_NE(cpu.find("device_lock@11"), nullptr);
}

TEST(Spawn, AChildWhoseBeforeExecHookThrowsRunsNothing) {
  auto dir = test::scratch_dir();
  const fs::path ran = dir.path() / "ran";
  const std::vector<std::string> argv{"sh", "-c", "touch " + ran.string()};
  SpawnOptions so;
  pid_t seen = 0;
  so.before_exec = [&](pid_t pid) {
    seen = pid;
    throw Error(Errc::kProcess, "not now");
  };
  EXPECT_THROW(spawn(argv, so), Error);
  EXPECT_GT(seen, 0);
  EXPECT_FALSE(fs::exists(ran)) << "the child ran although its hook refused";
  EXPECT_NE(::kill(seen, 0), 0) << "the refused child was not reaped";

  // A hook that returns lets it run, and saw its pid first.
  so.before_exec = [&](pid_t pid) { seen = pid; };
  Child c = spawn(argv, so);
  EXPECT_EQ(seen, c.pid());
  EXPECT_TRUE(c.wait().ok());
  EXPECT_TRUE(fs::exists(ran));
}

TEST(Guard, AfterAnInterruptNothingMoreIsProtectedOrStarted) {
  // The interrupt thread aborts the guard while the operation goes on: the operation's next
  // step (protect a tree, start criu) must fail, not run unguarded (a criu started then would
  // freeze the service after the guard had recovered, and leave it stopped).
  process::Guard g("dump");
  EXPECT_NE(g.abort().find("nothing"), std::string::npos);
  EXPECT_FALSE(g.armed());
  EXPECT_THROW(g.protect(::getpid()), Error);
  auto dir = test::scratch_dir();
  const fs::path ran = dir.path() / "criu-ran";
  SpawnOptions so;
  so.before_exec = [&](pid_t pid) { g.criu_started(pid); };
  EXPECT_THROW(spawn({"sh", "-c", "touch " + ran.string()}, so), Error);
  EXPECT_FALSE(fs::exists(ran));
  g.disarm();  // after an abort: nothing to do, and no throw
}

// A tree's locks go to the guard in messages of at most kMaxFdsPerMessage: every one of them
// must arrive, and go (their files with them) once the operation is done.
TEST(Guard, HoldsEveryLockItIsPassedBeyondOneMessagesWorth) {
  auto dir = test::scratch_dir();
  std::vector<process::HeldLockFile> locks;
  std::set<std::string> names;
  for (std::size_t i = 0; i < kMaxFdsPerMessage + 50; ++i) {
    const fs::path p = dir.path() / ("lock-" + std::to_string(i));
    UniqueFd fd(::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd);
    ASSERT_EQ(::flock(fd.get(), LOCK_EX | LOCK_NB), 0);
    names.insert(p.string());
    locks.emplace_back(p, std::move(fd));
  }
  process::Guard g("dump");
  g.hold_locks(std::move(locks));
  const fs::path fds = "/proc/" + std::to_string(g.pid()) + "/fd";
  const auto held = [&] {
    std::size_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fds, ec))
      if (names.count(fs::read_symlink(e.path(), ec).string())) ++n;
    return n;
  };
  EXPECT_TRUE(test::wait_until([&] { return held() == names.size(); }))
      << "the guard holds " << held() << " of " << names.size();
  g.disarm();
  for (const auto& n : names) EXPECT_FALSE(fs::exists(n)) << n;
}

TEST(Guard, KeepsTheSpoolItMayRestoreFromAfterItsGpuckptIsGone) {
  // A release-handoff migration over ssh: the original has ended and lives only in the spool's
  // checkpoint. If gpuckpt dies, the guard restores it from there, so no other run's sweep may
  // take the spool once gpuckpt's own lock is gone.
  auto parent = test::scratch_dir();
  TempDir spool(parent.path(), "gpuckpt-dump-spool");
  struct stat st {};
  ASSERT_EQ(::stat(spool.path().c_str(), &st), 0);
  process::Guard g("migrate");
  g.restore_on_recovery(spool.path() / "checkpoint", parent.path(), "/bin/false");
  const std::string by_guard = " " + std::to_string(g.pid()) + " ";
  const std::string on_spool = ":" + std::to_string(st.st_ino) + " ";
  EXPECT_TRUE(test::wait_until([&] {
    std::ifstream in("/proc/locks");
    for (std::string line; std::getline(in, line);)
      if (line.find(by_guard) != std::string::npos && line.find(on_spool) != std::string::npos)
        return true;
    return false;
  })) << "the guard never held the spool";
  const fs::path path = spool.release();  // as if gpuckpt had died: its lock is gone
  EXPECT_TRUE(remove_abandoned(parent.path(), {"gpuckpt-dump-spool-"}).empty());
  EXPECT_TRUE(fs::is_directory(path)) << "the spool was swept under the guard";
  g.disarm();
  // With the guard gone too, it is what a killed run left.
  EXPECT_TRUE(test::wait_until(
      [&] { return !remove_abandoned(parent.path(), {"gpuckpt-dump-spool-"}).empty(); }));
  EXPECT_FALSE(fs::exists(path));
}

// The real gpuckpt-guard, as gpuckpt runs it: commands on its stdin (`to`), its "ready" and
// summary on its stdout (`from`).
struct RawGuard {
  Child child;
  UniqueFd to, from;
};
RawGuard spawn_guard(const std::vector<std::string>& args) {
  int down[2], up[2];
  if (::pipe2(down, O_CLOEXEC) != 0 || ::pipe2(up, O_CLOEXEC) != 0)
    throw Error(Errc::kIo, std::string("pipe2: ") + std::strerror(errno));
  UniqueFd down_r(down[0]), down_w(down[1]), up_r(up[0]), up_w(up[1]);
  SpawnOptions so;
  so.stdin_fd = down_r.get();
  so.stdout_fd = up_w.get();
  std::vector<std::string> argv{(test::bin_dir() / process::kGuardBinary).string()};
  argv.insert(argv.end(), args.begin(), args.end());
  Child c = spawn(argv, so);
  return {std::move(c), std::move(down_w), std::move(up_r)};
}

// The guard acts on a protected pid only while it names the process it was told of (same start
// tick): a migration's original ends once handed over, and a recovery then (gpuckpt killed
// before it disarmed) must not kill whatever took that pid since. A wrong tick stands in for the
// reuse, which a test cannot bring about on purpose.
TEST(Guard, ARecoveryLeavesAloneAProcessThatTookAProtectedPid) {
  for (const bool same_process : {false, true}) {
    SCOPED_TRACE(same_process ? "the protected process" : "another process with its pid");
    Child victim = spawn({"sleep", "600"});
    const auto ticks = process::start_ticks(victim.pid());
    ASSERT_TRUE(ticks.has_value());
    auto [guard, down_w, up_r] = spawn_guard({"--operation", "migrate"});
    const std::uint64_t told = same_process ? *ticks : *ticks + 1;
    const std::string plan = nlohmann::json{{"op", "protect"},
                                            {"root", victim.pid()},
                                            {"pids", {victim.pid()}},
                                            {"started", {{victim.pid(), told}}}}
                                 .dump() +
                             "\n" + nlohmann::json{{"op", "hand_over"}, {"end", true}}.dump() +
                             "\n" + nlohmann::json{{"op", "abort"}}.dump() + "\n";
    ASSERT_EQ(::write(down_w.get(), plan.data(), plan.size()), static_cast<ssize_t>(plan.size()));
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(up_r.get(), buf, sizeof buf)) > 0;) out.append(buf, n);
    EXPECT_TRUE(guard.wait().ok()) << out;
    EXPECT_NE(out.find("ready"), std::string::npos) << out;
    if (same_process) {
      EXPECT_NE(out.find("ended as planned"), std::string::npos) << out;
      const ExitStatus st = victim.wait();
      EXPECT_FALSE(st.exited);
      EXPECT_EQ(st.code, SIGKILL);
    } else {
      EXPECT_NE(out.find(process::kNothingToUndo), std::string::npos) << out;
      EXPECT_TRUE(process::alive(victim.pid())) << "a process that took a protected pid was killed";
      victim.kill(SIGKILL);
      victim.wait();
    }
  }
}

// A dump's CRIU plugin locks a task's CUDA state before gpuckpt learns of it (only once criu
// has finished), so a gpuckpt killed in between would leave the task resumed with its VRAM in
// host memory, every CUDA call of it blocked. The guard reads the plugin's report and gives
// the state of the tasks it names back as it resumes them; the others it only resumes. The
// driver's side runs in scripts/gpu-check.sh; here, without one, the summary says why that
// task's state could not be given back.
TEST(Guard, GivesBackTheCudaStateOfTheTasksTheDumpsPluginLocked) {
  if (device::checkpoint_api_available())
    GTEST_SKIP() << "a CUDA driver is here: scripts/gpu-check.sh ('dump killed') checks this "
                    "with a real GPU";
  auto dir = test::scratch_dir();
  Child locked = spawn({"sleep", "600"}), other = spawn({"sleep", "600"});
  for (const Child* c : {&locked, &other}) {
    ASSERT_EQ(::kill(c->pid(), SIGSTOP), 0);
    ASSERT_TRUE(test::wait_until([&] { return test::process_state(c->pid()) == 'T'; }));
  }
  criu::PluginReport report;
  report.stage = "dump";
  report.locked_pids = {locked.pid()};
  const fs::path path = dir.path() / criu::kDumpReportName;
  write_file_atomic(path, criu::to_json_text(report));
  std::string summary;
  {
    process::Guard g("dump");
    g.protect(locked.pid());
    g.protect(other.pid());
    g.cuda_report(path);
    summary = g.abort();
  }
  const auto said = [&](const Child& c) {
    return summary.find("process " + std::to_string(c.pid()) +
                        " runs but its CUDA state could not be given back: ") != std::string::npos;
  };
  EXPECT_TRUE(said(locked)) << summary;
  EXPECT_FALSE(said(other)) << summary;
  for (Child* c : {&locked, &other}) {
    EXPECT_TRUE(test::runs_again(c->pid())) << "left stopped: " << summary;
    c->kill(SIGKILL);
    c->wait();
  }
}

// A socket path a restore takes over is moved aside (the same entry) and put back by a
// rollback. An entry of that name that a dead run left (a directory here, which no rename can
// replace) is neither replaced nor what comes back; a path that cannot be moved stops the
// restore; and after an interrupt's abort nothing more is moved, for the rollback that already
// ran would not put it back.
TEST(Guard, PutsBackTheVeryEntryItMovedAsideAndMovesNothingAfterAnAbort) {
  auto dir = test::scratch_dir();
  const fs::path path = dir.path() / "s.sock", stale = dir.path() / ".s.sock.aside";
  const UniqueFd sk = test::unix_listener(path);
  struct stat before {};
  ASSERT_EQ(::lstat(path.c_str(), &before), 0);
  fs::create_directory(stale);

  process::Guard g("restore");
  const fs::path aside = g.move_aside(path, stale.filename().string());
  EXPECT_NE(aside, stale);
  EXPECT_EQ(aside.parent_path(), path.parent_path());
  EXPECT_FALSE(fs::exists(fs::symlink_status(path)));
  EXPECT_TRUE(fs::is_directory(stale)) << "the stale entry was replaced";
  EXPECT_THROW(g.move_aside(dir.path() / "none.sock", "x"), Error);
  g.abort();
  struct stat after {};
  ASSERT_EQ(::lstat(path.c_str(), &after), 0) << "the path was not put back";
  EXPECT_TRUE(S_ISSOCK(after.st_mode));
  EXPECT_EQ(after.st_ino, before.st_ino) << "another entry came back, not the socket's";
  EXPECT_FALSE(fs::exists(fs::symlink_status(aside)));
  EXPECT_TRUE(fs::is_directory(stale));

  EXPECT_THROW(g.move_aside(path, "y"), Error);
  EXPECT_TRUE(fs::exists(fs::symlink_status(path))) << "moved after the rollback had run";
}

namespace {

// The first lines of a journal as a killed gpuckpt (pid `gpuckpt`) leaves it, written in the
// boot `boot_id` and in this pid namespace: its header, then its guard's protect of `root`
// (started at `ticks`).
std::string journal_head(const std::string& operation, pid_t gpuckpt, const std::string& boot_id,
                         pid_t root, std::uint64_t ticks) {
  std::error_code ec;
  const std::string pidns = fs::read_symlink("/proc/self/ns/pid", ec).string();
  return nlohmann::json{{"gpuckpt_journal", 1}, {"operation", operation}, {"pid", gpuckpt},
                        {"started", "T0"},      {"boot_id", boot_id},     {"pidns", pidns}}
             .dump() +
         "\n" +
         nlohmann::json{
             {"op", "protect"}, {"root", root}, {"pids", {root}}, {"started", {{root, ticks}}}}
             .dump() +
         "\n";
}

// Stops `victim` as a dump that was killed leaves it, and gives its start ticks: the process a
// journal's protect names. Fatal failures: call it in ASSERT_NO_FATAL_FAILURE.
void stop_victim(const Child& victim, std::uint64_t& ticks) {
  ASSERT_EQ(::kill(victim.pid(), SIGSTOP), 0);
  ASSERT_TRUE(test::wait_until([&] { return test::process_state(victim.pid()) == 'T'; }));
  const auto t = process::start_ticks(victim.pid());
  ASSERT_TRUE(t.has_value());
  ticks = *t;
}

std::string this_boot() {
  std::string boot = read_file("/proc/sys/kernel/random/boot_id");
  boot.erase(boot.find_last_not_of('\n') + 1);
  return boot;
}

}  // namespace

// A line of a journal that names no command gpuckpt knows, or one with its fields wrong, was
// dropped without a word, so a recovery plan quietly shrank and "undone" was reported in full.
// The rest is still undone; the recovery says it read less than was written.
TEST(Journal, ALineItCannotReadIsNamedAndTheRecoveryIsNotCalledComplete) {
  auto dir = test::scratch_dir();
  const fs::path run = dir.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());
  Child victim = spawn({"sleep", "600"});
  std::uint64_t ticks = 0;
  ASSERT_NO_FATAL_FAILURE(stop_victim(victim, ticks));
  fs::create_directories(run);
  {
    std::ofstream out(run / ".dump-1234.journal-0123456789abcdef");
    out << journal_head("dump", 1234, this_boot(), victim.pid(), ticks);
    out << nlohmann::json{{"op", "frobnicate"}}.dump() << "\n";
    out << nlohmann::json{{"op", "remove"}, {"path", 7}}.dump() << "\n";
  }
  const auto done = recover_abandoned_operations();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(test::wait_until([&] { return test::process_state(victim.pid()) != 'T'; }))
      << "what it could read was not undone";
  ASSERT_EQ(done[0].failures.size(), 2u) << done[0].summary;
  EXPECT_EQ(done[0].failures[0].code, Errc::kCorrupt);
  EXPECT_NE(done[0].failures[0].what.find("unknown command 'frobnicate'"), std::string::npos)
      << done[0].failures[0].what;
  EXPECT_NE(done[0].failures[1].what.find("command 'remove' is malformed"), std::string::npos)
      << done[0].failures[1].what;
  EXPECT_NE(done[0].summary.find("was not read"), std::string::npos) << done[0].summary;
  victim.kill(SIGKILL);
  victim.wait();
}

// A rootfs that a restore unpacked for its copy (copy_path) goes with the copy when gpuckpt and
// its guard died: only the very directory it made (a path that holds another one now is left),
// not once the copy was kept, and not while another restore of the same checkpoint, which took
// it meanwhile, holds it.
TEST(Journal, AReplayRemovesTheRootfsMadeForTheCopyOnlyIfItIsStillThatDirectory) {
  auto dir = test::scratch_dir();
  const fs::path run = dir.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());
  Child victim = spawn({"sleep", "600"});
  std::uint64_t ticks = 0;
  ASSERT_NO_FATAL_FAILURE(stop_victim(victim, ticks));
  const fs::path made = dir.path() / "made", other = dir.path() / "other",
                 kept = dir.path() / "kept", taken = dir.path() / "taken";
  for (const auto& d : {made, other, kept, taken}) fs::create_directories(d / "etc");
  auto line = [](const fs::path& p, const container::DirIdentity& id) {
    return nlohmann::json{{"op", "copy_path"},
                          {"path", p.string()},
                          {"dev", id.dev},
                          {"ino", id.ino},
                          {"btime_ns", id.btime_ns}}
               .dump() +
           "\n";
  };
  const auto made_id = container::dir_identity(made.string()),
             other_id = container::dir_identity(other.string()),
             kept_id = container::dir_identity(kept.string()),
             taken_id = container::dir_identity(taken.string());
  ASSERT_TRUE(made_id && other_id && kept_id && taken_id);
  fs::create_directories(run);
  {
    std::ofstream out(run / ".restore-1234.journal-0123456789abcdef");
    out << journal_head("restore", 1234, this_boot(), victim.pid(), ticks);
    // An earlier copy, kept: the commit keeps what was made for it.
    out << line(kept, *kept_id) << nlohmann::json{{"op", "keep_copy"}}.dump() << "\n";
    out << line(made, *made_id);
    // Made once, then replaced by another directory under the same name.
    out << line(other, container::DirIdentity{other_id->dev, other_id->ino + 1, 0});
    out << line(taken, *taken_id);
  }
  // Another restore runs on `taken`, its container not running yet. (flock's locks are those of
  // an open file, so this process's own hold keeps the recovery's open of it out too.)
  container::RootfsHold held = container::hold_rootfs(taken);
  ASSERT_TRUE(held);
  const auto done = recover_abandoned_operations();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].failures.empty()) << done[0].summary;
  EXPECT_FALSE(fs::exists(made)) << done[0].summary;
  EXPECT_NE(done[0].summary.find("removed " + made.string() + ", made for the copy"),
            std::string::npos)
      << done[0].summary;
  EXPECT_TRUE(fs::exists(other / "etc"));
  EXPECT_TRUE(fs::exists(kept / "etc"));
  EXPECT_TRUE(fs::exists(taken / "etc"));
  EXPECT_NE(
      done[0].summary.find(taken.string() + ", made for the copy, was left: another restore of its "
                                            "checkpoint runs on it"),
      std::string::npos)
      << done[0].summary;
  // Once that restore has ended without its container, the rootfs goes.
  held.reset();
  EXPECT_EQ(container::remove_unused_rootfs(taken, {}), "");
  EXPECT_FALSE(fs::exists(taken));
  victim.kill(SIGKILL);
  victim.wait();
}

// The journal covers gpuckpt and its guard killed together. What the next run undoes is only
// what nobody still holds (a live gpuckpt or guard recovers its own), only what was written in
// this boot (the pids of an earlier one name other processes), and only from a directory this
// user alone can write (a journal planted by anyone else would have root signal and rename what
// it names).
TEST(Journal, OnlyAnUnheldJournalOfThisBootInADirectoryOfOursAloneIsUndone) {
  auto dir = test::scratch_dir();
  const fs::path run = dir.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());
  Child victim = spawn({"sleep", "600"});
  std::uint64_t ticks = 0;
  ASSERT_NO_FATAL_FAILURE(stop_victim(victim, ticks));
  const std::string boot = this_boot();

  // A journal as a killed gpuckpt (pid 1234) leaves it: its header, then what it told its guard.
  auto write_journal = [&](const std::string& boot_id, const fs::path& cuda_report = {}) {
    fs::create_directories(run);
    const fs::path p = run / ".dump-1234.journal-0123456789abcdef";
    std::ofstream out(p);
    out << journal_head("dump", 1234, boot_id, victim.pid(), ticks);
    if (!cuda_report.empty())
      out << nlohmann::json{{"op", "cuda_report"}, {"path", cuda_report.string()}}.dump() << "\n";
    out << "{\"op\":\"durab";  // cut short by the kill
    return p;
  };
  auto frozen = [&] { return test::process_state(victim.pid()) == 'T'; };

  // Of an earlier boot: removed unread.
  fs::path j = write_journal("another-boot");
  EXPECT_TRUE(recover_abandoned_operations().empty());
  EXPECT_FALSE(fs::exists(j));
  EXPECT_TRUE(frozen());

  // In a directory others may write: not read, not removed.
  j = write_journal(boot);
  fs::permissions(run, fs::perms::all);
  EXPECT_TRUE(recover_abandoned_operations().empty());
  EXPECT_TRUE(fs::exists(j));
  EXPECT_TRUE(frozen());
  fs::permissions(run, fs::perms::owner_all);

  // Held, as by a live gpuckpt: left to it.
  {
    const UniqueFd held = process::hold_journal(j);
    ASSERT_TRUE(held);
    EXPECT_TRUE(recover_abandoned_operations().empty());
    EXPECT_TRUE(fs::exists(j));
    EXPECT_TRUE(frozen());
  }
  // Held by a live guard alone (its gpuckpt gone): left to it, and removed by it once the
  // operation is over.
  {
    auto [guard, down_w, up_r] = spawn_guard({"--operation", "dump", "--journal", j.string()});
    char ready[6] = {};
    ASSERT_EQ(::read(up_r.get(), ready, 6), 6);
    EXPECT_TRUE(recover_abandoned_operations().empty()) << "recovered under a live guard";
    EXPECT_TRUE(frozen());
    ASSERT_EQ(::write(down_w.get(), "{\"op\":\"done\"}\n", 14), 14);
    EXPECT_TRUE(guard.wait().ok());
    EXPECT_FALSE(fs::exists(j)) << "the guard left the journal of an operation that is over";
    EXPECT_TRUE(frozen());
  }
  j = write_journal(boot);

  // Nobody holds it: undone once, and gone.
  const auto done = recover_abandoned_operations();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].operation, "dump");
  EXPECT_EQ(done[0].gpuckpt_pid, 1234);
  EXPECT_EQ(done[0].summary, "process " + std::to_string(victim.pid()) + " was resumed");
  EXPECT_TRUE(done[0].failures.empty());
  EXPECT_TRUE(test::wait_until([&] { return !frozen(); })) << "the process was left frozen";
  EXPECT_FALSE(fs::exists(j));
  EXPECT_TRUE(recover_abandoned_operations().empty());

  // Its process runs again (resumed by someone since the kill): nothing is done to it, nor to
  // anything else the journal names, for that would take a running service down.
  j = write_journal(boot);
  const auto left = recover_abandoned_operations();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_NE(left[0].summary.find("runs again since gpuckpt was killed, so nothing was undone"),
            std::string::npos)
      << left[0].summary;
  EXPECT_FALSE(fs::exists(j));
  EXPECT_TRUE(process::alive(victim.pid()));

  // Except the CUDA state its dump's plugin locked: a tree resumed because criu died with
  // gpuckpt would serve frozen on the GPU. Without a driver here, the summary says why it could
  // not be given back; the rest is left as it is.
  const fs::path images = dir.path() / "gpuckpt-dump-x" / "images";
  fs::create_directories(images);
  criu::PluginReport report;
  report.stage = "dump";
  report.locked_pids = {victim.pid()};
  write_file_atomic(images / criu::kDumpReportName, criu::to_json_text(report));
  j = write_journal(boot, images / criu::kDumpReportName);
  const auto cuda = recover_abandoned_operations();
  ASSERT_EQ(cuda.size(), 1u);
  // (With a driver, `sleep` has no CUDA state, and nothing is said of it.)
  const bool driver = device::checkpoint_api_available();
  EXPECT_EQ(cuda[0].summary.find("process " + std::to_string(victim.pid()) +
                                 " runs but its CUDA state could not be given back: ") !=
                std::string::npos,
            !driver)
      << cuda[0].summary;
  EXPECT_NE(cuda[0].summary.find(driver ? "so nothing was undone" : "so nothing else was undone"),
            std::string::npos)
      << cuda[0].summary;
  // A state not given back is a failure of the recovery, not only a line of its summary.
  ASSERT_EQ(cuda[0].failures.size(), driver ? 0u : 1u);
  if (!driver) {
    EXPECT_NE(cuda[0].failures[0].code, Errc::kOk);
  }
  EXPECT_TRUE(process::alive(victim.pid()));
  victim.kill(SIGKILL);
  victim.wait();
}

// A failover script reads `gpuckpt recover`'s exit status. A migration killed with its guard
// after the original had ended is undone by restoring the original from the checkpoint; when
// that restore fails, the service is down, and recover must not exit 0 as if it were back.
TEST(Journal, ARecoveryThatCannotRestoreTheOriginalFailsWithTheRestoresCode) {
  auto dir = test::scratch_dir();
  const fs::path run = dir.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());
  Child original = spawn({"true"});
  ASSERT_TRUE(original.wait().ok());  // ended, as a migration ends it once its copy answers
  fs::create_directories(run);
  const fs::path j = run / ".migrate-4321.journal-0123456789abcdef";
  const fs::path checkpoint = dir.path() / "gone.ckpt";  // removed since, by someone
  auto write_journal = [&] {
    std::ofstream out(j);
    // The original's start tick is not the one it had: it has ended.
    out << journal_head("migrate", 4321, this_boot(), original.pid(), 1)
        << nlohmann::json{{"op", "restore_from"},
                          {"checkpoint", checkpoint.string()},
                          {"staging", (dir.path() / "staging").string()},
                          {"criu", "criu"}}
               .dump()
        << "\n";
  };
  write_journal();
  const auto r = test::run_cli({"--json", "recover"});
  const auto out = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.out << r.err;
  EXPECT_EQ(out["ok"], false);
  ASSERT_EQ(out["recovered"].size(), 1u) << r.out;
  const auto& op = out["recovered"][0];
  EXPECT_EQ(op["operation"], "migrate");
  EXPECT_EQ(op["complete"], false);
  ASSERT_EQ(op["failures"].size(), 1u) << r.out;
  EXPECT_NE(op["failures"][0]["message"].get<std::string>().find(
                "restore it by hand: gpuckpt restore " + checkpoint.string()),
            std::string::npos)
      << r.out;
  // The exit status is the failed restore's own code, named in the JSON as every error is.
  EXPECT_EQ(out["error"]["code"], op["failures"][0]["code"]);
  EXPECT_EQ(out["error"]["code"], std::string(errc_name(Errc::kInvalidInput))) << r.out;
  EXPECT_EQ(r.exit_code, static_cast<int>(Errc::kInvalidInput)) << r.err;
  // Said once: a later run does not fail again on a restore left to the operator.
  EXPECT_FALSE(fs::exists(j));
  EXPECT_EQ(test::run_cli({"recover"}).exit_code, 0);

  // Without --json: the same status, and why on stderr.
  write_journal();
  const auto text = test::run_cli({"recover"});
  EXPECT_EQ(text.exit_code, static_cast<int>(Errc::kInvalidInput)) << text.err;
  EXPECT_NE(text.err.find("not everything could be undone: restoring the original from " +
                          checkpoint.string() + " failed"),
            std::string::npos)
      << text.err;
}

// A guarded operation keeps its journal for as long as it runs, held by gpuckpt and by its
// guard, each of which alone keeps a later run from recovering it, and removes it once it is
// over, done or undone.
TEST(Journal, IsHeldByGpuckptAndItsGuardAndGoesWithTheOperation) {
  auto dir = test::scratch_dir();
  const fs::path run = dir.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());
  auto journals = [&] {
    std::vector<fs::path> v;
    for (const auto& e : fs::directory_iterator(run)) v.push_back(e.path());
    return v;
  };
  enum class End { kDone, kAbort, kGuardDies };
  for (const End end : {End::kDone, End::kAbort, End::kGuardDies}) {
    SCOPED_TRACE(static_cast<int>(end));
    Child victim = spawn({"sleep", "600"});
    {
      process::Guard g("dump");
      ASSERT_EQ(journals().size(), 1u);
      const fs::path j = journals().front();
      g.protect(victim.pid());
      ASSERT_EQ(::kill(victim.pid(), SIGSTOP), 0);
      EXPECT_NE(read_file(j).find("\"op\":\"protect\""), std::string::npos) << read_file(j);
      EXPECT_TRUE(recover_abandoned_operations().empty()) << "recovered while gpuckpt runs";
      if (end == End::kGuardDies) {
        ::kill(g.pid(), SIGKILL);
        ASSERT_TRUE(test::wait_until([&] { return test::process_state(g.pid()) == 'Z'; }));
        EXPECT_TRUE(recover_abandoned_operations().empty()) << "recovered while gpuckpt runs";
        EXPECT_TRUE(fs::exists(j));
      }
      if (end == End::kDone) {
        ::kill(victim.pid(), SIGCONT);
        g.disarm();
      } else {
        EXPECT_NE(g.abort().find("was resumed"), std::string::npos);
      }
      EXPECT_FALSE(fs::exists(j)) << "the journal outlived its operation";
    }
    EXPECT_TRUE(journals().empty());
    EXPECT_TRUE(test::wait_until([&] { return test::process_state(victim.pid()) != 'T'; }));
    victim.kill(SIGKILL);
    victim.wait();
  }
}

TEST(EndTree, EndsEveryProcessRunningOrStoppedAndCountsOneThatHadEndedAsEnded) {
  Child running = spawn({"sleep", "600"});
  Child stopped = spawn({"sleep", "600"});
  ASSERT_EQ(::kill(stopped.pid(), SIGSTOP), 0);  // as a dumped tree is when it is ended
  ASSERT_TRUE(test::wait_until([&] { return test::process_state(stopped.pid()) == 'T'; }));
  Child ended = spawn({"true"});
  siginfo_t info{};  // a zombie until wait() below: its pid cannot name anything else meanwhile
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(ended.pid()), &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(process::end_tree({running.pid(), stopped.pid(), ended.pid()}, 20000).empty());
  EXPECT_FALSE(process::alive(running.pid()));
  EXPECT_FALSE(process::alive(stopped.pid()));
  for (Child* c : {&running, &stopped}) {
    const ExitStatus st = c->wait();
    EXPECT_FALSE(st.exited);
    EXPECT_EQ(st.code, SIGKILL);
  }
  EXPECT_TRUE(ended.wait().ok());
}

// A graceful stop (stop_restored, `bench restore`): every process gets SIGTERM first, and only
// one that is still there after the grace gets SIGKILL.
TEST(EndTree, WithAGraceEveryProcessGetsSigtermAndOnlyOneThatIgnoresItIsKilled) {
  const TempDir dir = test::scratch_dir();
  const auto ready = dir.path() / "ready";
  Child polite = spawn({"sleep", "600"});
  Child stubborn = spawn({"python3", "-c",
                          "import signal, sys, time\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "open(sys.argv[1], 'w').close()\n"
                          "time.sleep(600)\n",
                          ready.string()});
  ASSERT_TRUE(test::wait_until([&] { return std::filesystem::exists(ready); }));
  EXPECT_TRUE(
      process::end_tree({polite.pid(), stubborn.pid()}, 20000, std::chrono::milliseconds(300))
          .empty());
  const ExitStatus p = polite.wait(), s = stubborn.wait();
  EXPECT_FALSE(p.exited);
  EXPECT_EQ(p.code, SIGTERM);
  EXPECT_FALSE(s.exited);
  EXPECT_EQ(s.code, SIGKILL);
}

// A service's shutdown may start processes of its own (its SIGTERM handler here): they got no
// SIGTERM, and the SIGKILL of their parent would orphan them out of reach. end_tree stops what
// is still there after the grace, takes in what it started (passing over a zombie, which needs
// no signal), and kills all of it.
TEST(EndTree, WhatTheTreeStartsDuringTheGraceIsEndedWithIt) {
  const TempDir dir = test::scratch_dir();
  const auto ready = dir.path() / "ready", late = dir.path() / "late";
  Child service = spawn({"python3", "-c",
                         "import os, signal, sys, time\n"
                         "def stop(*_):\n"
                         "    if os.fork() == 0: os._exit(0)  # never reaped: a zombie\n"
                         "    pid = os.fork()\n"
                         "    if pid == 0: os.execvp('sleep', ['sleep', '600'])\n"
                         "    with open(sys.argv[1], 'w') as f: f.write(str(pid))\n"
                         "signal.signal(signal.SIGTERM, stop)\n"
                         "open(sys.argv[2], 'w').close()\n"
                         "while True: time.sleep(600)\n",
                         late.string(), ready.string()});
  ASSERT_TRUE(test::wait_until([&] { return std::filesystem::exists(ready); }));
  const std::vector<pid_t> tree = process::process_tree(service.pid());
  ASSERT_EQ(tree.size(), 1U);
  // The grace only has to outlast the handler's two forks, on a machine that may be slow.
  EXPECT_TRUE(process::end_tree(tree, 20000, std::chrono::seconds(10)).empty());
  const ExitStatus st = service.wait();
  EXPECT_FALSE(st.exited);
  EXPECT_EQ(st.code, SIGKILL);
  std::ifstream in(late);
  pid_t started = 0;
  ASSERT_TRUE(in >> started) << "the handler did not start its sleep within the grace";
  EXPECT_FALSE(process::alive(started)) << "the sleep the handler started outlived its parent";
}

// A later run undoes a killed migration long after the kill: a container of the copy's ID may
// be someone else's by then. The replay kills and deletes only the container whose init it was
// told (same start tick); one it cannot name so is left running, and the summary says so. The
// frozen original is resumed either way.
TEST(Journal, AReplayLeavesAContainerItCannotNameAsTheCopyItMade) {
  auto dir = test::scratch_dir();
  const fs::path run = dir.path() / "run";
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", run.string());
  Child original = spawn({"sleep", "600"});
  ASSERT_EQ(::kill(original.pid(), SIGSTOP), 0);
  ASSERT_TRUE(test::wait_until([&] { return test::process_state(original.pid()) == 'T'; }));
  Child other = spawn({"sleep", "600"});  // a container someone made since, under the copy's ID
  const auto ticks = process::start_ticks(original.pid());
  const auto other_ticks = process::start_ticks(other.pid());
  ASSERT_TRUE(ticks && other_ticks);
  // runc's state of it, as runc writes it under its root.
  const fs::path root = dir.path() / "runc-root";
  for (const char* id : {"told-init", "no-init"}) {
    fs::create_directories(root / id);
    std::ofstream(root / id / "state.json") << nlohmann::json{
        {"id", id},
        {"init_process_pid", other.pid()},
        {"init_process_start", *other_ticks}}.dump();
  }
  fs::create_directories(run);
  {
    std::ofstream out(run / ".migrate-1234.journal-0123456789abcdef");
    out << journal_head("migrate", 1234, this_boot(), original.pid(), *ticks);
    // The copy gpuckpt restored as told-init (its init then, another process than now), and one
    // whose restore it never saw end.
    out << nlohmann::json{{"op", "container"},
                          {"root", root.string()},
                          {"id", "told-init"},
                          {"after", 0},
                          {"kill", true}}
               .dump()
        << "\n"
        << nlohmann::json{{"op", "container_init"}, {"started", *other_ticks + 1}}.dump() << "\n"
        << nlohmann::json{{"op", "container"},
                          {"root", root.string()},
                          {"id", "no-init"},
                          {"after", 0},
                          {"kill", true}}
               .dump()
        << "\n";
  }
  const auto done = recover_abandoned_operations();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].failures.empty()) << done[0].summary;
  for (const char* id : {"told-init", "no-init"})
    EXPECT_NE(done[0].summary.find("container " + std::string(id) + " (runc root " + root.string() +
                                   ") is not the one this restore made"),
              std::string::npos)
        << done[0].summary;
  EXPECT_TRUE(process::alive(other.pid())) << "someone else's container was killed";
  EXPECT_TRUE(fs::exists(root / "told-init" / "state.json"));
  EXPECT_TRUE(test::wait_until([&] { return test::process_state(original.pid()) != 'T'; }))
      << "the original was left frozen";
  original.kill(SIGKILL);
  original.wait();
  other.kill(SIGKILL);
  other.wait();
}
