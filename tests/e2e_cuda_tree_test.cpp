// gpuckpt's CUDA paths end to end, on a machine without a GPU: a tree of processes that the test
// driver (tests/support/fake_cuda_driver.cpp) takes for CUDA workers, dumped, restored and
// killed mid-dump through the CLI, with the real criu and plugin. The driver does no device
// work; it holds the states and the restore-thread rule of the real one, and logs each call.
// What the real driver does with VRAM is scripts/gpu-check.sh's (the "cuda tree" stage).
#include <cuda.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "process/proc_info.h"
#include "test_support.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace gpuckpt;
using test::FakeCudaCall;
using test::FakeCudaTree;

namespace {

constexpr int kRunning = CU_PROCESS_STATE_RUNNING;
constexpr int kCheckpointed = CU_PROCESS_STATE_CHECKPOINTED;

// The tree's environment set for the gpuckpt that the test starts.
std::vector<std::unique_ptr<test::ScopedEnv>> use(const FakeCudaTree& tree, int together) {
  std::vector<std::unique_ptr<test::ScopedEnv>> v;
  for (const auto& kv : tree.env(together)) {
    const auto eq = kv.find('=');
    v.push_back(std::make_unique<test::ScopedEnv>(kv.substr(0, eq).c_str(), kv.substr(eq + 1)));
  }
  return v;
}

json parse(const std::string& out) {
  return json::parse(out, nullptr, false);
}

// The stages NAME@PID of a --json timeline, for the pids given: whether there is one for each
// and they ran at the same time (each started before every other one ended).
bool ran_together(const json& timeline, const std::string& name, const std::vector<pid_t>& pids) {
  std::vector<std::pair<double, double>> spans;
  for (const auto& s : timeline.value("stages", json::array()))
    for (pid_t p : pids)
      if (s.value("name", "") == name + "@" + std::to_string(p)) {
        const double start = s.value("start", 0.0);
        spans.emplace_back(start, start + s.value("seconds", 0.0));
      }
  if (spans.size() != pids.size()) return false;
  for (const auto& a : spans)
    for (const auto& b : spans)
      if (&a != &b && a.first >= b.second) return false;
  return true;
}

long count(const std::vector<FakeCudaCall>& log, const std::string& op, pid_t pid) {
  return std::count_if(log.begin(), log.end(), [&](const FakeCudaCall& c) {
    return c.op == op && c.pid == pid && c.result == 0;
  });
}

}  // namespace

TEST(E2eCudaTree, EveryWorkersDeviceStateIsCheckpointedAndRestoredTogether) {
  FakeCudaTree tree(3);
  ASSERT_EQ(tree.pids.size(), 3u);
  const auto env = use(tree, 3);  // one by one, the first call would wait for the others
  const fs::path ckpt = tree.dir.path() / "tree.ckpt";
  const auto d = test::run_cli(
      {"--json", "dump", "--pid", std::to_string(tree.root.pid()), "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const json dj = parse(d.out);
  ASSERT_TRUE(dj.is_object()) << d.out;
  EXPECT_EQ(dj.value("gpu", false), true) << d.out;
  EXPECT_TRUE(ran_together(dj["timeline"], "device_checkpoint", tree.pids)) << d.out;
  for (pid_t p : tree.pids) {
    EXPECT_EQ(tree.cuda_state(p), kCheckpointed) << p;
    ASSERT_TRUE(FakeCudaTree::reap(p)) << p << " outlived its dump";
  }

  const auto r = test::run_cli({"--json", "restore", ckpt.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rj = parse(r.out);
  ASSERT_TRUE(rj.is_object()) << r.out;
  EXPECT_TRUE(ran_together(rj["timeline"], "device_restore", tree.pids)) << r.out;
  // Every worker is back under its pid, unlocked, its restore thread running again.
  for (pid_t p : tree.pids) {
    EXPECT_TRUE(test::runs_again(p)) << p;
    EXPECT_EQ(tree.cuda_state(p), kRunning) << p;
    const pid_t tid = FakeCudaTree::restore_thread(p);
    EXPECT_NE(tid, 0) << p;
    EXPECT_TRUE(test::runs_again(tid)) << "the restore thread of " << p << " stays stopped";
  }
  const auto log = tree.calls();
  for (pid_t p : tree.pids)
    for (const char* op : {"lock", "checkpoint", "restore", "unlock"})
      EXPECT_EQ(count(log, op, p), 1) << op << " " << p;
}

// SIGKILL once the workers are checkpointed, while a staged dump compresses their images (as
// the GPU check's "tree dump killed"): the guard gives every worker its device state back and
// resumes the tree; no checkpoint is left.
TEST(E2eCudaTree, AKilledDumpGivesEveryWorkerItsDeviceStateBack) {
  FakeCudaTree tree(3);
  ASSERT_EQ(tree.pids.size(), 3u);
  const auto env = use(tree, 0);
  const fs::path ckpt = tree.dir.path() / "tree.ckpt";
  const fs::path staging = tree.dir.path() / "staging";
  fs::create_directory(staging);
  EXPECT_FALSE(test::signalled_at({"dump", "--pid", std::to_string(tree.root.pid()), "-o",
                                   ckpt.string(), "--staging", staging.string()},
                                  "compress_write", SIGKILL, tree.dir.path())
                   .exited);
  for (pid_t p : tree.pids) {
    EXPECT_TRUE(test::wait_until([&] { return tree.cuda_state(p) == kRunning; }))
        << "the guard left " << p << " with its device state checkpointed";
    EXPECT_TRUE(test::runs_again(p)) << "the guard left " << p << " frozen";
  }
  EXPECT_TRUE(test::wait_until([&] { return !fs::exists(ckpt); }));
  // The driver logs a call once its state is saved: the guard's last lines may come after.
  for (pid_t p : tree.pids)
    for (const char* op : {"checkpoint", "restore", "unlock"})
      EXPECT_TRUE(test::wait_until([&] { return count(tree.calls(), op, p) == 1; }))
          << op << " " << p << " was not called once";
}
