// migrate --to ssh://: the target's GPUs are judged from its `gpuckpt --json devices` before
// anything is frozen: same chip, and room for the VRAM the tree holds (cuda-checkpoint#44: a
// restore that does not fit leaves the process stuck for good).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "process/migrate_ssh.h"

using namespace gpuckpt;
using nlohmann::json;

namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

json target(std::uint64_t total, std::optional<std::uint64_t> used) {
  json g = {{"uuid", "GPU-bbbb"}, {"name", "NVIDIA H200"}, {"total_memory", total}};
  g["used_memory"] = used ? json(*used) : json(nullptr);
  return {{"gpus", json::array({g})}};
}

GpuMap to_bbbb() {
  GpuMap m;
  m.pairs.emplace_back("GPU-aaaa", "GPU-bbbb");
  return m;
}

std::string refusal(const json& devices, const std::map<std::string, std::uint64_t>& held) {
  try {
    process::check_target_gpus({"GPU-aaaa"}, devices, to_bbbb(), "spare", held);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kNoDevice);
    return e.what();
  }
  return "";
}

TEST(MigrateTarget, AGpuWithoutRoomForTheProcessesVramIsRefusedBeforeFreezing) {
  const std::string why = refusal(target(140 * kGiB, 130 * kGiB), {{"gpu-aaaa", 40 * kGiB}});
  EXPECT_NE(why.find("10240 MiB of VRAM free"), std::string::npos) << why;
  EXPECT_NE(why.find("holds 40960 MiB"), std::string::npos) << why;
  EXPECT_NE(why.find("nothing was frozen"), std::string::npos) << why;
}

TEST(MigrateTarget, AGpuWithRoomIsAccepted) {
  EXPECT_EQ(refusal(target(140 * kGiB, 60 * kGiB), {{"gpu-aaaa", 40 * kGiB}}), "");
}

TEST(MigrateTarget, UnknownUseOnEitherSideIsLeftToTheRestoreThere) {
  // The target's driver does not say how much is used: nothing to compare, no refusal.
  EXPECT_EQ(refusal(target(140 * kGiB, std::nullopt), {{"gpu-aaaa", 40 * kGiB}}), "");
  EXPECT_NO_THROW(process::check_target_gpus({"GPU-aaaa"}, target(140 * kGiB, 139 * kGiB),
                                             to_bbbb(), "spare", std::nullopt));
}

TEST(MigrateTarget, AMissingTargetGpuIsRefused) {
  const std::string why = refusal(json{{"gpus", json::array()}}, {});
  EXPECT_NE(why.find("has no GPU GPU-bbbb"), std::string::npos) << why;
}

}  // namespace

// A process names itself (prctl PR_SET_NAME, up to 15 bytes): its migration's checkpoint must
// stay a plain file in --to whatever it chose.
TEST(MigrateTarget, TheCheckpointsNameCannotLeaveItsDirectory) {
  using process::checkpoint_name;
  EXPECT_EQ(checkpoint_name("vllm-serve", 42), "vllm-serve-42.ckpt");
  EXPECT_EQ(checkpoint_name("py3.11", 7), "py3.11-7.ckpt");
  EXPECT_EQ(checkpoint_name("/tmp/h3esc", 4584), "_tmp_h3esc-4584.ckpt");
  EXPECT_EQ(checkpoint_name("../../../esc", 1), "_._.._.._esc-1.ckpt");
  for (const std::string comm : {"../../../esc", "/etc/passwd", "..", ".hidden", "a/b", ""}) {
    const std::string n = checkpoint_name(comm, 9);
    SCOPED_TRACE(comm);
    EXPECT_EQ(n.find('/'), std::string::npos) << n;
    EXPECT_NE(n.front(), '.') << n;
    EXPECT_EQ(std::filesystem::path(n).filename().string(), n);
  }
  EXPECT_EQ(checkpoint_name("", 9), "process-9.ckpt");
  EXPECT_EQ(checkpoint_name("..", 9), "_.-9.ckpt");
}

// The driver restores only its own build's checkpoints: a target with another NVIDIA driver is
// refused before the freeze, naming both; one whose driver is unknown is left to its restore.
TEST(MigrateTarget, ATargetWithAnotherDriverIsRefusedBeforeFreezing) {
  const json there{{"driver", {{"kernel_module_version", "580.65.06"}}}, {"gpus", json::array()}};
  try {
    process::check_target_driver(there, "ssh://spare", "580.159");
    FAIL() << "another driver was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kNoDevice);
    EXPECT_NE(std::string(e.what()).find("580.65.06"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("580.159"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing was frozen"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(process::check_target_driver(there, "ssh://spare", "580.65.06"));
  EXPECT_NO_THROW(process::check_target_driver(json::object(), "ssh://spare", "580.159"));
  EXPECT_NO_THROW(process::check_target_driver(there, "ssh://spare", ""));
}
