// Micro-benchmarks of the per-chunk work the pack/unpack workers do, to tell apart CPU cost
// (this) from I/O cost (`gpuckpt bench io`). Run: build/bin/gpuckpt_bench_chunk
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "image/aligned_buffer.h"
#include "image/chunk_codec.h"

using namespace gpuckpt::image;

namespace {

constexpr std::size_t kChunk = 4u << 20;

// fp16-like values (compressible about 2:1) or uniformly random bytes.
AlignedBuffer make_chunk(bool random) {
  AlignedBuffer b(kChunk);
  std::mt19937_64 rng(42);
  auto* h = reinterpret_cast<std::uint16_t*>(b.data());
  for (std::size_t i = 0; i < kChunk / 2; ++i) {
    const std::uint64_t r = rng();
    h[i] = random ? static_cast<std::uint16_t>(r)
                  : static_cast<std::uint16_t>(0x3c00 | (r & 0x8000) | (r & 0x3f));
  }
  return b;
}

void BM_Compress(benchmark::State& state) {
  const bool random = state.range(1) != 0;
  AlignedBuffer in = make_chunk(random), out(kChunk + 8192);
  Compressor c(static_cast<int>(state.range(0)));
  std::size_t stored = 0;
  for (auto _ : state) {
    stored = c.compress(in.data(), kChunk, out.data(), out.size());
    benchmark::DoNotOptimize(stored);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kChunk));
  state.counters["ratio"] = stored ? double(kChunk) / double(stored) : 1.0;
}
BENCHMARK(BM_Compress)->ArgsProduct({{-1, 1, 3}, {0, 1}})->ArgNames({"level", "random"});

void BM_Decompress(benchmark::State& state) {
  AlignedBuffer in = make_chunk(false), packed(kChunk + 8192), out(kChunk);
  Compressor c(static_cast<int>(state.range(0)));
  const std::size_t n = c.compress(in.data(), kChunk, packed.data(), packed.size());
  Decompressor d;
  for (auto _ : state) {
    const std::string err = d.decompress(packed.data(), n, out.data(), kChunk);
    if (!err.empty()) state.SkipWithError(err.c_str());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kChunk));
}
BENCHMARK(BM_Decompress)->Arg(1)->Arg(3)->ArgName("level");

void BM_Xxh3(benchmark::State& state) {
  AlignedBuffer in = make_chunk(true);
  for (auto _ : state) benchmark::DoNotOptimize(xxh3(in.data(), kChunk));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kChunk));
}
BENCHMARK(BM_Xxh3);

void BM_Xxh3Streaming(benchmark::State& state) {
  AlignedBuffer in = make_chunk(true);
  StreamHash h;
  for (auto _ : state) {
    h.reset();
    h.update(in.data(), kChunk);
    benchmark::DoNotOptimize(h.digest());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kChunk));
}
BENCHMARK(BM_Xxh3Streaming);

}  // namespace

BENCHMARK_MAIN();
