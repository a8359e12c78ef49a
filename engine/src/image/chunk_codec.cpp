#include "image/chunk_codec.h"

#include <sodium.h>
#include <xxhash.h>
#ifdef GPUCKPT_HAVE_XXH3_DISPATCH
// XXH3_64bits and XXH3_64bits_update become the versions chosen for this CPU at run time.
#include <xxh_x86dispatch.h>
#endif
#include <zstd.h>
#include <zstd_errors.h>

#include <charconv>
#include <cstdio>
#include <new>

#include "gpuckpt/error.h"
#include "gpuckpt/support.h"

namespace gpuckpt::image {

std::uint64_t xxh3(const void* data, std::size_t len) {
  return XXH3_64bits(data, len);
}

std::optional<std::uint64_t> parse_hex64(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

Digest blake2b(const void* data, std::size_t len) {
  Digest d{};
  // No sodium_init() needed: generichash uses no randomness and no CPU-feature dispatch.
  crypto_generichash(d.data(), d.size(), static_cast<const unsigned char*>(data), len, nullptr, 0);
  return d;
}

std::string hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * d.size());
  for (unsigned char c : d) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

std::optional<Digest> parse_digest(std::string_view s) {
  if (s.size() != 64) return std::nullopt;
  Digest d{};
  for (std::size_t i = 0; i < d.size(); ++i) {
    unsigned v = 0;
    auto [p, ec] = std::from_chars(s.data() + 2 * i, s.data() + 2 * i + 2, v, 16);
    if (ec != std::errc() || p != s.data() + 2 * i + 2) return std::nullopt;
    d[i] = static_cast<unsigned char>(v);
  }
  return d;
}

StreamHash::StreamHash() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  reset();
}
StreamHash::~StreamHash() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
void StreamHash::reset() {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
void StreamHash::update(const void* data, std::size_t len) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, len);
}
std::uint64_t StreamHash::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

Compressor::Compressor(int level) : cctx_(ZSTD_createCCtx()), level_(level) {
  if (!cctx_) throw std::bad_alloc();
}
Compressor::~Compressor() {
  ZSTD_freeCCtx(cctx_);
}

std::size_t Compressor::compress(const std::byte* src, std::size_t len, std::byte* dst,
                                 std::size_t cap) {
  // A destination no larger than the input makes zstd give up early on incompressible data.
  const std::size_t limit = std::min(cap, len > 0 ? len - 1 : 0);
  // One-shot API; its defaults are what the format wants: content size in the frame header,
  // no zstd checksum (our xxh3 covers integrity).
  const std::size_t n = ZSTD_compressCCtx(cctx_, dst, limit, src, len, level_);
  if (ZSTD_isError(n)) {
    if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall) return 0;
    throw Error(Errc::kInternal, std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  }
  return n;
}

Decompressor::Decompressor() : dctx_(ZSTD_createDCtx()) {
  if (!dctx_) throw std::bad_alloc();
}
Decompressor::~Decompressor() {
  ZSTD_freeDCtx(dctx_);
}

std::string Decompressor::decompress(const std::byte* src, std::size_t len, std::byte* dst,
                                     std::size_t raw_len) {
  const unsigned long long content = ZSTD_getFrameContentSize(src, len);
  if (content == ZSTD_CONTENTSIZE_ERROR) return "not a zstd frame";
  if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != raw_len)
    return "frame holds " + std::to_string(content) + " bytes, manifest says " +
           std::to_string(raw_len);
  const std::size_t n = ZSTD_decompressDCtx(dctx_, dst, raw_len, src, len);
  if (ZSTD_isError(n)) return std::string("zstd: ") + ZSTD_getErrorName(n);
  if (n != raw_len)
    return "decompressed to " + std::to_string(n) + " bytes, manifest says " +
           std::to_string(raw_len);
  return {};
}

int min_zstd_level() {
  return ZSTD_minCLevel();
}
int max_zstd_level() {
  return ZSTD_maxCLevel();
}

}  // namespace gpuckpt::image
