#include "roofline/cpu_info.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

namespace fs = std::filesystem;

namespace gpuckpt {

namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\n");
  const auto e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string read_line(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return trim(s);
}

// "32768K", "1M", "512" -> bytes.
std::uint64_t parse_size(const std::string& s) {
  if (s.empty()) return 0;
  std::uint64_t v = 0;
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i++] - '0');
  if (i < s.size() && (s[i] == 'K' || s[i] == 'k')) v <<= 10;
  if (i < s.size() && (s[i] == 'M' || s[i] == 'm')) v <<= 20;
  if (i < s.size() && (s[i] == 'G' || s[i] == 'g')) v <<= 30;
  return v;
}

}  // namespace

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, fallback;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "model name" && !value.empty()) return value;
    // arm64 and others have no "model name"; these at least identify the part.
    if (fallback.empty() &&
        (key == "Hardware" || key == "cpu model" || key == "uarch" || key == "CPU part") &&
        !value.empty())
      fallback = key + " " + value;
  }
  return fallback.empty() ? "unknown CPU" : fallback;
}

std::uint64_t last_level_cache_bytes() {
  // Highest-level data/unified cache; each distinct shared_cpu_list is one instance.
  int best_level = 0;
  std::set<std::pair<std::string, std::uint64_t>> instances;
  std::error_code ec;
  for (const auto& cpu : fs::directory_iterator("/sys/devices/system/cpu", ec)) {
    const auto name = cpu.path().filename().string();
    if (name.size() < 4 || name.rfind("cpu", 0) != 0 || !std::isdigit(name[3])) continue;
    for (const auto& idx : fs::directory_iterator(cpu.path() / "cache", ec)) {
      if (idx.path().filename().string().rfind("index", 0) != 0) continue;
      if (read_line(idx.path() / "type") == "Instruction") continue;
      const int level = std::atoi(read_line(idx.path() / "level").c_str());
      const std::uint64_t size = parse_size(read_line(idx.path() / "size"));
      const std::string shared = read_line(idx.path() / "shared_cpu_list");
      if (level > best_level) {
        best_level = level;
        instances.clear();
      }
      if (level == best_level && size > 0) instances.insert({shared, size});
    }
  }
  std::uint64_t total = 0;
  for (const auto& [shared, size] : instances) total += size;
  return total;
}

}  // namespace gpuckpt
