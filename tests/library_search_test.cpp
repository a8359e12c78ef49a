// Where gpuckpt's binaries look for shared libraries. Operators run gpuckpt as root, in whatever
// directory their shell is in, and criu (as root) loads gpuckpt's plugin into itself; the plugin
// and gpuckpt dlopen() the driver by name. A relative or empty element in a binary's RUNPATH
// makes the loader look in the working directory first, so whoever can write there chooses the
// code that runs as root.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "criu/criu.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace gpuckpt::test;

namespace {

// What ships: the binaries `install` puts in bin/, and criu's plugin.
std::vector<fs::path> shipped_binaries() {
  std::vector<fs::path> v{gpuckpt_binary(), bin_dir() / "gpuckpt-guard"};
  // The demos and, where nvcc was found, the CUDA programs.
  for (const char* name : {"gpuckpt-demo-server", "gpuckpt-vllm-demo", "gpuckpt-roofline-gpu",
                           "gpuckpt-cuda-demo-server"})
    if (fs::exists(bin_dir() / name)) v.push_back(bin_dir() / name);
#ifdef GPUCKPT_HAVE_CRIU_PLUGIN
  v.push_back(fs::path(GPUCKPT_LIB_DIR) / "criu" / criu::kPluginFile);
#endif
  return v;
}

// The search path elements a binary's DT_RPATH and DT_RUNPATH name, in order.
std::vector<std::string> search_path_of(const fs::path& binary) {
  const auto r = run_capture({"readelf", "-d", binary.string()}, std::chrono::seconds(60));
  EXPECT_TRUE(r.status.ok()) << "readelf -d " << binary << ": " << r.status.describe();
  std::vector<std::string> elements;
  const std::regex entry(R"(\((?:RPATH|RUNPATH)\)\s+Library (?:rpath|runpath): \[([^\]]*)\])");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), entry), end; it != end; ++it) {
    const std::string list = (*it)[1];
    std::size_t from = 0;
    for (;;) {
      const std::size_t colon = list.find(':', from);
      elements.push_back(list.substr(from, colon - from));
      if (colon == std::string::npos) break;
      from = colon + 1;
    }
  }
  return elements;
}

}  // namespace

TEST(LibrarySearch, NoShippedBinaryLooksForLibrariesInTheWorkingDirectory) {
  const auto binaries = shipped_binaries();
  for (const auto& b : binaries) {
    ASSERT_TRUE(fs::exists(b)) << b << " missing";
    for (const auto& element : search_path_of(b))
      EXPECT_TRUE(element.rfind('/', 0) == 0 || element.rfind("$ORIGIN", 0) == 0)
          << b << " searches \"" << element
          << "\" for libraries: relative to the working directory";
  }
}

TEST(LibrarySearch, GpuckptLoadsNoLibcudaPlantedInTheDirectoryItRunsIn) {
  const auto dir = scratch_dir("gpuckpt-planted");
  fs::copy_file(GPUCKPT_PLANTED_LIBCUDA, dir.path() / "libcuda.so.1");
  const fs::path marker = dir.path() / "planted-library-was-loaded";
  const auto devices = [&](std::vector<std::string> env) {
    SpawnOptions o;
    o.cwd = dir.path();
    o.env = std::move(env);
    o.env.push_back("GPUCKPT_PLANTED_MARKER=" + marker.string());
    return run_capture({gpuckpt_binary().string(), "--json", "devices"}, std::chrono::seconds(60),
                       o);
  };

  // The control: a loader told to search the working directory does load it. Prepended: the
  // GPU check's bundle finds gpuckpt's own libraries through LD_LIBRARY_PATH.
  const char* path = std::getenv("LD_LIBRARY_PATH");
  devices({std::string("LD_LIBRARY_PATH=.") + (path && *path ? std::string(":") + path : "")});
  ASSERT_TRUE(fs::exists(marker)) << "the planted library does not record its loading";
  fs::remove(marker);

  devices({});
  EXPECT_FALSE(fs::exists(marker)) << "gpuckpt loaded the libcuda.so.1 in its working directory";
}
