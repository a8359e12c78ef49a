// Shared test helpers: paths of the built binaries, scratch directories, running the CLI.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "util/fs.h"
#include "util/subprocess.h"

namespace gpuckpt::test {

std::filesystem::path bin_dir();         // build/bin: gpuckpt, demo servers, kernels runner
std::filesystem::path gpuckpt_binary();  // build/bin/gpuckpt

// A fresh scratch directory under $TMPDIR (default /tmp), removed at the end of the test.
TempDir scratch_dir(const std::string& name = "gpuckpt-test");

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs build/bin/gpuckpt with `args`; never throws on a non-zero exit.
CliResult run_cli(const std::vector<std::string>& args, int timeout_s = 300);

// Writes `size` bytes of deterministic content (seeded) to `path`: `random_fraction` of it
// incompressible, the rest fp16-like values (compressible, like a KV cache).
void write_test_file(const std::filesystem::path& path, std::uint64_t size, std::uint64_t seed,
                     double random_fraction = 0.5);

// True if `a` and `b` have identical bytes.
bool same_contents(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace gpuckpt::test
