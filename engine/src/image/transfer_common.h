// Sizing and bookkeeping shared by pack, unpack and verify.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "gpuckpt/image.h"
#include "gpuckpt/timing.h"
#include "image/pipeline.h"

namespace gpuckpt::image {

// Buffer memory the auto-sized pipeline may use (both buffers of every slot).
inline constexpr std::uint64_t kAutoBufferBudget = 512ull << 20;

unsigned resolve_threads(unsigned requested);
// Capacity of each slot buffer for chunks of `chunk_bytes`: the chunk, rounded up to the I/O
// alignment, plus room for an unaligned read window.
std::size_t slot_buffer_bytes(std::uint32_t chunk_bytes);
// Slots for a job of `chunks` chunks: `requested`, or auto-sized; never more than there are
// chunks to hold (small checkpoints should not pay for pinning buffers they cannot use).
unsigned resolve_slots(unsigned requested, unsigned threads, std::size_t buffer_bytes,
                       std::uint64_t chunks);
void validate_io_options(unsigned threads, unsigned queue_depth, unsigned inflight);

// Adds the pipeline's stages to `t`: `overall` (the whole streaming phase, `raw` bytes), then
// "read", `work` and "write" as overlapping windows.
void add_pipeline_stages(Timeline& t, const PipelineStats& s, const std::string& overall,
                         const std::string& work, std::uint64_t raw, std::uint64_t stored,
                         bool has_write);
void fill_result(TransferResult& r, const PipelineStats& s, unsigned threads, unsigned slots,
                 std::size_t buffer_bytes);

// True if pages at the start, middle and end of the file are in the page cache: then reading
// through the cache is a memory copy, while O_DIRECT would go back to the disk (and first
// write back any dirty pages). CRIU images just written to disk or tmpfs look cached.
bool looks_cached(const std::filesystem::path& path, std::uint64_t size);

std::string utc_now_iso8601();
std::string host_name();

}  // namespace gpuckpt::image
