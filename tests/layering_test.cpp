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

// The engine's layers, lowest first: the core, the benchmarks, reporting.
enum class Layer { kCore, kBench, kReport };

Layer layer_of_header(const std::string& h) {
  if (h.rfind("report/", 0) == 0 || h.rfind("roofline/", 0) == 0 || h == "gpuckpt/report.h" ||
      h == "gpuckpt/roofline.h")
    return Layer::kReport;
  if (h.rfind("bench/", 0) == 0 || h == "gpuckpt/bench.h") return Layer::kBench;
  return Layer::kCore;
}

// A source under engine/src by its module's directory; a public header by its name.
Layer layer_of_file(const fs::path& file) {
  const fs::path src = kSource / "engine" / "src";
  const auto rel = fs::relative(file, src).string();
  if (rel.rfind("..", 0) == 0) return layer_of_header("gpuckpt/" + file.filename().string());
  const auto module = rel.substr(0, rel.find('/') + 1);
  return layer_of_header(
      module == "report/" || module == "roofline/" || module == "bench/" ? module : std::string());
}

const char* layer_name(Layer l) {
  switch (l) {
    case Layer::kCore:
      return "the checkpoint core";
    case Layer::kBench:
      return "the benchmarks";
    case Layer::kReport:
      return "reporting";
  }
  return "?";
}

TEST(Layering, NoLayerOfTheEngineIncludesALayerAboveIt) {
  auto all = quoted_includes(kSource / "engine" / "src");
  ASSERT_GT(all.size(), 100u) << "the engine's sources were not found";
  const auto headers = quoted_includes(kSource / "engine" / "include");
  ASSERT_GT(headers.size(), 10u) << "the engine's public headers were not found";
  all.insert(all.end(), headers.begin(), headers.end());
  for (const auto& [file, header] : all) {
    const Layer from = layer_of_file(file), to = layer_of_header(header);
    EXPECT_LE(static_cast<int>(to), static_cast<int>(from))
        << file << " (" << layer_name(from) << ") includes " << header << ", which is "
        << layer_name(to);
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
