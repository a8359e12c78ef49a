// Load for measurements: memory as a restore meets it (settled, first-touched) and bytes like a
// serving process's memory.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpuckpt/bench.h"
#include "gpuckpt/error.h"
#include "util/fs.h"

namespace gpuckpt {

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

namespace {

// Whether a virtio balloon reports free pages: feature bit 5 (VIRTIO_BALLOON_F_REPORTING) in the
// features its driver negotiated, one character per bit.
bool free_page_reporting() {
  std::error_code ec;
  for (const auto& d :
       std::filesystem::directory_iterator("/sys/bus/virtio/drivers/virtio_balloon", ec)) {
    std::string f;
    try {
      f = read_file(d.path() / "features");
    } catch (const Error&) {
      continue;  // not a device (bind, unbind, module)
    }
    if (f.size() > 5 && f[5] == '1') return true;
  }
  return false;
}

}  // namespace

double settle_free_memory(double limit_s) {
  using Clock = std::chrono::steady_clock;
  if (!free_page_reporting()) return 0;
  const auto t0 = Clock::now();
  const auto waited = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const std::filesystem::path counter = "/sys/module/page_reporting/parameters/reported_kib";
  const auto read_counter = [&]() -> std::optional<std::string> {
    try {
      return read_file(counter);
    } catch (const Error&) {
      return std::nullopt;  // no such counter in this kernel
    }
  };
  std::optional<std::string> last = read_counter();
  if (!last) {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(15.0, limit_s)));
    return waited();
  }
  // The reporting worker runs every 2 s (later on a busy machine): settled once the counter has
  // not moved for 3.5 s.
  auto still_since = Clock::now();
  while (waited() < limit_s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const auto now = read_counter();
    if (now != last) {
      last = now;
      still_since = Clock::now();
    } else if (Clock::now() - still_since >= std::chrono::milliseconds(3500)) {
      break;
    }
  }
  return waited();
}

std::optional<double> touch_fresh_memory(std::size_t bytes, bool huge, unsigned threads) {
  constexpr std::size_t kHuge = 2u << 20, kPiece = 32u << 20;
  if (bytes == 0) throw Error(Errc::kUsage, "no memory to touch");
  struct Mapping {
    void* p;
    std::size_t n;
    ~Mapping() { ::munmap(p, n); }
  };
  void* p = ::mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw_errno(Errc::kInternal, "map ", bytes, " bytes of memory");
  const Mapping m{p, bytes + kHuge};
  auto* base = reinterpret_cast<volatile char*>((reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) &
                                                ~std::uintptr_t{kHuge - 1});
  if (huge && ::madvise(const_cast<char*>(base), bytes, MADV_HUGEPAGE) != 0) return std::nullopt;
  std::atomic<std::size_t> next{0};
  const auto touch = [&] {
    for (std::size_t at; (at = next.fetch_add(kPiece)) < bytes;)
      for (std::size_t i = at; i < std::min(bytes, at + kPiece); i += 4096) base[i] = 1;
  };
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::jthread> helpers;
    for (unsigned t = 1; t < threads; ++t) helpers.emplace_back(touch);
    touch();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(bytes) / s / 1e9;
}

}  // namespace gpuckpt
