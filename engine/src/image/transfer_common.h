// Sizing and bookkeeping shared by pack, unpack and verify.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "gpuckpt/image.h"
#include "gpuckpt/timing.h"
#include "image/chunk_codec.h"
#include "image/manifest.h"
#include "image/pipeline.h"

namespace gpuckpt::image {

// Buffer memory the auto-sized pipeline may use (both buffers of every slot): 40 slots of 4 MiB
// chunks (2 x (4 MiB + 8 KiB) each), what 16 workers take. With the workers' zstd contexts and
// the rest of gpuckpt's and criu's memory, a dump's extra host memory stays under 512 MiB on any
// host (docs/PERFORMANCE.md): 394 MiB measured with 40 slots on 16 CPUs.
inline constexpr std::uint64_t kAutoBufferBudget = 330ull << 20;
// Auto-sized workers: one per usable CPU, at most this many. 32 workers of zstd level 1 compress
// 20-45 GB/s and decompress 90-180 GB/s, beyond any one node's storage or network, and a serving
// host's other CPUs stay with its services.
inline constexpr unsigned kMaxAutoThreads = 32;

// `requested`, or 0: one per usable CPU (usable_cpus()), at most kMaxAutoThreads.
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

// Shared by pack and the streaming writer (stream_pack.h).
// Throws Error(kUsage) for a chunk size, level, blob size or I/O setting out of range.
void validate_pack_options(const PackOptions& o);
// PackOptions::extra itself when it is a JSON object or null; Error(kUsage) otherwise.
const nlohmann::json& checked_extra(const nlohmann::json& extra);
// Whether `inner` lies inside `outer` (after resolving links).
bool is_within(const std::filesystem::path& inner, const std::filesystem::path& outer);
// --force may replace a previous checkpoint or an empty directory, never arbitrary data;
// Error(kExists / kInvalidInput) otherwise.
void check_pack_output(const std::filesystem::path& output, bool force);
// Writes `data` to dir/name (mode 0600, fsynced) through a temporary name and a rename.
void write_private_file(const std::filesystem::path& dir, const char* name,
                        const std::string& data);

// One stored chunk, checked and decoded: its stored bytes against their xxh3 (and BLAKE2b when
// the record has one) before zstd ever sees them, then decompressed into `out` (room for
// rec.raw bytes) if the chunk is compressed. Returns where the raw bytes are (`stored` itself
// for a raw chunk); a failed check throws corrupt(why), which must throw.
const std::byte* check_and_decode(const ChunkRecord& rec, const std::byte* stored, std::byte* out,
                                  Decompressor& dec,
                                  const std::function<void(const std::string&)>& corrupt);

// Shared by unpack, verify and the streaming reader: missing, truncated or oversized blobs
// are reported up front, by name (Error(kCorrupt)).
void check_blobs(const Manifest& m, const std::filesystem::path& ckpt);

}  // namespace gpuckpt::image
