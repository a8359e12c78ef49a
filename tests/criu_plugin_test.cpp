// gpuckpt's CRIU plugin as a binary: criu (Debian 13's loader and libraries) dlopen()s it, so it
// must need nothing but libc and export nothing but CR_PLUGIN_DESC. That it is actually called
// during a dump and a restore is tested in criu_runner_test and e2e_process_test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>

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
