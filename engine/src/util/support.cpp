#include "gpuckpt/support.h"

#include <cstdio>

#include "gpuckpt/error.h"
#include "util/subprocess.h"

namespace gpuckpt {

std::string format_seconds(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  return buf;
}

std::string format_mode(std::uint32_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", mode);
  return buf;
}

std::string format_hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

int run_shell(const std::string& command) {
  try {
    Child c = spawn({"/bin/sh", "-c", command});
    const ExitStatus st = c.wait();
    return st.exited ? st.code : -1;
  } catch (const Error&) {
    return -1;
  }
}

}  // namespace gpuckpt
