// gpuckpt's CRIU plugin as a binary: criu (Debian 13's loader and libraries) dlopen()s it, so it
// must need nothing but libc and export nothing but CR_PLUGIN_DESC. That it is actually called
// during a dump and a restore is tested in criu_runner_test and e2e_process_test.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>

#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "gpuckpt/error.h"
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
  const auto back = criu::parse_plugin_report(criu::to_json_text(r));
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
}
