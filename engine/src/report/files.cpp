#include "gpuckpt/report.h"
#include "util/fs.h"

namespace gpuckpt {

std::string read_report_input(const std::filesystem::path& path) {
  return read_file(path);
}

void write_report_output(const std::filesystem::path& path, const std::string& content) {
  write_file_atomic(path, content);
}

}  // namespace gpuckpt
