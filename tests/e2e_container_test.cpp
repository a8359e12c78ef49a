// Processes in containers, with real runc and a bundle the test makes (no registry reaches this
// machine): gpuckpt finds the container from runc's own state and names it, and the command that
// would take it whole, before anything is frozen. A pid namespace no runtime made is named as
// such, never blamed on a gpuckpt restore that was never run.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "process/pidns.h"
#include "process/proc_info.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

class E2eContainer : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto runc = find_executable("runc");
    if (!runc) GTEST_SKIP() << "runc is not installed (scripts/setup.sh installs it)";
    runc_ = runc->string();
    root_ = dir_.path() / "runc-root";
    bundle_ = dir_.path() / "bundle";
    make_bundle();
  }
  void TearDown() override {
    for (const auto& id : started_) {
      runc({"kill", id, "KILL"});
      runc({"delete", "--force", id});
    }
  }

  RunResult runc(std::vector<std::string> args) {
    args.insert(args.begin(), {runc_, "--root", root_.string()});
    SpawnOptions o;
    o.stderr_file = dir_.path() / "runc.err";
    return run_capture(args, 60s, o);
  }

  // A rootfs of empty mount points and the host's /usr (read-only), with the links of a merged
  // /usr; runc's default spec (its own pid, mount, ipc, uts and network namespaces), without the
  // rlimits that root here may not raise.
  void make_bundle() {
    const fs::path rootfs = bundle_ / "rootfs";
    for (const char* d : {"usr", "proc", "dev", "sys", "tmp", "etc"})
      fs::create_directories(rootfs / d);
    for (const char* l : {"bin", "lib", "lib64", "sbin"})
      fs::create_symlink(fs::path("usr") / l, rootfs / l);
    SpawnOptions o;
    o.cwd = bundle_;
    ASSERT_TRUE(run_capture({runc_, "spec"}, 30s, o).status.ok());
    json spec = json::parse(read_file(bundle_ / "config.json"));
    spec["process"]["terminal"] = false;
    spec["process"]["args"] = {"/usr/bin/sleep", "1000"};
    spec["process"].erase("rlimits");
    spec["root"]["readonly"] = false;
    spec["mounts"].push_back({{"destination", "/usr"},
                              {"type", "bind"},
                              {"source", "/usr"},
                              {"options", {"rbind", "ro"}}});
    std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  }

  // runc ARGS that leaves a process running with runc's own stdio (run or exec --detach): into
  // files, so that no pipe of ours stays open in the container.
  ExitStatus runc_detached(std::vector<std::string> args) {
    args.insert(args.begin(), {runc_, "--root", root_.string()});
    SpawnOptions o;
    o.cwd = bundle_;
    o.stdout_file = dir_.path() / "container.out";
    o.stderr_file = dir_.path() / "runc.err";
    Child c = spawn(args, o);
    if (auto st = c.wait_for(60s)) return *st;
    c.kill(SIGKILL);
    return c.wait();
  }

  // Starts container `id` (detached) and returns its init's host pid.
  pid_t run_container(const std::string& id) {
    const ExitStatus st = runc_detached({"run", "--detach", id});
    EXPECT_TRUE(st.ok()) << st.describe() << read_file(dir_.path() / "runc.err");
    started_.push_back(id);
    const json state = json::parse(runc({"state", id}).output, nullptr, false);
    EXPECT_TRUE(state.is_object());
    return state.is_object() ? state.value("pid", 0) : 0;
  }

  TempDir dir_ = test::scratch_dir("gpuckpt-e2e-container");
  std::string runc_;
  fs::path root_, bundle_;
  std::vector<std::string> started_;
};

}  // namespace

// The issue's first report: a redis in a plain runc container was refused as a process "a
// `restore --new-pidns` or a frozen-handoff migration put there", which nobody had run.
TEST_F(E2eContainer, ADumpOfAProcessInAContainerNamesTheContainerAndFreezesNothing) {
  const test::ScopedEnv roots("GPUCKPT_RUNC_ROOTS", root_.string());
  const std::string id = "gk-" + std::to_string(::getpid());
  const pid_t init = run_container(id);
  ASSERT_GT(init, 0);
  // A second process inside it, beside its init.
  ASSERT_TRUE(runc_detached({"exec", "--detach", id, "/usr/bin/sleep", "999"}).ok());
  pid_t inner = 0;
  ASSERT_TRUE(test::wait_until([&] {
    for (pid_t q : process::live_pids_where([&](const process::ProcInfo& p) {
           return p.pid != init && p.comm == "sleep" &&
                  process::pid_namespace_inode(p.pid) == process::pid_namespace_inode(init);
         }))
      inner = q;
    return inner > 0;
  }));
  const fs::path out = dir_.path() / "c.ckpt";
  for (const pid_t q : {init, inner}) {
    SCOPED_TRACE(q == init ? "its init" : "a process under it");
    const auto r =
        test::run_cli({"--json", "dump", "--pid", std::to_string(q), "-o", out.string()});
    EXPECT_EQ(r.exit_code, 10) << r.err;
    const json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    const std::string msg = j["error"].value("message", "");
    EXPECT_NE(msg.find("runs in the runc container " + id), std::string::npos) << msg;
    EXPECT_EQ(msg.find("as its init") != std::string::npos, q == init) << msg;
    EXPECT_EQ(msg.find("its init is pid " + std::to_string(init)) != std::string::npos, q == inner)
        << msg;
    EXPECT_NE(
        msg.find("`runc --root '" + root_.string() + "' checkpoint --image-path DIR '" + id + "'`"),
        std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("--new-pidns"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Nothing was frozen"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_EQ(test::process_state(q), 'S');
  }
  // runc still knows it as running.
  const json state = json::parse(runc({"state", id}).output, nullptr, false);
  ASSERT_TRUE(state.is_object());
  EXPECT_EQ(state.value("status", ""), "running");
}

// `unshare --pid --fork --mount-proc`: a pid namespace that no runtime's state names.
TEST_F(E2eContainer, AProcessInAPidNamespaceNoRuntimeMadeIsNamedAsSuch) {
  SpawnOptions o;
  o.new_session = true;
  o.stdout_file = dir_.path() / "u.out";
  o.stderr_file = dir_.path() / "u.err";
  Child u = spawn({"unshare", "--pid", "--fork", "--mount-proc", "/usr/bin/sleep", "1000"}, o);
  pid_t sleeper = 0;
  ASSERT_TRUE(test::wait_until([&] {
    for (pid_t q : process::live_pids_where(
             [&](const process::ProcInfo& p) { return p.ppid == u.pid() && p.comm == "sleep"; }))
      sleeper = q;
    return sleeper > 0;
  })) << read_file(dir_.path() / "u.err");
  const auto r = test::run_cli({"--json", "dump", "--pid", std::to_string(sleeper), "-o",
                                (dir_.path() / "u.ckpt").string()});
  EXPECT_EQ(r.exit_code, 10) << r.err;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  const std::string msg = j["error"].value("message", "");
  EXPECT_NE(msg.find("whose init is pid " + std::to_string(sleeper) + " (sleep)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("made by no container runtime gpuckpt knows"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("--new-pidns"), std::string::npos) << msg;
  EXPECT_EQ(test::process_state(sleeper), 'S');
  u.kill(SIGKILL);
  ::kill(sleeper, SIGKILL);
  u.wait();
}
