// docs/ARCHITECTURE.md's layering rules as checks that fail: the core includes no reporting
// (the link alone would not catch a header-only use), and the CLI includes only the public
// headers and its own.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace gpuckpt {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = GPUCKPT_SOURCE_DIR;

// Every `#include "X"` of the C++ files under `dir`, as "FILE: X".
std::vector<std::pair<fs::path, std::string>> quoted_includes(const fs::path& dir) {
  // A raw string with a delimiter of its own: the pattern holds `)"`.
  static const std::regex include(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<std::pair<fs::path, std::string>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const auto ext = e.path().extension();
    if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
    std::ifstream in(e.path());
    std::smatch m;
    for (std::string line; std::getline(in, line);)
      if (std::regex_search(line, m, include)) out.emplace_back(e.path(), m[1].str());
  }
  return out;
}

bool is_reporting(const fs::path& file) {
  const auto rel = fs::relative(file, kSource / "engine" / "src").string();
  return rel.rfind("report/", 0) == 0 || rel.rfind("roofline/", 0) == 0;
}

TEST(Layering, TheCoreIncludesNoReporting) {
  const auto all = quoted_includes(kSource / "engine" / "src");
  ASSERT_GT(all.size(), 100u) << "the engine's sources were not found";
  for (const auto& [file, header] : all) {
    if (is_reporting(file)) continue;
    EXPECT_FALSE(header.rfind("report/", 0) == 0 || header.rfind("roofline/", 0) == 0 ||
                 header == "gpuckpt/report.h" || header == "gpuckpt/roofline.h")
        << file << " (the checkpoint core) includes " << header << ", which is reporting";
  }
}

TEST(Layering, TheCliIncludesOnlyThePublicHeadersAndItsOwn) {
  const auto all = quoted_includes(kSource / "cli");
  ASSERT_GT(all.size(), 20u) << "the CLI's sources were not found";
  for (const auto& [file, header] : all)
    EXPECT_TRUE(header.rfind("gpuckpt/", 0) == 0 || fs::exists(kSource / "cli" / header))
        << file << " includes " << header << ", an engine internal";
}

}  // namespace
}  // namespace gpuckpt
