// Bounded memory: packing (and unpacking) an input many times larger than the pipeline's
// buffer budget must not raise peak RSS beyond that budget plus fixed overheads.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "gpuckpt/image.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

constexpr std::uint64_t kMiB = 1 << 20;
constexpr std::uint64_t kInput = 320 * kMiB;
// zstd contexts, thread stacks, allocator arenas, the manifest: independent of input size.
constexpr std::uint64_t kFixedOverhead = 48 * kMiB;

std::uint64_t status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

// Resets VmHWM to the current RSS ("5" in clear_refs, Linux >= 4.0).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

class PeakRss {
 public:
  PeakRss() : ok_(reset_peak_rss()), base_(status_bytes("VmRSS")) {}
  bool ok() const { return ok_; }
  std::uint64_t growth() const {
    const std::uint64_t peak = status_bytes("VmHWM");
    return peak > base_ ? peak - base_ : 0;
  }

 private:
  bool ok_;
  std::uint64_t base_;
};

TEST(PipelineMemory, PeakRssStaysWithinTheBufferBudget) {
  auto dir = test::scratch_dir();
  const fs::path input = dir.path() / "pages-1.img";
  test::write_test_file(input, kInput, 7);

  PackOptions po;
  po.chunk_bytes = 1 * kMiB;
  po.threads = 2;
  po.inflight_chunks = 6;
  TransferResult r;
  {
    PeakRss rss;
    if (!rss.ok()) GTEST_SKIP() << "/proc/self/clear_refs is not writable; cannot reset VmHWM";
    r = pack(input, dir.path() / "ckpt", po);
    const std::uint64_t bound = r.buffer_bytes + kFixedOverhead;
    ASSERT_GT(r.buffer_bytes, 0u);
    ASSERT_LT(bound, kInput / 4) << "the input must dwarf the budget for this test to mean much";
    EXPECT_LT(rss.growth(), bound) << "pack peak RSS grew by " << rss.growth() / kMiB
                                   << " MiB; buffers are " << r.buffer_bytes / kMiB << " MiB";
  }
  EXPECT_EQ(r.raw_bytes, kInput);

  UnpackOptions uo;
  uo.threads = 2;
  uo.inflight_chunks = 6;
  {
    PeakRss rss;
    const TransferResult u = unpack(dir.path() / "ckpt", dir.path() / "out", uo);
    EXPECT_LT(rss.growth(), u.buffer_bytes + kFixedOverhead)
        << "unpack peak RSS grew by " << rss.growth() / kMiB << " MiB";
  }
  EXPECT_EQ(fs::file_size(dir.path() / "out/pages-1.img"), kInput);
  {
    PeakRss rss;
    const TransferResult v = verify(dir.path() / "ckpt", uo);
    EXPECT_LT(rss.growth(), v.buffer_bytes + kFixedOverhead)
        << "verify peak RSS grew by " << rss.growth() / kMiB << " MiB";
  }
}

}  // namespace
