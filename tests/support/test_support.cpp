#include "test_support.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "gpuckpt/error.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt::test {

fs::path bin_dir() { return GPUCKPT_BIN_DIR; }
fs::path gpuckpt_binary() { return bin_dir() / "gpuckpt"; }

TempDir scratch_dir(const std::string& name) {
  const char* t = std::getenv("TMPDIR");
  return TempDir(t ? t : "/tmp", name);
}

CliResult run_cli(const std::vector<std::string>& args, int timeout_s) {
  std::vector<std::string> argv{gpuckpt_binary().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  TempDir tmp = scratch_dir("gpuckpt-cli");
  SpawnOptions opts;
  opts.stderr_file = tmp.path() / "stderr";
  CliResult r;
  try {
    RunResult rr = run_capture(argv, std::chrono::seconds(timeout_s), opts);
    r.exit_code = rr.status.exited ? rr.status.code : 128 + rr.status.code;
    r.out = std::move(rr.output);
  } catch (const Error& e) {
    r.exit_code = -1;
    r.err = e.what();
  }
  std::error_code ec;
  if (fs::exists(opts.stderr_file, ec)) r.err += read_file(opts.stderr_file);
  return r;
}

void write_test_file(const fs::path& path, std::uint64_t size, std::uint64_t seed,
                     double random_fraction) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw_errno(Errc::kIo, "create " + path.string());
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> buf(1 << 17);  // 1 MiB blocks
  const std::uint64_t random_bytes = static_cast<std::uint64_t>(size * random_fraction);
  std::uint64_t written = 0;
  while (written < size) {
    if (written < random_bytes) {
      for (auto& w : buf) w = rng();
    } else {
      // fp16-like: small-magnitude values with shared exponents, like activations in a KV cache.
      auto* h = reinterpret_cast<std::uint16_t*>(buf.data());
      for (size_t i = 0; i < buf.size() * 4; ++i) {
        std::uint16_t mant = static_cast<std::uint16_t>(rng() & 0x3f);  // low-entropy mantissa
        h[i] = static_cast<std::uint16_t>(0x3c00 | (rng() & 0x8000) | mant);
      }
    }
    const size_t n = static_cast<size_t>(std::min<std::uint64_t>(buf.size() * 8, size - written));
    if (::write(fd.get(), buf.data(), n) != static_cast<ssize_t>(n))
      throw_errno(Errc::kIo, "write " + path.string());
    written += n;
  }
}

bool same_contents(const fs::path& a, const fs::path& b) {
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  if (!fa || !fb) return false;
  std::vector<char> ba(1 << 20), bb(1 << 20);
  for (;;) {
    fa.read(ba.data(), ba.size());
    fb.read(bb.data(), bb.size());
    if (fa.gcount() != fb.gcount()) return false;
    if (std::memcmp(ba.data(), bb.data(), fa.gcount()) != 0) return false;
    if (!fa) return !fb;
  }
}

}  // namespace gpuckpt::test
