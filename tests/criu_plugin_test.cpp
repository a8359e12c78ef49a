// gpuckpt's CRIU plugin as a binary: criu (Debian 13's loader and libraries) dlopen()s it, so it
// must need nothing but libc and export nothing but CR_PLUGIN_DESC. That it is actually called
// during a dump and a restore is tested in criu_runner_test and e2e_process_test.
#include <cuda.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

fs::path plugin_path() {
  return fs::path(GPUCKPT_LIB_DIR) / "criu" / criu::kPluginFile;
}

std::string tool_output(const std::vector<std::string>& argv) {
  auto r = run_capture(argv, std::chrono::seconds(60));
  EXPECT_TRUE(r.status.ok()) << argv[0] << " failed";
  return r.output;
}

}  // namespace

TEST(CriuPlugin, IsBuiltIntoTheBuildTree) {
  ASSERT_TRUE(fs::exists(plugin_path()))
      << plugin_path()
      << " missing: criu-plugin.h was not found when cmake ran (run "
         "scripts/install-criu.sh, then re-run cmake)";
}

TEST(CriuPlugin, NeedsOnlyLibc) {
  ASSERT_TRUE(fs::exists(plugin_path()));
  const std::string dyn = tool_output({"readelf", "-d", plugin_path().string()});
  std::set<std::string> needed;
  std::regex re(R"(\(NEEDED\)\s+Shared library: \[([^\]]+)\])");
  for (std::sregex_iterator it(dyn.begin(), dyn.end(), re), end; it != end; ++it)
    needed.insert((*it)[1]);
  EXPECT_FALSE(needed.empty());
  // glibc's own libraries only (libm, libdl, libpthread are parts of glibc 2.34+).
  const std::set<std::string> allowed{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0",
                                      "ld-linux-x86-64.so.2"};
  for (const auto& n : needed) EXPECT_TRUE(allowed.count(n)) << "unexpected dependency " << n;
}

TEST(CriuPlugin, ExportsOnlyTheDescriptor) {
  ASSERT_TRUE(fs::exists(plugin_path()));
  const std::string syms = tool_output({"nm", "-D", "--defined-only", plugin_path().string()});
  std::istringstream in(syms);
  std::vector<std::string> exported;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string addr, type, name;
    if (f >> addr >> type >> name) exported.push_back(name);
  }
  EXPECT_EQ(exported, std::vector<std::string>{"CR_PLUGIN_DESC"});
  // The CRIU symbols it uses are resolved from criu at load time.
  const std::string undef = tool_output({"nm", "-D", "--undefined-only", plugin_path().string()});
  EXPECT_NE(undef.find("criu_get_image_dir"), std::string::npos);
  // Interrupt-only seizing (as CRIU's cuda plugin): referenced weakly, so that the plugin still
  // loads into a criu that lacks it.
  std::regex weak(R"(\bw\s+set_compel_interrupt_only_mode\b)");
  EXPECT_TRUE(std::regex_search(undef, weak)) << undef;
}

TEST(CriuPlugin, ReportRoundTrips) {
  criu::PluginReport r;
  r.stage = "restore";
  r.api_available = false;
  r.api_error = "no NVIDIA driver";
  r.gpu_map = "GPU-a=GPU-b";
  r.hooks.push_back({"device_restore", 42, 100, 250, true, false, ""});
  r.hooks.push_back({"unlock", 42, 260, 300, false, false, "CUDA_ERROR_ILLEGAL_STATE"});
  r.finished = true;
  r.driver_library = "/usr/local/nvidia/lib64/libcuda.so.580.65.06";
  r.cuinit_seconds = 1.5;
  r.interrupt_only = true;
  r.locked_pids = {42, 43};
  const auto back = criu::parse_plugin_report(criu::to_json_text(r));
  EXPECT_EQ(back.driver_library, r.driver_library);
  EXPECT_DOUBLE_EQ(back.cuinit_seconds, 1.5);
  EXPECT_TRUE(back.interrupt_only);
  EXPECT_EQ(back.locked_pids, (std::vector<pid_t>{42, 43}));
  EXPECT_EQ(back.stage, "restore");
  EXPECT_EQ(back.api_error, "no NVIDIA driver");
  EXPECT_EQ(back.gpu_map, "GPU-a=GPU-b");
  ASSERT_EQ(back.hooks.size(), 2u);
  EXPECT_EQ(back.hooks[0].start_ns, 100);
  EXPECT_DOUBLE_EQ(back.hooks[0].seconds(), 150e-9);
  EXPECT_FALSE(back.all_ok());
  EXPECT_NE(back.first_error().find("unlock (pid 42): CUDA_ERROR_ILLEGAL_STATE"),
            std::string::npos);
  EXPECT_THROW(criu::parse_plugin_report("{\"stage\": 1}"), Error);
  // Reports of plugins from before the driver fields still parse.
  const auto old = criu::parse_plugin_report(
      R"({"version": 1, "stage": "dump", "hooks": [], "finished": true})");
  EXPECT_EQ(old.driver_library, "");
  EXPECT_FALSE(old.interrupt_only);
  EXPECT_TRUE(old.locked_pids.empty());
}

// ---- the plugin inside a real criu: a task that needs the driver is never skipped ---------

namespace {

// As in criu_runner_test: nothing of the test runner's is inherited by a task CRIU dumps.
Child start_sleeper(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::stoi(e.path().filename().string());
    if (fd > 2) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  SpawnOptions o;
  o.new_session = true;
  o.stdout_file = dir / "sleeper.out";
  o.stderr_file = dir / "sleeper.err";
  return spawn({"sleep", "600"}, o);
}

criu::Installation installed_or_skip() {
  try {
    return criu::locate();
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
    throw;
  }
}

bool has_driver() {
  return device::checkpoint_api_available();
}

}  // namespace

TEST(CriuPluginHooks, DumpFailsForATaskHoldingTheGpuWithoutADriver) {
  if (has_driver()) GTEST_SKIP() << "a CUDA driver is present: the no-driver path is CI's";
  const auto inst = installed_or_skip();
  auto dir = test::scratch_dir("gpuckpt-plugin");
  Child sleeper = start_sleeper(dir.path());
  const pid_t pid = sleeper.pid();
  ASSERT_TRUE(test::wait_until(
      [&] { return device::holds_device_files(pid, (dir.path() / "sleeper.out").string()); }));
  const fs::path images = dir.path() / "images";
  fs::create_directory(images);
  criu::DumpArgs a;
  a.pid = pid;
  a.images_dir = images;
  a.final_state = criu::FinalState::kKilled;
  a.timeout = std::chrono::seconds(120);
  // Its stdout file stands for /dev/nvidia*: to the plugin, this task holds a GPU.
  a.env = {std::string(criu::kEnvTestDevicePrefix) + "=" + (dir.path() / "sleeper.out").string()};
  EXPECT_THROW(criu::dump(inst, a), Error);
  const auto rep = criu::read_plugin_report(images / criu::kDumpReportName);
  ASSERT_TRUE(rep.has_value());
  const auto* lock = rep->find("device_lock");
  ASSERT_NE(lock, nullptr);
  EXPECT_FALSE(lock->ok);
  EXPECT_FALSE(lock->skipped);
  EXPECT_NE(lock->error.find("has NVIDIA device files open"), std::string::npos) << lock->error;
  EXPECT_NE(lock->error.find("no NVIDIA GPU"), std::string::npos) << lock->error;
  EXPECT_NE(rep->find("cuda_init"), nullptr);  // the driver load was tried, and timed, once
  // criu resumed the task after the failed dump.
  EXPECT_TRUE(process::alive(pid));
  ::kill(pid, SIGKILL);
  sleeper.wait_for(std::chrono::seconds(10));
}

TEST(CriuPluginHooks, RestoreFailsTheHookForATaskRecordedWithCudaState) {
  if (has_driver()) GTEST_SKIP() << "a CUDA driver is present: the no-driver path is CI's";
  const auto inst = installed_or_skip();
  auto dir = test::scratch_dir("gpuckpt-plugin");
  Child sleeper = start_sleeper(dir.path());
  const pid_t pid = sleeper.pid();
  ASSERT_TRUE(test::wait_until([&] { return process::read_proc(pid)->comm == "sleep"; }));
  const fs::path images = dir.path() / "images";
  fs::create_directory(images);
  criu::DumpArgs a;
  a.pid = pid;
  a.images_dir = images;
  a.final_state = criu::FinalState::kKilled;
  a.timeout = std::chrono::seconds(120);
  criu::dump(inst, a);
  // Without a driver nothing held a GPU: skipped, and the driver was never loaded for it.
  const auto drep = criu::read_plugin_report(images / criu::kDumpReportName);
  ASSERT_TRUE(drep.has_value());
  ASSERT_NE(drep->find("device_lock"), nullptr);
  EXPECT_TRUE(drep->find("device_lock")->skipped);
  EXPECT_EQ(drep->find("cuda_init"), nullptr);
  sleeper.wait_for(std::chrono::seconds(10));

  // The checkpoint says this pid had CUDA state: a restore that cannot restore it must say so
  // (CRIU only logs a failed late hook; gpuckpt reads the report and kills the task).
  const fs::path report = dir.path() / "restore-report.json";
  criu::RestoreArgs r;
  r.images_dir = images;
  r.pidfile = dir.path() / "restore.pid";
  r.env = {std::string(criu::kEnvReport) + "=" + report.string(),
           std::string(criu::kEnvCudaPids) + "=" + std::to_string(pid)};
  r.timeout = std::chrono::seconds(120);
  try {
    criu::restore(inst, r);
  } catch (const Error&) {
    // a criu that fails the restore on the hook's error is as good
  }
  const auto rrep = criu::read_plugin_report(report);
  ASSERT_TRUE(rrep.has_value());
  const auto* h = rrep->find("device_restore");
  ASSERT_NE(h, nullptr);
  EXPECT_FALSE(h->ok);
  EXPECT_NE(h->error.find("was checkpointed with CUDA state"), std::string::npos) << h->error;
  EXPECT_FALSE(rrep->all_ok());
  ::kill(pid, SIGKILL);
  process::wait_ended(pid, std::chrono::seconds(10));
}

// ---- the plugin's device work inside a real criu, against the test driver -----------------
//
// tests/support/fake_cuda_driver.cpp stands in for libcuda here (these machines have no GPU):
// it enforces the driver's states and that a task's restore thread runs while the driver
// works, and logs each call. Whether the real driver's work is right is scripts/gpu-check.sh's.

namespace {

// Whether the hooks named `name` of every pid in `pids` ran at the same time: each started
// before every other one ended.
bool overlapped(const criu::PluginReport& r, const std::string& name,
                const std::vector<pid_t>& pids) {
  std::vector<const criu::PluginHook*> hs;
  for (const auto& h : r.hooks)
    if (h.name == name && std::find(pids.begin(), pids.end(), h.pid) != pids.end())
      hs.push_back(&h);
  if (hs.size() != pids.size()) return false;
  for (const auto* a : hs)
    for (const auto* b : hs)
      if (a != b && a->start_ns >= b->end_ns) return false;
  return true;
}

using test::FakeCudaCall;
using test::FakeCudaTree;
constexpr int kCheckpointed = CU_PROCESS_STATE_CHECKPOINTED;
constexpr int kRunning = CU_PROCESS_STATE_RUNNING;

// A dump of the whole tree into DIR/images (made here), killed once done, with the test
// driver's environment.
criu::DumpArgs dump_args(const FakeCudaTree& tree, int together) {
  criu::DumpArgs a;
  a.pid = tree.root.pid();
  a.images_dir = tree.dir.path() / "images";
  fs::create_directory(a.images_dir);
  a.final_state = criu::FinalState::kKilled;
  a.timeout = std::chrono::seconds(120);
  a.env = tree.env(together);
  return a;
}

}  // namespace

TEST(CriuPluginDevices, TheCudaTasksOfATreeAreCheckpointedAndRestoredTogether) {
  const auto inst = installed_or_skip();
  FakeCudaTree tree(3);
  ASSERT_EQ(tree.pids.size(), 3u);
  // The test driver holds every checkpoint call until three have arrived: one by one, the
  // first would time out and the dump fail.
  criu::DumpArgs a = dump_args(tree, 3);
  ASSERT_NO_THROW(criu::dump(inst, a));
  tree.root.wait_for(std::chrono::seconds(10));
  for (pid_t p : tree.pids) ASSERT_TRUE(FakeCudaTree::reap(p)) << p << " outlived its dump";
  const auto dump = criu::read_plugin_report((tree.dir.path() / "images") / criu::kDumpReportName);
  ASSERT_TRUE(dump.has_value());
  EXPECT_TRUE(dump->all_ok()) << dump->first_error();
  EXPECT_EQ(dump->together, 3);
  EXPECT_TRUE(overlapped(*dump, "device_checkpoint", tree.pids));
  EXPECT_EQ(std::set<pid_t>(dump->locked_pids.begin(), dump->locked_pids.end()),
            std::set<pid_t>(tree.pids.begin(), tree.pids.end()));
  for (pid_t p : tree.pids) EXPECT_EQ(tree.cuda_state(p), kCheckpointed) << p;

  // The restore: every task's device restore at once, then each unlocked, its restore thread
  // running again once criu lets the tree go.
  const fs::path report = tree.dir.path() / "restore-report.json";
  criu::RestoreArgs r;
  r.images_dir = (tree.dir.path() / "images");
  r.pidfile = tree.dir.path() / "restore.pid";
  r.env = tree.env(3);
  std::string pids;
  for (pid_t p : tree.pids) pids += (pids.empty() ? "" : ",") + std::to_string(p);
  r.env.push_back(std::string(criu::kEnvReport) + "=" + report.string());
  r.env.push_back(std::string(criu::kEnvCudaPids) + "=" + pids);
  r.timeout = std::chrono::seconds(120);
  // With gpuckpt's environment, a settings file among the images is not read at all.
  { std::ofstream((tree.dir.path() / "images") / criu::kEnvFileName) << "{ not json"; }
  ASSERT_NO_THROW(criu::restore(inst, r));
  const auto restored = criu::read_plugin_report(report);
  ASSERT_TRUE(restored.has_value());
  EXPECT_TRUE(restored->all_ok()) << restored->first_error();
  EXPECT_EQ(restored->together, 3);
  EXPECT_TRUE(overlapped(*restored, "device_restore", tree.pids));
  for (pid_t p : tree.pids) {
    EXPECT_EQ(tree.cuda_state(p), kRunning) << p;
    const pid_t tid = FakeCudaTree::restore_thread(p);
    ASSERT_NE(tid, 0) << p;
    EXPECT_TRUE(test::wait_until([&] {
      std::ifstream in("/proc/" + std::to_string(p) + "/task/" + std::to_string(tid) + "/stat");
      std::string stat;
      std::getline(in, stat);
      const auto close = stat.rfind(") ");
      return close != std::string::npos && (stat[close + 2] == 'S' || stat[close + 2] == 'R');
    })) << "the restore thread of "
        << p << " stays stopped";
  }
  const auto log = tree.calls();
  EXPECT_EQ(
      std::count_if(log.begin(), log.end(), [](const FakeCudaCall& c) { return c.result != 0; }),
      0);
  EXPECT_EQ(log.size(), 12u);  // lock, checkpoint, restore and unlock of each
}

TEST(CriuPluginDevices, ADeviceCheckpointThatFailsLeavesEveryTaskRunningUnlocked) {
  const auto inst = installed_or_skip();
  FakeCudaTree tree(2);
  ASSERT_EQ(tree.pids.size(), 2u);
  // One by one ($GPUCKPT_DEVICE_SERIAL), the first checkpoint waits for a second that never
  // comes, and fails.
  criu::DumpArgs a = dump_args(tree, 0);
  a.env.push_back("GPUCKPT_FAKE_CUDA_CHECKPOINTS_TOGETHER=2");
  a.env.push_back(std::string(criu::kEnvDeviceSerial) + "=1");
  a.env.push_back("GPUCKPT_FAKE_CUDA_WAIT_MS=300");
  EXPECT_THROW(criu::dump(inst, a), Error);
  const auto dump = criu::read_plugin_report((tree.dir.path() / "images") / criu::kDumpReportName);
  ASSERT_TRUE(dump.has_value());
  EXPECT_EQ(dump->together, 0);
  const auto* ckpt = dump->find("device_checkpoint");
  ASSERT_NE(ckpt, nullptr);
  EXPECT_FALSE(ckpt->ok);
  EXPECT_NE(ckpt->error.find("CUDA_ERROR_TIMEOUT"), std::string::npos) << ckpt->error;
  // criu resumed the tree, and the plugin gave each task its GPU back: none is left locked,
  // whose next CUDA call would block for good.
  for (pid_t p : tree.pids) {
    EXPECT_TRUE(test::runs_again(p)) << p;
    EXPECT_EQ(tree.cuda_state(p), kRunning) << p;
  }
  const auto log = tree.calls();
  EXPECT_EQ(
      std::count_if(log.begin(), log.end(), [](const FakeCudaCall& c) { return c.op == "unlock"; }),
      2);
}

TEST(CriuPluginDevices, OneTasksFailedCheckpointGivesEveryOtherTaskItsGpuBack) {
  const auto inst = installed_or_skip();
  FakeCudaTree tree(2);
  ASSERT_EQ(tree.pids.size(), 2u);
  const pid_t bad = tree.pids[1], good = tree.pids[0];
  criu::DumpArgs a = dump_args(tree, 0);
  a.env.push_back("GPUCKPT_FAKE_CUDA_CHECKPOINTS_TOGETHER=2");
  a.env.push_back("GPUCKPT_FAKE_CUDA_FAIL_CHECKPOINT=" + std::to_string(bad));
  EXPECT_THROW(criu::dump(inst, a), Error);
  const auto dump = criu::read_plugin_report((tree.dir.path() / "images") / criu::kDumpReportName);
  ASSERT_TRUE(dump.has_value());
  EXPECT_EQ(dump->together, 2);
  for (const auto& h : dump->hooks) {
    if (h.name != "device_checkpoint") continue;
    EXPECT_EQ(h.ok, h.pid != bad) << h.pid << ": " << h.error;
    if (h.pid == bad) {
      EXPECT_NE(h.error.find("UVM/managed"), std::string::npos) << h.error;  // the reason
    }
  }
  // The task that was checkpointed had its VRAM restored and both were unlocked: the tree runs
  // on, each task with its GPU state.
  for (pid_t p : tree.pids) {
    EXPECT_TRUE(test::runs_again(p)) << p;
    EXPECT_EQ(tree.cuda_state(p), kRunning) << p;
  }
  const auto log = tree.calls();
  const auto count = [&](const std::string& op, pid_t pid) {
    return std::count_if(log.begin(), log.end(), [&](const FakeCudaCall& c) {
      return c.op == op && c.pid == pid && c.result == 0;
    });
  };
  EXPECT_EQ(count("restore", good), 1);
  EXPECT_EQ(count("restore", bad), 0);
  EXPECT_EQ(count("unlock", good), 1);
  EXPECT_EQ(count("unlock", bad), 1);
}

// dockerd's CRIU runs with none of gpuckpt's environment: the restore's settings come in a file
// of the images directory, the GPU map among them.
TEST(CriuPluginDevices, ARestoreTakesGpuckptsSettingsFromTheImagesDirectory) {
  const auto inst = installed_or_skip();
  FakeCudaTree tree(1);
  ASSERT_EQ(tree.pids.size(), 1u);
  const criu::DumpArgs a = dump_args(tree, 0);
  const fs::path images = a.images_dir;
  ASSERT_NO_THROW(criu::dump(inst, a));
  ASSERT_TRUE(FakeCudaTree::reap(tree.root.pid()));
  ASSERT_EQ(tree.cuda_state(tree.root.pid()), kCheckpointed);

  const std::string gpu = "GPU-6e0fa43d-510b-4c27-9a41-0c7da23b8e19";  // the test driver's
  nlohmann::json env = nlohmann::json::object();
  env[criu::kEnvGpuMap] = gpu + "=" + gpu;
  env[criu::kEnvCudaPids] = std::to_string(tree.root.pid());
  // Not settings of the restore: a checkpoint's images must not choose a file criu writes or
  // the library it loads.
  const fs::path elsewhere = tree.dir.path() / "elsewhere.json";
  env[criu::kEnvReport] = elsewhere.string();
  const fs::path planted = tree.dir.path() / "planted.so";  // a driver as good as the other
  fs::copy_file(GPUCKPT_FAKE_CUDA_DRIVER, planted);
  env[criu::kEnvLibcuda] = planted.string();
  { std::ofstream(images / criu::kEnvFileName) << env.dump(2); }
  // The driver as a GPU host's loader finds it: libcuda.so.1 on the library path.
  const fs::path lib = tree.dir.path() / "lib";
  fs::create_directory(lib);
  fs::create_symlink(GPUCKPT_FAKE_CUDA_DRIVER, lib / "libcuda.so.1");
  criu::RestoreArgs r;
  r.images_dir = images;
  r.pidfile = tree.dir.path() / "restore.pid";
  r.timeout = std::chrono::seconds(120);
  r.env = {"LD_LIBRARY_PATH=" + lib.string(),
           "GPUCKPT_FAKE_CUDA_DIR=" + tree.state_dir().string()};  // the test driver's own
  ASSERT_NO_THROW(criu::restore(inst, r));
  EXPECT_FALSE(fs::exists(elsewhere));
  const auto restored = criu::read_plugin_report(images / criu::kRestoreReportName);
  ASSERT_TRUE(restored.has_value()) << "no report beside the images";
  EXPECT_TRUE(restored->all_ok()) << restored->first_error();
  EXPECT_EQ(restored->gpu_map, gpu + "=" + gpu);
  EXPECT_EQ(restored->cuda_pids, std::vector<pid_t>{tree.root.pid()});
  EXPECT_EQ(restored->driver_library, (lib / "libcuda.so.1").string());
  EXPECT_EQ(tree.cuda_state(tree.root.pid()), kRunning);

  // A settings file that cannot be read fails the restore: it must not go on without its map.
  ::kill(tree.root.pid(), SIGKILL);
  ASSERT_TRUE(FakeCudaTree::reap(tree.root.pid()));
  { std::ofstream(images / criu::kEnvFileName) << "{ not json"; }
  EXPECT_THROW(criu::restore(inst, r), Error);
  // Nor does one that is a FIFO, which nobody writes: it is refused, not waited on.
  fs::remove(images / criu::kEnvFileName);
  ASSERT_EQ(::mkfifo((images / criu::kEnvFileName).c_str(), 0600), 0);
  EXPECT_THROW(criu::restore(inst, r), Error);
}
