#include "util/mountinfo.h"

#include <sys/sysmacros.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace gpuckpt {

namespace {

// A path field as the kernel escapes it (its seq_path: \ooo for space, tab, newline, backslash).
std::string unescaped(const std::string& field) {
  auto octal = [&](std::size_t i) { return field[i] >= '0' && field[i] <= '7'; };
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

}  // namespace

std::vector<MountInfo> read_mountinfo(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<MountInfo> out;
  for (std::string line; std::getline(in, line);) {
    // ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS: no field
    // holds " - " (a space is \040).
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    std::string id, parent, dev, root, point, fstype, source, options;
    if (!(head >> id >> parent >> dev >> root >> point) || !(tail >> fstype >> source)) continue;
    tail >> options;
    out.push_back({std::atoi(id.c_str()), unescaped(point), fstype, options, unescaped(root), dev});
  }
  return out;
}

bool at_or_under(std::string_view path, std::string_view root) {
  if (root == "/" || path == root) return true;
  return path.size() > root.size() && path.starts_with(root) && path[root.size()] == '/';
}

std::optional<std::filesystem::path> shown_at(const std::filesystem::path& point,
                                              std::string_view root, std::string_view path) {
  if (!at_or_under(path, root)) return std::nullopt;
  const std::string_view rest = root == "/" ? path : path.substr(root.size());
  return point / std::filesystem::path(rest).relative_path();
}

std::optional<dev_t> device_number(const std::string& major_minor) {
  unsigned major_no = 0, minor_no = 0;
  if (std::sscanf(major_minor.c_str(), "%u:%u", &major_no, &minor_no) != 2) return std::nullopt;
  return makedev(major_no, minor_no);
}

}  // namespace gpuckpt
