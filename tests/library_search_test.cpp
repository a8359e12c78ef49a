// Where gpuckpt's binaries look for shared libraries. Operators run gpuckpt as root, in whatever
// directory their shell is in, and criu (as root) loads gpuckpt's plugin into itself; the plugin
// and gpuckpt dlopen() the driver by name. A relative or empty element in a binary's RUNPATH
// makes the loader look in the working directory first, so whoever can write there chooses the
// code that runs as root.
#include <elf.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
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

// The search path elements a binary's DT_RPATH and DT_RUNPATH name, in order: read from its
// ELF dynamic section here, for the GPU machine has no readelf.
std::vector<std::string> search_path_of(const fs::path& binary) {
  std::vector<std::string> elements;
  const std::string elf = read_file(binary);
  auto at = [&](std::uint64_t off, std::uint64_t size) {
    if (off > elf.size() || size > elf.size() - off)
      throw std::runtime_error(binary.string() + ": truncated ELF");
    return elf.data() + off;
  };
  Elf64_Ehdr eh;
  std::memcpy(&eh, at(0, sizeof eh), sizeof eh);
  EXPECT_EQ(std::memcmp(eh.e_ident, ELFMAG, SELFMAG), 0) << binary << " is not ELF";
  EXPECT_EQ(eh.e_ident[EI_CLASS], ELFCLASS64) << binary;
  auto section = [&](std::size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, at(eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof sh), sizeof sh);
    return sh;
  };
  for (std::size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr dyn = section(i);
    if (dyn.sh_type != SHT_DYNAMIC) continue;
    const Elf64_Shdr str = section(dyn.sh_link);
    for (std::uint64_t off = 0; off + sizeof(Elf64_Dyn) <= dyn.sh_size; off += sizeof(Elf64_Dyn)) {
      Elf64_Dyn d;
      std::memcpy(&d, at(dyn.sh_offset + off, sizeof d), sizeof d);
      if (d.d_tag != DT_RPATH && d.d_tag != DT_RUNPATH) continue;
      const char* list_at = at(str.sh_offset + d.d_un.d_val, 1);
      const std::string list(list_at, strnlen(list_at, elf.data() + elf.size() - list_at));
      std::size_t from = 0;
      for (;;) {
        const std::size_t colon = list.find(':', from);
        elements.push_back(list.substr(from, colon - from));
        if (colon == std::string::npos) break;
        from = colon + 1;
      }
    }
  }
  return elements;
}

// The absolute elements of this process's LD_LIBRARY_PATH: an empty or relative one, which the
// machine's environment may have, would make the loader search the working directory whatever
// gpuckpt does.
std::string absolute_library_path() {
  std::string out;
  const char* path = std::getenv("LD_LIBRARY_PATH");
  const std::string list = path ? path : "";
  for (std::size_t from = 0; from <= list.size();) {
    const std::size_t colon = std::min(list.find(':', from), list.size());
    const std::string element = list.substr(from, colon - from);
    if (!element.empty() && element[0] == '/') out += (out.empty() ? "" : ":") + element;
    from = colon + 1;
  }
  return out;
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
  const std::string path = absolute_library_path();
  devices({"LD_LIBRARY_PATH=." + (path.empty() ? "" : ":" + path)});
  ASSERT_TRUE(fs::exists(marker)) << "the planted library does not record its loading";
  fs::remove(marker);

  // Empty, LD_LIBRARY_PATH names no directory at all (glibc).
  devices({"LD_LIBRARY_PATH=" + path});
  EXPECT_FALSE(fs::exists(marker)) << "gpuckpt loaded the libcuda.so.1 in its working directory";
}
