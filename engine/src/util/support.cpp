#include "gpuckpt/support.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>

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

// xoshiro256**, splitmix64-seeded.
SampleContent::SampleContent(std::uint64_t seed) {
  for (auto& w : s_) {
    seed += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    w = z ^ (z >> 31);
  }
}

std::uint64_t SampleContent::next() {
  auto rotl = [](std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const std::uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return r;
}

void SampleContent::fill(std::span<std::byte> out, bool incompressible) {
  std::size_t i = 0;
  if (incompressible) {
    for (; i + 8 <= out.size(); i += 8) {
      const std::uint64_t r = next();
      std::memcpy(out.data() + i, &r, 8);
    }
  } else {
    for (; i + 16 <= out.size(); i += 16) {
      std::uint64_t r = next();
      std::uint16_t h[8];
      for (auto& v : h) {
        v = static_cast<std::uint16_t>(0x3c00 | ((r & 0x40) << 9) | (r & 0x3f));
        r >>= 7;
      }
      std::memcpy(out.data() + i, h, sizeof h);
    }
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(next());
}

}  // namespace gpuckpt
