// migrate --to ssh://: the target's GPUs are judged from its `gpuckpt --json devices` before
// anything is frozen: same chip, and room for the VRAM the tree holds (cuda-checkpoint#44: a
// restore that does not fit leaves the process stuck for good).
#include <gtest/gtest.h>

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
