// The benchmarks' library (gpuckpt_bench): what a measurement needs beyond the checkpoint core
// (load that meets memory as a restore does, bytes like a serving process's, the median), and the
// dump/restore comparison behind `gpuckpt bench dump`. It uses the core; the core never uses it,
// and reporting (the roofline's path ceilings, bench JSON) builds on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpuckpt/process.h"

namespace gpuckpt {

// Free page reporting (a virtio balloon with VIRTIO_BALLOON_F_REPORTING) hands memory that has
// stayed free a while back to the host, a few hundred MiB every 2 s; a first touch of it then
// costs a host fault as well, many times a plain first touch (docs/PERFORMANCE.md). Waits until
// what was freed lately has been reported, so that a measurement meets memory as a restore on
// an idle node does: until the kernel's reported_kib counter has not grown for 3.5 s, or 15 s
// where the kernel has no such counter, at most `limit_s`. Returns the seconds waited: 0 where no
// device reports free pages.
double settle_free_memory(double limit_s = 60);

// First touch of `bytes` of fresh anonymous memory, one write per 4 KiB page, into huge pages
// (MADV_HUGEPAGE) if `huge`, by `threads` threads taking 32 MiB pieces in turn, as a restore
// fills memory; the memory is freed on return. GB/s, or nullopt if huge pages were asked for and
// this kernel has none. Freed, that memory stays with the guest for a few seconds where free
// page reporting runs: what a restore right after another process's end meets.
std::optional<double> touch_fresh_memory(std::size_t bytes, bool huge, unsigned threads);

// Bytes like a serving process's memory, for benchmarks and the path ceilings' zstd sample:
// incompressible (weights in a compressed format, random state), or fp16 activations and KV
// values of similar magnitude (shared exponent, 7 random bits per value), which zstd
// compresses about 1.8:1. Deterministic for a seed, and fast: a fraction of a second per GiB.
class SampleContent {
 public:
  explicit SampleContent(std::uint64_t seed);
  void fill(std::span<std::byte> out, bool incompressible);

 private:
  std::uint64_t next();
  std::uint64_t s_[4];
};

// The median of `v`: the middle value, or the mean of the two middle ones for an even count;
// 0 for none. Every benchmark's summary uses this one.
double median(std::vector<double> v);

// `gpuckpt bench dump`: a demo server holding `size` bytes of weights is dumped and restored
// `runs` times each by gpuckpt streaming, gpuckpt staged, and plain `criu dump -D DIR` /
// `criu restore -D DIR` (then syncfs, as gpuckpt's checkpoints are durable), all on the disk of
// `dir`; each restore reads from the disk (the page cache is evicted for those files) and is timed
// to the server's first answer. Memory: the peak RSS of the dump or restore and of everything it
// starts, plus the peak bytes in the staging tmpfs (docs/PERFORMANCE.md).
struct DumpRestoreBenchOptions {
  std::filesystem::path dir;  // weights file, checkpoints, CRIU's plain image directory
  std::filesystem::path staging_root = "/dev/shm";
  std::uint64_t size = 1ull << 30;
  // The weights (gpuckpt-demo-server --content): half random, half fp16-like; or bf16-like.
  enum class Content { kMixed, kBf16 } content = Content::kMixed;
  unsigned runs = 3;
  // The memory each restore meets (below): kCold waits until what the dumped process freed
  // has gone back to the host (settle_free_memory), as on an idle node; kWarm touches and frees
  // the process's size just before, as right after a process of that size ended here.
  enum class Memory { kCold, kWarm } memory = Memory::kCold;
  // The server runs in a runc container (runc's default root, the host's /usr and network);
  // the methods are then "container" (gpuckpt dump and restore --container, streamed) and
  // "runc" (runc checkpoint and restore --detach with the same CRIU, then syncfs).
  bool container = false;
  CriuSettings criu;
  std::function<void(const std::string&)> log;  // one line per measured run
};

// "mixed", "bf16"; "cold", "warm".
const char* bench_content_name(DumpRestoreBenchOptions::Content c);
const char* bench_memory_name(DumpRestoreBenchOptions::Memory m);

struct DumpRestoreBenchMethod {
  // "stream", "stream-4k" (restored without huge pages), "staged", "criu"; or "container",
  // "runc". The last is the plain tool the others are compared with.
  std::string name;
  // A dump is timed from its start to its durable checkpoint (gpuckpt: its exit less its
  // process_end_seconds; plain criu: its syncfs returned), and to its exit: gpuckpt ends the
  // dumped process only once the checkpoint is durable, plain criu before its images are.
  std::vector<double> dump_seconds, dump_exit_seconds, restore_seconds;
  std::vector<std::uint64_t> dump_extra_bytes, restore_extra_bytes;
  double dump_median = 0, dump_exit_median = 0, restore_median = 0;
  std::uint64_t dump_extra_median = 0, restore_extra_median = 0;
};

struct DumpRestoreBenchResult {
  std::uint64_t process_bytes = 0;  // the server's dumpable memory
  std::vector<DumpRestoreBenchMethod> methods;
  std::map<std::string, std::uint64_t> checkpoint_bytes;  // on disk, per method (last run)
};

DumpRestoreBenchResult bench_dump_restore(const DumpRestoreBenchOptions& opts);

}  // namespace gpuckpt
