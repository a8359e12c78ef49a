// Per-chunk compression and checksums. Each chunk is an independent zstd frame, so chunks
// (de)compress in parallel; each worker owns one reusable context.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace gpuckpt::image {

// XXH3-64 (seed 0): chunk checksums and whole-file hashes.
std::uint64_t xxh3(const void* data, std::size_t len);
std::optional<std::uint64_t> parse_hex64(std::string_view s);

// BLAKE2b-256: what a signature needs to cover the data and not only the manifest (XXH3 is
// fast but offers no resistance to someone crafting data that matches it).
using Digest = std::array<unsigned char, 32>;
Digest blake2b(const void* data, std::size_t len);
std::string hex(const Digest& d);  // 64 lower-case hex digits
std::optional<Digest> parse_digest(std::string_view s);

// Streaming XXH3-64 over a file's chunks, fed in order.
class StreamHash {
 public:
  StreamHash();
  StreamHash(const StreamHash&) = delete;
  StreamHash& operator=(const StreamHash&) = delete;
  ~StreamHash();
  void reset();
  void update(const void* data, std::size_t len);
  std::uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

class Compressor {
 public:
  explicit Compressor(int level);
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  ~Compressor();
  // Compresses `src` into `dst` (capacity `cap`) as one frame; returns its size, or 0 when
  // the frame would not be smaller than `src` (the caller then stores the chunk raw).
  std::size_t compress(const std::byte* src, std::size_t len, std::byte* dst, std::size_t cap);

 private:
  ZSTD_CCtx_s* cctx_;
  int level_;
};

class Decompressor {
 public:
  Decompressor();
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
  ~Decompressor();
  // Decompresses one frame that must expand to exactly `raw_len` bytes; returns an error
  // description (empty on success) so the caller can name the chunk in its message.
  std::string decompress(const std::byte* src, std::size_t len, std::byte* dst,
                         std::size_t raw_len);

 private:
  ZSTD_DCtx_s* dctx_;
};

// Level range accepted by the zstd library in use.
int min_zstd_level();
int max_zstd_level();

}  // namespace gpuckpt::image
