// `gpuckpt devices` and `gpuckpt cuda-checkpoint` as a user runs them: exit codes, messages and
// the JSON document, with and without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "device/cuda_checkpoint.h"
#include "gpuckpt/device.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using ::testing::HasSubstr;

namespace {

constexpr int kNoDevice = 7;
constexpr int kUsage = 2;

bool have_gpu() {
  const DeviceList d = list_devices();
  return d.driver.loaded && !d.gpus.empty();
}

// run_cli with extra environment variables.
test::CliResult run_cli_env(const std::vector<std::string>& args,
                            const std::vector<std::string>& env) {
  auto tmp = test::scratch_dir("gpuckpt-cli-env");
  std::vector<std::string> argv{test::gpuckpt_binary().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions o;
  o.env = env;
  o.stderr_file = tmp.path() / "stderr";
  RunResult rr = run_capture(argv, std::chrono::seconds(60), o);
  test::CliResult r;
  r.exit_code = rr.status.exited ? rr.status.code : 128 + rr.status.code;
  r.out = rr.output;
  r.err = read_file(o.stderr_file);
  return r;
}

}  // namespace

TEST(DevicesCli, WithoutAGpuSaysSoAndExits7) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present";
  const auto r = test::run_cli({"devices"});
  EXPECT_EQ(r.exit_code, kNoDevice) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no NVIDIA GPU: "));
  EXPECT_EQ(r.err.find("internal error"), std::string::npos);
}

TEST(DevicesCli, JsonWithoutAGpuIsOneDocumentWithEmptyGpusAndTheReason) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present";
  const auto r = test::run_cli({"--json", "devices"});
  EXPECT_EQ(r.exit_code, kNoDevice) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;  // exactly one document
  ASSERT_TRUE(j.contains("gpus"));
  EXPECT_TRUE(j["gpus"].is_array());
  EXPECT_TRUE(j["gpus"].empty());
  EXPECT_EQ(j["ok"], false);
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("no NVIDIA GPU: "));
  EXPECT_EQ(j["driver"]["loaded"], false);
  EXPECT_FALSE(j["driver"]["error"].get<std::string>().empty());
}

TEST(DevicesCli, TheToolkitStubIsNotMistakenForADriver) {
  // The link stub exports the whole driver API but every call fails: this drives the loader
  // through dlopen, symbol resolution and a failing cuInit, on any machine.
  const fs::path stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!fs::exists(stub)) GTEST_SKIP() << stub << " not present";
  const auto r = run_cli_env({"--json", "devices"}, {"GPUCKPT_LIBCUDA=" + stub.string()});
  EXPECT_EQ(r.exit_code, kNoDevice) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["driver"]["library"], stub.string());
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("CUDA_ERROR_STUB_LIBRARY"));
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("stub"));
}

TEST(DevicesCli, WithAGpuListsEveryGpuWithItsUuid) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU: " << list_devices().driver.error;
  const auto r = test::run_cli({"--json", "devices"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j["gpus"].empty());
  for (const auto& g : j["gpus"]) {
    const std::string uuid = g["uuid"];
    EXPECT_EQ(uuid.size(), 40u);
    EXPECT_EQ(uuid.rfind("GPU-", 0), 0u);
    EXPECT_GT(g["total_memory"].get<std::uint64_t>(), 0u);
    EXPECT_FALSE(g["name"].get<std::string>().empty());
  }
  EXPECT_GT(j["driver"]["cuda_version"].get<int>(), 0);
  const auto t = test::run_cli({"devices"});
  EXPECT_EQ(t.exit_code, 0);
  EXPECT_THAT(t.out, HasSubstr(j["gpus"][0]["uuid"].get<std::string>()));
}

TEST(CudaCheckpointCli, WithoutTheApiExits7WithTheReason) {
  if (device::checkpoint_api_available()) GTEST_SKIP() << "the checkpoint API is available";
  const auto r =
      test::run_cli({"cuda-checkpoint", "--pid", std::to_string(::getpid()), "--action", "state"});
  EXPECT_EQ(r.exit_code, kNoDevice) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no NVIDIA GPU"));
  const auto j = test::run_cli({"--json", "cuda-checkpoint", "--pid", "1", "--action", "lock"});
  EXPECT_EQ(j.exit_code, kNoDevice);
  EXPECT_EQ(nlohmann::json::parse(j.out)["error"]["code"], "no_device");
}

TEST(CudaCheckpointCli, BadArgumentsAreUsageErrors) {
  const std::string self = std::to_string(::getpid());
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"cuda-checkpoint", "--action", "state"},
        {"cuda-checkpoint", "--pid", self},
        {"cuda-checkpoint", "--pid", self, "--action", "toggle"},
        {"cuda-checkpoint", "--pid", "0", "--action", "state"},
        {"cuda-checkpoint", "--pid", self, "--action", "lock", "--gpu-map",
         "GPU-11111111-2222-3333-4444-555555555555=GPU-11111111-2222-3333-4444-555555555555"},
        {"cuda-checkpoint", "--pid", self, "--action", "restore", "--gpu-map", "nonsense"},
        {"cuda-checkpoint", "--pid", self, "--action", "lock", "--timeout-ms", "-5"}}) {
    const auto r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, kUsage) << ::testing::PrintToString(args) << "\n" << r.err;
    EXPECT_FALSE(r.err.empty());
  }
}
