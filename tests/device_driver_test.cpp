// The device layer without a GPU (this is what CI sees): every entry point answers with a clear
// reason instead of crashing, and GPU maps are parsed and checked without a driver.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <functional>
#include <thread>

#include "criu/plugin_report.h"
#include "device/cuda_checkpoint.h"
#include "device/cuda_driver.h"
#include "device/gpu_map.h"
#include "device/nvml.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "process/record.h"
#include "test_support.h"

using namespace gpuckpt;
using ::testing::HasSubstr;

namespace {

const char* kUuidA = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
const char* kUuidB = "GPU-11111111-2222-3333-4444-555555555555";
const char* kUuidC = "GPU-abcdefab-cdef-abcd-efab-cdefabcdefab";

GpuInfo gpu(int index, const std::string& name, const std::string& uuid, int major = 9,
            int minor = 0) {
  GpuInfo g;
  g.index = index;
  g.name = name;
  g.uuid = uuid;
  g.compute_major = major;
  g.compute_minor = minor;
  return g;
}

// A machine with two H200s and an A100, as list_devices() would describe it.
DeviceList fake_machine() {
  DeviceList d;
  d.driver.loaded = true;
  d.gpus = {gpu(0, "NVIDIA H200", kUuidA), gpu(1, "NVIDIA H200", kUuidB),
            gpu(2, "NVIDIA A100-SXM4-80GB", kUuidC, 8, 0)};
  return d;
}

DeviceList no_driver() {
  DeviceList d;
  d.driver.error = "NVIDIA driver not installed (test)";
  return d;
}

template <typename F>
Error expect_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected gpuckpt::Error";
  return Error(Errc::kOk, "");
}

// Skips tests of the no-driver behaviour on machines where the driver works.
#define SKIP_IF_CHECKPOINT_API()                                                        \
  do {                                                                                  \
    if (device::checkpoint_api_available())                                             \
      GTEST_SKIP() << "the CUDA checkpoint API is available here: the no-driver paths " \
                      "are covered by CI machines without a GPU";                       \
  } while (0)

}  // namespace

TEST(DeviceNoDriver, ListDevicesReportsWhyWithoutThrowing) {
  DeviceList d;
  ASSERT_NO_THROW(d = list_devices());
  if (d.driver.loaded) GTEST_SKIP() << "a CUDA driver with a GPU is present";
  EXPECT_TRUE(d.gpus.empty());
  EXPECT_FALSE(d.driver.error.empty());
  EXPECT_FALSE(d.driver.checkpoint_api);
  EXPECT_FALSE(d.driver.gpu_remap);
  EXPECT_EQ(d.driver.library, "libcuda.so.1");
  // A second call answers the same (the driver is probed once per process).
  EXPECT_EQ(list_devices().driver.error, d.driver.error);
}

TEST(DeviceNoDriver, CheckpointApiIsUnavailableWithAReason) {
  SKIP_IF_CHECKPOINT_API();
  std::string why;
  EXPECT_FALSE(device::checkpoint_api_available(&why));
  EXPECT_FALSE(why.empty());
  EXPECT_FALSE(device::checkpoint_api_available());  // the reason pointer is optional
}

TEST(DeviceNoDriver, EveryCheckpointCallThrowsNoDeviceWithTheReason) {
  SKIP_IF_CHECKPOINT_API();
  std::string why;
  device::checkpoint_api_available(&why);
  const pid_t self = ::getpid();
  std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"process_state", [&] { device::process_state(self); }},
      {"lock", [&] { device::lock(self, std::chrono::milliseconds(100)); }},
      {"checkpoint", [&] { device::checkpoint(self); }},
      {"restore", [&] { device::restore(self, GpuMap{}); }},
      {"unlock", [&] { device::unlock(self); }},
      {"restore_thread_id", [&] { device::restore_thread_id(self); }},
      {"ProcessLock", [&] { device::ProcessLock l(self, std::chrono::milliseconds(100)); }},
      {"run_cuda_action", [&] {
         CudaActionOptions o;
         o.pid = self;
         run_cuda_action(o);
       }}};
  for (auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    const Error e = expect_error(call);
    EXPECT_EQ(e.code(), Errc::kNoDevice);
    EXPECT_THAT(e.what(), HasSubstr(why));
  }
  // Also for a pid that does not exist: "no GPU" is the more fundamental answer.
  EXPECT_EQ(expect_error([] { device::process_state(999999999); }).code(), Errc::kNoDevice);
}

// A process that has ended but is not reaped yet (a zombie) counted as one that may hold CUDA
// state, so giving its state back asked the driver about it: an error (here, no driver) and
// ~ProcessLock's spurious "may stay frozen". It holds none: there is nothing to give back, and
// the driver is not asked.
TEST(DeviceNoDriver, AZombieHasNoCudaStateToGiveBack) {
  SKIP_IF_CHECKPOINT_API();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_TRUE(test::wait_until([&] { return test::process_state(child) == 'Z'; }));
  EXPECT_EQ(device::return_to_running(child), device::Returned::kNothing);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
}

TEST(DeviceNoDriver, RemapNeedsTheDriverToo) {
  SKIP_IF_CHECKPOINT_API();
  GpuMap m;
  m.pairs = {{kUuidA, kUuidB}};
  EXPECT_EQ(expect_error([&] { device::restore(::getpid(), m); }).code(), Errc::kNoDevice);
}

TEST(CudaProcState, Names) {
  EXPECT_EQ(to_string(device::CudaProcState::kRunning), "running");
  EXPECT_EQ(to_string(device::CudaProcState::kLocked), "locked");
  EXPECT_EQ(to_string(device::CudaProcState::kCheckpointed), "checkpointed");
  EXPECT_EQ(to_string(device::CudaProcState::kFailed), "failed");
}

TEST(CudaAction, ParsesEveryNameAndRejectsOthers) {
  for (auto a :
       {CudaAction::kState, CudaAction::kLock, CudaAction::kCheckpoint, CudaAction::kRestore,
        CudaAction::kUnlock, CudaAction::kSuspend, CudaAction::kResume})
    EXPECT_EQ(parse_cuda_action(to_string(a)), a);
  const Error e = expect_error([] { parse_cuda_action("toggle"); });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("toggle"));
}

TEST(GpuUuid, FormatsAndParsesTheNvidiaSmiForm) {
  unsigned char b[16];
  for (int i = 0; i < 16; ++i) b[i] = static_cast<unsigned char>(i * 17 + 3);
  const std::string s = device::format_gpu_uuid(b);
  EXPECT_EQ(s, "GPU-03142536-4758-697a-8b9c-adbecfe0f102");
  unsigned char back[16] = {};
  ASSERT_TRUE(device::parse_gpu_uuid(s, back));
  EXPECT_EQ(std::memcmp(b, back, 16), 0);
  // Upper case is accepted; malformed forms are not.
  EXPECT_TRUE(device::parse_gpu_uuid("GPU-03142536-4758-697A-8B9C-ADBECFE0F102", back));
  for (const char* bad :
       {"", "GPU-", "03142536-4758-697a-8b9c-adbecfe0f102",
        "GPU-03142536-4758-697a-8b9c-adbecfe0f10", "GPU-03142536-4758-697a-8b9c-adbecfe0f1022",
        "GPU-0314253604758-697a-8b9c-adbecfe0f102", "GPU-0314253g-4758-697a-8b9c-adbecfe0f102",
        "MIG-03142536-4758-697a-8b9c-adbecfe0f102"})
    EXPECT_FALSE(device::parse_gpu_uuid(bad, back)) << bad;
}

TEST(GpuMap, ParsesUuidPairsWithoutADriver) {
  // The public entry point: UUID-only maps never need the driver.
  const GpuMap m =
      parse_gpu_map(std::string(kUuidA) + "=" + kUuidB + " , " + kUuidB + "=" + kUuidA);
  ASSERT_EQ(m.pairs.size(), 2u);
  EXPECT_EQ(m.pairs[0], std::make_pair(std::string(kUuidA), std::string(kUuidB)));
  EXPECT_EQ(m.pairs[1], std::make_pair(std::string(kUuidB), std::string(kUuidA)));
  EXPECT_EQ(parse_gpu_map(m.to_string()).pairs, m.pairs);
}

TEST(GpuMap, NormalisesUuidCase) {
  std::string upper = kUuidC;
  for (size_t i = 4; i < upper.size(); ++i) upper[i] = static_cast<char>(std::toupper(upper[i]));
  const GpuMap m = device::parse_gpu_map(upper + "=" + kUuidC, no_driver);
  ASSERT_EQ(m.pairs.size(), 1u);
  EXPECT_EQ(m.pairs[0].first, kUuidC);
}

TEST(GpuMap, EmptySpecMeansSameGpus) {
  EXPECT_TRUE(parse_gpu_map("").empty());
  EXPECT_TRUE(parse_gpu_map("  ").empty());
}

TEST(GpuMap, RejectsBadSyntaxAsUsageErrors) {
  const std::string a = kUuidA, b = kUuidB;
  for (const std::string& bad :
       {a, a + "=", "=" + b, a + "=" + b + "=" + a, a + "=" + b + ",", a + "=" + b + ",,",
        std::string("foo=bar"), a + "=GPU-1234", std::string("MIG-") + (a.c_str() + 4) + "=" + b,
        std::string("-1=0"), std::string(",")}) {
    SCOPED_TRACE(bad);
    const Error e = expect_error([&] { device::parse_gpu_map(bad, no_driver); });
    EXPECT_EQ(e.code(), Errc::kUsage);
    EXPECT_GT(std::string(e.what()).size(), 20u);
  }
}

TEST(GpuMap, RefusesDuplicateSourcesAndTargets) {
  const std::string a = kUuidA, b = kUuidB, c = kUuidC;
  Error e =
      expect_error([&] { device::parse_gpu_map(a + "=" + b + "," + a + "=" + c, no_driver); });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("twice"));
  e = expect_error([&] { device::parse_gpu_map(a + "=" + c + "," + b + "=" + c, no_driver); });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("two GPUs onto"));
}

TEST(GpuMap, ResolvesIndicesAgainstTheLocalGpus) {
  const GpuMap m = device::parse_gpu_map("0=1,1=0", fake_machine);
  ASSERT_EQ(m.pairs.size(), 2u);
  EXPECT_EQ(m.pairs[0], std::make_pair(std::string(kUuidA), std::string(kUuidB)));
  EXPECT_EQ(m.pairs[1], std::make_pair(std::string(kUuidB), std::string(kUuidA)));
  // Mixed forms.
  EXPECT_EQ(device::parse_gpu_map(std::string(kUuidB) + "=0", fake_machine).pairs[0].second,
            kUuidA);
}

TEST(GpuMap, IndicesNeedAGpuAndMustExist) {
  Error e = expect_error([] { device::parse_gpu_map("0=1", no_driver); });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("no NVIDIA GPU"));
  EXPECT_THAT(e.what(), HasSubstr("UUID"));
  e = expect_error([] { device::parse_gpu_map("0=7", fake_machine); });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("out of range"));
}

TEST(GpuMap, RefusesRemappingOntoAnotherChipType) {
  const Error e = expect_error([] { device::parse_gpu_map("0=2", fake_machine); });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("same chip type"));
  EXPECT_THAT(e.what(), HasSubstr("A100"));
  // Same chip: fine.
  EXPECT_NO_THROW(device::parse_gpu_map("1=0", fake_machine));
}

TEST(GpuMap, ValidatesAgainstTheGpusOfTheCheckpoint) {
  const std::vector<GpuInfo> checkpointed = {
      gpu(0, "NVIDIA H200", "GPU-99999999-9999-9999-9999-999999999999")};
  const auto local = fake_machine().gpus;
  GpuMap ok;
  ok.pairs = {{checkpointed[0].uuid, kUuidB}};
  EXPECT_NO_THROW(device::validate_gpu_map(ok, checkpointed, local));

  GpuMap unknown_source;
  unknown_source.pairs = {{kUuidA, kUuidB}};
  Error e = expect_error([&] { device::validate_gpu_map(unknown_source, checkpointed, local); });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("not a GPU of the checkpoint"));

  GpuMap missing_target;
  missing_target.pairs = {{checkpointed[0].uuid, "GPU-88888888-8888-8888-8888-888888888888"}};
  e = expect_error([&] { device::validate_gpu_map(missing_target, checkpointed, local); });
  EXPECT_THAT(e.what(), HasSubstr("not a GPU of this machine"));

  GpuMap other_chip;
  other_chip.pairs = {{checkpointed[0].uuid, kUuidC}};
  e = expect_error([&] { device::validate_gpu_map(other_chip, checkpointed, local); });
  EXPECT_THAT(e.what(), HasSubstr("same chip type"));
}

TEST(GpuMap, ChipTypeComparesNameAndComputeCapability) {
  EXPECT_TRUE(device::same_chip_type(gpu(0, "NVIDIA H200", kUuidA), gpu(1, "NVIDIA H200", kUuidB)));
  EXPECT_FALSE(
      device::same_chip_type(gpu(0, "NVIDIA H200", kUuidA), gpu(1, "NVIDIA H100", kUuidB)));
  EXPECT_FALSE(
      device::same_chip_type(gpu(0, "NVIDIA H200", kUuidA), gpu(1, "NVIDIA H200", kUuidB, 9, 1)));
}

TEST(KernelModuleVersion, ParsesProprietaryAndOpenModules) {
  EXPECT_EQ(device::parse_kernel_module_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 "
                "UTC 2024"),
            "550.54.15");
  EXPECT_EQ(device::parse_kernel_module_version(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release "
                "Build  (dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025"),
            "580.65.06");
  EXPECT_EQ(device::parse_kernel_module_version(""), "");
  EXPECT_EQ(device::parse_kernel_module_version("garbage"), "");
}

TEST(CudaVersion, Formats) {
  EXPECT_EQ(cuda_version_string(13000), "CUDA 13.0");
  EXPECT_EQ(cuda_version_string(12080), "CUDA 12.8");
  EXPECT_EQ(cuda_version_string(0), "unknown");
}

// ---- what the engine checks before a restore, and how it finds the driver -----------------

namespace {

RecordedGpu recorded(const std::string& uuid, const std::string& name, std::uint64_t process_mib,
                     int major = 9, int minor = 0) {
  RecordedGpu r;
  r.uuid = uuid;
  r.name = name;
  r.compute_major = major;
  r.compute_minor = minor;
  r.total_memory = 141ull << 30;
  r.process_memory = process_mib << 20;
  return r;
}

std::vector<device::LocalGpu> local_machine(std::uint64_t free_a_mib, std::uint64_t free_b_mib) {
  const DeviceList d = fake_machine();
  return {{d.gpus[0], free_a_mib << 20}, {d.gpus[1], free_b_mib << 20}, {d.gpus[2], std::nullopt}};
}

}  // namespace

TEST(RestoreTargets, SameGpusWithRoomPass) {
  EXPECT_NO_THROW(device::check_restore_targets({recorded(kUuidA, "NVIDIA H200", 4096)}, GpuMap{},
                                                local_machine(8192, 0)));
  // Nothing recorded about the memory (an older record): only the chip type is checked.
  EXPECT_NO_THROW(device::check_restore_targets({recorded(kUuidA, "NVIDIA H200", 0)}, GpuMap{},
                                                local_machine(0, 0)));
  // No name recorded (UUIDs only): nothing to compare.
  EXPECT_NO_THROW(
      device::check_restore_targets({RecordedGpu{kUuidC}}, GpuMap{}, local_machine(0, 0)));
}

TEST(RestoreTargets, RefusesATargetWithoutEnoughFreeMemory) {
  // cuda-checkpoint#44: an out-of-memory restore can leave the process checkpointed for good.
  const Error e = expect_error([] {
    device::check_restore_targets({recorded(kUuidA, "NVIDIA H200", 4096)}, GpuMap{},
                                  local_machine(1024, 0));
  });
  EXPECT_EQ(e.code(), Errc::kDevice);
  EXPECT_THAT(e.what(), HasSubstr("1024 MiB free"));
  EXPECT_THAT(e.what(), HasSubstr("4096 MiB"));
  // Remapped onto the GPU with room: fine.
  GpuMap m;
  m.pairs = {{kUuidA, kUuidB}};
  EXPECT_NO_THROW(device::check_restore_targets({recorded(kUuidA, "NVIDIA H200", 4096)}, m,
                                                local_machine(1024, 8192)));
}

TEST(RestoreTargets, RefusesAnotherChipTypeAndUnmappedOrMissingGpus) {
  GpuMap to_a100;
  to_a100.pairs = {{kUuidA, kUuidC}};
  Error e = expect_error([&] {
    device::check_restore_targets({recorded(kUuidA, "NVIDIA H200", 1)}, to_a100,
                                  local_machine(8192, 8192));
  });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("same chip type"));

  // Two GPUs checkpointed, one mapped: the driver wants every one.
  GpuMap partial;
  partial.pairs = {{kUuidA, kUuidB}};
  e = expect_error([&] {
    device::check_restore_targets(
        {recorded(kUuidA, "NVIDIA H200", 1), recorded(kUuidB, "NVIDIA H200", 1)}, partial,
        local_machine(8192, 8192));
  });
  EXPECT_THAT(e.what(), HasSubstr("does not map"));

  // A source that is not a GPU of the checkpoint.
  GpuMap stranger;
  stranger.pairs = {{kUuidB, kUuidA}};
  e = expect_error([&] {
    device::check_restore_targets({recorded(kUuidA, "NVIDIA H200", 1)}, stranger,
                                  local_machine(8192, 8192));
  });
  EXPECT_THAT(e.what(), HasSubstr("not a GPU of the checkpoint"));

  // In place on a machine that lacks the GPU.
  const std::string other = "GPU-99999999-2222-3333-4444-555555555555";
  e = expect_error([&] {
    device::check_restore_targets({recorded(other, "NVIDIA H200", 1)}, GpuMap{},
                                  local_machine(8192, 8192));
  });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_THAT(e.what(), HasSubstr("--gpu-map " + other + "=UUID"));
}

TEST(RestoreTargets, SumsTheNeedPerTarget) {
  // Each GPU fits alone, both do not (a map is one-to-one, but the check must not rely on it).
  GpuMap both_on_b;
  both_on_b.pairs = {{kUuidA, kUuidB}, {kUuidC, kUuidB}};
  const Error e = expect_error([&] {
    device::check_restore_targets(
        {recorded(kUuidA, "NVIDIA H200", 3000), recorded(kUuidC, "NVIDIA H200", 3000)}, both_on_b,
        local_machine(0, 4000));
  });
  EXPECT_EQ(e.code(), Errc::kDevice);
}

TEST(DeviceFiles, SeesAnOpenFileUnderThePrefix) {
  // What the plugin and lock_before_kill look for (/dev/nvidia*), faked with another device.
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(device::holds_device_files(::getpid(), "/dev/null"));
  ::close(fd);
  EXPECT_FALSE(device::holds_device_files(::getpid(), "/dev/gpuckpt-no-such-device"));
  EXPECT_FALSE(device::holds_device_files(999999999));
  EXPECT_FALSE(device::holds_device_files(0));
}

TEST(DeviceFiles, LockBeforeKillLeavesProcessesWithoutAGpuAlone) {
  // No /dev/nvidia* here: nothing to lock, and the driver is not even needed for that.
  EXPECT_TRUE(device::lock_before_kill({::getpid(), 999999999}).empty());
}

TEST(DriverLocation, TheOverrideIsTheOnlyCandidate) {
  ::setenv("GPUCKPT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  EXPECT_EQ(device::driver_candidates(), std::vector<std::string>{"/nonexistent/libcuda.so.1"});
  ::unsetenv("GPUCKPT_LIBCUDA");
  ::setenv(criu::kEnvLibcuda, "/usr/local/nvidia/lib64/libcuda.so.1", 1);
  EXPECT_EQ(device::driver_candidates(),
            (std::vector<std::string>{"/usr/local/nvidia/lib64/libcuda.so.1", "libcuda.so.1"}));
  ::unsetenv(criu::kEnvLibcuda);
  EXPECT_EQ(device::driver_candidates(), std::vector<std::string>{"libcuda.so.1"});
}

TEST(DeviceNoDriver, ProbeSaysWhyWithoutCuInit) {
  SKIP_IF_CHECKPOINT_API();
  std::string why;
  EXPECT_FALSE(device::probe_checkpoint_api(&why));
  EXPECT_THAT(why, HasSubstr("no NVIDIA GPU"));
  EXPECT_EQ(device::driver_library_path(), "");
}

TEST(DeviceNoDriver, NoGpuMemoryWithoutAGpu) {
  EXPECT_EQ(gpu_memory_of({::getpid()}), 0u);
  const auto gpus = describe_checkpointed_gpus({kUuidA}, {::getpid()});
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].uuid, kUuidA);
  if (device::nvml_gpus().empty()) {
    EXPECT_EQ(gpus[0].name, "");
  }
}

TEST(ProcessRecordGpus, RoundTripAndOldRecordsStayReadable) {
  process::ProcessRecord r;
  r.pid = 42;
  r.cuda = true;
  r.gpu_uuids = {kUuidA};
  r.gpus = {recorded(kUuidA, "NVIDIA H200", 4096)};
  const auto back = process::from_extra(process::to_extra(r));
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->gpus.size(), 1u);
  EXPECT_EQ(back->gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(back->gpus[0].compute_major, 9);
  EXPECT_EQ(back->gpus[0].process_memory, 4096ull << 20);
  EXPECT_EQ(back->gpus[0].total_memory, 141ull << 30);

  // A record written before the GPU fields: its UUIDs become GPUs without a description.
  const auto old = process::from_extra(nlohmann::json::parse(
      R"({"process": {"version": 1, "pid": 7, "cuda": true, "gpu_uuids": [")" +
      std::string(kUuidA) + R"("]}})"));
  ASSERT_TRUE(old.has_value());
  ASSERT_EQ(old->gpus.size(), 1u);
  EXPECT_EQ(old->gpus[0].uuid, kUuidA);
  EXPECT_EQ(old->gpus[0].name, "");
  EXPECT_FALSE(old->driver.has_value());
}

// CUDA state restored under another driver build failed late, inside criu's plugin or the
// driver, with the process half-restored. The record keeps the driver it was dumped under, and
// the restore's preflight refuses another, naming both sides; what is unknown on either side
// (an older record, no driver here) is not guessed at.
TEST(DriverIdentity, ARestoreUnderAnotherDriverBuildIsRefusedNamingBoth) {
  const device::DriverIdentity dumped{"580.159", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159",
                                      std::string(64, 'a')};
  EXPECT_EQ(device::driver_mismatch(dumped, dumped), "");

  auto other = dumped;
  other.module_version = "580.65.06";
  other.library_sha256 = std::string(64, 'b');
  std::string why = device::driver_mismatch(dumped, other);
  EXPECT_THAT(why, HasSubstr("driver 580.159"));
  EXPECT_THAT(why, HasSubstr("driver 580.65.06"));
  EXPECT_THAT(why, HasSubstr("aaaaaaaaaaaaaaaa"));
  EXPECT_THAT(why, HasSubstr("bbbbbbbbbbbbbbbb"));

  // The same version, another build of libcuda.
  other = dumped;
  other.library_sha256 = std::string(64, 'c');
  why = device::driver_mismatch(dumped, other);
  EXPECT_THAT(why, HasSubstr("another build"));

  // Unknown on one side: nothing to compare.
  EXPECT_EQ(device::driver_mismatch(dumped, device::DriverIdentity{}), "");
  EXPECT_EQ(device::driver_mismatch(device::DriverIdentity{}, other), "");

  // Kept in the record.
  process::ProcessRecord r;
  r.pid = 42;
  r.cuda = true;
  r.driver = dumped;
  const auto back = process::from_extra(process::to_extra(r));
  ASSERT_TRUE(back && back->driver);
  EXPECT_EQ(back->driver->module_version, "580.159");
  EXPECT_EQ(back->driver->library, dumped.library);
  EXPECT_EQ(back->driver->library_sha256, dumped.library_sha256);
}

// Here the loader finds CUDA's link stub, or nothing: whichever, its identity is what the
// file is (a hash of 64 hex digits), and no kernel module is loaded.
TEST(DriverIdentity, IsReadWithoutADriverToo) {
  SKIP_IF_CHECKPOINT_API();
  const auto id = device::driver_identity();
  EXPECT_EQ(id.module_version, "");
  if (!id.library.empty()) {
    EXPECT_EQ(id.library_sha256.size(), 64u) << id.library;
  }
}
