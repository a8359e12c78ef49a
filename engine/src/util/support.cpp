#include "gpuckpt/support.h"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "gpuckpt/error.h"
#include "util/fs.h"
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

std::uint64_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    throw Error(Errc::kUsage, "bad size: " + s);
  }
  std::uint64_t mult = 1;
  if (pos < s.size()) {
    switch (s[pos]) {
      case 'k':
      case 'K':
        mult = 1ull << 10;
        break;
      case 'm':
      case 'M':
        mult = 1ull << 20;
        break;
      case 'g':
      case 'G':
        mult = 1ull << 30;
        break;
      default:
        throw Error(Errc::kUsage, "bad size: " + s);
    }
  }
  return static_cast<std::uint64_t>(v * static_cast<double>(mult));
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

std::string shell_quote(std::string_view s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
  return buf;
}

std::uint64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) == 0)
      return std::strtoull(line.c_str() + 13, nullptr, 10) << 10;  // "MemAvailable:  123 kB"
  }
  return 0;
}

std::string boot_id() {
  std::string id;
  try {
    id = read_file("/proc/sys/kernel/random/boot_id");
  } catch (const std::exception&) {
  }
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

std::vector<int> usable_cpu_ids() {
  // Sized for hosts beyond cpu_set_t's 1024 CPUs; EINVAL: the kernel's mask is larger still.
  struct Free {
    void operator()(cpu_set_t* s) const { CPU_FREE(s); }
  };
  for (int n = 1024; n <= (1 << 16); n *= 4) {
    const std::unique_ptr<cpu_set_t, Free> set(CPU_ALLOC(n));
    if (!set) break;
    const std::size_t size = CPU_ALLOC_SIZE(n);
    if (::sched_getaffinity(0, size, set.get()) == 0) {
      std::vector<int> ids;
      for (int c = 0; c < n; ++c)
        if (CPU_ISSET_S(c, size, set.get())) ids.push_back(c);
      if (!ids.empty()) return ids;
      break;
    }
    if (errno != EINVAL) break;
  }
  std::vector<int> all(std::max(1u, std::thread::hardware_concurrency()));
  for (std::size_t c = 0; c < all.size(); ++c) all[c] = static_cast<int>(c);
  return all;
}

unsigned usable_cpus() {
  return static_cast<unsigned>(usable_cpu_ids().size());
}

}  // namespace gpuckpt
