// The CUDA programs (kernels/): they exist whenever nvcc was found at configure time (so CI
// proves they compile), behave plainly without a GPU, and on a GPU keep their contracts: the
// roofline JSON that `gpuckpt roofline` parses, and a demo server whose VRAM checksum is a
// deterministic function of its requests.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "gpuckpt/device.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using ::testing::HasSubstr;

namespace {

const fs::path kManifest = fs::path(GPUCKPT_LIB_DIR) / "kernels.manifest";
const fs::path kRoofline = test::bin_dir() / "gpuckpt-roofline-gpu";
const fs::path kServer = test::bin_dir() / "gpuckpt-cuda-demo-server";

struct Output {
  int code = -1;
  std::string out, err;
};

Output run(const std::vector<std::string>& argv, int timeout_s = 300) {
  auto tmp = test::scratch_dir("gpuckpt-kernels");
  SpawnOptions o;
  o.stderr_file = tmp.path() / "stderr";
  RunResult r = run_capture(argv, std::chrono::seconds(timeout_s), o);
  return {r.status.exited ? r.status.code : 128 + r.status.code, r.output,
          read_file(o.stderr_file)};
}

bool have_gpu() {
  const DeviceList d = list_devices();
  return d.driver.loaded && !d.gpus.empty();
}

class Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kManifest))
      GTEST_SKIP() << "nvcc was not found when this build was configured: no CUDA kernels";
  }
};

}  // namespace

TEST_F(Kernels, EveryBinaryOfTheManifestWasBuilt) {
  std::ifstream in(kManifest);
  std::string name;
  int n = 0;
  while (std::getline(in, name)) {
    if (name.empty()) continue;
    ++n;
    const fs::path p = test::bin_dir() / name;
    struct stat st {};
    ASSERT_EQ(::stat(p.c_str(), &st), 0) << p << " missing: build the kernels targets";
    EXPECT_TRUE(st.st_mode & S_IXUSR) << p;
    EXPECT_GT(st.st_size, 10000) << p;
  }
  EXPECT_EQ(n, 2);
}

TEST_F(Kernels, WithoutAGpuBothExit7WithAPlainReason) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present";
  for (const auto& argv : {std::vector<std::string>{kRoofline.string(), "--quick"},
                           {kServer.string(), "--socket", "/tmp/gpuckpt-never.sock"}}) {
    const Output r = run(argv, 60);
    EXPECT_EQ(r.code, 7) << argv[0] << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("no NVIDIA GPU: "));
    EXPECT_TRUE(r.out.empty()) << "no half-written JSON on stdout: " << r.out;
  }
}

TEST_F(Kernels, BadArgumentsAreUsageErrors) {
  for (const auto& argv : {std::vector<std::string>{kRoofline.string(), "--repeats", "0"},
                           {kRoofline.string(), "--bogus"},
                           {kServer.string()},
                           {kServer.string(), "--socket", "/tmp/x.sock", "--vram-gib", "-1"},
                           {kServer.string(), "--client"}}) {
    const Output r = run(argv, 60);
    EXPECT_EQ(r.code, 2) << ::testing::PrintToString(argv) << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("usage:"));
  }
}

TEST_F(Kernels, DemoClientSaysWhenNoServerAnswers) {
  auto dir = test::scratch_dir();
  const Output r = run({kServer.string(), "--client", (dir.path() / "none.sock").string(), "PING"});
  EXPECT_EQ(r.code, 10);
  EXPECT_THAT(r.err, HasSubstr("cannot connect"));
}

TEST_F(Kernels, RooflinePrintsTheJsonThatGpuckptParses) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU: " << list_devices().driver.error;
  const Output r = run({kRoofline.string(), "--quick"});
  if (r.code == 7) GTEST_SKIP() << r.err;  // e.g. a driver older than the CUDA runtime
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["device_name"].get<std::string>().empty());
  EXPECT_GT(j["bandwidth_gbps"].get<double>(), 10);
  EXPECT_GT(j["fp32_gflops"].get<double>(), 100);
  const DeviceList d = list_devices();
  if (d.gpus[0].compute_major >= 8) {
    EXPECT_GT(j["tensor_gflops"].get<double>(), 100);
  }
  EXPECT_TRUE(j["details"].is_object());
  EXPECT_GT(j["details"]["d2h_pinned_gbps"].get<double>(), 0.1);
  EXPECT_EQ(j["details"]["uuid"], d.gpus[0].uuid);
}

TEST_F(Kernels, DemoServerChecksumIsADeterministicFunctionOfItsRequests) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU: " << list_devices().driver.error;
  auto dir = test::scratch_dir();
  struct Server {
    fs::path sock;
    Child child;
  };
  auto start = [&](const std::string& name, int seed) {
    Server s;
    s.sock = dir.path() / (name + ".sock");
    SpawnOptions o;
    o.capture_stdout = true;
    o.stderr_file = dir.path() / (name + ".err");
    s.child = spawn({kServer.string(), "--socket", s.sock.string(), "--vram-gib", "0.125", "--seed",
                     std::to_string(seed)},
                    o);
    std::string line;
    char c;
    while (::read(s.child.stdout_fd(), &c, 1) == 1 && c != '\n') line += c;
    return std::make_pair(std::move(s), line);
  };
  auto ask = [&](const Server& s, const std::string& req) {
    const Output r = run({kServer.string(), "--client", s.sock.string(), req});
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out;
  };
  auto [a, ready_a] = start("a", 1);
  if (ready_a.empty()) {
    const auto st = a.child.wait();
    if (st.exited && st.code == 7) GTEST_SKIP() << read_file(dir.path() / "a.err");
    FAIL() << "server did not start: " << read_file(dir.path() / "a.err");
  }
  EXPECT_EQ(ready_a, "READY " + a.sock.string());
  auto [b, ready_b] = start("b", 1);
  auto [c, ready_c] = start("c", 2);
  ASSERT_FALSE(ready_b.empty());
  ASSERT_FALSE(ready_c.empty());

  EXPECT_EQ(ask(a, "PING"), "PONG\n");
  EXPECT_EQ(ask(a, "STATE"), ask(b, "STATE"));  // same seed, same VRAM
  EXPECT_NE(ask(a, "STATE"), ask(c, "STATE"));  // another seed
  const std::string s0 = ask(a, "STATE");
  EXPECT_EQ(ask(a, "STATE"), s0);  // STATE does not mutate
  const std::string g1 = ask(a, "GEN the quick brown fox");
  EXPECT_THAT(g1, HasSubstr("OK 1 "));
  EXPECT_NE(g1, s0);
  EXPECT_EQ(ask(b, "GEN the quick brown fox"), g1);
  EXPECT_NE(ask(c, "GEN the quick brown fox").substr(5), g1.substr(5));
  // The reply depends on the request text and on everything before it.
  const std::string g2a = ask(a, "GEN one");
  const std::string g2b = ask(b, "GEN two");
  EXPECT_NE(g2a, g2b);
  EXPECT_THAT(ask(a, "INFO"), HasSubstr("vram_bytes="));
  EXPECT_THAT(ask(a, "NONSENSE"), HasSubstr("ERR"));
}
